"""Differential fuzzing of the proxy's HTTP/1.1 request parsing against h11.

Random requests (one to three on a connection, with bodies framed by a
content-length or chunked), often mutated byte by byte and cut into reads at
random places, go to both twins of ``ray_lite._fast.http_conn`` (over
httptools) and to h11.  The twins must answer byte for byte alike; with h11
they must accept and refuse the same inputs and parse the same method,
target, headers and body of each request, except where a documented
difference explains it (``DIFFERENCES`` below: each with its reason).

CI runs 200 examples; ``RAY_LITE_HTTP_FUZZ_EXAMPLES=100000`` runs a long one.
"""
import os
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ray_lite.serve import _proxy_conn

h11 = pytest.importorskip("h11")
httptools = pytest.importorskip("httptools")

EXAMPLES = int(os.environ.get("RAY_LITE_HTTP_FUZZ_EXAMPLES", "200"))

# ------------------------------------------------------- known differences
# Where the proxy (llhttp's rules, then ray_lite's) and h11 differ by
# design.  Keyed by which side refused and its stated reason: llhttp's
# error text, ray_lite's status, or h11's error text (a prefix).
DIFFERENCES = {
    # ray_lite's bounds: a head of 64 KiB (every byte of it, however it
    # arrives; h11 bounds only an unfinished one, by 16 KiB), a request
    # line of 64 KiB, a chunk-size line of 16 KiB.
    ("proxy", 431): "the head's bound (64 KiB, 256 lines)",
    ("proxy", 414): "the request line's bound (64 KiB)",
    # llhttp knows a fixed list of methods (RFC 9110's, WebDAV's...): a
    # token outside it is refused; h11 takes any token.
    ("proxy", "Invalid method"): "llhttp accepts only the methods it knows",
    ("proxy", "Invalid method for HTTP/x.x request"): "llhttp accepts only the methods it knows",
    ("proxy", "Expected SOURCE method for ICE/x.x request"): "llhttp: ICE/ request lines",
    # A version other than HTTP/1.0 and 1.1 (h11 takes any digit.digit):
    # RFC 9110 15.6.6's 505, and HTTP/0.9's form (no version) is 400.
    ("proxy", 505): "a version other than 1.0/1.1 is not spoken (505)",
    ("proxy", "version 0.9"): "HTTP/0.9 is refused",
    ("proxy", "Invalid HTTP version"): "a version llhttp refuses (answered 505)",
    # llhttp refuses a lone LF as a line end (RFC 9112 2.2 lets a
    # recipient accept one; refusing closes a request smuggling vector).
    ("proxy", "Expected CRLF after version"): "a lone LF or other bytes after the version",
    ("proxy", "Missing expected CR after header value"): "a lone LF after a header value",
    ("proxy", "Missing expected LF after header value"): "a lone CR after a header value",
    ("proxy", "Expected LF after headers"): "a lone CR or LF ends the head",
    ("proxy", "Expected LF after CR"): "a lone CR",
    ("proxy", "Expected LF after chunk size"): "a lone CR after a chunk size",
    ("proxy", "Missing expected LF after chunk data"): "a lone CR or LF after chunk data",
    ("proxy", "Expected LF after chunk data"): "a lone CR or LF after chunk data",
    ("proxy", "Expected CRLF after chunk"): "a lone CR or LF after chunk data",
    ("proxy", "Invalid header field char"): "a lone LF or a non-token byte in a name",
    # Obsolete line folding: RFC 9112 5.2 lets a server refuse it (400)
    # or unfold it; llhttp refuses, h11 unfolds.
    ("proxy", "Unexpected whitespace after header value"): "obs-fold is refused",
    # A control byte (other than HTAB) in a header value: RFC 9110 5.5 says
    # such a value is invalid; llhttp refuses it, h11 takes \x01-\x08 etc.
    ("proxy", "Invalid header value char"): "a control byte in a header value",
    # Content-Length with Transfer-Encoding: RFC 9112 6.1 lets a server
    # refuse it (a request smuggling vector); llhttp does, h11 ignores CL.
    ("proxy", "Content-Length can't be present with Transfer-Encoding"):
        "content-length beside transfer-encoding",
    ("proxy", "Transfer-Encoding can't be present with Content-Length"):
        "content-length beside transfer-encoding",
    # RFC 9112 6.3: a content-length holding a list ("5, 5") is invalid
    # (h11 takes identical values); llhttp refuses it.
    ("proxy", "Invalid character in Content-Length"): "a content-length that is not digits",
    ("proxy", "Duplicate Content-Length"): "two content-lengths",
    # Whitespace after a chunk size: h11 is lenient, llhttp is not.
    ("proxy", "Invalid character in chunk size"): "whitespace or other bytes after a chunk size",
    ("proxy", "Invalid character in chunk extensions"): "a chunk extension that is not token=value",
    ("proxy", "Invalid character in chunk extensions quoted value"): "a bad quoted extension",
    ("proxy", "Invalid character in chunk extensions value"): "a bad extension value",
    ("proxy", "Missing expected CR after chunk extension name"): "a lone LF in an extension",
    ("proxy", "Missing expected CR after chunk extension value"): "a lone LF in an extension",
    ("proxy", "Missing expected CR after chunk size"): "a lone LF after a chunk size",
    ("proxy", "Missing expected LF after chunk size"): "a lone CR after a chunk size",
    # llhttp refuses a target byte h11 takes (and the reverse below).
    ("proxy", "Invalid char in url path"): "a byte llhttp refuses in a target",
    ("proxy", "Invalid char in url query"): "a byte llhttp refuses in a target",
    ("proxy", "Invalid char in url fragment start"): "a byte llhttp refuses in a target",
    ("proxy", "Unexpected start char in url"): "a target llhttp refuses",
    ("proxy", "Unexpected char in url schema"): "an absolute-form target llhttp refuses",
    ("proxy", "Unexpected char in url server"): "an absolute-form target llhttp refuses",
    ("proxy", "Invalid characters in url"): "a target llhttp refuses",
    ("proxy", "Invalid characters in url (strict mode)"): "a target llhttp refuses",
    ("proxy", "Expected space after method"): "bytes after the method",
    ("proxy", "Expected HTTP/, RTSP/ or ICE/"): "no HTTP/ after the target",
    ("proxy", "Invalid major version"): "a version that is not digit.digit",
    ("proxy", "Invalid minor version"): "a version that is not digit.digit",
    ("proxy", "Expected dot"): "a version that is not digit.digit",
    ("proxy", "Invalid Transfer-Encoding header value"): "a transfer coding llhttp refuses",
    # llhttp refuses a transfer-encoding field among the trailers (a
    # framing field there is not allowed, RFC 9110 6.5.1); h11 takes any.
    ("proxy", "Invalid `Transfer-Encoding` header value"):
        "a transfer-encoding llhttp refuses (in the trailers, or not ending in chunked)",
    ("proxy", "Request has invalid `Transfer-Encoding`"): "transfer codings not ending in chunked",
    ("proxy", "Data after `Connection: close`"): "bytes after a request that closes",
    ("proxy", "Invalid Content-Length"): "a content-length llhttp refuses",
    ("proxy", "Content-Length overflow"): "a content-length over 2**64",
    ("proxy", "Chunk size overflow"): "a chunk size over 2**64",
    ("proxy", "Pause on CONNECT/Upgrade"): "an upgrade or CONNECT (the proxy's own path)",
    ("proxy", "upgrade"): "an upgrade or CONNECT (the proxy's own path)",
    # h11 refuses what llhttp takes.
    ("h11", "Missing mandatory Host: header"):
        "RFC 9112 3.2's Host rule is not enforced (as uvicorn over httptools)",
    ("h11", "Found multiple Host: headers"):
        "RFC 9112 3.2's Host rule is not enforced (as uvicorn over httptools)",
    ("h11", "no request line received"):
        "empty lines before a request line are skipped (RFC 9112 2.2)",
    ("h11", "illegal request line: bytearray(b'\\r"):
        "llhttp skips CR and LF bytes before a request line (RFC 9112 2.2: empty lines)",
    ("h11", "illegal request line"):
        "llhttp is lenient with spaces and some bytes in the request line",
    ("h11", "illegal header line"): "a header line llhttp takes and h11 does not",
    ("h11", "illegal chunk header"): "a chunk-size line llhttp takes and h11 does not",
    ("h11", "Transfer-Encoding: "): "a transfer coding other than chunked (h11: 501)",
    ("h11", "Only Transfer-Encoding: chunked is supported"): "transfer codings (h11: 501)",
    ("h11", "multiple Transfer-Encoding headers"): "transfer codings (h11: 501)",
    ("h11", "conflicting Content-Length headers"): "two content-lengths",
    ("h11", "bad Content-Length"): "a content-length h11 refuses",
    ("h11", "malformed chunk footer"): "the bytes after chunk data",
    ("h11", "Receive buffer too long"): "h11's 16 KiB bound on an unfinished event",
    ("h11", "Illegal header value"): "a value h11 refuses",
    ("h11", "Illegal header name"): "a name h11 refuses",
    ("h11", "Illegal target characters"): "a target h11 refuses",
    ("h11", "Missing mandatory"): "h11's required headers",
    ("h11", "upgrade"): "an upgrade or CONNECT (the proxy's own path)",
}


