"""The proxy's HTTP/1.1 connection, both twins (``http_conn_impl``): what it
hands the proxy for each request, and the bytes it answers with."""
import contextlib

import pytest

from ray_lite.serve import _core, _proxy_conn

pytest.importorskip("httptools")

MAX_BODY = 1000


class Transport:
    def __init__(self):
        self.out = []
        self.closed = False
        self.reading = True

    def write(self, data):
        assert not self.closed, "a write after close"
        self.out.append(bytes(data))

    def get_extra_info(self, name):
        return ("127.0.0.1", 40000) if name == "peername" else None

    def close(self):
        self.closed = True

    def pause_reading(self):
        self.reading = False

    def resume_reading(self):
        self.reading = True

    def take(self):
        out, self.out = b"".join(self.out), []
        return out


class Proxy:
    """Records what the connection hands it; answers only when told to."""

    def __init__(self):
        self.conns = set()
        self.idle_sweep = object()     # a sweep is scheduled: none asked for
        self.max_body = MAX_BODY
        self.dispatched = []
        self.released = []
        self.ids = 0
        self.loop = None

    def dispatch(self, conn, req):
        self.dispatched.append(req)

    def release(self, req):
        self.released.append(req)

    def new_request_id(self):
        self.ids += 1
        return b"id-%d" % self.ids


@contextlib.contextmanager
def serve_patched(twin, **parts):
    """``twin`` bound to Serve with some of ``_core``'s parts replaced, then
    bound to the real ones again."""
    real = {name: getattr(_core, name) for name in parts}
    try:
        for name, value in parts.items():
            setattr(_core, name, value)
        _proxy_conn.bind_to_serve(twin)
        yield
    finally:
        for name, value in real.items():
            setattr(_core, name, value)
        _proxy_conn.bind_to_serve(twin)


@pytest.fixture
def conn(http_conn_impl):
    _proxy_conn.bind_to_serve(http_conn_impl)
    proxy = Proxy()
    c = http_conn_impl.HttpConnection(proxy)
    c.connection_made(Transport())
    return c


def test_a_request_reaches_the_proxy_whole_and_its_answer_names_it(conn):
    conn.data_received(b"POST /a/b?x=1 HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n"
                       b"X-Request-Id: abc\r\n\r\nhel")
    assert conn.proxy.dispatched == []      # the body is not complete yet
    conn.data_received(b"lo")
    (req,) = conn.proxy.dispatched
    assert (req.method, req.url, req.body, req.version, req.keep_alive) == \
        ("POST", b"/a/b?x=1", b"hello", "1.1", True)
    assert req.headers == b"host:h\r\ncontent-length:5\r\nx-request-id:abc"
    assert req.request_id == b"abc" and conn.client == "127.0.0.1:40000"
    assert conn in conn.proxy.conns
    conn.respond(req, 200, b"content-length: 2\r\n", b"ok")
    assert conn.transport.take() == (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n"
                                     b"x-request-id: abc\r\n\r\nok")
    assert not conn.transport.closed and conn.current is None


