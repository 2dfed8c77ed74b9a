"""The HTTP server under what clients do wrong or leave undone (issue 14):
HTTP/1.0 keep-alive, upgrade requests it does not serve, idle keep-alive
connections, a client that does not read its stream, oversized uploads; and
under faults: a killed proxy, routes that change while requests wait."""
import asyncio
import contextlib
import os
import signal
import socket
import time

import pytest
from starlette.requests import Request

from ray_lite import serve
from ray_lite._fast import shm

from serve_helpers import PinnedController, connection_to, process_gone, raw, wait_until

# Each test that takes serve_port (or serve_http_mode) runs through the
# proxies and with direct ingress (conftest).
SERVE_HTTP_MODES = ("proxies", "direct")


@serve.deployment
def hello(request: Request):
    return "hello"


def _one_answer(s):
    """One response read from ``s``: (head, body); a body of content-length bytes."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        assert chunk, f"the server closed the connection; got {buf!r}"
        buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        chunk = s.recv(65536)
        assert chunk, "the server closed the connection mid-body"
        body += chunk
    assert len(body) == length, "more bytes than one answer"
    return head.lower(), body


def test_http10_keep_alive_is_said_in_the_answer_and_kept(serve_port):
    serve.run(hello.bind())
    with socket.create_connection(("127.0.0.1", serve_port), timeout=30) as s:
        for _ in range(2):
            s.sendall(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            head, body = _one_answer(s)
            assert body == b"hello"
            # Without it an HTTP/1.0 client takes the answer to end with the
            # connection, and waits (ab -k stalls).
            assert b"\r\nconnection: keep-alive" in head
    # Plain HTTP/1.0: the connection ends with the answer, and says so.
    out = raw(serve_port, b"GET / HTTP/1.0\r\n\r\n")
    assert out.endswith(b"hello") and b"connection: close" in out.lower()


def test_upgrade_and_connect_get_one_answer_then_the_connection_ends(serve_port):
    serve.run(hello.bind())
    for request in (b"GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
                    b"Upgrade: websocket\r\n\r\n",
                    b"GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\n"
                    b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n",
                    b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n"):
        out = raw(serve_port, request)
        assert out.count(b"HTTP/1.1 ") == 1, out
        assert out.startswith(b"HTTP/1.1 200") and out.endswith(b"hello"), out
        assert b"connection: close" in out.lower()


def test_an_upgrade_request_answered_at_once_says_the_connection_ends(serve_port):
    # A 404 is written while the request is dispatched, before the parser
    # stops at the upgrade: the answer still says that the connection ends.
    serve.run(hello.bind(), route_prefix="/hello")
    for request in (b"GET /nowhere HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings"
                    b"\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n",
                    b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n"):
        out = raw(serve_port, request)
        assert out.count(b"HTTP/1.1 ") == 1, out
        assert out.startswith(b"HTTP/1.1 404"), out
        assert b"\r\nconnection: close\r\n" in out.lower(), out


def test_idle_keep_alive_connections_are_closed_after_the_timeout(serve_runtime):
    from ray_lite.serve.api import _http_port
    serve.start(http_options={"port": 0, "proxies": 1, "keep_alive_timeout_s": 0.3})
    port = _http_port()
    serve.run(hello.bind())
    with socket.create_connection(("127.0.0.1", port), timeout=30) as used, \
            socket.create_connection(("127.0.0.1", port), timeout=30) as unused:
        used.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _one_answer(used)[1] == b"hello"
        # Both idle now: the server ends them (a read sees the end, not the
        # 30 s socket timeout).
        assert used.recv(65536) == b""
        assert unused.recv(65536) == b""


# ------------------------------------------------- resources under slow clients
CHUNK = b"x" * 65536
STREAM_CHUNKS = 1024            # 64 MB


@serve.deployment(max_ongoing_requests=10)
class Flood:
    """A stream of ``?n=`` 64 kB chunks (64 MB by default) made as fast as
    they are taken; ``progress`` says how far the last stream's generator
    got and whether it was closed."""

    def __init__(self):
        self.sent = 0
        self.closed = False

    async def __call__(self, request: Request):
        from starlette.responses import StreamingResponse
        n = int(request.query_params.get("n", STREAM_CHUNKS))
        self.sent, self.closed = 0, False

        async def chunks():
            try:
                for _ in range(n):
                    self.sent += 1
                    yield CHUNK
            finally:
                self.closed = True
        return StreamingResponse(chunks())

    def progress(self):
        return self.sent, self.closed


def _proxy_rss_kb():
    """The resident memory of the (one) proxy, found through Serve's controller."""
    from ray_lite.serve import context
    from ray_lite.serve._core import get
    pid, = get(context.get_controller().process_ids.remote())["proxies"]
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_a_client_that_does_not_read_holds_the_stream_back(serve_port):
    h = serve.run(Flood.bind())
    assert raw(serve_port, b"GET /?n=4 HTTP/1.0\r\n\r\n").endswith(CHUNK * 4)   # warm-up
    assert h.progress.remote().result(timeout_s=30) == (4, True)
    start_kb = _proxy_rss_kb()
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
    s.settimeout(30)
    s.connect(("127.0.0.1", serve_port))
    s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert s.recv(4096).startswith(b"HTTP/1.1 200")
    # Then it reads nothing.  The generator's steps never await, so each
    # answer of progress() finds it held (or done): once two answers agree,
    # it has stopped where the proxy held it.
    seen = []
    while len(seen) < 2 or seen[-1] != seen[-2]:
        assert len(seen) < 1000
        seen.append(h.progress.remote().result(timeout_s=30))
    sent, closed = seen[-1]
    assert not closed and sent < STREAM_CHUNKS // 4, sent
    assert _proxy_rss_kb() - start_kb < 40 * 1024
    s.close()       # the client leaves: the stream ends in the replica
    deadline = time.monotonic() + 60
    while not closed and time.monotonic() < deadline:
        sent, closed = h.progress.remote().result(timeout_s=30)
    assert closed and sent < STREAM_CHUNKS // 4


