"""The large-object benchmark workloads (B19, B20, B21), written once against
Ray's API: ``RAYMOD=ray`` runs them on Ray (``--compare-ray``), the default on
ray_lite.  Standalone on purpose, like ``_core_workloads.py``: a Python with
Ray and numpy but without ray_lite runs this file as is.  Prints one JSON object.

    python _store_workloads.py NAME [SCALE]      # SCALE: full | quick | smoke

B19  a task on a ref to a 100 MB float64 array already ``put`` (ms per task)
B20  a task taking the same array by value (ms per task)
B21  ``put`` of the array (GB/s), ``get`` of it in another process reading
     every byte (GB/s), and (ray_lite only) the array broadcast by
     ``MultiprocExecutor.collective_rpc`` to 2 workers (ms)
readers10  memory of the whole program (the driver and every process under
     it: workers, and Ray's raylet and object store) while 10 actors hold and
     read the same 1 GB array: PSS summed over the processes (shared pages
     counted once), RSS summed (shared pages counted per reader), and the
     PSS before the array was made
"""
import functools
import json
import os
import sys
import time

import numpy as np

# A sibling file, standalone too: this script runs as a file, not in the
# package, and PYTHONSAFEPATH may keep its folder off sys.path.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _workload_common as common  # noqa: E402
from _procs import descendants  # noqa: E402

ray = common.runtime()

NAME, SCALE, pick = common.command_line()
init = functools.partial(common.init, ray)


def array():
    return np.ones(pick(100, 100, 4) * (1 << 20) // 8, dtype=np.float64)


@ray.remote
def nbytes(arr):
    return arr.nbytes


@ray.remote
def read_all(refs):
    # A ref inside a list is not resolved by the call: this process gets it.
    arr = ray.get(refs[0])
    return float(arr.sum())


def timed_ms(fn, trials, warmup=2):
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(trials):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def b19():
    init()
    try:
        arr = array()
        ref = ray.put(arr)
        ms = timed_ms(lambda: ray.get(nbytes.remote(ref)), pick(20, 5, 2))
        return {"task_on_ref_ms": ms, "mb": arr.nbytes / 1e6}
    finally:
        ray.shutdown()


def b20():
    init()
    try:
        arr = array()
        ms = timed_ms(lambda: ray.get(nbytes.remote(arr)), pick(20, 5, 2))
        return {"task_by_value_ms": ms, "mb": arr.nbytes / 1e6}
    finally:
        ray.shutdown()


class _Reader:
    def __init__(self, rank, world_size):
        self.rank = rank

    def nbytes(self, arr):
        return arr.nbytes


def _collective_ms(arr, trials):
    from ray_lite.executor import MultiprocExecutor
    ex = MultiprocExecutor(_Reader, world_size=2)
    try:
        return timed_ms(lambda: ex.collective_rpc("nbytes", args=(arr,)), trials)
    finally:
        ex.shutdown()


def b21():
    init()
    try:
        arr = array()
        gb = arr.nbytes / 1e9
        trials = pick(10, 3, 1)
        refs = []
        put_ms = timed_ms(lambda: refs.append(ray.put(arr)) or refs.pop(0), trials)
        ref = ray.put(arr)
        get_ms = timed_ms(lambda: ray.get(read_all.remote([ref])), trials)
        out = {"put_gbps": [gb / (t / 1000) for t in put_ms],
               "get_other_process_gbps": [gb / (t / 1000) for t in get_ms], "mb": gb * 1000}
    finally:
        ray.shutdown()
    out["collective_rpc_2_workers_ms"] = (
        _collective_ms(arr, trials) if common.RAYMOD == "ray_lite" else None)
    return out


def _memory_mb():
    """``(PSS, RSS)`` in MB summed over this process and its descendants."""
    pss = rss = 0
    for pid in descendants(os.getpid()):
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        pss += int(line.split()[1])
                    elif line.startswith("Rss:"):
                        rss += int(line.split()[1])
        except OSError:
            continue
    return pss / 1024, rss / 1024


@ray.remote(num_cpus=0)
class _Holder:
    def hold(self, refs):
        self.kept = ray.get(refs[0])
        return float(self.kept.sum())      # every page read

    def drop(self):
        self.kept = None
        return True


def readers10():
    init()
    try:
        readers = [_Holder.remote() for _ in range(10)]
        # All started and numpy imported in each: the baseline.
        ray.get([r.hold.remote([ray.put(np.ones(8))]) for r in readers])
        ray.get([r.drop.remote() for r in readers])
        before_pss, _ = _memory_mb()
        arr = np.ones(pick(1024, 256, 16) * (1 << 20) // 8, dtype=np.float64)
        ref = ray.put(arr)
        del arr                         # the program keeps the stored copy only
        sums = ray.get([r.hold.remote([ref]) for r in readers])
        pss, rss = _memory_mb()         # every reader holds its view now
        assert len(set(sums)) == 1
        ray.get([r.drop.remote() for r in readers])
        return {"pss_mb": [pss], "rss_mb": [rss], "pss_before_mb": [before_pss],
                "mb": pick(1024, 256, 16) * 1.048576}
    finally:
        ray.shutdown()


if __name__ == "__main__":
    result = {"b19": b19, "b20": b20, "b21": b21, "readers10": readers10}[NAME]()
    print("RESULT " + json.dumps(result), flush=True)
