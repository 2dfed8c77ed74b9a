"""B14 app (``../shared/anchors/serve_sse.py``): token streaming over HTTP as
server-sent events.  Each request streams N events (``data: tok<i>``, N from
``?n=``, default 100) from one of REPLICAS replicas (default 4), started with
``ray-lite serve run ray_lite.bench.serve_sse_app:model``; ``RAYMOD=ray`` makes
it the same app on Ray Serve (``--compare-ray``).  ``asgi`` is the same stream
from a bare ASGI app: the single-process ceiling, served by uvicorn."""
import importlib
import os

RAYMOD = os.environ.get("RAYMOD", "ray_lite")


async def _tokens(n):
    for i in range(n):
        yield f"data: tok{i}\n\n"


if RAYMOD in ("ray", "ray_lite"):      # not under bare uvicorn, which needs only `asgi`
    from starlette.requests import Request
    from starlette.responses import StreamingResponse

    serve = importlib.import_module(RAYMOD + ".serve")

    @serve.deployment(num_replicas=int(os.environ.get("REPLICAS", "4")),
                      ray_actor_options={"num_cpus": 0})
    class Tokens:
        async def __call__(self, request: Request):
            n = int(request.query_params.get("n", "100"))
            return StreamingResponse(_tokens(n), media_type="text/event-stream")

    def model(args):
        return Tokens.bind()


async def asgi(scope, receive, send):
    if scope["type"] != "http":
        return
    n = 100
    for kv in scope.get("query_string", b"").decode().split("&"):
        if kv.startswith("n="):
            n = int(kv[2:])
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream")]})
    async for chunk in _tokens(n):
        await send({"type": "http.response.body", "body": chunk.encode(), "more_body": True})
    await send({"type": "http.response.body", "body": b""})