def _chunked_upload_until_refused(port, mb):
    """Send a chunked body of up to ``mb`` MB; the answer the server sent."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        s.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        piece = b"%x\r\n" % (1 << 20) + b"y" * (1 << 20) + b"\r\n"
        try:
            for _ in range(mb):
                s.sendall(piece)
        except OSError:
            pass            # refused and closed mid-upload
        out = b""
        while True:
            try:
                chunk = s.recv(65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        return out
    finally:
        s.close()


def test_refused_oversized_uploads_leave_no_memory_behind(serve_port):
    serve.run(hello.bind())
    raw(serve_port, b"GET / HTTP/1.0\r\n\r\n")
    start_kb = _proxy_rss_kb()
    for _ in range(3):
        out = _chunked_upload_until_refused(serve_port, 200)   # the limit: 100 MB
        assert out.startswith(b"HTTP/1.1 413 "), out[:80]
        assert _proxy_rss_kb() - start_kb < 40 * 1024


def _serve_pids():
    from ray_lite.serve import context
    from ray_lite.serve._core import get
    return get(context.get_controller().process_ids.remote())


def test_a_killed_proxy_is_replaced_on_the_same_port(serve_port):
    serve.run(hello.bind())
    old, = _serve_pids()["proxies"]
    os.kill(old, signal.SIGKILL)
    # The controller learns of the death from the runtime (no polling) and
    # publishes the replacement's pid once it listens.
    deadline = time.monotonic() + 60
    new = [old]
    while new == [old] and time.monotonic() < deadline:
        new = _serve_pids()["proxies"]
    assert new and new != [old], "no replacement within 60 s"
    assert raw(serve_port, b"GET / HTTP/1.0\r\n\r\n").endswith(b"hello")


@serve.deployment
async def held(request: Request):
    """Says its pid to the test's door (a socket at ``?door=`` port), then
    waits for a byte that never comes; "up" without a door."""
    if "door" not in request.query_params:
        return "up"
    reader, writer = await asyncio.open_connection("127.0.0.1",
                                                   int(request.query_params["door"]))
    writer.write(b"%d\n" % os.getpid())
    await reader.read(1)
    return "never"


def test_a_replica_killed_mid_request(serve_port, serve_http_mode):
    """A request whose replica dies gets a 500 from the proxy that took its
    connection, which stays open.  With direct ingress, a connection the
    dying replica accepted itself ends with it, unanswered."""
    serve.run(held.bind(), name="held", route_prefix="/held")
    pids = _serve_pids()
    (proxy,) = pids["proxies"]
    door = socket.create_server(("127.0.0.1", 0))
    door.settimeout(30)
    ask = b"GET /held?door=%d HTTP/1.1\r\nHost: x\r\n\r\n" % door.getsockname()[1]

    def kill_the_runner(s):
        s.sendall(ask)
        inside, _ = door.accept()
        with inside:                # (open until the kill: closed, it lets the handler end)
            with inside.makefile("rb") as f:
                pid = int(f.readline())
            os.kill(pid, signal.SIGKILL)
            wait_until(lambda: process_gone(pid), "the killed replica's end")
        # Its shared memory (its cell, which the router reads) goes with it.
        wait_until(lambda: not [n for n in shm.list_segments() if f"_{pid}_" in n],
                   "the killed replica's segments to be unlinked")
        return pid

    try:
        if serve_http_mode == "direct":
            (replica,) = pids["replicas"]["held/held"]
            with connection_to(serve_port, replica) as s:
                assert kill_the_runner(s) == replica     # it ran where it was accepted
                try:
                    assert s.recv(65536) == b""
                except ConnectionResetError:
                    pass

            def proxy_knows_the_replacement():      # (503 until then)
                with connection_to(serve_port, proxy) as s:
                    s.sendall(b"GET /held HTTP/1.0\r\n\r\n")
                    return _one_answer(s)[1] == b"up"
            wait_until(proxy_knows_the_replacement, "the proxy to route to the replacement")
        with connection_to(serve_port, proxy) as s:
            kill_the_runner(s)
            head, body = _one_answer(s)
            assert head.startswith(b"http/1.1 500 ") and body == b"Internal Server Error"
            s.sendall(b"GET /-/healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert _one_answer(s)[0].startswith(b"http/1.1 200 ")     # kept open
    finally:
        door.close()


@serve.deployment(max_ongoing_requests=1)
async def gate(request: Request):
    """Passes once the test's door (a socket at ``?door=`` port) sends a byte."""
    reader, writer = await asyncio.open_connection("127.0.0.1",
                                                   int(request.query_params["door"]))
    await reader.read(1)
    writer.close()
    return "through"