def explained(side, reason):
    for (s, r), why in DIFFERENCES.items():
        if s == side and (reason == r if not isinstance(r, str) or not isinstance(reason, str)
                          else reason.startswith(r)):
            return why
    return None


# --------------------------------------------------------- the proxy side
class _Transport:
    def __init__(self):
        self.out = []
        self.closed = False

    def write(self, data):
        self.out.append(bytes(data))

    def get_extra_info(self, name):
        return ("127.0.0.1", 40000) if name == "peername" else None

    def close(self):
        self.closed = True

    def pause_reading(self):
        pass

    def resume_reading(self):
        pass


class _Proxy:
    """Answers each request at once (200, empty), as it comes."""

    def __init__(self):
        self.conns = set()
        self.idle_sweep = object()
        self.max_body = 1 << 30
        self.requests = []
        self.ids = 0
        self.loop = None

    def dispatch(self, conn, req):
        self.requests.append(req)
        conn.respond(req, 200, b"content-length: 0\r\n", b"")

    def release(self, req):
        pass

    def new_request_id(self):
        self.ids += 1
        return b"id-%d" % self.ids


def _upgrade_refused(conn, req):
    return False


def _upgrade_not_taken(conn, data, exc):
    conn.upgraded = True
    return False


def proxy_parse(module, reads):
    """``(requests, refusal, output)``: what the connection handed the proxy
    (method, target, headers, body), the status it refused the input with
    (None), and all it wrote."""
    conn = module.HttpConnection(_Proxy())
    conn.connection_made(_Transport())
    for data in reads:
        conn.data_received(data)
    reqs = []
    for req in conn.proxy.requests:
        headers = [tuple(line.split(b":", 1)) for line in req.headers.split(b"\r\n")] \
            if req.headers else []
        reqs.append((req.method, bytes(req.url), headers, bytes(req.body),
                     req.version == "1.1" and req.keep_alive))
    out = b"".join(conn.transport.out)
    statuses = [int(line[9:12]) for line in out.split(b"\r\n") if line.startswith(b"HTTP/1.1 ")]
    refusal = next((s for s in statuses if s >= 300), None)
    if refusal is None and getattr(conn, "upgraded", False):
        refusal = "upgrade"
    return reqs, refusal, out