def test_http_1_0_closes_unless_asked_to_keep_alive(conn):
    conn.data_received(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
    (req,) = conn.proxy.dispatched
    conn.respond(req, 200, b"", b"")
    assert conn.transport.take() == (b"HTTP/1.1 200 OK\r\nx-request-id: id-1\r\n"
                                     b"connection: keep-alive\r\n\r\n")
    conn.data_received(b"GET / HTTP/1.0\r\n\r\n")
    req = conn.proxy.dispatched[1]
    conn.respond(req, 404, b"content-length: 1\r\n", b"x")
    assert conn.transport.take() == (b"HTTP/1.1 404 Not Found\r\ncontent-length: 1\r\n"
                                     b"x-request-id: id-2\r\nconnection: close\r\n\r\nx")
    assert conn.transport.closed and conn.closed


def test_pipelined_requests_are_answered_in_order(conn):
    conn.data_received(b"GET /1 HTTP/1.1\r\n\r\nHEAD /2 HTTP/1.1\r\n\r\nGET /3 HTTP/1.1\r\n\r\n")
    assert [r.url for r in conn.proxy.dispatched] == [b"/1"]   # one at a time
    first = conn.proxy.dispatched[0]
    conn.respond(first, 200, b"", b"a")
    assert [r.url for r in conn.proxy.dispatched] == [b"/1", b"/2"]
    conn.respond(conn.proxy.dispatched[1], 200, b"content-length: 1\r\n", b"b")
    conn.respond(conn.proxy.dispatched[2], 200, b"", b"c", close=True)
    assert conn.transport.take() == (
        b"HTTP/1.1 200 OK\r\nx-request-id: id-1\r\n\r\na"
        b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\nx-request-id: id-2\r\n\r\n"   # HEAD: no body
        b"HTTP/1.1 200 OK\r\nx-request-id: id-3\r\nconnection: close\r\n\r\nc")
    assert conn.transport.closed


@pytest.mark.parametrize("data, status", [
    (b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n", 414),
    (b"GET / HTTP/1.1\r\nX-Big: " + b"b" * 70000 + b"\r\n\r\n", 431),
    (b"POST / HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % (MAX_BODY + 1), 413),
    (b"POST / HTTP/1.1\r\nContent-Length: nine\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nBad Header\r\n\r\n", 400),
])
def test_refused_input_gets_its_status_and_the_connection_ends(conn, data, status):
    conn.data_received(data)
    out = conn.transport.take()
    assert out.startswith(b"HTTP/1.1 %d " % status), out[:60]
    assert b"connection: close\r\n" in out and b"x-request-id: id-1\r\n" in out
    assert conn.transport.closed and conn.proxy.dispatched == []
    conn.data_received(b"GET / HTTP/1.1\r\n\r\n")     # nothing more is read
    assert conn.proxy.dispatched == []


def test_an_error_waits_for_the_answers_before_it(conn):
    conn.data_received(b"GET /ok HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\nBad Header\r\n\r\n")
    (req,) = conn.proxy.dispatched
    assert conn.transport.out == []
    conn.respond(req, 200, b"", b"fine")
    out = conn.transport.take()
    assert out.startswith(b"HTTP/1.1 200 OK\r\n") and b"fine" in out
    assert out.index(b"HTTP/1.1 400 Bad Request\r\n") > out.index(b"fine")
    assert conn.transport.closed


def test_a_large_body_goes_as_a_view_and_in_pieces(conn, http_conn_impl):
    with serve_patched(http_conn_impl, LARGE_BYTES=8):
        conn.data_received(b"POST / HTTP/1.1\r\nContent-Length: 12\r\n\r\nhello ")
        conn.data_received(b"world!")
        (req,) = conn.proxy.dispatched
        assert type(req.body) is memoryview and bytes(req.body) == b"hello world!"
        conn.respond(req, 200, b"", memoryview(b"0123456789"))
        assert conn.transport.out == [b"HTTP/1.1 200 OK\r\nx-request-id: id-1\r\n\r\n",
                                      b"0123456789"]


def test_expect_100_continue_is_answered_before_the_body(conn):
    conn.data_received(b"PUT / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n")
    assert conn.transport.take() == b"HTTP/1.1 100 Continue\r\n\r\n"
    conn.data_received(b"hi")
    assert conn.proxy.dispatched[0].body == b"hi"


def test_a_client_that_leaves_cancels_its_request(conn, http_conn_impl):
    cancelled = []
    with serve_patched(http_conn_impl, cancel=cancelled.append):
        conn.data_received(b"GET / HTTP/1.1\r\n\r\n")
        (req,) = conn.proxy.dispatched
        req.ref = "the call"
        conn.connection_lost(None)
    assert cancelled == ["the call"] and conn.proxy.released == [req]
    assert req.finished and conn.closed and conn not in conn.proxy.conns
    conn.respond(req, 200, b"", b"late")        # an answer after it left: dropped
    assert conn.transport.out == []


def test_a_closed_connection_is_freed_without_the_cyclic_collector(http_conn_impl):
    # Its parser calls back into it: unless closing breaks that cycle, every
    # connection that closed waits for a collection (a server with a new
    # connection per request paid for it in collections).
    import gc
    _proxy_conn.bind_to_serve(http_conn_impl)
    gc.collect()
    flags = gc.get_debug()
    gc.set_debug(gc.DEBUG_SAVEALL)      # what a collection finds stays in gc.garbage
    try:
        c = http_conn_impl.HttpConnection(Proxy())
        c.connection_made(Transport())
        c.data_received(b"GET / HTTP/1.1\r\n\r\n")
        (req,) = c.proxy.dispatched
        c.respond(req, 200, b"content-length: 2\r\n", b"ok")
        c.connection_lost(None)
        del c, req
        gc.collect()
        left = [type(o).__name__ for o in gc.garbage
                if type(o).__name__ in ("HttpConnection", "HttpRequestParser", "HttpRequest")]
    finally:
        gc.set_debug(flags)
        gc.garbage.clear()
    assert left == []


def test_a_request_has_its_defaults(http_conn_impl):
    req = http_conn_impl.HttpRequest("GET", b"/", b"", b"", True, "1.1", None)
    assert (req.ref, req.gen, req.route, req.rep, req.timer, req.t0, req.ws_headers) == \
        (None,) * 7
    assert (req.finished, req.sent, req.sends) == (False, 0.0, 1)
    with pytest.raises(AttributeError):
        req.not_a_field = 1


def test_the_twins_answer_byte_for_byte_alike(twin_pair):
    inputs = [b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.0\r\n\r\n",
              b"HEAD / HTTP/1.1\r\nX-Request-Id: q\r\n\r\n",
              b"GET / HTTP/1.1\r\nBad Header\r\n\r\n"]
    outs = []
    for twin in twin_pair:
        module = twin.module("http_conn")
        _proxy_conn.bind_to_serve(module)
        got = []
        for data in inputs:
            c = module.HttpConnection(Proxy())
            c.connection_made(Transport())
            c.data_received(data)
            while c.proxy.dispatched:
                req = c.proxy.dispatched.pop(0)
                c.respond(req, 200, b"content-length: 3\r\n", b"abc")
            got.append((c.transport.take(), c.closed))
        outs.append(got)
    _proxy_conn.bind_to_serve(_proxy_conn._http_conn)
    assert outs[0] == outs[1]


# ------------------------------------------------ limits that are exact
def _refused_with(conn, status):
    out = conn.transport.take()
    assert out.startswith(b"HTTP/1.1 %d " % status), out[:80]
    assert b"connection: close\r\n" in out and conn.transport.closed
    assert conn.proxy.dispatched == []


@pytest.mark.parametrize("pieces", [1, 64])
def test_the_head_limit_counts_every_byte_of_the_head(conn, pieces):
    # 30,000 "a:b" lines are 150,000 bytes with their CRLFs: over 64 KiB,
    # though their names and values alone are 60,000.
    data = b"GET / HTTP/1.1\r\n" + b"a:b\r\n" * 30000 + b"\r\n"
    step = -(-len(data) // pieces)
    for i in range(0, len(data), step):
        conn.data_received(data[i:i + step])
    _refused_with(conn, 431)


def test_whitespace_in_a_head_that_spans_reads_counts_too(conn):
    conn.data_received(b"GET / HTTP/1.1\r\nA:")
    for _ in range(5):      # spaces the parser skips without reporting them
        conn.data_received(b" " * 16000)
    _refused_with(conn, 431)


def test_the_number_of_header_lines_is_bounded(conn):
    conn.data_received(b"GET / HTTP/1.1\r\n" + b"a:b\r\n" * (_proxy_conn.MAX_HEADER_LINES + 1)
                       + b"\r\n")
    _refused_with(conn, 431)


def test_a_head_just_under_the_limits_is_taken(conn):
    lines = _proxy_conn.MAX_HEADER_LINES
    conn.data_received(b"GET / HTTP/1.1\r\n" + b"a:b\r\n" * lines + b"\r\n")
    (req,) = conn.proxy.dispatched
    assert req.headers.count(b"a:b") == lines


@pytest.mark.parametrize("line, status", [
    (b"GET / HTTP/2.0", 505),
    (b"GET / HTTP/1.2", 505),
    (b"GET / HTTP/3.0", 505),
    (b"GET /", 400),                # HTTP/0.9's form: no version
    (b"GET / HTTP/0.9", 400),       # (the parser reports both as 0.9)
    (b"GET / HTTP/12.0", 400),
    (b"GET / HTTP/1.x", 400),
])
def test_a_version_other_than_1_0_or_1_1_is_refused(conn, line, status):
    conn.data_received(line + b"\r\nHost: x\r\n\r\n")
    _refused_with(conn, status)


def _chunked(*parts):
    return b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + b"".join(parts)


@pytest.mark.parametrize("pieces", [1, 3, 1000])
def test_a_chunk_extension_of_a_megabyte_is_refused(conn, pieces):
    data = _chunked(b"5;", b"e" * 1_000_000, b"\r\nhello\r\n0\r\n\r\n")
    step = -(-len(data) // pieces)
    for i in range(0, len(data), step):
        conn.data_received(data[i:i + step])
        if conn.closed:
            break
    _refused_with(conn, 400)


@pytest.mark.parametrize("pieces", [1, 2, 7])
def test_a_chunk_size_line_is_bounded_exactly(conn, pieces):
    # The line "5;" + extension + CRLF: at the limit it is taken, one byte
    # over it is refused, however the input is cut.
    limit = _proxy_conn.MAX_CHUNK_LINE
    head = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
    for extra, ok in ((0, True), (1, False)):
        c = type(conn)(Proxy())
        c.connection_made(Transport())
        ext = b"x" * (limit - 4 + extra)       # "5;" ext CRLF: limit (+ extra) bytes
        data = head + b"1\r\na\r\n" + b"5;" + ext + b"\r\nhello\r\n0\r\n\r\n"
        step = -(-len(data) // pieces)
        for i in range(0, len(data), step):
            c.data_received(data[i:i + step])
        if ok:
            (req,) = c.proxy.dispatched
            assert req.body == b"ahello"
        else:
            _refused_with(c, 400)


def test_trailers_are_bounded_and_not_taken_as_headers(conn):
    conn.data_received(_chunked(b"2\r\nhi\r\n0\r\nX-Trailer: 1\r\nX-Request-Id: t\r\n\r\n"))
    (req,) = conn.proxy.dispatched
    assert req.body == b"hi"
    assert req.headers == b"transfer-encoding:chunked" and req.request_id is None
    conn.respond(req, 200, b"", b"")
    conn.data_received(_chunked(b"2\r\nhi\r\n0\r\n", b"t:v\r\n" * 20000, b"\r\n"))
    out = conn.transport.take()
    assert b"HTTP/1.1 431 " in out and conn.transport.closed


def test_a_large_pipelined_read_parses_as_small_ones(conn):
    # Reads over the slice size go to the parser in slices: the requests
    # and their bodies come out the same.
    body = bytes(range(256)) * 400
    conn.proxy.max_body = 10 * len(body)
    one = (b"POST /a HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body) + body +
           _chunked(b"%x\r\n" % len(body), body, b"\r\n3\r\nend\r\n0\r\n\r\n"))
    conn.data_received(one * 3)
    for _ in range(6):
        req = conn.proxy.dispatched[-1]
        conn.respond(req, 200, b"", b"")
    got = [r.body for r in conn.proxy.dispatched]
    assert got == [body, body + b"end"] * 3


# ------------------------------------- what an answer's head may hold
@pytest.mark.parametrize("block, name", [
    (b"x-echo: a\r\nset-cookie: pwned=1\r\n\r\nHTTP/1.1 200 OK\r\n", b""),
    (b"x-echo: a\rb\r\n", b"x-echo"),
    (b"x-echo: a\nset-cookie: b\r\n", b"x-echo"),
    (b"x-echo: a\x00b\r\n", b"x-echo"),
    (b"x-echo: a\x1bb\r\n", b"x-echo"),
    (b"x-echo: a\x7fb\r\n", b"x-echo"),
    (b"ok: 1\r\nbad name: v\r\n", b"bad name"),
    (b"ok: 1\r\n(x): v\r\n", b"(x)"),
    (b"no-colon\r\n", b"no-colon"),
    (b"x: unterminated", b"x"),
])
def test_an_answer_with_a_bad_header_is_a_500_and_logged(conn, block, name, capsys):
    conn.data_received(b"GET /echo HTTP/1.1\r\n\r\n")
    (req,) = conn.proxy.dispatched
    conn.respond(req, 200, block, b"body")
    out = conn.transport.take()
    assert out.startswith(b"HTTP/1.1 500 Internal Server Error\r\n"), out
    assert b"set-cookie" not in out and b"body" not in out and b"\x00" not in out
    assert out.count(b"HTTP/1.1") == 1
    assert repr(name) in capsys.readouterr().err
    assert not conn.closed      # the answer was whole: the connection goes on


def test_an_answer_with_good_headers_goes_as_it_is(conn):
    block = b"x-a: b\tc d\r\nx-e:\r\nx-f: caf\xc3\xa9\r\n!#$%&'*+-.^_`|~09az: v\r\n"
    conn.data_received(b"GET / HTTP/1.1\r\n\r\n")
    conn.respond(conn.proxy.dispatched[0], 200, block, b"ok")
    assert conn.transport.take() == (b"HTTP/1.1 200 OK\r\n" + block +
                                     b"x-request-id: id-1\r\n\r\nok")


@pytest.mark.parametrize("headers, bad", [
    ([(b"x-echo", b"fine"), (b"content-type", b"text/plain")], None),
    ([(b"x-echo", b"a\r\nset-cookie: pwned=1")], b"x-echo"),
    ([(b"x-echo", b"a\nb")], b"x-echo"),
    ([(b"x-echo", b"a\x00")], b"x-echo"),
    ([(b"x-echo", b"\x01")], b"x-echo"),
    ([(b"ok", b"tab\there"), (b"x y", b"v")], b"x y"),
    ([(b"", b"v")], b""),
    ([(b"x\r\nset-cookie", b"v")], b"x\r\nset-cookie"),
    ([(bytearray(b"x-b"), memoryview(b"caf\xc3\xa9"))], None),
])
def test_bad_header_names_the_first_that_may_not_be_sent(http_conn_impl, headers, bad):
    assert http_conn_impl.bad_header(headers) == bad


def test_the_twins_judge_header_blocks_alike(twin_pair):
    blocks = [b"", b"a: b\r\n", b"a: b", b"a:\r\n", b":\r\n", b"\r\n", b"a: b\r\nc: \x80\r\n",
              b"a: b\r\r\n", b"a b: c\r\n", b"a: \x7f\r\n", b"a\x00: b\r\n"] + \
             [bytes([c]) + b": v\r\n" for c in range(256)] + \
             [b"n: " + bytes([c]) + b"\r\n" for c in range(256)]
    mods = [t.module("http_conn") for t in twin_pair]
    for block in blocks:
        assert mods[0].bad_head_line(block) == mods[1].bad_head_line(block), block
        assert mods[0].bad_head_line(bytearray(block)) == mods[1].bad_head_line(block)
        pairs = [(block[:1], block[1:])]
        assert mods[0].bad_header(pairs) == mods[1].bad_header(pairs), block


def test_bytes_after_a_request_that_closes_are_not_answered(conn):
    conn.data_received(b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n")
    (req,) = conn.proxy.dispatched
    conn.respond(req, 200, b"", b"")
    conn.data_received(b"GET / HTTP/1.1\r\n\r\n")     # after the close: not read
    assert conn.proxy.dispatched == [req]
    # Inside one read: the parser refuses what follows; nothing is written
    # after the answer that closed the connection.
    c = type(conn)(Proxy())
    c.connection_made(Transport())
    c.proxy.dispatch = lambda cn, r: cn.respond(r, 200, b"", b"")
    c.data_received(b"GET / HTTP/1.1\r\nConnection: close\r\n\r\nGET / HTTP/1.1\r\n\r\n")
    assert c.transport.take() == (b"HTTP/1.1 200 OK\r\nx-request-id: id-1\r\n"
                                  b"connection: close\r\n\r\n")