def _answer_of(s):
    buf = b""
    while not buf.endswith(b"through"):
        chunk = s.recv(65536)
        assert chunk, buf
        buf += chunk
    return buf


def test_route_changes_while_requests_wait_in_the_proxy(serve_port):
    serve.run(gate.bind(), name="gate", route_prefix="/gate")
    door = socket.create_server(("127.0.0.1", 0))
    door.settimeout(30)
    ask = b"GET /gate?door=%d HTTP/1.1\r\nHost: x\r\n\r\n" % door.getsockname()[1]
    first = socket.create_connection(("127.0.0.1", serve_port), timeout=30)
    queued = socket.create_connection(("127.0.0.1", serve_port), timeout=30)
    try:
        first.sendall(ask)
        inside, _ = door.accept()       # the first request is in the replica
        queued.sendall(ask)
        # The proxy read that request (it waits in its queue: the replica
        # takes one at a time) before this later one, which it answers.
        assert raw(serve_port, b"GET /nothing HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.1 404")
        # Changes while it waits: each reaches the proxy (the first used to
        # kill the proxy's route loop, leaving it deaf to the second).
        serve.run(hello.bind(), name="other", route_prefix="/other")
        serve.run(hello.options(name="third").bind(), name="third", route_prefix="/third")
        assert raw(serve_port, b"GET /third HTTP/1.0\r\n\r\n").endswith(b"hello")
        for s in (first, queued):
            inside.sendall(b"!")
            assert _answer_of(s).startswith(b"HTTP/1.1 200")
            inside.close()
            if s is first:
                inside, _ = door.accept()
    finally:
        for s in (first, queued, door):
            s.close()