class _Bare:
    """httptools with no limits of ray_lite's: what llhttp itself says."""

    def __init__(self):
        self.parser = None
        self.versions = []

    def on_headers_complete(self):
        self.versions.append(self.parser.get_http_version())


def llhttp_reason(reads):
    """Why the proxy refused these reads with a 400: llhttp's error text,
    or "version 0.9" (llhttp took a request line without a version, which
    the connection refuses); None if neither."""
    bare = _Bare()
    parser = bare.parser = httptools.HttpRequestParser(bare)
    try:
        for data in reads:
            parser.feed_data(data)
    except httptools.HttpParserUpgrade:
        return "upgrade"
    except httptools.HttpParserError as exc:
        if "0.9" in bare.versions:
            return "version 0.9"
        return str(exc)
    return "version 0.9" if "0.9" in bare.versions else None


# ------------------------------------------------------------ the h11 side
def h11_parse(reads):
    """``(requests, refusal)`` as h11 parses the reads (a server that
    answers each request at once)."""
    conn = h11.Connection(h11.SERVER)
    reqs = []
    cur = None
    for data in reads:
        conn.receive_data(data)
        while True:
            try:
                ev = conn.next_event()
            except h11.RemoteProtocolError as exc:
                return reqs, str(exc)
            if ev is h11.NEED_DATA:
                break
            if ev is h11.PAUSED:
                return reqs, "upgrade"
            if isinstance(ev, h11.Request):
                cur = [ev.method.decode("ascii"), bytes(ev.target),
                       [(bytes(k), bytes(v)) for k, v in ev.headers], b"", None]
            elif isinstance(ev, h11.Data):
                cur[3] += bytes(ev.data)
            elif isinstance(ev, h11.EndOfMessage):
                conn.send(h11.Response(status_code=200, headers=[(b"content-length", b"0")]))
                conn.send(h11.EndOfMessage())
                cur[4] = conn.our_state is not h11.MUST_CLOSE
                reqs.append(tuple(cur))
                if not cur[4]:
                    return reqs, None
                conn.start_next_cycle()
            else:           # ConnectionClosed
                return reqs, None
    return reqs, None


