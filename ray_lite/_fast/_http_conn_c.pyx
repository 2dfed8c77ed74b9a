# cython: language_level=3
"""A Serve proxy's HTTP/1.1 connection, compiled.  Same names, behaviour and
errors as ``_http_conn_py`` (the executable specification, which documents
the semantics); the C layout is in ``_http_conn_c.pxd``.

What is compiled is the per-request path: httptools' callbacks (URL,
headers, end of message), the request object (a freelist: one per request),
and the answer's head joined in one allocation.  Under ``ab`` a connection
lives for one request, so making and ending one is on that path too.
"""
cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE

import collections

__all__ = ["HttpConnection", "HttpRequest", "bind", "bad_header", "bad_head_line",
           "END_QUIETLY"]

END_QUIETLY = -1
cdef int _END_QUIETLY = -1

# See _http_conn_py: where the parser is in a request, and the slices it is
# given while in a head or in chunk framing.
cdef enum:
    _HEAD = 0
    _BODY = 1
    _LINE = 2
    _CHUNK = 3
cdef Py_ssize_t _SLICE = 16 * 1024

cdef object _deque = collections.deque

# Bound by ``bind`` (see _http_conn_py.bind); C globals: no dict look-up per use.
cdef object _load_parser = None
cdef object _HttpRequestParser = None
cdef object _HttpParserUpgrade = None
cdef object _cancel = None
cdef object _ws_take = None
cdef object _ws_took_over = None
cdef Py_ssize_t _large_bytes = 0
cdef Py_ssize_t _max_header_bytes = 0
cdef Py_ssize_t _max_header_lines = 0
cdef Py_ssize_t _max_chunk_line = 0
cdef Py_ssize_t _max_pipelined = 0
cdef object _refused_header = None
cdef object _status_line = None
cdef object _text_answer = None
cdef bytes _CONNECTION_CLOSE = b""
cdef bytes _REQUEST_ID_HEADER = b""
# The answer's last header lines and the blank line, per kind of answer.
cdef bytes _TAIL_KEEP = b"\r\n"             # HTTP/1.1, kept alive
cdef bytes _TAIL_KEEP_10 = b"\r\n"          # HTTP/1.0, kept alive (said so)
cdef bytes _TAIL_CLOSE = b"\r\n"            # closed after it
cdef bytes _ID_NAME = b"x-request-id: "


def bind(*, load_parser, cancel, websocket_take, websocket_took_over, large_bytes,
         max_header_bytes, max_header_lines, max_chunk_line, max_pipelined, status_line,
         text_answer, refused_header, connection_close, connection_keep_alive,
         request_id_header):
    """See ``_http_conn_py.bind``."""
    global _load_parser, _cancel, _ws_take, _ws_took_over, _large_bytes, _max_header_bytes
    global _max_header_lines, _max_chunk_line, _max_pipelined, _status_line, _text_answer
    global _refused_header, _CONNECTION_CLOSE, _REQUEST_ID_HEADER, _TAIL_KEEP_10, _TAIL_CLOSE
    _load_parser = load_parser
    _cancel = cancel
    _ws_take = websocket_take
    _ws_took_over = websocket_took_over
    _large_bytes = large_bytes
    _max_header_bytes = max_header_bytes
    _max_header_lines = max_header_lines
    _max_chunk_line = max_chunk_line
    _max_pipelined = max_pipelined
    _status_line = status_line
    _text_answer = text_answer
    _refused_header = refused_header
    _CONNECTION_CLOSE = bytes(connection_close)
    _REQUEST_ID_HEADER = bytes(request_id_header)
    _TAIL_KEEP_10 = bytes(connection_keep_alive) + b"\r\n"
    _TAIL_CLOSE = _CONNECTION_CLOSE + b"\r\n"


cdef object _parser_class():
    global _HttpRequestParser, _HttpParserUpgrade
    if _load_parser is None:
        raise RuntimeError("ray_lite._fast.http_conn: bind() was not called")
    _HttpRequestParser, _HttpParserUpgrade = _load_parser()
    return _HttpRequestParser


# ------------------------------------------------- headers of an answer
# A byte scan over two tables (see _http_conn_py for the rules): a token's
# bytes, and a value's (HTAB, SP..~, 0x80..0xff).
cdef unsigned char _TCHAR[256]
cdef unsigned char _VCHAR[256]
cdef Py_ssize_t _NAME_SHOWN = 100


cdef void _fill_tables():
    cdef int c
    for c in range(256):
        _TCHAR[c] = 1 if (48 <= c <= 57 or 65 <= c <= 90 or 97 <= c <= 122
                          or c in b"!#$%&'*+-.^_`|~") else 0
        _VCHAR[c] = 1 if (c == 9 or 32 <= c <= 126 or c >= 128) else 0


