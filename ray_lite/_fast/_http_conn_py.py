"""An HTTP/1.1 connection of a Serve proxy, pure Python (the executable
specification of ``_http_conn_c``).

One ``HttpConnection`` per TCP connection (with ``ab``, one per request), an
asyncio protocol whose bytes httptools (llhttp, in C) parses; keep-alive and
pipelining, answers to pipelined requests in request order.  Each complete
request becomes an ``HttpRequest`` and goes to ``proxy.dispatch(conn, req)``;
the proxy answers it with ``conn.respond``.

What the connection needs from Serve (the parser, the size bounds, the
status lines, how to cancel a request in its replica, the WebSocket hand-off)
is given once per process by ``bind`` (``ray_lite.serve._proxy_conn`` does
it), so that this module imports nothing from Serve and the proxy's process
alone loads httptools.

The proxy object a connection is made with provides: ``conns`` (a set the
connection is in while open), ``idle_sweep`` and ``sweep_idle_later()``,
``max_body``, ``dispatch(conn, req)``, ``release(req)``, ``new_request_id()``
and ``loop``.
"""
import collections
import re

__all__ = ["HttpConnection", "HttpRequest", "bind", "bad_header", "bad_head_line",
           "END_QUIETLY"]

# ``fail_status`` of a connection that ends, without an error, after the
# answers it owes: the client asked to switch protocols (WebSocket, h2c) or
# to tunnel (CONNECT), which the proxy does not do.
END_QUIETLY = -1

# Where the parser is in a request: the head (and between requests), a body
# framed by its content-length (or none), a chunk-size line (with its
# extensions), or a chunk's data (or the trailers after the last chunk).
_HEAD, _BODY, _LINE, _CHUNK = 0, 1, 2, 3
# Input is parsed in slices of at most this many bytes while the parser is
# in a head or in chunk framing, so that the bytes of an unfinished head or
# chunk-size line are counted exactly at each slice's end; a chunk-size line
# that starts and ends inside one slice is shorter than the slice, which is
# no longer than that line's limit.
_SLICE = 16 * 1024

# Bound by ``bind`` (see there); the parser's classes on the first connection.
_load_parser = None
_HttpRequestParser = None
_HttpParserUpgrade = None
_cancel = None
_ws_take = None
_ws_took_over = None
_large_bytes = 0
_max_header_bytes = 0
_max_header_lines = 0
_max_chunk_line = 0
_max_pipelined = 0
_refused_header = None
_status_line = None
_text_answer = None
_CONNECTION_CLOSE = b""
_CONNECTION_KEEP_ALIVE = b""
_REQUEST_ID_HEADER = b""


def bind(*, load_parser, cancel, websocket_take, websocket_took_over, large_bytes,
         max_header_bytes, max_header_lines, max_chunk_line, max_pipelined, status_line,
         text_answer, refused_header, connection_close, connection_keep_alive,
         request_id_header):
    """What connections need from Serve:

    - ``load_parser()``: httptools' ``(HttpRequestParser, HttpParserUpgrade)``,
      called on the first connection;
    - ``cancel(ref)``: cancel a request's call in its replica (its client left);
    - ``websocket_take(conn, req)``: True if the upgrade request ``req`` is a
      WebSocket now relayed; ``websocket_took_over(conn, data, exc)``: True if
      the bytes after an upgrade went to the relay;
    - ``large_bytes``: a body this large goes to the replica as a view;
    - ``max_header_bytes``: the bytes of a request's head, every one of
      them (the request line alone beyond: 414; the head: 431), and of its
      trailers; ``max_header_lines``: header and trailer lines (431 beyond);
      ``max_chunk_line``: the bytes of a chunk-size line with its
      extensions (400 beyond); ``max_pipelined`` (reading pauses beyond);
    - ``status_line(status)``, ``text_answer(status, text=None)``;
    - ``refused_header(req, name)``: an answer's header block held a line
      that may not be sent (``bad_head_line``): say so in the log (the
      client gets a 500 instead);
    - the header lines ``connection_close``, ``connection_keep_alive`` and the
      name ``request_id_header`` (lower case)."""
    global _load_parser, _cancel, _ws_take, _ws_took_over, _large_bytes, _max_header_bytes
    global _max_header_lines, _max_chunk_line, _max_pipelined, _status_line, _text_answer
    global _refused_header, _CONNECTION_CLOSE, _CONNECTION_KEEP_ALIVE, _REQUEST_ID_HEADER
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
    _CONNECTION_CLOSE = connection_close
    _CONNECTION_KEEP_ALIVE = connection_keep_alive
    _REQUEST_ID_HEADER = request_id_header


