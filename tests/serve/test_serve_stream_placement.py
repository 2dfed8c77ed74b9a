"""An open streamed response counts as an ongoing request of its replica
until it ends, for every proxy: with two replicas and an idle one, a second
stream never joins the first on its replica, whichever of the proxies
sharing the port takes each connection (each proxy counts its own requests;
the replica's open streams are what the others see), and with direct
ingress whichever replica takes it."""
import asyncio
import os
import socket

import pytest
from starlette.requests import Request
from starlette.responses import StreamingResponse

from ray_lite import serve

from serve_helpers import wait_until


_OPEN = [0]     # the streams open in this replica's process (the test's module there)


def _open_here():
    # A module function, called by name: a deployment's class travels by
    # value, and a global its methods read directly would be the copy that
    # came with it, not the counter the streams change.
    return _OPEN[0]


async def _held_body():
    _OPEN[0] += 1
    try:
        yield f"{os.getpid()}\n"
        await asyncio.get_running_loop().create_future()    # until the client leaves
    finally:
        _OPEN[0] -= 1


@serve.deployment(num_replicas=2, max_ongoing_requests=10)
class Held:
    async def __call__(self, request: Request):
        return StreamingResponse(_held_body(), media_type="text/plain")

    def open_streams(self):
        return _open_here()


def _held_app():
    from starlette.applications import Starlette
    from starlette.routing import Route

    async def held(request):
        return StreamingResponse(_held_body(), media_type="text/plain")

    return Starlette(routes=[Route("/", held)])


@serve.deployment(num_replicas=2, max_ongoing_requests=10)
@serve.ingress(_held_app())
class HeldAsgi:
    def open_streams(self):
        return _open_here()


def _first_chunk(port):
    """Open a streamed request; (the socket, the pid its first chunk names)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    buf = b""
    while b"\n" not in buf.partition(b"\r\n\r\n")[2].partition(b"\r\n")[2]:
        chunk = s.recv(65536)
        assert chunk, buf
        buf += chunk
    assert buf.startswith(b"HTTP/1.1 200"), buf
    body = buf.partition(b"\r\n\r\n")[2]
    return s, int(body.partition(b"\r\n")[2].partition(b"\n")[0])


@pytest.mark.parametrize("deployment", [Held, HeldAsgi])
@pytest.mark.parametrize("mode", ["proxies", "direct"])
def test_a_second_stream_goes_to_the_idle_replica(serve_runtime, deployment, mode):
    from ray_lite.serve.api import _http_port
    # Through the proxies: more proxies than replicas, two proxies share each
    # replica of choice.  Direct: each replica listens, and one that took
    # the second stream's connection while it runs the first sends it on.
    serve.start(http_options={"port": 0, "proxies": 4, "direct_ingress": mode == "direct"})
    port = _http_port()
    h = serve.run(deployment.bind())

    def all_closed():
        # (a stream's user code ends after its replica stopped counting it)
        return sum(h.broadcast("open_streams").results(timeout_s=30)) == 0

    for _ in range(30):
        # Each connection lands on any of the four proxies.
        s1, pid1 = _first_chunk(port)
        s2, pid2 = _first_chunk(port)
        try:
            assert pid1 != pid2, "both streams run on one replica while the other is idle"
        finally:
            s1.close()
            s2.close()
        wait_until(all_closed, "the streams to end in their replicas", timeout=30)


class _Slot:
    """A replica as a proxy sees it: its own calls, and the replica's open
    streams (a cell, as mapped from the replica's shared memory)."""

    def __init__(self, inflight, open_streams):
        self.inflight = inflight
        self.streams = memoryview(bytearray(8)).cast("q")
        self.streams[0] = open_streams


def test_routing_counts_the_replicas_open_streams(monkeypatch):
    from ray_lite.serve import _routing
    from ray_lite.serve._routing import ServiceTime, choose_for_http
    monkeypatch.setattr(_routing, "_proxy_rank", 0)
    spread, packed = ServiceTime(), ServiceTime()
    packed.observe(1e-5)                    # a fast route: packed onto its first replicas
    assert spread.depth == 0 and packed.depth > 0
    for draw in (0.0, 0.3, 0.5, 0.7, 0.999):
        monkeypatch.setattr(_routing, "_random", lambda: draw)
        for service in (spread, packed):
            # This proxy has nothing in flight; another proxy's stream is
            # open on the replica this one would take.
            slots = [_Slot(0, 1), _Slot(0, 0)]
            assert choose_for_http(slots, 100, service) is slots[1]
            # Both busy with others' streams: the less loaded one.
            slots = [_Slot(0, 2), _Slot(0, 1)]
            assert choose_for_http(slots, 100, service) is slots[1]
            # A replica's streams do not count against this caller's limit.
            slots = [_Slot(0, 5), _Slot(1, 0)]
            assert choose_for_http(slots, 1, service) is slots[0]
