"""The core benchmark workloads (B1, B3, B10, B11, B13), written once against
Ray's API: ``RAYMOD=ray`` runs them on Ray (``--compare-ray``), the default on
ray_lite.  Standalone on purpose: a Python with Ray but without ray_lite runs
this file as is.  Prints one JSON object.

    python _core_workloads.py NAME [SCALE]      # SCALE: full | quick | smoke
"""
import asyncio
import importlib
import json
import os
import sys
import time

RAYMOD = os.environ.get("RAYMOD", "ray_lite")
ray = importlib.import_module(RAYMOD)

NAME = sys.argv[1]
SCALE = sys.argv[2] if len(sys.argv) > 2 else "full"


def pick(full, quick, smoke):
    return {"full": full, "quick": quick, "smoke": smoke}[SCALE]


def init():
    # On Ray (--compare-ray, or ray_lite on its Ray backend) as Ray is measured: no dashboard.
    on_ray = RAYMOD == "ray" or os.environ.get("RAY_LITE_BACKEND") == "ray"
    extra = {"include_dashboard": False, "log_to_driver": False} if on_ray else {}
    ray.init(num_cpus=2, **extra)


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
class Caller:
    def __init__(self, ep):
        self.ep = ep
        self.durations = []

    async def _consume(self):
        t = time.monotonic()
        async for ref in self.ep.aio_stream.options(num_returns="streaming").remote():
            ray.get(ref)
        self.durations.append((time.monotonic() - t) * 1000)

    async def batch(self):
        await asyncio.gather(*[self._consume() for _ in range(BATCH)])

    async def run(self, trials, trial_s):
        end = time.monotonic() + 0.1
        while time.monotonic() < end:
            await self.batch()
        self.durations.clear()
        res = []
        for _ in range(trials):
            t0 = time.monotonic()
            n = 0
            while time.monotonic() - t0 < trial_s:
                await self.batch()
                n += 1
            res.append(BATCH * TOKENS * n / (time.monotonic() - t0))
        d = sorted(self.durations)
        q = [d[min(len(d) - 1, int(len(d) * p))] for p in (0.5, 0.75, 0.99)]
        return res, q


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