def _parser_class():
    global _HttpRequestParser, _HttpParserUpgrade
    if _load_parser is None:
        raise RuntimeError("ray_lite._fast.http_conn: bind() was not called")
    _HttpRequestParser, _HttpParserUpgrade = _load_parser()
    return _HttpRequestParser


# ------------------------------------------------- headers of an answer
# What an answer may say (RFC 9110 5.1, 5.5): a name is a token; a value
# holds no control byte but HTAB (no CR, LF or NUL: a value that held them
# could end the head early and add headers or a second answer of its own).
_TOKEN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_TOKEN_RE = re.compile(_TOKEN)
_CONTROL_RE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_HEAD_LINES_RE = re.compile(rb"(?:" + _TOKEN + rb":[\t\x20-\x7e\x80-\xff]*\r\n)*")
_NAME_SHOWN = 100       # bytes of a refused name shown in the log


def bad_header(headers):
    """The name of the first ``(name, value)`` of ``headers`` that may not be
    sent in an answer (a name that is not a token, a value with a control
    byte), else None.  Names and values are bytes-like."""
    for name, value in headers:
        if _TOKEN_RE.fullmatch(name) is None or _CONTROL_RE.search(value) is not None:
            return bytes(name[:_NAME_SHOWN])
    return None


def bad_head_line(block):
    """The name of the first line of the header block ``block`` (bytes:
    ``name:value`` lines, each ended by CRLF) that may not be sent, else
    None: a line whose name is not a token, that has no colon, whose value
    holds a control byte (a lone CR or LF, NUL), or that is empty."""
    end = _HEAD_LINES_RE.match(block).end()
    if end == len(block):
        return None
    line = block[end:end + _NAME_SHOWN]
    return line.partition(b":")[0].partition(b"\r")[0].partition(b"\n")[0]


class HttpRequest:
    """One request of a connection, as the proxy routes and answers it."""

    __slots__ = ("method", "url", "headers", "body", "keep_alive", "version", "ref", "gen",
                 "route", "rep", "finished", "timer", "sent", "t0", "sends", "request_id",
                 "ws_headers")

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
        self.sent = 0.0         # when it left, if alone in flight (the proxy's spin)
        self.t0 = None          # when it was dispatched, if the metrics are on
        self.sends = 1          # how many times it was sent (a dead replica: again)
        self.request_id = request_id    # the client's x-request-id (bytes), else None
        self.ws_headers = None  # a WebSocket's, while it waits for a replica


class _Reject(Exception):
    """Refused input: ``args[0]`` is the status to answer."""


