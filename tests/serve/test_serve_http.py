"""Serve over real HTTP on loopback: responses of every kind, streaming, routing,
keep-alive and pipelining, and every error status."""
import asyncio
import json
import os
import socket
import time
import uuid

import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

import ray_lite as ray
from ray_lite import serve

from serve_helpers import http, raw, refused_and_waiting, wait_until

# Each test that takes serve_port (or serve_http_mode) runs through the
# proxies and with direct ingress (conftest).
SERVE_HTTP_MODES = ("proxies", "direct")
# Per-caller queues, as in Ray: with direct ingress each listener (the
# proxy, the replica) has its own max_queued_requests, so which of two
# waiting requests is refused depends on where the kernel sent each
# connection (test_serve_direct_ingress covers the queue at each listener).
SERVE_HTTP_PROXIES_ONLY = ("test_queue_limit_is_503_and_disconnect_cancels",)


@serve.deployment
class Echo:
    async def __call__(self, request: Request):
        body = await request.body()
        kind = request.query_params.get("kind", "echo")
        if kind == "echo":
            return {"method": request.method, "path": request.url.path,
                    "query": request.query_params.get("q"), "body": body.decode(),
                    "header": request.headers.get("x-test"), "root": request.scope["root_path"]}
        if kind == "json":
            return await request.json()
        if kind == "str":
            return "hello"
        if kind == "bytes":
            return b"\x00\x01raw"
        if kind == "list":
            return [1, 2, 3]
        if kind == "response":
            return Response(b"custom", status_code=201, headers={"x-made": "here"})
        if kind == "plain":
            return PlainTextResponse("plain", status_code=202)
        if kind == "jsonresponse":
            return JSONResponse({"ok": True})
        if kind == "stream":
            async def gen():
                for i in range(3):
                    yield f"chunk{i};"
            return StreamingResponse(gen(), media_type="text/plain")
        if kind == "gen":
            def gen():
                for i in range(3):
                    yield f"g{i};"
            return gen()
        if kind == "burst":
            # Items yielded faster than the proxy writes them (they queue up
            # and go out several per write), empty ones among them.
            def gen():
                for i in range(300):
                    yield "" if i % 7 == 3 else f"{i};"
            return gen()
        if kind == "fail":
            raise ValueError("secret detail")
        return "?"


def test_response_kinds(serve_port):
    serve.run(Echo.bind())
    p = serve_port
    status, headers, body = http(p, "POST", "/x/y?q=1", body=b"data", headers={"X-Test": "t"})
    assert status == 200 and headers["content-type"] == "application/json"
    assert json.loads(body) == {"method": "POST", "path": "/x/y", "query": "1", "body": "data",
                                "header": "t", "root": ""}
    assert http(p, "POST", "/?kind=json", body=b'{"a": [1]}')[2] == b'{"a":[1]}'
    s, h, b = http(p, "GET", "/?kind=str")
    assert (s, b) == (200, b"hello") and h["content-type"].startswith("text/plain")
    assert http(p, "GET", "/?kind=bytes")[2] == b"\x00\x01raw"
    assert json.loads(http(p, "GET", "/?kind=list")[2]) == [1, 2, 3]
    s, h, b = http(p, "GET", "/?kind=response")
    assert (s, b, h["x-made"]) == (201, b"custom", "here")
    assert http(p, "GET", "/?kind=plain")[:3:2] == (202, b"plain")
    assert json.loads(http(p, "GET", "/?kind=jsonresponse")[2]) == {"ok": True}


def test_streaming_responses_are_chunked(serve_port):
    serve.run(Echo.bind())
    s, h, b = http(serve_port, "GET", "/?kind=stream")
    assert s == 200 and h.get("transfer-encoding") == "chunked" and b == b"chunk0;chunk1;chunk2;"
    s, h, b = http(serve_port, "GET", "/?kind=gen")
    assert s == 200 and b == b"g0;g1;g2;"
    # HTTP/1.0 has no chunked encoding: the body ends with the connection.
    out = raw(serve_port, b"GET /?kind=stream HTTP/1.0\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 200") and b"chunked" not in out.lower()
    assert out.endswith(b"chunk0;chunk1;chunk2;")


class _State:
    pass


