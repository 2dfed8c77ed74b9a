"""The ``ray.util`` benchmark workloads (B17, B18, ActorPool.map), written once
against Ray's API: ``RAYMOD=ray`` runs them on Ray, the default on ray_lite.
Standalone on purpose, like ``_core_workloads.py``: a Python with Ray but
without ray_lite runs this file as is.  Each workload is a plain function
returning a dict; run as a script, it prints one JSON object.

    python _util_workloads.py NAME [SCALE]      # NAME: b17 | b18 | actor_pool
                                                # SCALE: full | quick | smoke
"""
import importlib
import json
import multiprocessing
import os
import statistics
import sys
import time

if __package__:
    from . import _workload_common as common
else:
    # Run as a file, maybe by a Python without ray_lite; PYTHONSAFEPATH may
    # keep this folder off sys.path.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import _workload_common as common

ray = common.runtime()
ON_RAY = common.RAYMOD == "ray"     # Ray itself, not ray_lite on its Ray backend
pick = common.pick


def init():
    common.init(ray)


def tiny(x):
    return x + 1


@ray.remote
def produce(q, n):
    for i in range(n):
        q.put(i)
    return n


@ray.remote
class Doubler:
    def double(self, v):
        return 2 * v


def double(actor, v):
    return actor.double.remote(v)


def b17(scale="full"):
    """``Pool(2).map`` over 1,000 tiny tasks: this runtime's pool against the
    standard library's, in interleaved trials (pool creation not timed).

    Each trial is the mean of ``reps`` maps; the two pools alternate which
    goes first.  ``ratio`` is the median of ours over the median of theirs
    (the goal: <= 1.0).
    """
    n = 1000
    trials, reps = pick(scale, 9, 5, 1), pick(scale, 20, 10, 2)
    items = list(range(n))
    expected = [tiny(x) for x in items]
    # Started before the runtime: forked while this process has no threads.
    stdlib_pool = multiprocessing.Pool(2)
    try:
        init()
        try:
            pool = importlib.import_module(f"{common.RAYMOD}.util.multiprocessing").Pool(2)
            try:
                for _ in range(max(2, reps)):       # workers up, functions loaded
                    assert pool.map(tiny, items) == expected
                    assert stdlib_pool.map(tiny, items) == expected
                ours, theirs = [], []
                for t in range(trials):
                    order = [(pool, ours), (stdlib_pool, theirs)]
                    if t % 2:
                        order.reverse()
                    for p, out in order:
                        t0 = time.perf_counter()
                        for _ in range(reps):
                            p.map(tiny, items)
                        out.append((time.perf_counter() - t0) / reps * 1e3)
            finally:
                pool.terminate()
        finally:
            ray.shutdown()
    finally:
        stdlib_pool.terminate()
        stdlib_pool.join()
    return {"n": n, "pool_ms": ours, "stdlib_pool_ms": theirs,
            "ratio": statistics.median(ours) / statistics.median(theirs)}


def b18(scale="full"):
    """``util.queue.Queue``: items put by a task and taken by the driver
    (two processes, the queue's owner a third), in microseconds per item;
    and ``put`` then ``get`` by the driver alone, per pair."""
    n = pick(scale, 20000, 5000, 200)
    if ON_RAY:
        n = max(50, n // 20)      # Ray's queue takes about a millisecond an item
    trials = pick(scale, 5, 3, 1)
    init()
    try:
        q = importlib.import_module(f"{common.RAYMOD}.util.queue").Queue()
        ray.get(produce.remote(q, 200))
        for _ in range(200):
            q.get()
        between, alone = [], []
        for _ in range(trials):
            t0 = time.perf_counter()
            producer = produce.remote(q, n)
            for _ in range(n):
                q.get()
            ray.get(producer)
            between.append((time.perf_counter() - t0) / n * 1e6)
            m = max(10, n // 4)
            t0 = time.perf_counter()
            for i in range(m):
                q.put(i)
                q.get()
            alone.append((time.perf_counter() - t0) / m * 1e6)
        q.shutdown()
        return {"n": n, "put_get_between_processes_us": between, "put_then_get_driver_us": alone}
    finally:
        ray.shutdown()


def actor_pool(scale="full"):
    """``ActorPool.map`` over 2 actors, items per second (one call per item)."""
    n = pick(scale, 20000, 5000, 200)
    if ON_RAY:
        n = max(50, n // 10)
    trials = pick(scale, 5, 3, 1)
    init()
    try:
        actors = [Doubler.remote() for _ in range(2)]
        ray.get([a.double.remote(0) for a in actors])
        pool = importlib.import_module(f"{common.RAYMOD}.util").ActorPool(actors)
        values = list(range(n))
        assert list(pool.map(double, values[:200])) == [2 * v for v in values[:200]]
        rates = []
        for _ in range(trials):
            t0 = time.perf_counter()
            out = list(pool.map(double, values))
            rates.append(n / (time.perf_counter() - t0))
            assert len(out) == n
        return {"n": n, "items_per_s": rates}
    finally:
        ray.shutdown()


WORKLOADS = {"b17": b17, "b18": b18, "actor_pool": actor_pool}

if __name__ == "__main__":
    name = sys.argv[1]
    result = WORKLOADS[name](sys.argv[2] if len(sys.argv) > 2 else "full")
    print("RESULT " + json.dumps(result), flush=True)
