"""What every benchmark suite shares: figures, statistics, timing loops,
child processes, the machine description and how busy it is, and a
figure's JSON form (what is printed, and how: ``_report.py``).

A suite returns a list of :class:`Figure`.  A figure is one row of the table:
one workload (``bench``, e.g. ``"B4"``) measured on one implementation
(``impl``: ``"compiled"`` / ``"python"`` twin of ray_lite, ``"anchor"`` for
what we compare with in the same run, ``"ceiling"`` for a bare reference
that does less than the workload asks (a one-process HTTP server), ``"C"``
for a compiled loop with no Python in it).  A figure that could not be measured keeps its row, with
``status`` saying why (``"not built"``, ``"unavailable"``, ``"error"``), so a
missing compiled twin or an absent optional library shows in the table
instead of silently vanishing.
"""
import datetime
import gc
import importlib
import math
import os
import platform
import statistics
import sys
import time
import timeit
from dataclasses import asdict, dataclass, field

OK = "ok"
NOT_BUILT = "not built"
UNAVAILABLE = "unavailable"
ERROR = "error"


@dataclass
class Figure:
    bench: str                     # "B3", "B4", ... (BENCHMARKS.md)
    name: str                      # what is measured, e.g. "ring round trip, 1-byte message"
    impl: str                      # "compiled" | "python" | "anchor" | "ceiling" | "C"
    label: str                     # the row's subject, e.g. "ray_lite (compiled)", "multiprocessing.Pipe"
    unit: str                      # "ns", "us" (printed µs), "%", "req/s", ...: ASCII codes
    value: float = None            # the headline statistic (a median or a p50)
    stat: str = "median"           # what `value` is: "median" of trials, "p50" of samples, ...
    spread: dict = field(default_factory=dict)   # e.g. {"min": .., "max": ..} or {"p99": ..}
    trials: int = 0
    samples: int = 0               # calls or round trips measured in all trials
    goal_id: str = None            # the goal this row measures: a key of _goals.GOALS
    goal: str = None               # the goal as text, e.g. "<= 0.2 us" (set from GOALS)
    goal_met: bool = None          # None: no goal for this row, or not judged
    goal_note: str = None          # why a row with a goal has no verdict
    informational: bool = False    # a pure-Python twin beside a compiled run: no verdict
    detail: dict = field(default_factory=dict)   # extra numbers (encode/decode split, ratios)
    note: str = None               # a short remark shown beside the spread
    status: str = OK
    reason: str = None             # why status is not "ok"

    def to_json(self):
        return _json_safe(asdict(self))


