"""Core runtime benchmarks: B1, B3, B10, B11, B13, ``ray_lite.util``'s B17,
B18 and ActorPool.map, and the large objects' B19-B21 (``ray-lite bench core``).

Each workload runs in a fresh interpreter (a clean runtime per figure) from
``_core_workloads.py``, ``_util_workloads.py`` or ``_store_workloads.py``
(which needs numpy), written against
Ray's API; with ``--compare-ray PYTHON`` the same files run on Ray with that
interpreter.  B17's standard-library pool, measured in the same trials as
ours, is the row's ceiling.
"""
import json
import os
import statistics
import subprocess
import sys

from ._harness import ERROR, UNAVAILABLE, Figure, missing, summarize_trials

DESCRIPTION = ("core runtime: streaming throughput, ready-check, init, round trips, worker "
               "memory; util: Pool.map, Queue, ActorPool")
_HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOADS = os.path.join(_HERE, "_core_workloads.py")
UTIL_WORKLOADS = os.path.join(_HERE, "_util_workloads.py")
STORE_WORKLOADS = os.path.join(_HERE, "_store_workloads.py")
_SCRIPT = {"b17": UTIL_WORKLOADS, "b18": UTIL_WORKLOADS, "actor_pool": UTIL_WORKLOADS,
           "b19": STORE_WORKLOADS, "b20": STORE_WORKLOADS, "b21": STORE_WORKLOADS,
           "readers10": STORE_WORKLOADS}
POOL_MAP = "Pool(2).map over 1,000 tiny tasks"


def _run(python, raymod, name, scale, timeout=900):
    script = _SCRIPT.get(name, WORKLOADS)
    env = dict(os.environ, RAYMOD=raymod)
    if raymod == "ray_lite":
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in sys.path if p])
    out = subprocess.run([python, script, name, scale], capture_output=True, text=True,
                         timeout=timeout, env=env, cwd=_HERE)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{name} on {raymod} failed (exit {out.returncode}): "
                       f"{out.stderr.strip()[-800:]}")


def _fig(bench, name, impl, label, unit, values, goal_id=None, **kw):
    """A row of the trials' ``values``; ``goal_id``: its goal in ``_goals.GOALS``
    (judged on ray_lite's rows only)."""
    value, spread = summarize_trials(values)
    return Figure(bench=bench, name=name, impl=impl, label=label, unit=unit, value=value,
                  spread=spread, trials=len(values), goal_id=goal_id, **kw)


