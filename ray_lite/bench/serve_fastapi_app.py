"""B15 app (``../shared/anchors/serve_fastapi.py``): a FastAPI ingress, the most
common way Serve apps take HTTP, with a path parameter, a query parameter and
a pydantic body, REPLICAS replicas (default 8), started with
``ray-lite serve run ray_lite.bench.serve_fastapi_app:model``; ``RAYMOD=ray``
makes it the same app on Ray Serve (``--compare-ray``).  ``app`` itself,
served by uvicorn, is the single-process ceiling.

    GET  /echo/{word}?times=2     -> {"echo": "word word"}
    POST /items  {"name", "qty"}  -> {"name", "total"}
"""
import importlib
import os

from fastapi import FastAPI
from pydantic import BaseModel

RAYMOD = os.environ.get("RAYMOD", "ray_lite")

app = FastAPI()


class Item(BaseModel):
    name: str
    qty: int = 1


@app.get("/echo/{word}")
def echo(word: str, times: int = 1):
    return {"echo": " ".join([word] * times)}


@app.post("/items")
def items(item: Item):
    return {"name": item.name, "total": item.qty * 2}


if RAYMOD in ("ray", "ray_lite"):      # not under bare uvicorn, which needs only `app`
    serve = importlib.import_module(RAYMOD + ".serve")

    @serve.deployment(num_replicas=int(os.environ.get("REPLICAS", "8")),
                      ray_actor_options={"num_cpus": 0})
    @serve.ingress(app)
    class Api:
        pass

    def model(args):
        return Api.bind()
