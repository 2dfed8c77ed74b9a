"""B23 app: a CPU-bound handler, where routing by load matters most.  Each
request burns BURN_MS (default 21) milliseconds of the handler thread's CPU
in pure Python and answers "done"; REPLICAS replicas (default 2), each
taking up to 8 requests at once, started with
``ray-lite serve run ray_lite.bench.serve_cpu_bound_app:model``.  The
handler is synchronous, as most CPU-bound handlers are.  ``RAYMOD=ray``
makes it the same app on Ray Serve (``--compare-ray``); ``asgi`` is the same
work in a bare ASGI app, served by uvicorn (one process, or a worker per
core: the machine's ceiling).

The burn counts CPU time, not wall time: a request preempted by another
process still costs its 21 ms of CPU, so the figure is what the machine can
serve, not what the clock let through.
"""
import importlib
import os
import time

RAYMOD = os.environ.get("RAYMOD", "ray_lite")
BURN_S = float(os.environ.get("BURN_MS", "21")) / 1000.0


def burn(seconds=BURN_S):
    """Pure-Python arithmetic until this thread has used ``seconds`` of CPU."""
    end = time.thread_time() + seconds
    n = 0
    while time.thread_time() < end:
        for i in range(500):        # mostly bytecode, few clock reads
            n += i * i % 7
    return n


if RAYMOD in ("ray", "ray_lite"):      # not under bare uvicorn, which needs only `asgi`
    serve = importlib.import_module(RAYMOD + ".serve")

    @serve.deployment(num_replicas=int(os.environ.get("REPLICAS", "2")),
                      max_ongoing_requests=8, ray_actor_options={"num_cpus": 0})
    class Burn:
        def __call__(self, request):
            burn()
            return "done"

    def model(args):
        return Burn.bind()


async def asgi(scope, receive, send):
    if scope["type"] != "http":
        return
    burn()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain; charset=utf-8")]})
    await send({"type": "http.response.body", "body": b"done"})
