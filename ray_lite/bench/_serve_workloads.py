"""Serve's B2 workload (the workload of Ray's
``streaming_handle_throughput.py``, async), written once against Ray's API:
``RAYMOD=ray`` runs it on Ray Serve (``--compare-ray``), the default on
ray_lite.  Standalone on purpose, like ``_core_workloads.py``: a Python with
Ray but without ray_lite runs this file as is.  Prints one JSON object.

    TOKENS=1000 BATCH=10 TRIALS=5 TRIAL_S=5 python _serve_workloads.py
"""
import importlib
import json
import os
import statistics
import sys

if __package__:     # ray_lite's run: its workers import the package's copy
    from . import _workload_common as common
else:               # run as a file (Ray's Python): a sibling file, standalone too;
    # PYTHONSAFEPATH may keep this folder off sys.path.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import _workload_common as common


def b2_main():
    """Run B2 on ``RAYMOD`` and print ``RESULT {mean, std, p50, p75, p99}``."""
    ray = common.runtime()
    common.ship_with_classes(ray)
    serve = importlib.import_module(common.RAYMOD + ".serve")
    tokens = int(os.environ.get("TOKENS", 1000))
    batch = int(os.environ.get("BATCH", 10))
    trials = int(os.environ.get("TRIALS", 5))
    trial_s = float(os.environ.get("TRIAL_S", 5))

    @serve.deployment(ray_actor_options={"num_cpus": 0})
    class Endpoint:
        async def aio_stream(self):
            for _ in range(tokens):
                yield "OK"

    @serve.deployment(ray_actor_options={"num_cpus": 0})
    class Caller(common.TokenStreamCaller):
        def __init__(self, ep):
            self.ep = ep.options(stream=True)

        async def _read_stream(self):
            async for _ in self.ep.aio_stream.remote():
                pass

        async def run(self):
            rates, q = await self.measure(trials, trial_s, batch, tokens)
            return (statistics.mean(rates), statistics.pstdev(rates) if len(rates) > 1 else 0.0,
                    q)

    common.init(ray)
    h = serve.run(Caller.bind(Endpoint.bind()), route_prefix=None)
    mean, std, q = h.run.remote().result(timeout_s=1200)
    print("RESULT " + json.dumps({"mean": mean, "std": std, "p50": q[0], "p75": q[1],
                                  "p99": q[2]}), flush=True)
    serve.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    b2_main()
