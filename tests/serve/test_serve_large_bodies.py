"""Serve's HTTP path with large bodies: a request body and a whole response
of several MB travel through the object store (one copy, written by their
producer, mapped by their reader), not through the rings; both arrive intact."""
import hashlib
import json
import os

from starlette.requests import Request
from starlette.responses import Response

from ray_lite import serve
from ray_lite._fast import shm
from ray_lite._private.objects import object_store
from ray_lite._private.process import state

from serve_helpers import http

# Through a proxy, which stores a large body for the replica and maps a
# large answer the replica stored (a listening replica keeps both in its
# own process).
SERVE_HTTP_PROXIES_ONLY = ("test_large_request_body_arrives_intact_through_the_store",
                           "test_large_response_arrives_intact_through_the_store")

MB = 1 << 20


@serve.deployment
class Large:
    async def __call__(self, request: Request):
        kind = request.query_params.get("kind")
        if kind == "sum":      # a large request, a small answer
            body = await request.body()
            return {"sha": hashlib.sha256(body).hexdigest(), "len": len(body),
                    "type": type(body).__name__, "pid": os.getpid()}
        if kind == "echo":     # a large request echoed as a large Response
            return Response(await request.body(), headers={"x-pid": str(os.getpid())})
        n = int(request.query_params["n"])
        return bytes(range(256)) * (n // 256)     # a large bytes answer


def _store_owners():
    """The pids owning a segment of the object store now: a stored object
    (``<prefix>o<pid>_...``) or a freed one kept in its pool for reuse
    (``<prefix>p<pid>_...``)."""
    owners = set()
    for kind in "op":
        prefix = state.node.shm_prefix + kind
        owners |= {int(name[len(prefix):].split("_")[0]) for name in shm.list_segments(prefix)}
    return owners


def _body(n, seed):
    return hashlib.sha256(seed).digest() * (n // 32)


def test_large_request_body_arrives_intact_through_the_store(serve_port):
    serve.run(Large.bind())
    assert 8 * MB >= 4 * object_store.STORE_THRESHOLD
    for n in (8 * MB, 32 * MB):
        body = _body(n, b"%d" % n)
        status, _, out = http(serve_port, "POST", "/?kind=sum", body=body, timeout=120)
        assert status == 200
        got = json.loads(out)
        assert got == {"sha": hashlib.sha256(body).hexdigest(), "len": n, "type": "bytes",
                       "pid": got["pid"]}
    # The body was stored by the proxy (a process neither the driver nor the
    # replica): its segment stays in the proxy's pool while it runs.
    assert _store_owners() - {os.getpid(), got["pid"]}


def test_large_response_arrives_intact_through_the_store(serve_port):
    serve.run(Large.bind())
    n = 16 * MB
    status, headers, out = http(serve_port, "GET", f"/?n={n}", timeout=120)
    assert status == 200
    assert int(headers["content-length"]) == n
    assert out == bytes(range(256)) * (n // 256)
    body = _body(8 * MB, b"echo")
    status, headers, out = http(serve_port, "POST", "/?kind=echo", body=body, timeout=120)
    assert status == 200
    assert out == body
    # The replica stored its answers (the proxy mapped them).
    assert int(headers["x-pid"]) in _store_owners()


def test_small_bodies_keep_the_ring(serve_port):
    serve.run(Large.bind())
    before = _store_owners()
    status, _, out = http(serve_port, "POST", "/?kind=echo", body=b"small")
    assert (status, out) == (200, b"small")
    status, _, out = http(serve_port, "GET", "/?n=1024")
    assert (status, out) == (200, bytes(range(256)) * 4)
    assert _store_owners() == before