@serve.deployment
class StreamsAndForgets:
    """Streams a response from a request whose context holds an object, and
    tells whether any request's object is still alive after a collection."""

    def __init__(self):
        import contextvars
        import weakref
        self.states = weakref.WeakSet()
        self.request_state = contextvars.ContextVar("request_state")

    async def __call__(self, request: Request):
        if request.query_params.get("alive"):
            import gc
            gc.collect()
            return {"alive": len(self.states)}
        state = _State()
        self.states.add(state)
        self.request_state.set(state)      # held by the request's context only

        async def gen():
            for i in range(3):
                yield f"{i};"
        return StreamingResponse(gen(), media_type="text/plain")


def test_a_streamed_request_is_not_kept_alive_after_its_stream_ends(serve_port):
    # The replica's guard against a stream nobody claims is a timer; once the
    # proxy (or the listening replica) has taken the stream, nothing of the
    # request may outlive it, or a busy replica holds a minute of requests.
    serve.run(StreamsAndForgets.bind())
    for _ in range(3):
        s, _, b = http(serve_port, "GET", "/")
        assert s == 200 and b == b"0;1;2;"
    s, _, b = http(serve_port, "GET", "/?alive=1")
    assert s == 200 and json.loads(b) == {"alive": 0}


def _dechunk(body):
    """The chunks of a chunked body, checking its framing; the terminator must end it."""
    chunks = []
    while True:
        size_line, _, body = body.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            assert body == b"\r\n", f"bytes after the last chunk: {body[:80]!r}"
            return chunks
        chunk, crlf, body = body[:size], body[size:size + 2], body[size + 2:]
        assert len(chunk) == size and crlf == b"\r\n", "a chunk is cut or misframed"
        chunks.append(chunk)