def _json_safe(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


def missing(bench, name, impl, label, unit, status, reason, goal_id=None):
    """A row for a figure that could not be measured."""
    return Figure(bench=bench, name=name, impl=impl, label=label, unit=unit, goal_id=goal_id,
                  status=status, reason=reason)


TWINS = ("compiled", "python")
TWIN_LABEL = {"compiled": "ray_lite (compiled)", "python": "ray_lite (pure Python)"}


def load_twin(name, twin):
    """``(module, None)`` or ``(None, (status, reason))`` for twin "compiled"/"python"."""
    module_name = f"ray_lite._fast._{name}_{'c' if twin == 'compiled' else 'py'}"
    try:
        return importlib.import_module(module_name), None
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            return None, (NOT_BUILT, f"{module_name} is not built")
        return None, (ERROR, f"{module_name}: {type(exc).__name__}: {exc}")
    except Exception as exc:   # noqa: BLE001 - an import error is a row, not a crash
        return None, (ERROR, f"{module_name}: {type(exc).__name__}: {exc}")


def guard(fn, *fail_rows):
    """Run one measurement; an exception turns the rows it would have filled
    into "error" rows that say why."""
    try:
        return fn()
    except Exception as exc:   # noqa: BLE001 - a failed measurement is a row
        for row in fail_rows:
            row.value = None
            row.status = ERROR
            row.reason = f"{type(exc).__name__}: {exc}"
        return list(fail_rows)


def per_twin(hot_path, rows_of, measure):
    """The figures of each twin of ``hot_path``, measured one after the other.

    ``rows_of(twin, label)`` gives the rows a twin's measurement fills: a
    twin that cannot load keeps them, marked with why; a measurement that
    raises turns them into error rows (``guard``).  ``measure(mod, twin,
    label)`` returns the twin's figures.
    """
    figures = []
    for twin in TWINS:
        mod, why = load_twin(hot_path, twin)
        label = TWIN_LABEL[twin]
        rows = rows_of(twin, label)
        if mod is None:
            figures.extend(missing(r.bench, r.name, twin, label, r.unit, *why, goal_id=r.goal_id)
                           for r in rows)
            continue
        figures.extend(guard(lambda mod=mod, twin=twin, label=label: measure(mod, twin, label),
                             *rows))
    return figures


def idle_plan(ctx, smoke_idle_s):
    """B5's idle periods: ``(long idle s, short idle s, number of short ones)``.

    After the long idle (its CPU share is the figure), shorter ones give more
    wake-up samples, each long enough that the waiter has gone to sleep:
    spinning lasts microseconds."""
    return ctx.pick(5.0, 1.0, smoke_idle_s), ctx.pick(0.2, 0.1, 0.05), ctx.pick(10, 4, 2)


def idle_waiter_figures(replies, twin, label, cpu_name, wake_name):
    """B5's two rows from an idle waiter's rounds, ``(cpu_ns, wall_ns, wake_ns)``
    each, the first after the long idle: its CPU share then, and the wake-ups."""
    cpu_ns, wall_ns, _ = replies[0]
    cpu_pct = 100.0 * cpu_ns / wall_ns
    cpu_fig = Figure("B5", cpu_name, twin, label, "%", cpu_pct, stat=f"over {wall_ns / 1e9:.1f} s",
                     trials=1, samples=1, goal_id="B5 cpu")
    cpu_fig.detail = {"cpu_s": cpu_ns / 1e9, "wall_s": wall_ns / 1e9,
                      "short_idles_cpu_pct": [100.0 * c / w for c, w, _ in replies[1:]]}
    wakes_us = [w / 1000.0 for _, _, w in replies]
    value, spread = summarize_samples(wakes_us)
    wake_fig = Figure("B5", wake_name, twin, label, "us", value, stat="p50",
                      spread={"max": spread["max"], "after long idle": wakes_us[0]},
                      trials=len(wakes_us), samples=len(wakes_us), goal_id="B5 wake")
    wake_fig.detail = {"samples_us": wakes_us}
    return [cpu_fig, wake_fig]


class Context:
    """What a suite gets: the run's size and where to log progress.

    ``scale`` is "full", "quick" (CI smoke run, the whole suite well under a
    minute) or "smoke" (tests: as small as still exercises every code path).
    """

    def __init__(self, scale="full", compare_ray=None, log=None, only=None):
        self.scale = scale
        self.compare_ray = compare_ray
        self._log = log
        # The benchmark ids to run (upper case, "B11"), None: all of them.
        self.only = None if only is None else {b.strip().upper() for b in only}

    @property
    def quick(self):
        return self.scale != "full"

    def pick(self, full, quick, smoke):
        return {"full": full, "quick": quick, "smoke": smoke}[self.scale]

    def log(self, message):
        if self._log is not None:
            self._log(message)


# -- statistics ---------------------------------------------------------------

def percentile(sorted_values, q):
    """The q-th percentile (0..100) of already sorted values, linear
    interpolation between closest ranks."""
    if not sorted_values:
        return float("nan")
    if len(sorted_values) == 1:
        return float(sorted_values[0])
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarize_trials(values):
    """Median of per-trial figures and their min-max."""
    return statistics.median(values), {"min": min(values), "max": max(values)}


def summarize_samples(samples, trial_p50s=None):
    """p50 of all samples, their p99 (and max), and the spread of the per-trial p50s."""
    s = sorted(samples)
    spread = {"p99": percentile(s, 99), "max": s[-1] if s else float("nan")}
    if trial_p50s:
        spread["trial_p50_min"] = min(trial_p50s)
        spread["trial_p50_max"] = max(trial_p50s)
    return percentile(s, 50), spread


# -- timing loops ---------------------------------------------------------------

def ns_per_call(stmt, setup="pass", globals=None, number=10000, trials=5, warmup=1):
    """Nanoseconds per execution of ``stmt`` (the Python loop included), for
    each of ``trials`` timed runs of ``number`` executions after ``warmup``
    untimed ones.  ``setup`` runs before each run, untimed; names it binds are
    locals of the loop (fast to look up), as in :mod:`timeit`.  The collector
    is off while timing, as in :mod:`timeit`."""
    timer = timeit.Timer(stmt, setup, timer=time.perf_counter_ns, globals=globals)
    for _ in range(warmup):
        timer.timeit(number)
    results = []
    for _ in range(trials):
        results.append(timer.timeit(number) / number)
    return results


# -- child processes --------------------------------------------------------------

class ChildProcess:
    """A spawned child (``multiprocessing`` spawn context: a fresh interpreter
    with this process's ``sys.path``), always reaped: ``stop`` joins with a
    timeout and kills it by PID if it has not exited."""

    def __init__(self, target, args=(), name=None):
        import multiprocessing
        ctx = multiprocessing.get_context("spawn")
        self.process = ctx.Process(target=target, args=args, name=name, daemon=True)

    def start(self):
        self.process.start()
        return self

    @property
    def pid(self):
        return self.process.pid

    def is_alive(self):
        return self.process.is_alive()

    def stop(self, timeout=10.0):
        """Wait up to ``timeout`` s for the child to exit, then kill it.
        Returns its exit code (negative: killed by that signal)."""
        p = self.process
        if p.pid is None:
            return None
        p.join(timeout)
        if p.is_alive():
            p.kill()
            p.join(5.0)
        code = p.exitcode
        p.close()
        return code

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop(timeout=2.0 if exc[0] is not None else 10.0)


# -- ours against the anchor of the same run ---------------------------------------

def reference_rows(figures):
    """``{"anchor": {(bench, name): figure}, "ceiling": {...}}``: the measured
    anchor and ceiling each ray_lite figure of a workload is compared with
    (the last one measured on the workload)."""
    refs = {"anchor": {}, "ceiling": {}}
    for f in figures:
        if f.impl in refs and f.status == OK and f.value:
            refs[f.impl][(f.bench, f.name)] = f
    return refs


def relate_to_anchors(figures):
    """Give each ray_lite figure its factor over the anchor row of the same
    workload (same ``bench`` and ``name``, ``impl == "anchor"``) measured in
    this run: ``detail["x_anchor"]`` (> 1 means ray_lite is better: more per
    second, or less time, memory or CPU) and a note such as "262x Ray".  A
    ``"ceiling"`` row of the workload (what a bare server does, say) gives
    ``detail["x_ceiling"]`` and its own note the same way.  Goals, some of
    them factors over these rows, are judged apart (``_goals.judge``).
    """
    refs = reference_rows(figures)
    for f in figures:
        if f.impl in refs or f.status != OK or not f.value:
            continue
        key = (f.bench, f.name)
        texts = []
        for kind, a in (("anchor", refs["anchor"].get(key)),
                        ("ceiling", refs["ceiling"].get(key))):
            if a is None:
                continue
            higher_is_better = f.unit.endswith("/s")
            x = f.value / a.value if higher_is_better else a.value / f.value
            f.detail = dict(f.detail, **{f"x_{kind}": round(x, 2)})
            texts.append(f"{ratio_text(x)} {a.label}")
        if texts:
            text = "; ".join(texts)
            f.note = f"{text}; {f.note}" if f.note else text


# -- the machine -----------------------------------------------------------------

def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info():
    import ray_lite
    info = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "arch": platform.machine(),
        "kernel": f"{platform.system()} {platform.release()}",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "ray_lite": ray_lite.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
    try:
        with open("/proc/loadavg") as f:
            info["loadavg_1min"] = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    try:
        import ray_lite._fast as fast
        info["compiled"] = bool(fast.USING_EXTENSIONS)
        info["hot_paths"] = {name: ("compiled" if getattr(fast, name).COMPILED else "python")
                             for name in fast.HOT_PATHS}
        info["no_extensions_env"] = bool(fast.NO_EXTENSIONS)
    except Exception as exc:   # noqa: BLE001 - the machine block must print anyway
        info["compiled"] = None
        info["hot_paths_error"] = f"{type(exc).__name__}: {exc}"
    info["bytecode_cached"] = bytecode_cached()
    idle = cpu_idle()
    if idle is not None:
        info["cpu_idle"] = idle
    return info


def cpu_idle(sys_root="/sys"):
    """How this machine's idle CPUs wait for work: Linux's cpuidle driver
    and governor, and for ``haltpoll`` (a VM's) how long an idle CPU polls
    before it halts; None where Linux does not say.

    It moves every latency figure that crosses processes: where an idle
    virtual CPU halts at once, waking a process onto it is an exit to the
    host.  On the EPYC VM of docs/performance.md, bare uvicorn's B9
    was 186 µs a request with ``guest_halt_poll_ns=0`` and 111 µs with
    200,000.
    """
    base = os.path.join(sys_root, "devices", "system", "cpu", "cpuidle")

    def read(*parts):
        try:
            with open(os.path.join(*parts)) as f:
                return f.read().strip()
        except OSError:
            return None

    driver = read(base, "current_driver")
    if not driver:
        return None
    idle = {"driver": driver,
            "governor": read(base, "current_governor_ro") or read(base, "current_governor")}
    if driver == "haltpoll":
        ns = read(sys_root, "module", "haltpoll", "parameters", "guest_halt_poll_ns")
        if ns is not None and ns.isdigit():
            idle["halt_poll_ns"] = int(ns)
    return idle


def ratio_text(x):
    """A factor as printed: "262x", "2.51x", "0.061x"."""
    return f"{x:,.0f}x" if x >= 10 else f"{x:.2g}x" if x < 0.1 else f"{x:.2f}x"


def idle_text(idle):
    text = idle["driver"]
    if idle.get("governor") and idle["governor"] != idle["driver"]:
        text += f"/{idle['governor']}"
    ns = idle.get("halt_poll_ns")
    if ns is not None:
        text += " (halt at once)" if ns == 0 else f" (poll {ns / 1000:g} µs, then halt)"
    return text


def bytecode_cached():
    """Whether ray_lite's modules load from cached bytecode.

    Without it (an editable install under PYTHONDONTWRITEBYTECODE=1, common
    in containers) every process the runtime starts compiles ray_lite from
    source: init() took 0.19 s instead of 0.09 s here, and every worker's
    memory and every replica's start grow with it.  ``pip install .``
    writes the bytecode at install time.
    """
    import importlib.util

    import ray_lite._private.node.driver as probe
    try:
        return os.path.exists(importlib.util.cache_from_source(probe.__file__))
    except (NotImplementedError, ValueError):
        return False


def machine_parts(info):
    """The machine description as parts: CPU and cores and how idle CPUs
    wait first (they move every cross-process figure), then the rest."""
    if info.get("compiled") is None:
        mode = "hot paths did not import"
    else:
        mode = "compiled hot paths" if info["compiled"] else "pure-Python hot paths"
        if not info["compiled"] and "hot_paths" in info:
            mode += " (" + ", ".join(f"{k} {v}" for k, v in info["hot_paths"].items()) + ")"
    parts = [f"{info['cpu']}, {info['cores']} cores"]
    idle = info.get("cpu_idle")
    if idle:
        parts.append(f"idle CPUs: {idle_text(idle)}")
    parts += [info["kernel"], info["python"], f"ray_lite {info['ray_lite']} ({mode})",
              info["date"]]
    return parts


BYTECODE_NOTE = ("note: ray_lite has no cached bytecode here: every process it starts compiles"
                 " it from source (start-up and memory figures run high); pip install . writes it")


def machine_line(info):
    """The machine in one line (and the bytecode note on a second one)."""
    line = ", ".join(machine_parts(info))
    if info.get("bytecode_cached") is False:
        line += "\n" + BYTECODE_NOTE
    return line


# -- the load before a run ------------------------------------------------------------

def load_reading(sample_s=0.5, exclude=None):
    """How busy the machine is now: ``{"cores", "loadavg_1min",
    "sample_s", "others_cores", "busiest": [{"pid", "name", "cores"}, ...]}``
    -- the load average of the last minute, and the CPU every other process
    used over ``sample_s`` seconds, read from ``/proc`` (the busiest three
    named).  ``exclude``: PIDs not counted (default: this process)."""
    from ._procs import cpu_by_process
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    reading = {"cores": cores or 1, "sample_s": sample_s}
    try:
        reading["loadavg_1min"] = round(os.getloadavg()[0], 2)
    except OSError:
        pass
    exclude = {os.getpid()} if exclude is None else set(exclude)
    try:
        used = cpu_by_process(sample_s)
    except OSError:
        return reading
    others = sorted(((s, pid, name) for pid, (name, s) in used.items() if pid not in exclude),
                    reverse=True)
    reading["others_cores"] = round(sum(s for s, _, _ in others) / sample_s, 2)
    reading["busiest"] = [{"pid": pid, "name": name, "cores": round(s / sample_s, 2)}
                          for s, pid, name in others[:3] if s > 0]
    return reading


# -- misc ---------------------------------------------------------------------------

def settle():
    """Collect garbage before a timed section so a collection does not land in it."""
    gc.collect()


def print_err(message):
    print(message, file=sys.stderr, flush=True)