# ------------------------------------------------ no response splitting
_SPLIT = "a%0d%0aSet-Cookie:%20pwned=1%0d%0a%0d%0aHTTP/1.1%20200%20OK%0d%0a%0d%0aforged"


def _echo_app():
    """Deployments and an ASGI ingress that copy ?v= into a response
    header, as a careless app does."""
    from fastapi import FastAPI
    from starlette.responses import Response, StreamingResponse

    @serve.deployment
    def plain(request: Request):
        return Response("h", headers={"x-echo": request.query_params["v"]})

    @serve.deployment
    def streamed(request: Request):
        def gen():
            yield b"h"
        return StreamingResponse(gen(), headers={"x-echo": request.query_params["v"]})

    api = FastAPI()

    @api.get("/")
    def root(v: str):
        return Response("h", headers={"x-echo": v})

    @serve.deployment
    @serve.ingress(api)
    class Fast:
        pass

    return plain, streamed, Fast


def test_a_header_value_with_cr_lf_or_nul_is_refused_with_a_500(serve_port):
    # (The replica logs each refusal with the header's name; the proxy's
    # own check and its log line: tests/fast/test_http_conn.py.)
    plain, streamed, fast = _echo_app()
    serve.run(plain.bind(), name="plain", route_prefix="/plain")
    serve.run(streamed.bind(), name="streamed", route_prefix="/streamed")
    serve.run(fast.bind(), name="fast", route_prefix="/fast")
    for prefix in ("/plain", "/streamed", "/fast"):
        for value in (_SPLIT, "a%00b", "a%0ab", "a%1bb"):
            out = raw(serve_port, f"GET {prefix}/?v={value} HTTP/1.1\r\nHost: x\r\n"
                                  f"Connection: close\r\n\r\n".encode())
            assert out.startswith(b"HTTP/1.1 500 "), (prefix, value, out)
            assert out.count(b"HTTP/1.1 ") == 1, out
            assert b"pwned" not in out and b"forged" not in out and b"\x00" not in out
        # A value that may be sent goes as it is.
        out = raw(serve_port, f"GET {prefix}/?v=fine%20value HTTP/1.1\r\nHost: x\r\n"
                              f"Connection: close\r\n\r\n".encode())
        assert out.startswith(b"HTTP/1.1 200 ") and b"\r\nx-echo: fine value\r\n" in out, out


@pytest.mark.parametrize("request_line, status", [
    (b"GET / HTTP/2.0", 505),
    (b"GET / HTTP/1.2", 505),
    (b"GET /", 400),
])
def test_a_version_other_than_http_1_x_is_refused(serve_port, request_line, status):
    serve.run(hello.bind())
    out = raw(serve_port, request_line + b"\r\nHost: x\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 %d " % status), out
    assert b"hello" not in out