def test_streamed_items_that_queue_up_arrive_each_as_a_chunk_in_order_and_empty_ones_end_nothing(
        serve_port):
    serve.run(Echo.bind())
    expected = "".join("" if i % 7 == 3 else f"{i};" for i in range(300)).encode()
    out = raw(serve_port, b"GET /?kind=burst HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    head, _, body = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head.lower()
    chunks = _dechunk(body)
    assert b"".join(chunks) == expected
    assert all(chunks)          # an empty item is no chunk (it would end the body)
    # Each item is its own chunk, as Ray Serve frames them, also where items
    # queued up and crossed as one ring message (tests/serve/test_serve_body.py).
    assert chunks == [f"{i};".encode() for i in range(300) if i % 7 != 3]
    # HTTP/1.0: the raw bytes, in order, until the connection ends.
    out = raw(serve_port, b"GET /?kind=burst HTTP/1.0\r\n\r\n")
    assert out.partition(b"\r\n\r\n")[2] == expected
    # HEAD: the head only, and the connection stays usable.
    s, h, b = http(serve_port, "HEAD", "/?kind=burst")
    assert s == 200 and b == b""


def test_replica_exception_is_500_without_traceback(serve_port):
    serve.run(Echo.bind())
    s, _, b = http(serve_port, "GET", "/?kind=fail")
    assert s == 500 and b"secret detail" not in b and b"Traceback" not in b
    assert http(serve_port, "GET", "/?kind=str")[0] == 200   # the replica still serves


@serve.deployment
def hello_a(request):
    return "a"


@serve.deployment
def hello_b(request):
    return "b:" + request.url.path + ":" + request.scope["root_path"]


def test_longest_prefix_routing_and_404(serve_port):
    serve.run(hello_a.bind(), name="a", route_prefix="/api")
    serve.run(hello_b.bind(), name="b", route_prefix="/api/v2")
    p = serve_port
    assert http(p, "GET", "/api")[2] == b"a"
    assert http(p, "GET", "/api/v1/x")[2] == b"a"
    assert http(p, "GET", "/api/v2/x")[2] == b"b:/api/v2/x:/api/v2"
    assert http(p, "GET", "/api2")[::2] == (404, b"Path '/api2' not found. Ping "
                                                 b"http://.../-/routes for available routes.")
    assert http(p, "GET", "/")[0] == 404
    serve.delete("b")
    assert http(p, "GET", "/api/v2/x")[2] == b"a"
    from ray_lite.serve.exceptions import RayServeException
    with pytest.raises(RayServeException, match="being used"):   # Ray's type for it
        serve.run(hello_b.bind(), name="c", route_prefix="/api")


def test_keep_alive_and_pipelining(serve_port):
    serve.run(hello_b.bind())
    s = socket.create_connection(("127.0.0.1", serve_port), timeout=30)
    try:
        reqs = b"".join(b"GET /p%d HTTP/1.1\r\nHost: x\r\n\r\n" % i for i in range(5))
        s.sendall(reqs)
        buf = b""
        while buf.count(b"HTTP/1.1 200") < 5 or not buf.endswith(b"b:/p4:"):
            chunk = s.recv(65536)
            assert chunk, "server closed a keep-alive connection"
            buf += chunk
        bodies = [part.split(b"\r\n\r\n", 1)[1] for part in buf.split(b"HTTP/1.1 ")[1:]]
        assert bodies == [b"b:/p%d:" % i for i in range(5)]   # in request order
        s.sendall(b"GET /again HTTP/1.1\r\nHost: x\r\n\r\n")   # still open
        more = b""
        while not more.endswith(b"b:/again:"):
            chunk = s.recv(65536)
            assert chunk
            more += chunk
    finally:
        s.close()


def test_malformed_request_is_400_and_closed(serve_port):
    serve.run(hello_a.bind())
    out = raw(serve_port, b"GARBAGE\x00\x01 nonsense\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 400") and b"connection: close" in out.lower()
    # A good request followed by garbage: the good one is answered first.
    out = raw(serve_port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\nBAD\x00REQ\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 200") and b"HTTP/1.1 400" in out


def test_oversized_request_line_and_headers_carry_their_reason_phrases(serve_port):
    serve.run(hello_a.bind())
    out = raw(serve_port, b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 414 URI Too Long\r\n"), out[:80]
    out = raw(serve_port, b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 70000 + b"\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n"), out[:80]
    assert out.endswith(b"Request Header Fields Too Large")


def test_body_over_limit_is_413(serve_port):
    serve.shutdown()
    serve.start(http_options={"port": 0, "proxies": 1, "max_body_size": 1000})
    from ray_lite.serve.api import _http_port
    port = _http_port()
    serve.run(Echo.bind())
    assert http(port, "POST", "/", body=b"x" * 500)[0] == 200
    out = raw(port, b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n" + b"x" * 5000)
    assert out.startswith(b"HTTP/1.1 413 Content Too Large\r\n")


@serve.deployment(max_ongoing_requests=1, max_queued_requests=1)
class Sleepy:
    def __init__(self):
        self.cancelled = 0

    async def __call__(self, request: Request):
        try:
            await asyncio.sleep(float(request.query_params.get("s", "0")))
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return "slept"

    def cancellations(self):
        return self.cancelled


def test_request_timeout_is_408(serve_runtime, serve_http_options):
    serve.start(http_options=serve_http_options(port=0, proxies=1, request_timeout_s=0.5))
    from ray_lite.serve.api import _http_port
    port = _http_port()
    serve.run(Sleepy.options(max_queued_requests=-1).bind())
    assert http(port, "GET", "/?s=60")[0] == 408
    assert http(port, "GET", "/?s=0")[2] == b"slept"


def test_queue_limit_is_503_and_disconnect_cancels(serve_port):
    h = serve.run(Sleepy.bind())
    p = serve_port
    # One request runs (max_ongoing_requests=1), one waits in the proxy's
    # queue (max_queued_requests=1) and the other is refused with a 503.
    s1, s2, s3 = (socket.create_connection(("127.0.0.1", p), timeout=30) for _ in range(3))
    try:
        s1.sendall(b"GET /?s=60 HTTP/1.1\r\nHost: x\r\n\r\n")
        deadline = time.monotonic() + 30
        while _ongoing(h) != 1:
            assert time.monotonic() < deadline, "the first request never reached the replica"
        for s in (s2, s3):
            s.sendall(b"GET /?s=0 HTTP/1.1\r\nHost: x\r\n\r\n")
        refused, waiting = refused_and_waiting(s2, s3)
        assert refused.recv(65536).startswith(b"HTTP/1.1 503")
        s1.close()    # the client leaves: its request is cancelled in the replica
        buf = b""
        while not buf.endswith(b"slept"):
            chunk = waiting.recv(65536)
            assert chunk
            buf += chunk
        assert buf.startswith(b"HTTP/1.1 200")
        assert h.cancellations.remote().result(timeout_s=30) == 1
    finally:
        for s in (s1, s2, s3):
            s.close()


def test_backpressure_config_sets_the_refusal(serve_port):
    from ray_lite.serve.config import BackpressureConfig
    h = serve.run(Sleepy.options(max_queued_requests=0, backpressure_config=BackpressureConfig(
        status_code=429, retry_after_s=1.5)).bind())
    s1 = socket.create_connection(("127.0.0.1", serve_port), timeout=30)
    try:
        s1.sendall(b"GET /?s=60 HTTP/1.1\r\nHost: x\r\n\r\n")
        deadline = time.monotonic() + 30
        while _ongoing(h) != 1:
            assert time.monotonic() < deadline, "the first request never reached the replica"
        status, headers, body = http(serve_port, "GET", "/?s=0")
        assert (status, headers.get("retry-after")) == (429, "2")     # rounded up
        assert b"too many queued requests" in body
    finally:
        s1.close()


@pytest.mark.parametrize("value, words", [
    ({"status_code": 500}, "503 or 429"),
    ({"status_code": 429, "retry_after": 1}, "unknown key"),
    ({"retry_after_s": -1}, "retry_after_s"),
    ("429", "expected a BackpressureConfig"),
])
def test_bad_backpressure_configs_are_refused(value, words):
    with pytest.raises(ValueError, match=words):
        Sleepy.options(backpressure_config=value)


def _ongoing(h):
    ctl = serve.context.get_controller()
    reps = ray.get(ctl.replica_handles.remote(h.app_name, h.deployment_name), timeout=30)
    return sum(ray.get(r.num_ongoing.remote(), timeout=30) for r in reps)


def test_several_proxies_share_the_port(serve_runtime):
    serve.start(http_options={"port": 0, "proxies": 2})
    from ray_lite.serve.api import _http_port
    port = _http_port()
    serve.run(hello_a.bind())
    assert serve.status().proxies == {ray.get_runtime_context().get_node_id(): "HEALTHY"}
    assert len(ray.get(serve.context.get_controller().process_ids.remote(),
                       timeout=30)["proxies"]) == 2
    assert all(http(port, "GET", "/")[2] == b"a" for _ in range(20))


def test_by_default_one_proxy_per_core_and_two_spare_without_direct_ingress(serve_runtime):
    # The spare ones take a core whose proxy sleeps while work is on its way.
    from ray_lite.serve._controller import SPARE_PROXIES
    serve.start(http_options={"port": 0, "direct_ingress": False})
    serve.run(hello_a.bind())
    pids = ray.get(serve.context.get_controller().process_ids.remote(), timeout=30)["proxies"]
    assert len(pids) == len(os.sched_getaffinity(0)) + SPARE_PROXIES


def test_by_default_direct_ingress_with_one_proxy(serve_runtime):
    serve.start(http_options={"port": 0})
    serve.run(hello_a.bind())
    ids = ray.get(serve.context.get_controller().process_ids.remote(), timeout=30)
    assert len(ids["proxies"]) == 1
    from ray_lite.serve.api import _http_port
    assert http(_http_port(), "GET", "/")[2] == b"a"


@serve.deployment
class Counted:
    def __init__(self):
        self.n = 0

    async def __call__(self, request: Request):
        self.n += 1
        return "counted"

    def count(self):
        return self.n


def test_nothing_pipelined_behind_connection_close_is_run(serve_port):
    h = serve.run(Counted.bind(), route_prefix="/only")
    # One read: a request answered at once (404) asking to close, then one
    # for the app.  The second must not reach a replica: nobody reads its
    # answer (llhttp refuses bytes after a message that closes the connection).
    out = raw(serve_port, b"GET /elsewhere HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                          b"GET /only HTTP/1.1\r\nHost: x\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 404") and out.count(b"HTTP/1.1 ") == 1
    assert http(serve_port, "GET", "/only")[2] == b"counted"
    assert h.count.remote().result(timeout_s=60) == 1


@serve.deployment
def takes_no_request():
    return "sync!"


@serve.deployment
class CallTakesNoRequest:
    async def __call__(self):
        return "cls!"


def test_a_deployment_that_takes_no_request_is_called_without_it(serve_port):
    # As Ray Serve: a function, or a __call__, without a parameter is called
    # without the request (it was a TypeError, answered 500).
    serve.run(takes_no_request.bind(), name="f", route_prefix="/f")
    serve.run(CallTakesNoRequest.bind(), name="c", route_prefix="/c")
    assert http(serve_port, "GET", "/f")[::2] == (200, b"sync!")
    assert http(serve_port, "GET", "/c")[::2] == (200, b"cls!")


def test_route_prefixes_ray_refuses_are_refused(serve_port):
    for bad, why in (("/hello/", "Invalid route_prefix '/hello/', may not end with a "
                                 "trailing '/'"),
                     ("/{hello}", "may not contain wildcards"),
                     ("hello", "must start with a forward slash")):
        with pytest.raises(ValueError, match=why):
            serve.run(Echo.bind(), route_prefix=bad)
    assert serve.status().applications == {}       # nothing was deployed


@ray.remote
class Tally:
    def __init__(self):
        self.events = []

    def add(self, event):
        self.events.append(event)

    def seen(self):
        return list(self.events)


@serve.deployment
class StuckChild:
    async def __call__(self, tally):
        try:
            # Sent, not awaited: once the tally has it, this call is inside
            # the try (its answer may come after the cancel does).
            started = tally.add.remote("child started")    # noqa: F841
            await asyncio.sleep(600)    # the workload: it ends by being cancelled
        except asyncio.CancelledError:
            await tally.add.remote("child cancelled")
            # Cancelled once: a second cancel would cut this cleanup short.
            await tally.add.remote("child cleaned up")
            raise


@serve.deployment
class ParentOfStuck:
    def __init__(self, child, tally):
        self.child, self.tally = child, tally

    async def __call__(self, request):
        self.child.remote(self.tally)   # not awaited: it still goes with the request
        await asyncio.sleep(600)


@serve.deployment
class SwallowingParent:
    def __init__(self, child, tally):
        self.child, self.tally = child, tally

    async def __call__(self, request):
        self.child.remote(self.tally)
        try:
            await asyncio.sleep(600)
        except asyncio.CancelledError:
            return "gone"      # caught: its calls go with the request all the same


def _ingress_parent():
    fastapi = pytest.importorskip("fastapi")
    app = fastapi.FastAPI()

    @serve.deployment
    @serve.ingress(app)
    class IngressParent:
        def __init__(self, child, tally):
            self.child, self.tally = child, tally

        @app.get("/")
        async def root(self):
            self.child.remote(self.tally)
            await asyncio.sleep(600)
    return IngressParent


@pytest.mark.parametrize("parent", ["plain", "swallowing", "ingress"])
def test_a_cancelled_request_cancels_the_handle_calls_it_made(serve_port, parent):
    # As Ray Serve: the client leaves, its request is cancelled in the
    # replica, and so is the call that request made to another deployment,
    # also when the handler caught its cancellation, and through
    # @serve.ingress (both kept running).
    if parent == "swallowing" and not hasattr(asyncio.Task, "cancelling"):
        pytest.skip("Python 3.10 cannot tell a task that caught its cancellation")
    cls = {"plain": lambda: ParentOfStuck, "swallowing": lambda: SwallowingParent,
           "ingress": _ingress_parent}[parent]()
    tally = Tally.remote()
    serve.run(cls.bind(StuckChild.bind(), tally))
    s = socket.create_connection(("127.0.0.1", serve_port), timeout=30)
    try:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        wait_until(lambda: "child started" in ray.get(tally.seen.remote(), timeout=30),
                   "the child call to start", 30)
    finally:
        s.close()
    wait_until(lambda: "child cleaned up" in ray.get(tally.seen.remote(), timeout=30),
               "the child call to be cancelled, and its cleanup to end", 30)


def test_chunks_that_crossed_together_are_framed_each_alone():
    # The proxy's framing of a replica's burst: short chunks (a table's
    # length line) and long ones alike; an empty one is no chunk.
    from ray_lite.serve._proxy import _framed
    chunks = [b"ab", b"", b"x" * 5000, b"c" * 1023, b"d" * 1024]
    assert _dechunk(_framed(chunks) + b"0\r\n\r\n") == [c for c in chunks if c]
    assert _framed([b"", b""]) == b""


@serve.deployment
class SaysItsRequestId:
    def __call__(self, request):
        from ray_lite.serve.context import _get_serve_request_context
        ctx = _get_serve_request_context()
        assert ctx.is_http_request and ctx.route == "/"
        return ctx.request_id


async def _request_id_app(scope, receive, send):
    from ray_lite.serve.context import _get_serve_request_context
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body",
                "body": _get_serve_request_context().request_id.encode()})


@pytest.mark.parametrize("ingress", [False, True])
def test_a_replica_sees_the_id_its_answer_carries(serve_port, ingress):
    # As Ray's serve.context._get_serve_request_context().request_id: the
    # client's x-request-id, else the one the proxy made (the answer's header).
    deployment = (serve.deployment(serve.ingress(_request_id_app)(), name="Ids") if ingress
                  else SaysItsRequestId)
    serve.run(deployment.bind())
    status, headers, body = http(serve_port, "GET", "/")
    assert status == 200 and body and body.decode() == headers["x-request-id"]
    assert str(uuid.UUID(headers["x-request-id"], version=4)) == headers["x-request-id"]
    status, headers, body = http(serve_port, "GET", "/", headers={"X-Request-ID": "123-234"})
    assert (status, body, headers["x-request-id"]) == (200, b"123-234", "123-234")
    from ray_lite.serve.context import _get_serve_request_context
    assert _get_serve_request_context().request_id == ""      # outside a request


def _context_seen():
    from ray_lite.serve.context import _get_serve_request_context
    c = _get_serve_request_context()
    return {"id": c.request_id, "route": c.route, "app": c.app_name, "http": c.is_http_request}


@serve.deployment
class ContextLeaf:
    def __call__(self):
        return _context_seen()

    def stream(self):
        yield _context_seen()


@serve.deployment
class ContextMiddle:
    def __init__(self, leaf):
        self.leaf = leaf

    async def __call__(self, request=None):
        mine = _context_seen()
        leaf = await self.leaf.remote()
        streamed = [x async for x in self.leaf.options(stream=True).stream.remote()]
        again = _context_seen()
        return {"mine": mine, "leaf": leaf, "streamed": streamed[0], "again": again}


def test_handle_calls_carry_the_request_id_and_route_downstream(serve_port):
    # Ray passes a request's id and route on to the deployments it calls (one
    # request's logs share its id); a call from a driver gets a fresh id of
    # its own, the same all along its chain.
    serve.run(ContextMiddle.bind(ContextLeaf.bind()), name="ctxapp", route_prefix="/ctx")
    status, headers, body = http(serve_port, "GET", "/ctx/x", headers={"X-Request-ID": "rid-7"})
    assert status == 200
    seen = json.loads(body)
    assert seen["mine"] == {"id": "rid-7", "route": "/ctx", "app": "ctxapp", "http": True}
    downstream = {"id": "rid-7", "route": "/ctx", "app": "ctxapp", "http": False}
    assert seen["leaf"] == seen["streamed"] == downstream
    status, headers, body = http(serve_port, "GET", "/ctx/x")
    assert json.loads(body)["leaf"]["id"] == headers["x-request-id"]

    handle = serve.get_deployment_handle("ContextMiddle", "ctxapp")
    ids = set()
    for _ in range(6):
        # Each call right after an HTTP request: it reaches the replica while
        # that request's spin polls for work, in the request's context; it
        # must not inherit the request's id or scope from there.
        http(serve_port, "GET", "/ctx/x", headers={"X-Request-ID": "rid-7"})
        r = handle.remote().result(timeout_s=30)
        rid = r["mine"]["id"]
        assert str(uuid.UUID(rid, version=4)) == rid
        assert r["leaf"]["id"] == r["streamed"]["id"] == r["again"]["id"] == rid
        assert r["leaf"]["route"] == r["mine"]["route"] == ""
        assert r["mine"]["app"] == "ctxapp" and not r["mine"]["http"]
        ids.add(rid)
    assert len(ids) == 6
    from ray_lite.serve.context import _get_serve_request_context
    assert _get_serve_request_context().request_id == ""      # the driver serves none


def test_a_clients_address_is_split_once_and_the_cache_stays_bounded(monkeypatch):
    # The replica's scope["client"] for each request of a keep-alive client.
    from ray_lite.serve import _asgi_scope
    monkeypatch.setattr(_asgi_scope, "_ADDRS", {})
    monkeypatch.setattr(_asgi_scope, "_ADDRS_MAX", 3)
    addr = _asgi_scope.addr("10.0.0.1:5000")
    assert addr == ("10.0.0.1", 5000) and _asgi_scope.addr("10.0.0.1:5000") is addr
    assert _asgi_scope.addr("::1:80") == ("::1", 80)     # the proxy's "host:port"
    assert _asgi_scope.addr("") is None
    for port in range(10):
        assert _asgi_scope.addr(f"h:{port}") == ("h", port)
    assert len(_asgi_scope._ADDRS) <= 3
