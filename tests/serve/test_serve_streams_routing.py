"""Long-lived streams are spread over the replicas: two concurrent streams
never share a replica while another sits idle, through a handle or through
several HTTP proxies.

Two causes made them pile up: the power of two choices drew its two replicas
with replacement (with two replicas, one second stream in four was sent to
the busy one), and every proxy preferred the same idle replica although each
counts only its own calls (two streams taken by two proxies both went to it).
The routing tests below are deterministic; the end-to-end ones repeat the
scenario enough rounds that the old behaviour could not pass them."""
import asyncio
import os
import socket
import time

import pytest

import ray_lite
from ray_lite import serve
from ray_lite.serve import _routing
from ray_lite.serve._routing import first_idle_else_power_of_two, power_of_two

ROUNDS = 20
WAIT_S = 60


class _Slot:
    def __init__(self, inflight):
        self.inflight = inflight
        self.streams = None     # (no replica's count of open streams mapped)


@pytest.mark.parametrize("draw", [0.0, 0.3, 0.5, 0.7, 0.999])
@pytest.mark.parametrize("n", [2, 3, 5])
def test_power_of_two_compares_two_different_replicas(monkeypatch, draw, n):
    # Whatever the random draws, the replica drawn first is compared with
    # another one: with one replica busy and the rest idle, never the busy one.
    monkeypatch.setattr(_routing, "_random", lambda: draw)
    busy = int(draw * n)
    slots = [_Slot(1 if i == busy else 0) for i in range(n)]
    assert power_of_two(slots, 100) is not slots[busy]


@pytest.fixture
def restore_rank():
    yield
    _routing.set_proxy_rank(0)


def test_each_proxy_has_its_own_replica_of_choice(restore_rank):
    # Two proxies, each seeing only its own (no) calls: their first requests
    # go to two different replicas, and each keeps to its own while idle.
    picks = []
    for rank in (0, 1):
        _routing.set_proxy_rank(rank)
        view = [_Slot(0) for _ in range(2)]
        picks.append([view.index(first_idle_else_power_of_two(view, 100)) for _ in range(5)])
    assert picks == [[0] * 5, [1] * 5]
    _routing.set_proxy_rank(3)          # more proxies than replicas: round the replicas
    view = [_Slot(0) for _ in range(2)]
    assert first_idle_else_power_of_two(view, 100) is view[1]


@serve.deployment(num_replicas=2, max_ongoing_requests=10)
class Streamer:
    async def __call__(self):
        yield os.getpid()
        await asyncio.Event().wait()     # open until the caller cancels it


def _wait_until(cond, what):
    deadline = time.monotonic() + WAIT_S
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {WAIT_S} s: {what}")
        time.sleep(0.01)


def test_two_handle_streams_take_two_replicas(serve_runtime):
    h = serve.run(Streamer.bind(), name="streams", route_prefix=None).options(stream=True)
    for _ in range(ROUNDS):
        g1 = h.remote()
        pid1 = next(g1)
        g2 = h.remote()
        pid2 = next(g2)
        router = h._router
        # While both are open, this caller counts one stream on each replica.
        assert sorted(s.inflight for s in router.replicas) == [1, 1]
        assert pid1 != pid2
        g1.cancel()
        g2.cancel()
        _wait_until(lambda: all(s.inflight == 0 for s in router.replicas),
                    "the cancelled streams are counted out")


def _open_stream(port, round_no):
    """A socket with a streamed response under way; the first chunk's text."""
    s = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
    s.sendall(b"GET /s?round=%d HTTP/1.1\r\nHost: t\r\n\r\n" % round_no)
    data = b""
    while True:
        chunk = s.recv(4096)
        assert chunk, f"the server closed the stream: {data!r}"
        data += chunk
        head, sep, body = data.partition(b"\r\n\r\n")
        if sep and body.count(b"\r\n") >= 2:      # chunked: "<size>\r\n<data>\r\n"
            return s, body.split(b"\r\n")[1], data


def _read_to_the_end(s, data):
    # The proxy counts a stream out before it sends the last chunk: once it
    # is read, the next round starts from idle replicas in every proxy.
    while not data.endswith(b"0\r\n\r\n"):
        chunk = s.recv(4096)
        assert chunk, f"the server closed the stream: {data!r}"
        data += chunk
    s.close()


@ray_lite.remote
class Gate:
    """Rounds the test opens: a stream of round k ends once k is open."""

    def __init__(self):
        self.level = 0
        self.changed = asyncio.Event()

    async def wait(self, k):
        while self.level < k:
            await self.changed.wait()

    async def open(self, k):
        self.level = k
        self.changed.set()
        self.changed = asyncio.Event()


@serve.deployment(num_replicas=2, max_ongoing_requests=10)
class HttpStreamer:
    def __init__(self, gate):
        self.gate = gate

    async def __call__(self, request):
        from starlette.responses import StreamingResponse

        async def body(k):
            yield f"{os.getpid()}".encode()
            await self.gate.wait.remote(k)
        return StreamingResponse(body(int(request.query_params["round"])),
                                 media_type="text/event-stream")


def test_two_http_streams_take_two_replicas_through_two_proxies(serve_runtime):
    pytest.importorskip("starlette")
    from ray_lite.serve.api import _http_port
    serve.start(http_options={"port": 0, "proxies": 2, "direct_ingress": False})
    gate = Gate.remote()
    serve.run(HttpStreamer.bind(gate), name="sse", route_prefix="/s")
    port = _http_port()
    for k in range(1, ROUNDS + 1):
        s1, pid1, data1 = _open_stream(port, k)
        s2, pid2, data2 = _open_stream(port, k)
        assert pid1 != pid2
        ray_lite.get(gate.open.remote(k), timeout=WAIT_S)
        _read_to_the_end(s1, data1)
        _read_to_the_end(s2, data2)