def _send_until_refused(port, data):
    """Send ``data`` (the server may refuse and close before it has all of
    it); what the server answered."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        try:
            s.sendall(data)
        except OSError:
            pass
        out = b""
        while True:
            try:
                chunk = s.recv(65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        return out
    finally:
        s.close()


def test_thirty_thousand_header_lines_are_over_the_head_limit(serve_port):
    serve.run(hello.bind())
    out = _send_until_refused(
        serve_port, b"GET / HTTP/1.1\r\nHost: x\r\n" + b"a:b\r\n" * 30000 + b"\r\n")
    assert out.startswith(b"HTTP/1.1 431 "), out[:100]


def test_a_megabyte_of_chunk_extension_is_refused(serve_port):
    serve.run(hello.bind())
    out = _send_until_refused(
        serve_port, b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;" + b"e" * 1_000_000 + b"\r\nhello\r\n0\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 400 "), out[:100]
    assert b"hello" not in out


def _endless_stream(request):
    """A streamed answer that never ends; its generator, closed, writes the
    id of the request whose context it was closed in to the file
    ``?closed=`` names."""
    from starlette.responses import StreamingResponse

    from ray_lite.serve import context
    closed = request.query_params["closed"]

    async def chunks():
        try:
            yield "first\n"
            await asyncio.Event().wait()
        finally:
            with open(closed + ".tmp", "w") as f:
                f.write(context._get_serve_request_context().request_id)
            os.rename(closed + ".tmp", closed)
    return StreamingResponse(chunks())


@serve.deployment
async def endless_stream(request: Request):
    return _endless_stream(request)


@serve.deployment
class StreamNobodyClaims:
    """``endless_stream``, in a replica that drops a stream nobody claimed
    after 0.2 s."""

    def __init__(self):
        from ray_lite.serve import _defaults
        _defaults.UNCLAIMED_STREAM_S = 0.2

    async def __call__(self, request: Request):
        return _endless_stream(request)


@contextlib.contextmanager
def _one_request_through(proxy_class, app, request):
    """Serve ``app`` through one proxy of ``proxy_class`` (given the
    controller's routes), send ``request`` on a connection and read until
    it closes; the proxy stops when the block ends."""
    from ray_lite.serve import _core, context
    serve.start(http_options={"port": 0, "proxies": 1, "direct_ingress": False})
    serve.run(app, name="app", route_prefix="/")
    _, routes, _ = _core.get(context.get_controller().listen_routes.remote(0, -1), timeout=60)
    proxy = _core.remote(proxy_class).remote(PinnedController(routes), 0,
                                             {"host": "127.0.0.1", "port": 0})
    try:
        port = _core.get(proxy.start.remote(), timeout=60)
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(request)
            try:
                while s.recv(65536):
                    pass
            except ConnectionResetError:
                pass
        yield
    finally:
        _core.get(proxy.stop.remote(0), timeout=60)
        _core.kill(proxy)


def test_a_stream_nobody_claims_is_closed_in_its_requests_context(serve_runtime, tmp_path):
    """A proxy that never asks for a streamed answer (it went away): the
    replica's timer closes the stream, and the user's generator ends in its
    request's context, as it would have on the proxy's claim."""
    from ray_lite.serve._proxy import ProxyActor

    class NeverClaims(ProxyActor):
        async def _stream_next_turn(self, conn, req, rep, *args):
            conn.transport.close()

    closed = tmp_path / "closed"
    with _one_request_through(NeverClaims, StreamNobodyClaims.bind(),
                              b"GET /?closed=%s HTTP/1.1\r\nHost: x\r\n"
                              b"X-Request-Id: unclaimed-1\r\n\r\n" % str(closed).encode()):
        wait_until(closed.exists, "the replica's timer to close the stream", timeout=20)
    assert closed.read_text() == "unclaimed-1"


def test_a_stream_whose_client_left_before_it_was_claimed_is_closed(serve_runtime, tmp_path):
    """The client leaves between the replica's streamed reply and the
    proxy's task that claims the stream: the replica closes the stream at
    once, instead of running it unclaimed for a minute."""
    from ray_lite.serve._proxy import ProxyActor

    class ClientLeavesFirst(ProxyActor):
        async def _stream_next_turn(self, conn, req, rep, *args):
            conn.transport.abort()      # the client leaves before this task runs
            for _ in range(1000):
                if req.finished:
                    break
                await asyncio.sleep(0.001)
            await ProxyActor._stream_next_turn(self, conn, req, rep, *args)

    closed = tmp_path / "closed"
    with _one_request_through(ClientLeavesFirst, endless_stream.bind(),
                              b"GET /?closed=%s HTTP/1.1\r\nHost: x\r\n\r\n"
                              % str(closed).encode()):
        wait_until(closed.exists, "the replica's stream to be closed", timeout=20)