_fill_tables()


cdef inline bint _is_token(const unsigned char* p, Py_ssize_t n):
    cdef Py_ssize_t i
    if n == 0:
        return False
    for i in range(n):
        if not _TCHAR[p[i]]:
            return False
    return True


cdef inline bint _has_control(const unsigned char* p, Py_ssize_t n):
    cdef Py_ssize_t i
    for i in range(n):
        if not _VCHAR[p[i]]:
            return True
    return False


def bad_header(headers):
    """See ``_http_conn_py.bad_header``."""
    for name, value in headers:
        if type(name) is not bytes:
            name = bytes(name)
        if type(value) is not bytes:
            value = bytes(value)
        if not _is_token(<const unsigned char*>PyBytes_AS_STRING(name),
                         PyBytes_GET_SIZE(name)) or \
                _has_control(<const unsigned char*>PyBytes_AS_STRING(value),
                             PyBytes_GET_SIZE(value)):
            return name[:_NAME_SHOWN]
    return None


def bad_head_line(block):
    """See ``_http_conn_py.bad_head_line``."""
    if type(block) is not bytes:
        block = bytes(block)
    cdef Py_ssize_t at = _bad_line_at(block)
    return None if at < 0 else _line_name(block, at)


cdef Py_ssize_t _bad_line_at(bytes block) noexcept:
    """Where the first line of ``block`` that may not be sent starts; -1 if none."""
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(block)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(block)
    cdef Py_ssize_t i = 0, line
    while i < n:
        line = i
        while i < n and _TCHAR[p[i]]:
            i += 1
        if i == line or i == n or p[i] != 58:          # ':'
            return line
        i += 1
        while i < n and _VCHAR[p[i]]:
            i += 1
        if i + 1 >= n or p[i] != 13 or p[i + 1] != 10:  # CRLF
            return line
        i += 2
    return -1


cdef bytes _line_name(bytes block, Py_ssize_t start):
    line = block[start:start + _NAME_SHOWN]
    return line.partition(b":")[0].partition(b"\r")[0].partition(b"\n")[0]


@cython.final
@cython.freelist(64)
cdef class HttpRequest:
    """One request of a connection, as the proxy routes and answers it."""

    def __init__(self, method, url, headers, body, keep_alive, version, request_id):
        self.method = method
        self.url = url
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive
        self.version = version
        self.ref = None
        self.gen = None
        self.route = None
        self.rep = None
        self.finished = False
        self.timer = None
        self.sent = 0.0
        self.t0 = None
        self.sends = 1
        self.request_id = request_id
        self.ws_headers = None


class _Reject(Exception):
    """Refused input: ``args[0]`` is the status to answer."""


