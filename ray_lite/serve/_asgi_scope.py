"""A request as a replica receives it, in ASGI's terms, and the whole reply
it sends back: shared by the plain replica (``_replica``), the ASGI ingress
(``_asgi``) and its WebSockets (``_websocket``).

The proxy passes a request's parts as plain values (the header block as it
came, addresses as ``"host:port"``); ``http_scope``/``websocket_scope``
turn them into the ASGI scope, ``Receive`` hands over a body that arrived
whole, and ``stored_if_large`` marks a reply whose body the core should
store once in shared memory.
"""
import asyncio
import pickle

from ray_lite._fast.http_conn import bad_header

from ._core import LARGE_BYTES

def parse_headers(blob):
    """A request's header block (``name: value`` lines) as ASGI's
    ``[(name, value)]`` (names lower case already: the proxy's parser)."""
    if not blob:
        return []
    out = []
    for line in blob.split(b"\r\n"):
        k, _, v = line.partition(b":")
        out.append((k, v))
    return out


def check_headers(headers):
    """Refuse (``ValueError`` naming it) a header that may not be sent: a
    name that is not a token, a value with a control byte (CR, LF, NUL...),
    which would let a value copied from a request end the head and add
    headers or a second answer (response splitting).  uvicorn and h11
    refuse the same."""
    bad = bad_header(headers)
    if bad is not None:
        raise ValueError(f"invalid HTTP header {bad!r} in an answer: a name must be a token, "
                         f"a value may hold no control byte (CR, LF, NUL...)")


def header_block(headers, length=True):
    """The header lines of an answer, from its ``[(name, value)]``, checked
    by ``check_headers``.  ``length``: True keeps the headers as they are;
    None drops a content-length (a streamed body goes out chunked, so one
    would contradict it); an int is the whole body's size, added when the
    headers lack it."""
    if type(headers) is not list and type(headers) is not tuple:
        headers = list(headers)
    check_headers(headers)
    if length is True:
        return b"".join(bytes(k) + b": " + bytes(v) + b"\r\n" for k, v in headers)
    lines = []
    sized = False
    for k, v in headers:
        k = bytes(k)
        if k.lower() == b"content-length":
            if length is None:
                continue
            sized = True
        lines.append(k + b": " + bytes(v) + b"\r\n")
    if length is not None and not sized:
        lines.append(b"content-length: %d\r\n" % length)
    return b"".join(lines)


def split_addr(s):
    """``"host:port"`` as ASGI's ``(host, port)`` (None for "")."""
    if not s:
        return None
    host, _, port = s.rpartition(":")
    try:
        return (host, int(port))
    except ValueError:
        return (s, 0)


# A keep-alive client sends many requests from one address (and the server's
# is always the same): each (host, port) is made once, not per request.
# Bounded: cleared when full.
_ADDRS = {}
_ADDRS_MAX = 4096


def addr(s):
    """``split_addr(s)``, the same tuple for the same string."""
    a = _ADDRS.get(s)
    if a is None:
        if len(_ADDRS) >= _ADDRS_MAX:
            _ADDRS.clear()
        a = _ADDRS[s] = split_addr(s)
    return a


def http_scope(method, path, query, headers, client, root_path, http_version, server):
    """The ASGI scope of an HTTP request, from the parts the proxy sends."""
    return {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": http_version, "method": method,
        "scheme": "http", "path": path,
        "raw_path": path.encode("utf-8", "surrogateescape"),
        "query_string": query, "root_path": root_path,
        "headers": parse_headers(headers),
        "client": addr(client), "server": addr(server),
    }


def websocket_scope(path, query, headers, client, root_path, http_version, server):
    """The ASGI scope of a WebSocket's opening request (its subprotocols
    from the ``sec-websocket-protocol`` headers)."""
    hdrs = [(k, v.strip()) for k, v in parse_headers(headers)]
    protocols = [p.strip() for k, v in hdrs if k == b"sec-websocket-protocol"
                 for p in v.decode("latin-1").split(",") if p.strip()]
    return {
        "type": "websocket", "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": http_version, "scheme": "ws", "path": path,
        "raw_path": path.encode("utf-8", "surrogateescape"), "query_string": query,
        "root_path": root_path, "headers": hdrs,
        "client": addr(client), "server": addr(server),
        "subprotocols": protocols,
    }


class Receive:
    """The ASGI ``receive`` of a request whose body arrived whole."""

    __slots__ = ("body",)

    def __init__(self, body):
        self.body = body

    async def __call__(self):
        body = self.body
        if body is not None:
            self.body = None
            if type(body) is not bytes:
                # A large body arrives as a read-only view of the proxy's
                # stored copy; ASGI promises bytes: the one copy made here.
                body = bytes(body)
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.get_running_loop().create_future()   # until cancelled


class StoredReply(tuple):
    """An HTTP reply ``(status, header block, body, 0, service s)`` whose whole body is
    large: the core stores it in the object store as it does any large
    result (its ``nbytes`` says it is one), the body as an out-of-band
    buffer, and the proxy maps that one copy: the body arrives there as a
    read-only memoryview, written to the socket from the mapping.  It
    arrives as a plain tuple (the class does not travel)."""

    __slots__ = ()

    @property
    def nbytes(self):
        return len(self[2])

    def __reduce__(self):
        status, head, body, token, service_s = self
        return (tuple, ((status, head, pickle.PickleBuffer(body), token, service_s),))


def stored_if_large(reply):
    """``reply`` (a whole answer), as a ``StoredReply`` when its body is large."""
    body = reply[2]
    if body is not None and len(body) >= LARGE_BYTES:
        return StoredReply(reply)
    return reply
