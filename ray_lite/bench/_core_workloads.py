"""The core benchmark workloads (B1, B3, B10, B11, B13), written once against
Ray's API: ``RAYMOD=ray`` runs them on Ray (``--compare-ray``), the default on
ray_lite.  Standalone on purpose: a Python with Ray but without ray_lite runs
this file as is.  Prints one JSON object.

    python _core_workloads.py NAME [SCALE]      # SCALE: full | quick | smoke
"""
import functools
import json
import os
import sys
import time

# A sibling file, standalone too: this script runs as a file, not in the
# package, and PYTHONSAFEPATH may keep its folder off sys.path.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _workload_common as common  # noqa: E402

ray = common.runtime()
common.ship_with_classes(ray)

NAME, SCALE, pick = common.command_line()
init = functools.partial(common.init, ray)


def rss_kb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


@ray.remote
def noop(x):
    return x


@ray.remote
def worker_rss():
    return rss_kb()


@ray.remote
class Echo:
    def echo(self, x):
        return x

    def rss(self):
        return rss_kb()


@ray.remote
class Gen:
    def gen(self, n):
        for i in range(n):
            yield i


TOKENS, BATCH = 1000, 10


@ray.remote
class Endpoint:
    async def aio_stream(self):
        for _ in range(TOKENS):
            yield "OK"


@ray.remote
class Caller(common.TokenStreamCaller):
    def __init__(self, ep):
        self.ep = ep

    async def _read_stream(self):
        async for ref in self.ep.aio_stream.options(num_returns="streaming").remote():
            ray.get(ref)

    async def run(self, trials, trial_s):
        return await self.measure(trials, trial_s, BATCH, TOKENS)


def b10():
    trials = pick(5, 3, 1)
    times = []
    for _ in range(trials):
        t0 = time.perf_counter()
        init()
        ray.get(noop.remote(1))   # started means: it runs tasks
        times.append(time.perf_counter() - t0)
        ray.shutdown()
    return {"init_s": times}


def b11():
    n = pick(5000, 1000, 50)
    init()
    try:
        for _ in range(200):
            ray.get(noop.remote(1))
        trials_task, trials_actor = [], []
        e = Echo.remote()
        for _ in range(200):
            ray.get(e.echo.remote(1))
        for _ in range(pick(5, 3, 1)):
            t0 = time.perf_counter()
            for _ in range(n):
                ray.get(noop.remote(1))
            trials_task.append((time.perf_counter() - t0) / n * 1e6)
            t0 = time.perf_counter()
            for _ in range(n):
                ray.get(e.echo.remote(1))
            trials_actor.append((time.perf_counter() - t0) / n * 1e6)
        return {"task_us": trials_task, "actor_us": trials_actor}
    finally:
        ray.shutdown()


def b3():
    n = pick(20000, 5000, 200)
    init()
    try:
        a = Gen.remote()
        ray.get(a.gen.remote(1).completed())
        out = {"next_us": [], "get_us": [], "wait_us": []}
        for _ in range(pick(5, 3, 1)):
            g = a.gen.remote(n)
            ray.get(g.completed())
            t0 = time.perf_counter()
            refs = [next(g) for _ in range(n)]
            t1 = time.perf_counter()
            for r in refs:
                ray.get(r)
            t2 = time.perf_counter()
            r = ray.put(1)
            m = max(n // 4, 10)
            t3 = time.perf_counter()
            for _ in range(m):
                ray.wait([r], timeout=0)
            t4 = time.perf_counter()
            out["next_us"].append((t1 - t0) / n * 1e6)
            out["get_us"].append((t2 - t1) / n * 1e6)
            out["wait_us"].append((t4 - t3) / m * 1e6)
        return out
    finally:
        ray.shutdown()


def b1():
    init()
    try:
        c = Caller.remote(Endpoint.remote())
        res, q = ray.get(c.run.remote(pick(5, 2, 1), pick(5.0, 1.0, 0.2)))
        return {"tokens_per_s": res, "p50_ms": q[0], "p75_ms": q[1], "p99_ms": q[2]}
    finally:
        ray.shutdown()


def b13():
    init()
    try:
        task_rss = ray.get([worker_rss.remote() for _ in range(4)])
        e = Echo.remote()
        actor_rss = ray.get(e.rss.remote())
        return {"task_worker_rss_mb": [r / 1024 for r in task_rss],
                "actor_rss_mb": actor_rss / 1024}
    finally:
        ray.shutdown()


if __name__ == "__main__":
    result = {"b1": b1, "b3": b3, "b10": b10, "b11": b11, "b13": b13}[NAME]()
    print("RESULT " + json.dumps(result), flush=True)
