"""B7/B8/B9 app: the reproduction of ray-project/ray issue 42565 — a deployment of
REPLICAS (default 48) replicas answering "hi", started with
``ray-lite serve run ray_lite.bench.serve_hi_app:model``.  ``RAYMOD=ray`` makes it
the same app on Ray Serve (``--compare-ray``)."""
import importlib
import os

from starlette.requests import Request

serve = importlib.import_module(os.environ.get("RAYMOD", "ray_lite") + ".serve")


@serve.deployment(num_replicas=int(os.environ.get("REPLICAS", "48")),
                  ray_actor_options={"num_cpus": 0})
class TestDeployment:
    async def __call__(self, request: Request):
        return "hi"


def model(args):
    return TestDeployment.bind()