def _figures(res, impl, label, with_ceilings):
    figs = []
    if "b1" in res:
        r = res["b1"]
        figs.append(_fig("B1", "core streaming, async actor -> async caller actor, tokens/s",
                         impl, label, "tokens/s", r["tokens_per_s"], "B1",
                         detail={k: r[k] for k in ("p50_ms", "p75_ms", "p99_ms")},
                         note=f"P50 {r['p50_ms']:.1f} ms, P99 {r['p99_ms']:.1f} ms per stream"))
    if "b3" in res:
        r = res["b3"]
        both = [a + b for a, b in zip(r["next_us"], r["get_us"])]
        figs.append(_fig("B3", "next() + get() on a reported item", impl, label, "us", both,
                         "B3 next+get"))
        figs.append(_fig("B3", "wait() on a ready ref", impl, label, "us", r["wait_us"],
                         "B3 wait"))
    if "b10" in res:
        figs.append(_fig("B10", "init() until it runs a task", impl, label, "s",
                         res["b10"]["init_s"]))
    if "b11" in res:
        r = res["b11"]
        figs.append(_fig("B11", "task round trip get(f.remote(x))", impl, label, "us",
                         r["task_us"], "B11 task"))
        figs.append(_fig("B11", "actor call round trip", impl, label, "us", r["actor_us"],
                         "B11 actor"))
    if "b13" in res:
        r = res["b13"]
        vals = r["task_worker_rss_mb"] + [r["actor_rss_mb"]]
        figs.append(_fig("B13", "RSS of an idle worker / actor process", impl, label, "MB",
                         [statistics.mean(vals)] if len(vals) < 2 else vals, "B13"))
    if "b17" in res:
        r = res["b17"]
        figs.append(_fig("B17", POOL_MAP, impl, label, "ms", r["pool_ms"], "B17"))
        if with_ceilings:   # the standard library's pool, timed in the same trials
            figs.append(_fig("B17", POOL_MAP, "ceiling", "stdlib multiprocessing.Pool(2)", "ms",
                             r["stdlib_pool_ms"]))
    if "b18" in res:
        r = res["b18"]
        figs.append(_fig("B18", "Queue put + get between two processes, per item", impl, label,
                         "us", r["put_get_between_processes_us"]))
    if "b19" in res:
        figs.append(_fig("B19", "a task on a ref to a 100 MB array already put", impl, label,
                         "ms", res["b19"]["task_on_ref_ms"]))
    if "b20" in res:
        figs.append(_fig("B20", "a task taking a 100 MB array by value", impl, label, "ms",
                         res["b20"]["task_by_value_ms"]))
    if "b21" in res:
        r = res["b21"]
        figs.append(_fig("B21", "put of a 100 MB array, GB/s", impl, label, "GB/s",
                         r["put_gbps"]))
        figs.append(_fig("B21", "get of it in another process, reading every byte, GB/s",
                         impl, label, "GB/s", r["get_other_process_gbps"]))
        if r.get("collective_rpc_2_workers_ms"):
            figs.append(_fig("B21", "the array to 2 workers by collective_rpc", impl, label,
                             "ms", r["collective_rpc_2_workers_ms"]))
    if "readers10" in res:
        r = res["readers10"]
        # The goal is relative to the array's size: quick and smoke scale it.
        figs.append(_fig("B21", f"memory (PSS, all processes) while 10 workers read one "
                                f"{r['mb'] / 1000:.2f} GB array", impl, label, "GB",
                         [v / 1000 for v in r["pss_mb"]], "B21 pss",
                         detail={"array_gb": r["mb"] / 1000, "rss_sum_gb": r["rss_mb"][0] / 1000,
                                 "pss_before_array_gb": r["pss_before_mb"][0] / 1000},
                         note=f"RSS summed {r['rss_mb'][0] / 1000:.2f} GB; "
                              f"{r['pss_before_mb'][0] / 1000:.2f} GB before the array"))
    if "actor_pool" in res:
        figs.append(_fig("util", "ActorPool.map over 2 actors", impl, label, "items/s",
                         res["actor_pool"]["items_per_s"]))
    return figs


# Workloads that measure what only ray_lite's own runtime has (B21 broadcasts
# through the executor's shared-memory queue): not run on the Ray backend.
RAY_LITE_ONLY = {"b21", "readers10"}


def _ray_backend():
    from ray_lite import _config
    return _config.BACKEND == "ray"


def _measure(ctx, python, raymod, impl, label, with_ceilings):
    figs = []
    on_ray_backend = raymod == "ray_lite" and _ray_backend()
    for name in ("b10", "b11", "b3", "b1", "b13", "b17", "b18", "actor_pool", "b19", "b20",
                 "b21", "readers10"):
        if ctx.only is not None and name.upper() not in ctx.only:
            continue
        if on_ray_backend and name in RAY_LITE_ONLY:
            figs.append(missing(name.upper(), name, impl, label, "", UNAVAILABLE,
                                "ray_lite-only: skipped on the Ray backend (RAY_LITE_BACKEND=ray)"))
            continue
        ctx.log(f"core: {name} on {label}")
        try:
            res = {name: _run(python, raymod, name, ctx.scale)}
        except Exception as exc:  # noqa: BLE001 - one failed workload must not hide the rest
            figs.append(missing(name.upper(), name, impl, label, "", ERROR, str(exc)))
            continue
        figs.extend(_figures(res, impl, label, with_ceilings))
    return figs


def run(ctx):
    from ray_lite import _fast
    impl = "compiled" if _fast.USING_EXTENSIONS else "python"
    label = f"ray_lite ({impl})" if not _ray_backend() else f"ray_lite ({impl}) on Ray"
    return _measure(ctx, sys.executable, "ray_lite", impl, label, True)


def compare_ray(ctx, python):
    return _measure(ctx, python, "ray", "anchor", "Ray", False)