class HttpConnection:
    # asyncio.Protocol's methods, without the base class: uvloop and asyncio
    # call them by name.  Slots: one per TCP connection (with ab, per request).
    __slots__ = ("proxy", "parser", "transport", "client", "queue", "current", "closed",
                 "fail_status", "paused", "in_next", "url", "headers", "header_bytes", "body",
                 "body_size", "expect_continue", "idle_sweeps", "write_paused", "write_waiter",
                 "request_id", "header_lines", "chunked", "content_length", "version", "method",
                 "phase", "seq", "raw", "feeding", "feed_start", "feed_seq")

    def __init__(self, proxy):
        self.proxy = proxy
        self.parser = (_HttpRequestParser or _parser_class())(self)
        self.transport = None
        self.client = ""
        self.queue = collections.deque()
        self.current = None
        self.closed = False
        self.fail_status = 0
        self.paused = False
        self.in_next = False
        self.idle_sweeps = 0     # sweeps that found it idle since it last received
        self.write_paused = False   # the transport's buffer is over its high-water mark
        self.write_waiter = None    # a streamed answer's wait for the client to read
        self.phase = _HEAD      # where the parser is (_HEAD, _BODY, _LINE, _CHUNK)
        self.seq = 0            # phases entered so far: the same one across a slice?
        self.raw = 0            # bytes of the unfinished head or chunk-size line so far
        self.feeding = None     # the input whose slice the parser has, while in a line
        self.feed_start = 0     # where that slice starts in it
        self.feed_seq = 0       # and ``seq`` when it did
        self._reset()

    def _reset(self):
        self.url = b""
        self.headers = []
        self.header_bytes = 0   # the head's bytes, from what the parser reports
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
        req = self.current
        if req is not None and not req.finished:
            # The client left: cancel its request in the replica.
            req.finished = True
            target = req.gen if req.gen is not None else req.ref
            if target is not None:
                try:
                    _cancel(target)
                except Exception:   # noqa: BLE001 - already done
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
        return None         # close the transport (asyncio.Protocol's default)

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
        """Until the client has read enough of what was written (or left): a
        streamed answer takes no more from the replica meanwhile, so a slow
        reader holds the replica's generator back instead of filling memory."""
        while self.write_paused and not self.closed:
            self.write_waiter = self.proxy.loop.create_future()
            await self.write_waiter

    def data_received(self, data):
        if self.closed or self.fail_status:
            if not self.closed:
                # Refused input (a body over the limit, say): what follows it
                # is neither parsed nor kept, and is not read any more.
                self.transport.pause_reading()
            return
        self.idle_sweeps = 0
        n = len(data)
        start = 0
        try:
            if n <= _SLICE:
                self._feed(data, 0, n)      # the common case: one small read
                return
            view = memoryview(data)
            while start < n and not self.fail_status and not self.closed:
                step = _SLICE
                if self.phase == _BODY and self.content_length > self.body_size:
                    # A body framed by its length: to its end in one piece.
                    step = max(step, self.content_length - self.body_size)
                end = min(n, start + step)
                self._feed(view[start:end], start, end, data)
                start = end
        except Exception as exc:    # noqa: BLE001 - httptools' errors, or _Reject
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
                # HTTP/<digit>.<digit> the parser does not speak (1.2, 3.0).
                status = 505
            if not self.closed:     # (answered and closed already: nothing to say)
                self.fail(status)

    def _feed(self, part, start, end, data=None):
        """Parse ``part`` (``data[start:end]``), then count what it left
        unfinished: the head or chunk-size line the parser is in."""
        if data is None:
            data = part
        phase = self.phase
        seq = self.seq
        if phase == _LINE:
            # A chunk-size line that ends in this part: on_chunk_header
            # counts its bytes here.
            self.feeding = data
            self.feed_start = start
            self.feed_seq = seq
        self.parser.feed_data(part)
        self.feeding = None
        phase = self.phase
        if phase == _HEAD or phase == _LINE:
            if self.seq == seq:
                self.raw += end - start         # all of it is the same head or line
            elif phase == _LINE:
                # A chunk-size line began in this part, after the last LF.
                self.raw = end - max(data.rfind(b"\n", start, end) + 1, start)
            else:
                self.raw = 0    # a head began after a request: its parts are counted
            if phase == _HEAD:
                if self.raw > _max_header_bytes:
                    raise _Reject(431)
            elif self.raw > _max_chunk_line:
                raise _Reject(400)

    # ------------------------------------------------------------- parser
    def on_url(self, url):
        self.url += url
        if len(self.url) > _max_header_bytes:
            raise _Reject(414)
        self.header_bytes += len(url)

    def on_header(self, name, value):
        # Every byte of the head counts: "name:value" and its CRLF (the
        # request line's and the blank line's in on_headers_complete).
        self.header_bytes += len(name) + len(value) + 3
        self.header_lines += 1
        if self.header_bytes > _max_header_bytes or self.header_lines > _max_header_lines:
            raise _Reject(431)
        if self.phase != _HEAD:
            return      # a trailer: counted, not kept (a request's headers are its head's)
        if value and value[-1] in b" \t":
            value = value.rstrip(b" \t")   # (the parser drops leading whitespace only)
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
        # The request line's method, spaces, version and CRLF; the blank line.
        method = self.method = p.get_method()
        self.header_bytes += len(method) + 14
        if self.header_bytes > _max_header_bytes:
            raise _Reject(431)
        version = self.version = p.get_http_version()
        if version != "1.1" and version != "1.0":
            # 0.9: a request line without a version (or with HTTP/0.9),
            # which is not HTTP/1.x's form; another version: not spoken.
            raise _Reject(400 if version == "0.9" else 505)
        self.phase = _LINE if self.chunked else _BODY
        self.seq += 1
        self.raw = 0
        if self.expect_continue:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_chunk_header(self):
        data = self.feeding
        if data is not None and self.seq == self.feed_seq:
            # The line began before this part: its bytes here, to its LF.
            start = self.feed_start
            if self.raw + data.find(b"\n", start) + 1 - start > _max_chunk_line:
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
            self.body = None    # let the refused part go at once
            raise _Reject(413)
        b = self.body
        if b is None:
            self.body = body    # most bodies arrive in one piece
        else:
            if type(b) is bytes:
                # One growing buffer, not a list of pieces: a large body is
                # one allocation, given back to the system whole when freed.
                b = self.body = bytearray(b)
            b += body

    def on_message_complete(self):
        p = self.parser
        body = self.body
        if body is None:
            body = b""
        elif len(body) >= _large_bytes:
            # A view, not bytes: the call stores it once in the object store
            # (no bytes() copy, no trip through the ring); the replica maps it.
            body = memoryview(body)
        elif type(body) is not bytes:
            body = bytes(body)
        req = HttpRequest(self.method.decode("ascii", "replace"), self.url,
                          b"\r\n".join(self.headers), body, p.should_keep_alive(),
                          self.version, self.request_id)
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
            # The common case (no pipelining): straight to a replica.
            self.current = req
            self.proxy.dispatch(self, req)
            return
        self.queue.append(req)
        if len(self.queue) > _max_pipelined and not self.paused:
            self.paused = True
            self.transport.pause_reading()
        if self.current is None:
            self.next()

    # ---------------------------------------------------------- responses
    def next(self):
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
                if self.fail_status == END_QUIETLY:
                    self.closed = True
                    self.transport.close()
                else:
                    self._write_error_and_close(self.fail_status)
            elif self.paused and not self.closed:
                self.paused = False
                self.transport.resume_reading()

    def end_after_answers(self):
        """Read no more: the last request (the one that asked to upgrade)
        gets its answer, with ``connection: close``, then the connection ends."""
        self.fail_status = END_QUIETLY
        last = self.queue[-1] if self.queue else self.current
        if last is not None:
            last.keep_alive = False
        elif not self.closed:
            self.closed = True
            self.transport.close()

    def fail(self, status):
        """Malformed or refused input: answer the requests before it, then this, and close."""
        self.fail_status = status
        if self.current is None and not self.queue:
            self._write_error_and_close(status)

    def _write_error_and_close(self, status):
        headers, body = _text_answer(status)
        self.transport.write(_status_line(status) + headers + _REQUEST_ID_HEADER + b": " +
                             self.proxy.new_request_id() + b"\r\n" + _CONNECTION_CLOSE +
                             b"\r\n" + body)
        self.closed = True
        self.transport.close()

    def respond(self, req, status, headers, body, close=False):
        if self.closed:
            return
        if headers and bad_head_line(headers) is not None:
            # Not one byte of it: a header that could end the head early
            # (CR, LF) or that no client could read; a 500 instead.
            _refused_header(req, bad_head_line(headers))
            status = 500
            headers, body = _text_answer(500)
        keep = req.keep_alive and not close
        # Every answer names its request, as Ray's proxy does: by the
        # client's x-request-id, else by a fresh id.
        head = b"%s%sx-request-id: %s\r\n" % (
            _status_line(status), headers, req.request_id or self.proxy.new_request_id())
        if keep:
            if req.version != "1.1":
                head += _CONNECTION_KEEP_ALIVE    # HTTP/1.0 closes unless told
        else:
            head += _CONNECTION_CLOSE
        if req.method == "HEAD":
            body = b""
        if body and len(body) >= _large_bytes:
            # A large body (a view of the replica's stored reply): to the
            # socket from where it is, not joined to the head first.
            self.transport.write(head + b"\r\n")
            self.transport.write(body)
        else:
            self.transport.write(head + b"\r\n" + body if body else head + b"\r\n")
        self.current = None
        if not keep:
            self.closed = True
            self.transport.close()
        else:
            self.next()

    def respond_text(self, req, status, text=None, close=False):
        headers, body = _text_answer(status, text)
        self.respond(req, status, headers, body, close)