def _same_request(ours, theirs):
    """The proxy's request and h11's alike, as h11 normalizes: names in
    lower case (both), a transfer coding in lower case, a content-length
    list of one value as that value."""
    method, target, headers, body, _ = ours
    norm = []
    for k, v in headers:
        if k == b"transfer-encoding":
            v = v.lower()
        elif k == b"content-length":
            v = v.split(b",")[0].strip()
        norm.append((k, v))
    return (method, target, norm, body) == theirs[:4]


def _kept(reqs):
    """The requests up to the first that ends the connection."""
    out = []
    for r in reqs:
        out.append(r)
        if not r[4]:
            break
    return out


# --------------------------------------------------------- what is sent
_TCHAR = "!#$%&'*+-.^_`|~" + string.ascii_letters + string.digits
_METHODS = ["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH", "TRACE"]
_NAMES = [b"Host", b"Content-Type", b"Accept", b"X-A", b"Connection", b"Cookie",
          b"X-Request-Id", b"Expect", b"User-Agent"]
_VALUE_BYTES = (bytes(range(0x21, 0x7F)) + b" \t" + bytes(range(0x80, 0x100, 7)))
_TARGET = string.ascii_letters + string.digits + "/-._~%!$&'()*+,;=:@?"
_ODD = [b"\r", b"\n", b"\r\n", b" ", b"\t", b":", b"\x00", b"\x01", b"\x7f", b"\x80", b";",
        b"0", b"=", b"\"", b",", b"HTTP/1.1", b"chunked", b"Transfer-Encoding: chunked\r\n",
        b"Content-Length: 3\r\n", b"\r\n\r\n", b"ff", b"/", b"?", b"#"]


@st.composite
def requests(draw):
    method = draw(st.sampled_from(_METHODS)) if draw(st.integers(0, 19)) else \
        draw(st.text(_TCHAR, min_size=1, max_size=7))
    target = draw(st.sampled_from(["/", "*", "http://h/p?q"]) |
                  st.text(_TARGET, max_size=24).map(lambda t: "/" + t))
    version = draw(st.sampled_from(["HTTP/1.1"] * 30 + ["HTTP/1.0"] * 3 +
                                   ["HTTP/2.0", "HTTP/0.9", "HTTP/1.2"]))
    head = f"{method} {target} {version}\r\n".encode()
    names = draw(st.lists(st.sampled_from(_NAMES) | st.text(_TCHAR, min_size=1, max_size=10)
                          .map(str.encode), max_size=6))
    if version == "HTTP/1.1" and draw(st.integers(0, 9)) and b"Host" not in names:
        names.insert(0, b"Host")
    for name in names:
        value = draw(st.binary(max_size=16).map(
            lambda b: bytes(_VALUE_BYTES[c % len(_VALUE_BYTES)] for c in b)))
        if name == b"Connection":
            value = draw(st.sampled_from([b"keep-alive", b"close", b"Keep-Alive, x", value]))
        if name == b"Expect":
            value = draw(st.sampled_from([b"100-continue", value]))
        if not draw(st.integers(0, 40)):
            value = b"v" * draw(st.integers(15000, 20000))    # the parser's slices
        sep = draw(st.sampled_from([b": ", b":", b":  ", b":\t"]))
        head += name + sep + value + draw(st.sampled_from([b"", b"", b" ", b"\t"])) + b"\r\n"
    framing = draw(st.sampled_from(["none", "length", "chunked"]))
    body = draw(st.binary(max_size=40))
    if not draw(st.integers(0, 40)):
        body = body * draw(st.integers(500, 1500))          # over a slice
    if framing == "length":
        head += b"Content-Length: %d\r\n\r\n" % len(body) + body
    elif framing == "chunked":
        head += b"Transfer-Encoding: chunked\r\n\r\n"
        cuts = sorted(draw(st.lists(st.integers(0, len(body)), max_size=3)))
        pieces = [body[a:b] for a, b in zip([0] + cuts, cuts + [len(body)]) if b > a]
        for piece in pieces:
            ext = draw(st.sampled_from([b"", b"", b";a", b";a=b", b';a="q s"', b";a=b;c"]))
            head += b"%x%s\r\n%s\r\n" % (len(piece), ext, piece)
        head += b"0\r\n"
        if draw(st.booleans()):
            head += b"X-Trailer: t\r\n"
        head += b"\r\n"
    else:
        head += b"\r\n"
    return head


