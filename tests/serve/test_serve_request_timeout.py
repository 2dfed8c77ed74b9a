"""The HTTP request timeout, as Ray Serve's proxy applies it: the
``RAY_SERVE_REQUEST_PROCESSING_TIMEOUT_S`` environment variable (or the
older ``SERVE_REQUEST_PROCESSING_TIMEOUT_S``) when ``http_options`` give no
``request_timeout_s``; a 408 naming the request, the handler cancelled in its
replica, and the same for a request still waiting for a replica."""
import asyncio

import pytest
from starlette.requests import Request

import ray_lite
from ray_lite import serve

from serve_helpers import http, wait_until


@serve.deployment(max_ongoing_requests=1, max_queued_requests=-1)
class Counted:
    def __init__(self):
        self.started = 0
        self.cancelled = 0

    async def __call__(self, request: Request):
        self.started += 1
        try:
            await asyncio.sleep(float(request.query_params.get("s", "0")))
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return "done"

    def counts(self):
        return self.started, self.cancelled


def _start_runtime(monkeypatch, env):
    for name in ("RAY_SERVE_REQUEST_PROCESSING_TIMEOUT_S", "SERVE_REQUEST_PROCESSING_TIMEOUT_S"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    # Set before init: the runtime's processes (the proxies among them)
    # start with the driver's environment as it is then, as Ray's do.
    ray_lite.init(num_cpus=1)


@pytest.fixture
def stop_serve():
    yield
    try:
        serve.shutdown()
    finally:
        ray_lite.shutdown()


@pytest.mark.parametrize("variable", ["RAY_SERVE_REQUEST_PROCESSING_TIMEOUT_S",
                                      "SERVE_REQUEST_PROCESSING_TIMEOUT_S"])
def test_the_environment_variable_sets_the_timeout(monkeypatch, stop_serve, variable):
    _start_runtime(monkeypatch, {variable: "0.1"})
    serve.start(http_options={"port": 0, "proxies": 1})
    from ray_lite.serve.api import _http_port
    port = _http_port()
    h = serve.run(Counted.bind())
    status, hdrs, body = http(port, "GET", "/?s=3600", timeout=20)
    assert status == 408 and hdrs["connection"] == "close"
    assert body.decode() == f"Request {hdrs['x-request-id']} timed out after 0.1s."
    # The handler is cancelled in its replica, not left to run.
    wait_until(lambda: h.counts.remote().result(timeout_s=30) == (1, 1),
               "the timed-out handler to be cancelled", timeout=30)
    assert http(port, "GET", "/?s=0")[::2] == (200, b"done")


def test_http_options_take_precedence_over_the_variable(monkeypatch, stop_serve):
    _start_runtime(monkeypatch, {"RAY_SERVE_REQUEST_PROCESSING_TIMEOUT_S": "0.1"})
    serve.start(http_options={"port": 0, "proxies": 1, "request_timeout_s": 60})
    from ray_lite.serve.api import _http_port
    port = _http_port()
    serve.run(Counted.bind())
    # Longer than the variable's 0.1 s, well within the options' 60 s.
    assert http(port, "GET", "/?s=0.5")[::2] == (200, b"done")


def _held_app():
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route, WebSocketRoute

    plain_calls = []

    async def hold(ws):
        await ws.accept()
        await ws.receive()      # until the client closes

    async def plain(request):
        plain_calls.append(1)
        return PlainTextResponse(str(len(plain_calls)))

    return Starlette(routes=[WebSocketRoute("/ws", hold), Route("/plain", plain)])


def test_a_request_waiting_for_a_replica_times_out(monkeypatch, stop_serve):
    import websockets
    _start_runtime(monkeypatch, {"RAY_SERVE_REQUEST_PROCESSING_TIMEOUT_S": "0.5"})
    serve.start(http_options={"port": 0, "proxies": 1})
    from ray_lite.serve.api import _http_port
    port = _http_port()

    @serve.deployment(max_ongoing_requests=1, max_queued_requests=-1)
    @serve.ingress(_held_app())
    class Held:
        pass

    serve.run(Held.bind(), route_prefix="/app")

    async def scenario():
        loop = asyncio.get_running_loop()
        # An open WebSocket holds the one replica's one slot (a WebSocket
        # has no deadline): a request behind it waits in the proxy's queue.
        async with websockets.connect(f"ws://127.0.0.1:{port}/app/ws"):
            queued = await loop.run_in_executor(
                None, lambda: http(port, "GET", "/app/plain",
                                   headers={"X-Request-ID": "queued-1"}, timeout=20))
        return queued

    status, hdrs, body = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert (status, body) == (408, b"Request queued-1 timed out after 0.5s.")
    # It never reached the replica: the next request is the first it sees.
    assert http(port, "GET", "/app/plain")[::2] == (200, b"1")


# ------------------------------------------------ the deadline queue itself
class _Loop:
    """The two calls Deadlines makes of a loop, with a clock the test moves."""

    def __init__(self):
        self.now = 0.0
        self.timers = []

    def time(self):
        return self.now

    def call_at(self, when, callback):
        timer = [when, callback]
        self.timers.append(timer)
        return timer

    def run_due(self):
        due = [t for t in self.timers if t[0] <= self.now]
        self.timers = [t for t in self.timers if t[0] > self.now]
        for _, callback in due:
            callback()


class _Conn:
    def __init__(self):
        self.current = None


class _Req:
    def __init__(self):
        self.timer = None
        self.finished = False


def _routed(deadlines, loop, at):
    loop.now = at
    conn, req = _Conn(), _Req()
    conn.current = req
    deadlines.add(conn, req)
    return conn, req


def test_deadlines_expire_in_order_with_one_timer():
    from ray_lite.serve._proxy import Deadlines
    loop, expired = _Loop(), []
    deadlines = Deadlines(loop, 10.0, lambda conn, req: expired.append(req))
    (c1, r1), (c2, r2), (c3, r3) = (_routed(deadlines, loop, t) for t in (0.0, 1.0, 2.0))
    assert len(loop.timers) == 1        # one timer for all, at the first deadline
    c2.current = None                   # the second is answered
    loop.now = 10.5
    loop.run_due()
    assert expired == [r1]
    assert len(loop.timers) == 1 and loop.timers[0][0] > 12.0   # next: the third's
    r3.finished = True                  # (answered as its deadline came)
    loop.now = 13.0
    loop.run_due()
    assert expired == [r1] and loop.timers == [] and not deadlines.entries


def test_deadlines_do_not_grow_with_answered_requests():
    from ray_lite.serve._proxy import DEADLINE_COMPACT_AT, Deadlines
    loop = _Loop()
    deadlines = Deadlines(loop, 30.0, lambda conn, req: None)
    held = _routed(deadlines, loop, 0.0)     # one request stays in flight throughout
    for i in range(20 * DEADLINE_COMPACT_AT):
        conn, req = _routed(deadlines, loop, i * 1e-4)
        conn.current = None                  # answered at once
        assert len(deadlines.entries) <= DEADLINE_COMPACT_AT + 1
    assert held[0].current is held[1]
    assert any(e[1] is held[0] for e in deadlines.entries)
