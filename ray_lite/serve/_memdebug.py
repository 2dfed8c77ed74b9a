"""A memory probe for a long-running Serve process (the soak's leak hunt).

With ``RAY_LITE_SERVE_MEMDEBUG=DIR`` in its environment, a proxy starts
``tracemalloc`` and, on each SIGUSR2, writes to ``DIR/proxy-<pid>-<n>.txt``
the allocation sites that grew since the previous signal and the counts of
the objects the garbage collector tracks, by type.  Off (nothing imported,
nothing run) without the variable.
"""
import collections
import gc
import os

from ray_lite import _config


def install(loop, role):
    """Start the probe in this process if asked for; True when it runs."""
    out_dir = _config.SERVE_MEMDEBUG
    if not out_dir:
        return False
    import signal
    import tracemalloc
    tracemalloc.start(8)
    state = {"n": 0, "last": tracemalloc.take_snapshot()}

    def dump():
        state["n"] += 1
        snap = tracemalloc.take_snapshot()
        grown = snap.compare_to(state["last"], "traceback")
        state["last"] = snap
        types = collections.Counter(type(o).__name__ for o in gc.get_objects())
        path = os.path.join(out_dir, f"{role}-{os.getpid()}-{state['n']}.txt")
        with open(path, "w") as f:
            for stat in grown[:25]:
                f.write(f"{stat.size_diff:+d} B {stat.count_diff:+d} blocks\n")
                for line in stat.traceback.format()[-8:]:
                    f.write(f"    {line}\n")
            f.write("\n")
            for name, n in types.most_common(40):
                f.write(f"{n} {name}\n")
    loop.add_signal_handler(signal.SIGUSR2, dump)
    return True
