"""An HTTP/1.1 connection of the proxy (see _proxy): parsed by httptools
(llhttp, in C), with keep-alive and pipelining; answers to pipelined requests
go out in request order.  Each complete request goes to ``proxy.dispatch``."""
import asyncio
import collections
import itertools
import os
import uuid

from . import _core, _websocket
from ._defaults import MAX_HEADER_BYTES, MAX_PIPELINED
from ._http import CONNECTION_CLOSE, CONNECTION_KEEP_ALIVE, status_line, text_answer


class _Req:
    __slots__ = ("method", "url", "headers", "body", "keep_alive", "version", "ref", "gen",
                 "route", "rep", "finished", "timer", "sent", "t0",   # t0: see _metrics
                 "sends",     # set on a resend only (see _proxy._send_elsewhere)
                 "request_id",
                 "ws_headers")    # set on a WebSocket waiting for a replica only (_websocket)

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
        self.sent = 0.0         # when it left, if alone in flight (see SPIN_BUDGET_S)
        self.request_id = request_id    # the client's x-request-id (bytes), else None


REQUEST_ID_HEADER = b"x-request-id"


def request_id_maker():
    """A function making this process's fresh request ids (bytes), shaped as
    Ray's (a UUID 4): a random UUID made here (after the fork: each proxy its
    own) whose last 12 hex digits are a counter, a few hundred ns per id
    where ``uuid4()`` costs several microseconds."""
    prefix = str(uuid.UUID(bytes=os.urandom(16), version=4))[:24].encode()
    count = itertools.count(1).__next__
    return lambda: prefix + b"%012x" % count()


class _Reject(Exception):
    pass


_HttpRequestParser = None
_HttpParserUpgrade = None


def _load_parser():
    # Imported by the proxy process only (not by whoever imports this module).
    global _HttpRequestParser, _HttpParserUpgrade
    from httptools import HttpParserUpgrade, HttpRequestParser
    _HttpRequestParser = HttpRequestParser
    _HttpParserUpgrade = HttpParserUpgrade
    return HttpRequestParser


# ``fail_status`` of a connection that ends, without an error, after the
# answers it owes: the client asked to switch protocols (WebSocket, h2c) or
# to tunnel (CONNECT), which this proxy does not do.
_END_QUIETLY = -1


class HttpConnection(asyncio.Protocol):
    # One per TCP connection (with ab, per request): slots make it cheaper.
    __slots__ = ("proxy", "parser", "transport", "client", "queue", "current", "closed",
                 "fail_status", "paused", "in_next", "url", "headers", "header_bytes", "body",
                 "body_size", "expect_continue", "idle_sweeps", "write_paused", "write_waiter",
                 "request_id")

    def __init__(self, proxy):
        self.proxy = proxy
        self.parser = (_HttpRequestParser or _load_parser())(self)
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
        self._reset()

    def _reset(self):
        self.url = b""
        self.headers = []
        self.header_bytes = 0
        self.body = None
        self.body_size = 0
        self.expect_continue = False
        self.request_id = None

    # ---------------------------------------------------------- transport
    def connection_made(self, transport):
        self.transport = transport
        peer = transport.get_extra_info("peername")
        if peer:
            self.client = f"{peer[0]}:{peer[1]}"
        self.proxy.conns.add(self)
        if self.proxy.idle_sweep is None:
            self.proxy.sweep_idle_later()

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
                    _core.cancel(target)
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
        self._wake_writer()

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
        try:
            self.parser.feed_data(data)
        except Exception as exc:    # noqa: BLE001 - httptools' errors, or _Reject
            if isinstance(exc, _HttpParserUpgrade):
                if not _websocket.took_over(self, data, exc):
                    self.end_after_answers()
                return
            status = 400
            cause = exc.__cause__ or exc.__context__
            if isinstance(exc, _Reject) or isinstance(cause, _Reject):
                status = (exc if isinstance(exc, _Reject) else cause).args[0]
            self.fail(status)

    # ------------------------------------------------------------- parser
    def on_url(self, url):
        self.url += url
        if len(self.url) > MAX_HEADER_BYTES:
            raise _Reject(414)

    def on_header(self, name, value):
        self.header_bytes += len(name) + len(value)
        if self.header_bytes > MAX_HEADER_BYTES:
            raise _Reject(431)
        name = name.lower()
        if name == b"content-length":
            try:
                if int(value) > self.proxy.max_body:
                    raise _Reject(413)
            except ValueError:
                raise _Reject(400) from None
        elif name == b"expect" and value.strip().lower() == b"100-continue":
            self.expect_continue = True
        elif name == REQUEST_ID_HEADER:
            self.request_id = value.strip() or None
        self.headers.append(name + b":" + value)

    def on_headers_complete(self):
        if self.expect_continue:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

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
        elif len(body) >= _core.LARGE_BYTES:
            # A view, not bytes: the call stores it once in the object store
            # (no bytes() copy, no trip through the ring); the replica maps it.
            body = memoryview(body)
        elif type(body) is not bytes:
            body = bytes(body)
        req = _Req(p.get_method().decode("ascii", "replace"), self.url,
                   b"\r\n".join(self.headers), body, p.should_keep_alive(),
                   p.get_http_version(), self.request_id)
        self._reset()
        if p.should_upgrade() and _websocket.take(self, req):
            return
        if self.current is None and not self.queue and not self.in_next:
            # The common case (no pipelining): straight to a replica.
            self.current = req
            self.proxy.dispatch(self, req)
            return
        self.queue.append(req)
        if len(self.queue) > MAX_PIPELINED and not self.paused:
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
                if self.fail_status == _END_QUIETLY:
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
        self.fail_status = _END_QUIETLY
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
        headers, body = text_answer(status)
        self.transport.write(status_line(status) + headers + REQUEST_ID_HEADER + b": " +
                             self.proxy.new_request_id() + b"\r\n" + CONNECTION_CLOSE +
                             b"\r\n" + body)
        self.closed = True
        self.transport.close()

    def respond(self, req, status, headers, body, close=False):
        if self.closed:
            return
        keep = req.keep_alive and not close
        # Every answer names its request, as Ray's proxy does: by the
        # client's x-request-id, else by a fresh id.
        head = b"%s%sx-request-id: %s\r\n" % (
            status_line(status), headers, req.request_id or self.proxy.new_request_id())
        if keep:
            if req.version != "1.1":
                head += CONNECTION_KEEP_ALIVE    # HTTP/1.0 closes unless told
        else:
            head += CONNECTION_CLOSE
        if req.method == "HEAD":
            body = b""
        if body and len(body) >= _core.LARGE_BYTES:
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
        headers, body = text_answer(status, text)
        self.respond(req, status, headers, body, close)