@st.composite
def inputs(draw):
    data = b"".join(draw(st.lists(requests(), min_size=1, max_size=3)))
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2, 3]))):
        at = draw(st.integers(0, len(data)))
        op = draw(st.sampled_from(["insert", "delete", "replace"]))
        odd = draw(st.sampled_from(_ODD) | st.binary(min_size=1, max_size=2))
        if op == "insert":
            data = data[:at] + odd + data[at:]
        elif op == "delete":
            data = data[:at] + data[at + draw(st.integers(1, 4)):]
        else:
            data = data[:at] + odd + data[at + len(odd):]
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=3)))
    return [data[a:b] for a, b in zip([0] + cuts, cuts + [len(data)]) if b > a] or [b""]


# ------------------------------------------------------------------- tests
@pytest.fixture
def twins(twin_pair):
    modules = [t.module("http_conn") for t in twin_pair]
    saved = (_proxy_conn._websocket.take, _proxy_conn._websocket.took_over)
    try:
        _proxy_conn._websocket.take = _upgrade_refused
        _proxy_conn._websocket.took_over = _upgrade_not_taken
        for m in modules:
            _proxy_conn.bind_to_serve(m)
        yield modules
    finally:
        _proxy_conn._websocket.take, _proxy_conn._websocket.took_over = saved
        for m in modules:
            _proxy_conn.bind_to_serve(m)


def _show(x, room=300):
    """``x`` for a failure's message: long runs of a byte shortened."""
    import re
    text = repr(x)
    text = re.sub(r"(.)\1{20,}", lambda m: f"{m.group(1)}*{len(m.group(0))}", text)
    return text if len(text) <= room else text[:room] + "..."


def check(twins, reads):
    got = [proxy_parse(m, reads) for m in twins]
    assert got[0] == got[1], _show(reads)   # the twins: byte for byte alike
    ours, refusal, _ = got[0]
    theirs, their_refusal = h11_parse(reads)
    ours = _kept(ours)
    if ours and not ours[-1][4]:
        refusal = None          # the connection ends after it: nothing later counts
    if theirs and not theirs[-1][4]:
        their_refusal = None
    n = min(len(ours), len(theirs))
    for a, b in zip(ours[:n], theirs[:n]):
        assert _same_request(a, b), _show((reads, a, b), 2000)
    if (len(ours), refusal is None) == (len(theirs), their_refusal is None):
        return
    # llhttp refuses as soon as a byte is wrong; h11 looks at a head once
    # it has all of it: the side still waiting is given an end of head.
    if refusal is not None and their_refusal is None:
        more, later = h11_parse(list(reads) + [b"\r\n\r\n"])
        if later is not None and len(_kept(more)) == len(ours):
            return
    elif their_refusal is not None and refusal is None:
        more, later, _ = proxy_parse(twins[0], list(reads) + [b"\r\n\r\n"])
        if later is not None and len(_kept(more)) == len(theirs):
            return
    # They part: one refused what the other took (or stopped early).
    if refusal is not None and (len(ours) <= len(theirs)):
        reason = llhttp_reason(reads) if refusal == 400 else refusal
        if explained("proxy", reason):
            return
    if their_refusal is not None and len(theirs) <= len(ours):
        if explained("h11", their_refusal):
            return
    pytest.fail(f"the proxy and h11 differ on {_show(reads, 2000)}:\n"
                f" proxy {_show(ours)} refused {refusal}\n"
                f" h11 {_show(theirs)} refused {_show(their_refusal)}")


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(reads=inputs())
def test_the_proxy_parses_as_h11_does(twins, reads):
    check(twins, reads)


@pytest.mark.parametrize("data", [
    b"GET /a?b=c HTTP/1.1\r\nHost: h\r\nX-A:  v  \r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello"
    b"GET /2 HTTP/1.1\r\nHost: h\r\n\r\n",
    b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"3;a=b\r\nabc\r\n0\r\nX-T: 1\r\n\r\n",
    b"GET / HTTP/1.0\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
])
def test_common_requests_parse_alike(twins, data):
    for cut in range(len(data) + 1):
        check(twins, [data[:cut], data[cut:]] if 0 < cut < len(data) else [data])