cdef class HttpConnection:

    def __init__(self, proxy):
        self.proxy = proxy
        self.parser = (_HttpRequestParser or _parser_class())(self)
        self.transport = None
        self.client = ""
        self.queue = _deque()
        self.current = None
        self.closed = False
        self.fail_status = 0
        self.paused = False
        self.in_next = False
        self.idle_sweeps = 0
        self.write_paused = False
        self.write_waiter = None
        self.phase = _HEAD
        self.seq = 0
        self.raw = 0
        self.feeding = None
        self.feed_start = 0
        self.feed_seq = 0
        self._reset()

    cdef inline void _reset(self):
        self.url = b""
        self.headers = []
        self.header_bytes = 0
        self.header_lines = 0
        self.body = None
        self.body_size = 0
        self.expect_continue = False
        self.request_id = None
        self.chunked = False
        self.content_length = -1
        self.version = None
        self.method = None

    # ---------------------------------------------------------- transport
    def connection_made(self, transport):
        self.transport = transport
        peer = transport.get_extra_info("peername")
        if peer:
            self.client = f"{peer[0]}:{peer[1]}"
        proxy = self.proxy
        proxy.conns.add(self)
        if proxy.idle_sweep is None:
            proxy.sweep_idle_later()

    def connection_lost(self, exc):
        self.closed = True
        self.proxy.conns.discard(self)
        cdef HttpRequest req = self.current
        if req is not None and not req.finished:
            req.finished = True
            target = req.gen if req.gen is not None else req.ref
            if target is not None:
                try:
                    _cancel(target)
                except Exception:
                    pass
                self.proxy.release(req)
            elif req.route is not None:
                try:
                    req.route.waiting.remove((self, req))
                except ValueError:
                    pass
                req.route.waiting_changed()
        self.queue.clear()
        self.body = None
        # The parser calls back into this connection (it holds its bound
        # methods): dropping it breaks the cycle, so a closed connection is
        # freed at once instead of by the cyclic collector, which otherwise
        # walks every connection that closed since its last full pass.
        self.parser = None
        self._wake_writer()

    def eof_received(self):
        return None

    def pause_writing(self):
        self.write_paused = True

    def resume_writing(self):
        self.write_paused = False
        self._wake_writer()

    def _wake_writer(self):
        waiter, self.write_waiter = self.write_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def drained(self):
        """See ``_http_conn_py.HttpConnection.drained``."""
        while self.write_paused and not self.closed:
            self.write_waiter = self.proxy.loop.create_future()
            await self.write_waiter

    def data_received(self, data):
        if self.closed or self.fail_status:
            if not self.closed:
                self.transport.pause_reading()
            return
        self.idle_sweeps = 0
        cdef Py_ssize_t n = len(data)
        cdef Py_ssize_t start = 0, end, step
        try:
            if n <= _SLICE:
                self._feed(data, 0, n, data)
                return
            view = memoryview(data)
            while start < n and not self.fail_status and not self.closed:
                step = _SLICE
                if self.phase == _BODY and self.content_length > self.body_size:
                    step = max(step, <Py_ssize_t>(self.content_length - self.body_size))
                end = min(n, start + step)
                self._feed(view[start:end], start, end, data)
                start = end
        except Exception as exc:
            self.feeding = None
            if isinstance(exc, _HttpParserUpgrade):
                if not _ws_took_over(self, data[start:] if start else data, exc):
                    self.end_after_answers()
                return
            status = 400
            cause = exc.__cause__ or exc.__context__
            if isinstance(exc, _Reject) or isinstance(cause, _Reject):
                status = (exc if isinstance(exc, _Reject) else cause).args[0]
            elif str(exc) == "Invalid HTTP version":
                status = 505
            if not self.closed:     # (answered and closed already: nothing to say)
                self.fail(status)

    cdef int _feed(self, object part, Py_ssize_t start, Py_ssize_t end, object data) except -1:
        # See _http_conn_py.HttpConnection._feed.
        cdef int phase = self.phase
        cdef Py_ssize_t seq = self.seq
        if phase == _LINE:
            self.feeding = data
            self.feed_start = start
            self.feed_seq = seq
        self.parser.feed_data(part)
        self.feeding = None
        phase = self.phase
        if phase == _HEAD or phase == _LINE:
            if self.seq == seq:
                self.raw += end - start
            elif phase == _LINE:
                self.raw = end - max(<Py_ssize_t>data.rfind(b"\n", start, end) + 1, start)
            else:
                self.raw = 0
            if phase == _HEAD:
                if self.raw > _max_header_bytes:
                    raise _Reject(431)
            elif self.raw > _max_chunk_line:
                raise _Reject(400)
        return 0

    # ------------------------------------------------------------- parser
    def on_url(self, bytes url):
        self.url += url
        if PyBytes_GET_SIZE(self.url) > _max_header_bytes:
            raise _Reject(414)
        self.header_bytes += PyBytes_GET_SIZE(url)

    def on_header(self, bytes name, bytes value):
        self.header_bytes += PyBytes_GET_SIZE(name) + PyBytes_GET_SIZE(value) + 3
        self.header_lines += 1
        if self.header_bytes > _max_header_bytes or self.header_lines > _max_header_lines:
            raise _Reject(431)
        if self.phase != _HEAD:
            return
        cdef Py_ssize_t last = PyBytes_GET_SIZE(value) - 1
        if last >= 0 and (PyBytes_AS_STRING(value)[last] == 32 or
                          PyBytes_AS_STRING(value)[last] == 9):
            value = value.rstrip(b" \t")
        name = name.lower()
        if name == b"content-length":
            try:
                length = int(value)
            except ValueError:
                raise _Reject(400) from None
            if length > self.proxy.max_body:
                raise _Reject(413)
            self.content_length = length
        elif name == b"transfer-encoding":
            self.chunked = True
        elif name == b"expect" and value.strip().lower() == b"100-continue":
            self.expect_continue = True
        elif name == _REQUEST_ID_HEADER:
            self.request_id = value.strip() or None
        self.headers.append(name + b":" + value)

    def on_headers_complete(self):
        p = self.parser
        method = self.method = p.get_method()
        self.header_bytes += PyBytes_GET_SIZE(method) + 14
        if self.header_bytes > _max_header_bytes:
            raise _Reject(431)
        version = self.version = p.get_http_version()
        if version != "1.1" and version != "1.0":
            raise _Reject(400 if version == "0.9" else 505)
        self.phase = _LINE if self.chunked else _BODY
        self.seq += 1
        self.raw = 0
        if self.expect_continue:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_chunk_header(self):
        cdef Py_ssize_t start
        data = self.feeding
        if data is not None and self.seq == self.feed_seq:
            start = self.feed_start
            if self.raw + <Py_ssize_t>data.find(b"\n", start) + 1 - start > _max_chunk_line:
                raise _Reject(400)
        self.feeding = None
        self.phase = _CHUNK
        self.seq += 1

    def on_chunk_complete(self):
        self.phase = _LINE
        self.seq += 1
        self.raw = 0

    def on_body(self, body):
        self.body_size += len(body)
        if self.body_size > self.proxy.max_body:
            self.body = None
            raise _Reject(413)
        b = self.body
        if b is None:
            self.body = body
        else:
            if type(b) is bytes:
                b = self.body = bytearray(b)
            b += body

    def on_message_complete(self):
        p = self.parser
        body = self.body
        if body is None:
            body = b""
        elif len(body) >= _large_bytes:
            body = memoryview(body)
        elif type(body) is not bytes:
            body = bytes(body)
        cdef HttpRequest req = HttpRequest(
            self.method.decode("ascii", "replace"), self.url, b"\r\n".join(self.headers),
            body, p.should_keep_alive(), self.version, self.request_id)
        self._reset()
        self.phase = _HEAD
        self.seq += 1
        self.raw = 0
        if p.should_upgrade():
            if _ws_take(self, req):
                return
            # Answered as plain HTTP, and the connection ends after it
            # (``end_after_answers``, once the parser stops at the upgrade):
            # said now, for an answer may be written before dispatch returns.
            req.keep_alive = False
        if self.current is None and not self.queue and not self.in_next:
            self.current = req
            self.proxy.dispatch(self, req)
            return
        self.queue.append(req)
        if len(self.queue) > _max_pipelined and not self.paused:
            self.paused = True
            self.transport.pause_reading()
        if self.current is None:
            self._next()

    # ---------------------------------------------------------- responses
    def next(self):
        self._next()

    cdef void _next(self) except *:
        if self.in_next:
            return
        self.in_next = True
        try:
            while self.current is None and self.queue and not self.closed:
                req = self.current = self.queue.popleft()
                self.proxy.dispatch(self, req)
        finally:
            self.in_next = False
        if self.current is None and not self.queue:
            if self.fail_status and not self.closed:
                if self.fail_status == _END_QUIETLY:
                    self.closed = True
                    self.transport.close()
                else:
                    self._write_error_and_close(self.fail_status)
            elif self.paused and not self.closed:
                self.paused = False
                self.transport.resume_reading()

    def end_after_answers(self):
        """See ``_http_conn_py.HttpConnection.end_after_answers``."""
        cdef HttpRequest last
        self.fail_status = _END_QUIETLY
        last = self.queue[-1] if self.queue else self.current
        if last is not None:
            last.keep_alive = False
        elif not self.closed:
            self.closed = True
            self.transport.close()

    def fail(self, int status):
        """See ``_http_conn_py.HttpConnection.fail``."""
        self.fail_status = status
        if self.current is None and not self.queue:
            self._write_error_and_close(status)

    cdef void _write_error_and_close(self, int status) except *:
        headers, body = _text_answer(status)
        self.transport.write(b"".join((
            _status_line(status), headers, _REQUEST_ID_HEADER, b": ",
            self.proxy.new_request_id(), b"\r\n", _TAIL_CLOSE, body)))
        self.closed = True
        self.transport.close()

    def respond(self, HttpRequest req, status, headers, body, close=False):
        if self.closed:
            return
        if headers and (type(headers) is not bytes or _bad_line_at(headers) >= 0) and \
                bad_head_line(headers) is not None:
            # (see _http_conn_py: a 500 instead, not one byte of this head)
            _refused_header(req, bad_head_line(headers))
            status = 500
            headers, body = _text_answer(500)
        cdef bint keep = req.keep_alive and not close
        cdef bytes tail
        if keep:
            tail = _TAIL_KEEP if req.version == "1.1" else _TAIL_KEEP_10
        else:
            tail = _TAIL_CLOSE
        rid = req.request_id or self.proxy.new_request_id()
        if req.method == "HEAD":
            body = b""
        if body and len(body) >= _large_bytes:
            # A large body (a view of the replica's stored reply): to the
            # socket from where it is, not joined to the head first.
            self.transport.write(b"".join((_status_line(status), headers, _ID_NAME, rid,
                                           b"\r\n", tail)))
            self.transport.write(body)
        else:
            self.transport.write(b"".join((_status_line(status), headers, _ID_NAME, rid,
                                           b"\r\n", tail, body or b"")))
        self.current = None
        if not keep:
            self.closed = True
            self.transport.close()
        else:
            self._next()

    def respond_text(self, req, status, text=None, close=False):
        headers, body = _text_answer(status, text)
        self.respond(req, status, headers, body, close)
