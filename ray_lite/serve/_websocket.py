"""WebSockets through the HTTP proxy, to an ``@serve.ingress`` ASGI app.

The proxy answers the upgrade (RFC 6455's handshake) only once the app has
accepted; wsproto frames the messages.  The connection is relayed to one
replica for its whole life over the proxy's ring to it, a stream in each
direction: the replica's ``handle_websocket`` is a streamed call whose items
are what the app sends (accept, text, bytes, close); each message from the
client is a ``websocket_receive`` call on the same replica.  Events travel as
small lists of str/bytes/int (msgpack): nothing from the network is unpickled.

- a close from the client reaches the app as ``websocket.disconnect``; a
  close from the app reaches the client as a close frame;
- the client gone without a close: ``websocket.disconnect`` with 1006;
- the replica dead: the client gets a close frame with 1011;
- the app closing before it accepts (Starlette does so for a path without a
  websocket route): 403, as uvicorn answers; an app error before: 500;
- a deployment without an ASGI app answers the request as plain HTTP (and
  the connection ends after it), as before WebSockets were relayed.

A WebSocket holds one of its replica's ``max_ongoing_requests`` while open.
With metrics on, it counts as a request of method ``WS`` when it ends, its
close code as the status (see _metrics).
"""
import asyncio
import itertools
import os
import sys
from time import monotonic as _monotonic
from urllib.parse import unquote

from ray_lite._fast.http_conn import END_QUIETLY, bad_header

from . import _core, _defaults
from ._asgi_scope import check_headers, header_block, websocket_scope
from ._defaults import STREAM_ITEMS_AHEAD
from ._http import refused_header, status_line, text_answer
from ._routing import first_idle_else_power_of_two as _choose
from ._routing import least_loaded

# An app's close waits this long for the client's answering close frame.
CLOSE_WAIT_S = 5.0
# An app that has not returned this long after its client left is cancelled.
APP_EXIT_GRACE_S = 5.0
# Messages from the client not yet taken by the app: beyond this many the
# replica does not answer the proxy's calls, and beyond PUSH_AHEAD calls
# unanswered the proxy stops reading from the client (TCP holds it back).
INBOX_AHEAD = 16
PUSH_AHEAD = 32
# A frame or message from the client larger than this is refused with close
# code 1009 as soon as its header announces it (websockets' and uvicorn's
# default bound).
MAX_MESSAGE_BYTES = 16 * 1024 * 1024

_keys = itertools.count(1)


def _header_dict(blob):
    out = {}
    for line in blob.split(b"\r\n"):
        k, _, v = line.partition(b":")
        out[k] = v.strip()
    return out


# =============================================================== the proxy
def take(conn, req):
    """Called by the proxy for a request that asks to upgrade: True if it is
    a WebSocket this module now answers, False to answer it as plain HTTP."""
    headers = _header_dict(req.headers)
    if headers.get(b"upgrade", b"").lower() != b"websocket" or conn.current is not None \
            or conn.queue:
        return False
    proxy = conn.proxy
    url = req.url
    raw_path, _, query = url.partition(b"?")
    path = raw_path.decode("utf-8", "surrogateescape")
    if "%" in path:
        path = unquote(path)
    route = proxy.match(path)
    if route is None or not (route.replicas or route.from_zero):
        return False      # 404 / 503 as for any request
    if not _valid_handshake(req, headers):
        return False      # answered as plain HTTP, as a server without WebSockets does
    conn.current = req
    req.t0 = _monotonic()               # its latency in the metrics: its whole life
    conn.transport.pause_reading()     # until the app accepts: then frames follow
    req.route, req.url = route, (path, query)
    if not route.replicas:
        # Scaled to zero: it waits in the route's queue, as a request does,
        # while a replica starts; the proxy's pump then calls ``start``.
        req.ws_headers = headers
        proxy.route_request(conn, req, path, query)
        return True
    start(proxy, conn, req, route,
          _choose(route.replicas, route.max_ongoing) or least_loaded(route.replicas), headers)
    return True


def start(proxy, conn, req, route, rep, headers, early=b""):
    """Relay the WebSocket ``req`` asks for to ``rep``, one of ``route``'s
    replicas (``early``: frames that came with the upgrade request)."""
    req.timer = None        # (its deadline while it waited: the relay has none)
    rep.inflight += 1
    proxy.inflight += 1
    req.rep = rep
    relay = _Relay(proxy, conn, req, rep, headers)
    relay.early = early
    _relays.add(relay)
    proxy.loop.create_task(relay.run(route))


def _valid_handshake(req, headers):
    return (req.method == "GET" and req.version == "1.1" and
            headers.get(b"sec-websocket-version") == b"13" and
            bool(headers.get(b"sec-websocket-key")))


def took_over(conn, data, exc):
    """The parser stopped at an upgrade: the bytes after it belong to the
    WebSocket, if this module took the connection (True)."""
    for relay in _relays:
        if relay.conn is conn:
            relay.early += data[exc.args[0]:] if exc.args else b""
            return True
    return False


_relays = set()


class _SizeGuard:
    """Follows the frame headers in the bytes from a client (RFC 6455 5.2)
    to see the size each data frame announces before its payload comes:
    wsproto hands a payload over in pieces as it arrives, so a frame that
    announces 2**62 bytes would be read for ever.  Control frames are
    wsproto's to judge (more than 125 bytes: 1002)."""

    __slots__ = ("max_size", "skip", "head", "message")

    def __init__(self, max_size):
        self.max_size = max_size
        self.skip = 0           # payload bytes of the current frame still to come
        self.head = b""         # a frame header cut by the end of a read
        self.message = 0        # the data frames' bytes of the current message

    def too_big(self, data):
        """Where in ``data`` the first frame starts whose size (or its
        message's) is over the bound: -1 if none (0 if its header began in
        an earlier read)."""
        i = 0
        n = len(data)
        while i < n:
            if self.skip:
                take = min(self.skip, n - i)
                self.skip -= take
                i += take
                continue
            had = len(self.head)
            h = self.head + data[i:i + 14]
            if len(h) < 2:
                self.head = h
                return -1
            short = h[1] & 0x7F
            size = 2 + (2 if short == 126 else 8 if short == 127 else 0) + \
                (4 if h[1] & 0x80 else 0)
            if len(h) < size:
                self.head = h
                return -1
            self.head = b""
            if short == 126:
                length = int.from_bytes(h[2:4], "big")
            elif short == 127:
                length = int.from_bytes(h[2:10], "big")
            else:
                length = short
            opcode = h[0] & 0x0F
            if opcode < 3 and not length >> 63:     # a data frame (a bad length: 1002)
                if opcode:
                    self.message = 0                # a new message (0: continued)
                self.message += length
                if length > self.max_size or self.message > self.max_size:
                    return max(i - had, 0)
            self.skip = length
            i += size - had
        return -1


def close_all(code=1001):
    """A stopping proxy: every WebSocket it relays gets a close frame ("going away")."""
    for relay in list(_relays):
        relay.close(code, "")


class _Relay(asyncio.Protocol):
    """One WebSocket: the transport is this protocol's once the app accepted."""

    def __init__(self, proxy, conn, req, rep, headers):
        self.proxy = proxy
        self.conn = conn
        self.req = req
        self.rep = rep
        self.headers = headers
        self.key = f"{os.getpid()}:{next(_keys)}"
        self.transport = None
        self.ws = None
        self.early = b""           # frames that came with the upgrade request
        self.parts = []            # a fragmented message's parts so far
        self.gone = False          # the client's side is closed
        self.told_replica = False  # the app has its websocket.disconnect
        self.write_paused = False
        self.waiter = None
        self.close_timer = None
        self.released = False
        self.push = rep.handle.websocket_receive
        self.unanswered = 0        # pushes the replica has not answered yet
        self.reading_paused = False
        self.code = None           # how it ended: the first close code either side sent
        self.guard = _SizeGuard(MAX_MESSAGE_BYTES)

    # ------------------------------------------------- replica -> client
    async def run(self, route):
        conn, req = self.conn, self.req
        try:
            gen = req.gen = self.rep.handle.handle_websocket.options(
                _generator_backpressure_num_objects=STREAM_ITEMS_AHEAD).remote(
                self.key, req.url[0], req.url[1], req.headers, conn.client, route.root_path,
                req.version, self.proxy.server_addr)
            async for ref in gen:
                r = _core.peek(ref)
                ev = r[1] if r is not None and r[0] else await ref
                if self.transport is None:
                    if not self._first(ev):
                        return
                    continue
                if self.gone:
                    break
                self._to_client(ev)
                if self.write_paused:
                    await self._drained()
        except asyncio.CancelledError:
            raise
        except Exception as exc:   # noqa: BLE001 - the replica died or failed
            if self.transport is None:
                if self._start_elsewhere(route, exc):
                    return
                if not conn.closed:
                    print(f"proxy: websocket to {route.app}/{route.deployment} failed: "
                          f"{type(exc).__name__}", file=sys.stderr, flush=True)
                    req.method = "WS"       # (the metrics' name of a websocket's method)
                    conn.respond_text(req, 500, close=True)
            else:
                self.close(1011, "")
        finally:
            self._done()

    def _start_elsewhere(self, route, exc):
        """The replica was dead when the relay began (this proxy not yet
        told): certain it never saw the WebSocket, drop it from the route
        (until the controller's next set) and relay to another replica,
        ``SEND_ATTEMPTS`` at most, as a request goes elsewhere.  False when
        it cannot."""
        conn, req, proxy = self.conn, self.req, self.proxy
        if not getattr(exc, "never_sent", False) or conn.closed or \
                req.sends >= _defaults.SEND_ATTEMPTS:
            return False
        req.sends += 1
        if self.rep in route.replicas:
            route.replicas = [r for r in route.replicas if r is not self.rep]
        self._done()        # (its slot back)
        others = route.replicas
        if others:
            start(proxy, conn, req, route,
                  _choose(others, route.max_ongoing) or least_loaded(others),
                  self.headers, self.early)
        else:               # it waits in the route's queue for a replica
            req.ws_headers = self.headers
            proxy.route_request(conn, req, *req.url)
        return True

    def _first(self, ev):
        """The app's first answer: accept (101 and relay), deny, or plain HTTP."""
        conn, req = self.conn, self.req
        if conn.closed:
            return False
        kind = ev[0]
        if kind == "http":
            # Not an ASGI app: the request is answered as any other, the
            # connection ends after it (a plain HTTP server's answer).
            self._done()
            conn.fail_status = END_QUIETLY  # read no more
            req.keep_alive = False
            req.gen = None
            self.proxy.route_request(conn, req, *req.url)
            return False
        if kind == "deny":
            _, status, headers, body = ev
            req.method = "WS"
            conn.respond(req, status, headers, body, close=True)
            return False
        # accept
        from wsproto.connection import Connection, ConnectionType
        from wsproto.utilities import generate_accept_token
        _, subprotocol, extra = ev
        lines = list(extra)
        if subprotocol:
            lines.append((b"sec-websocket-protocol", subprotocol.encode()))
        bad = bad_header(lines)
        if bad is not None:
            # (The replica refuses these already: a head is never written
            # with a header that may not be sent.)
            refused_header(req, bad)
            req.method = "WS"
            if req.gen is not None:
                _core.cancel(req.gen)
            conn.respond_text(req, 500, close=True)
            return False
        head = (status_line(101) + b"upgrade: websocket\r\nconnection: Upgrade\r\n"
                b"sec-websocket-accept: " +
                generate_accept_token(self.headers[b"sec-websocket-key"]) + b"\r\n")
        for k, v in lines:
            head += k + b": " + v + b"\r\n"
        self.ws = Connection(ConnectionType.SERVER)
        transport = self.transport = conn.transport
        # The HTTP connection is done with: the idle sweep and the proxy's
        # stop leave the socket to this relay.
        conn.closed = True
        conn.current = None
        self.proxy.conns.discard(conn)
        transport.set_protocol(self)
        transport.write(head + b"\r\n")
        early, self.early = self.early, b""
        if early:
            self.data_received(early)
        if not self.gone:
            transport.resume_reading()
        return True

    def _to_client(self, ev):
        from wsproto.events import BytesMessage, TextMessage
        kind = ev[0]
        if kind == "text":
            self._send(TextMessage(data=ev[1]))
        elif kind == "bytes":
            self._send(BytesMessage(data=ev[1]))
        elif kind == "close":
            self.told_replica = True     # the app closed: it needs no disconnect
            self.close(ev[1], ev[2])

    def _send(self, event):
        if self.gone:
            return
        try:
            self.transport.write(self.ws.send(event))
        except Exception:   # noqa: BLE001 - wsproto: the socket is closing already
            pass

    def close(self, code, reason):
        """A close frame to the client; the socket ends on its answer (or soon)."""
        if self.transport is None or self.gone:
            return
        if self.code is None:
            self.code = code
        from wsproto.connection import ConnectionState
        from wsproto.events import CloseConnection
        if self.ws.state is ConnectionState.OPEN:
            self._send(CloseConnection(code=code, reason=reason or None))
            self.close_timer = self.proxy.loop.call_later(CLOSE_WAIT_S, self._end)
        else:
            self._end()

    async def _drained(self):
        while self.write_paused and not self.gone:
            self.waiter = self.proxy.loop.create_future()
            await self.waiter

    def _done(self):
        """The replica's side ended: the slot it held is given back (and an
        accepted WebSocket is counted, once)."""
        _relays.discard(self)
        if not self.released:
            self.released = True
            self.proxy.release(self.req)
            observer = self.proxy.observer
            if observer is not None and self.transport is not None:
                observer.websocket_ended(self.conn, self.req,
                                         1006 if self.code is None else self.code)

    def _end(self):
        if self.close_timer is not None:
            self.close_timer.cancel()
            self.close_timer = None
        if not self.gone:
            self.gone = True
            self.transport.close()

    # ------------------------------------------------- client -> replica
    def data_received(self, data):
        if self.ws is None:
            self.early += data
            return
        if self.gone:
            return
        over = self.guard.too_big(data)
        if over >= 0:
            data = data[:over]      # the frames before it still count
        self.ws.receive_data(data)
        if self._take_events() and over >= 0:
            self._fail(1009, "message too big")

    def _fail(self, code, reason):
        """The client broke the protocol: a close frame with ``code``
        (RFC 6455 7.1.7), the app told, the socket closed."""
        if self.code is None:
            self.code = code
        from wsproto.connection import ConnectionState
        from wsproto.events import CloseConnection
        if self.ws.state is ConnectionState.OPEN:
            self._send(CloseConnection(code=code, reason=reason))
        self._tell_replica(code)
        self._end()

    def _take_events(self):
        """What wsproto made of the bytes so far; False once the connection ends."""
        from wsproto.events import BytesMessage, CloseConnection, Ping, TextMessage
        for ev in self.ws.events():
            t = type(ev)
            if t is TextMessage or t is BytesMessage:
                self.parts.append(ev.data)
                if ev.message_finished:
                    parts, self.parts = self.parts, []
                    data = parts[0] if len(parts) == 1 else \
                        ("" if t is TextMessage else b"").join(parts)
                    self._push("text" if t is TextMessage else "bytes", data)
            elif t is Ping:
                self._send(ev.response())
            elif t is CloseConnection:
                # wsproto's code is an IntEnum when it knows it: a plain int
                # for the app and the metrics' label (str() of an IntEnum
                # is its name before Python 3.11).
                code = int(ev.code)
                from wsproto.connection import ConnectionState
                state = self.ws.state
                if state is ConnectionState.OPEN:
                    # Not a close from the client: wsproto refused what it
                    # sent (unmasked, reserved bits, bad UTF-8, a control
                    # frame fragmented or over 125 bytes...): that code
                    # goes to the client in a close frame.
                    self._fail(code, ev.reason)
                    return False
                if self.code is None:
                    self.code = code
                if state is ConnectionState.REMOTE_CLOSING:
                    self._send(ev.response())
                self._tell_replica(code)
                self._end()
                return False
        return True

    def _push(self, kind, data):
        try:
            ref = self.push.remote(self.key, kind, data)
        except Exception:   # noqa: BLE001 - the replica is gone: its stream says so
            return
        self.unanswered += 1
        _core.on_ready(ref, self._answered)
        if self.unanswered >= PUSH_AHEAD and not self.reading_paused and not self.gone:
            self.reading_paused = True
            self.transport.pause_reading()

    def _answered(self, _entry):
        self.unanswered -= 1
        if self.reading_paused and self.unanswered <= PUSH_AHEAD // 2 and not self.gone:
            self.reading_paused = False
            self.transport.resume_reading()

    def _tell_replica(self, code):
        if not self.told_replica:
            self.told_replica = True
            self._push("disconnect", code)

    def eof_received(self):
        return False

    def connection_lost(self, exc):
        if self.code is None:
            self.code = 1006        # gone without a close frame
        self.gone = True
        if self.close_timer is not None:
            self.close_timer.cancel()
            self.close_timer = None
        self._tell_replica(1006)
        self._wake()
        # The replica's side ends too (its app hears of the disconnect first).
        gen = self.req.gen
        if gen is not None:
            try:
                _core.cancel(gen)
            except Exception:   # noqa: BLE001 - it has ended already
                pass

    def pause_writing(self):
        self.write_paused = True

    def resume_writing(self):
        self.write_paused = False
        self._wake()

    def _wake(self):
        w, self.waiter = self.waiter, None
        if w is not None and not w.done():
            w.set_result(None)


# ============================================================= the replica
class _Disconnected(OSError):
    """``send`` on a WebSocket whose client has left (ASGI: an OSError)."""


class _ReplicaSocket:
    """One WebSocket as its replica sees it: the app's inbox and what it sent."""

    def __init__(self, loop):
        self.inbox = asyncio.Queue()
        self.room = None           # a waiter for the app to take from a full inbox
        self.outbox = asyncio.Queue()
        self.accepted = False
        self.closed = False        # the app sent its close (or its denial)
        self.disconnected = False  # the app was told the client left
        self.denial = None         # a websocket.http.response's parts

    async def take(self):
        """The app's ``receive``."""
        msg = await self.inbox.get()
        self._wake_room()
        return msg

    def _wake_room(self):
        room, self.room = self.room, None
        if room is not None and not room.done():
            room.set_result(None)

    async def has_room(self):
        """Until the app has taken enough of what came (or the client left)."""
        while self.inbox.qsize() >= INBOX_AHEAD and not self.disconnected:
            if self.room is None:
                self.room = asyncio.get_running_loop().create_future()
            await self.room

    def deliver(self, kind, data):
        if self.disconnected:
            return
        if kind == "text":
            self.inbox.put_nowait({"type": "websocket.receive", "text": data})
        elif kind == "bytes":
            self.inbox.put_nowait({"type": "websocket.receive", "bytes": data})
        else:
            self.disconnected = True
            self.inbox.put_nowait({"type": "websocket.disconnect", "code": int(data)})
            self._wake_room()

    async def send(self, msg):
        t = msg["type"]
        if self.disconnected and t != "websocket.close":
            raise _Disconnected("the WebSocket's client has disconnected")
        if t == "websocket.accept":
            if self.accepted or self.closed:
                raise RuntimeError("websocket.accept sent twice or after websocket.close")
            extra = [[bytes(k).lower(), bytes(v)] for k, v in msg.get("headers") or ()]
            subprotocol = msg.get("subprotocol")
            check_headers(extra + [[b"sec-websocket-protocol", subprotocol.encode()]]
                          if subprotocol else extra)
            self.accepted = True
            self.outbox.put_nowait(["accept", subprotocol, extra])
        elif t == "websocket.send":
            if not self.accepted or self.closed:
                raise RuntimeError("websocket.send before websocket.accept or after close")
            text = msg.get("text")
            self.outbox.put_nowait(["text", text] if text is not None
                                   else ["bytes", bytes(msg.get("bytes") or b"")])
        elif t == "websocket.close":
            if self.closed:
                return
            self.closed = True
            if self.accepted:
                self.outbox.put_nowait(["close", int(msg.get("code") or 1000),
                                        msg.get("reason") or ""])
            else:
                self._deny(403)
        elif t == "websocket.http.response.start" and not self.accepted:
            self.denial = [msg["status"], list(msg.get("headers") or ()), []]
        elif t == "websocket.http.response.body" and self.denial is not None:
            self.denial[2].append(bytes(msg.get("body", b"")))
            if not msg.get("more_body", False):
                status, headers, body = self.denial
                self.closed = True
                body = b"".join(body)
                block = header_block([(k, v) for k, v in headers
                                      if bytes(k).lower() != b"content-length"], len(body))
                self.outbox.put_nowait(["deny", status, block, body])
        else:
            raise RuntimeError(f"unexpected ASGI message {t!r} on a websocket")

    def _deny(self, status):
        head, body = text_answer(status)
        self.outbox.put_nowait(["deny", status, head, body])

    def ended(self, failed):
        """The app returned (or raised): what the client must still be told."""
        if not self.closed:
            self.closed = True
            if self.accepted:
                self.outbox.put_nowait(["close", 1011 if failed else 1000, ""])
            else:
                self._deny(500 if failed else 403)
        self.outbox.put_nowait(None)


_sockets = {}


async def serve(rep, key, path, query, headers, client, root_path, http_version, server):
    """The replica's ``handle_websocket``: run the app on the connection and
    yield what it sends, until it closes or the client leaves."""
    asgi = rep._asgi
    if asgi is None:
        yield ["http"]
        return
    await rep.admit()
    loop = asyncio.get_running_loop()
    sock = _sockets[key] = _ReplicaSocket(loop)
    scope = websocket_scope(path, query, headers, client, root_path, http_version, server)
    scope["state"] = asgi._state.copy()
    sock.inbox.put_nowait({"type": "websocket.connect"})
    task = loop.create_task(asgi._app(scope, sock.take, sock.send))

    def app_ended(t):
        failed = not t.cancelled() and t.exception() is not None
        if failed and not isinstance(t.exception(), _Disconnected):
            exc = t.exception()
            import traceback
            print(f"Replica {rep._deployment}#{rep._id}: websocket {path} failed:\n" +
                  "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
                  file=sys.stderr, end="", flush=True)
        sock.ended(failed)
    task.add_done_callback(app_ended)
    try:
        while True:
            ev = await sock.outbox.get()
            if ev is None:
                return
            yield ev
            if ev[0] in ("close", "deny"):
                return
    finally:
        _sockets.pop(key, None)
        if not task.done():
            # The client left (or the proxy gave up): the app hears of it,
            # and has a while to end by itself.
            sock.deliver("disconnect", 1006)
            loop.call_later(APP_EXIT_GRACE_S, task.cancel)
        rep._slots.release()
        rep._leave()


async def receive(rep, key, kind, data):
    """The replica's ``websocket_receive``: one message (or the disconnect)
    from the client, for the app's next ``receive()``."""
    sock = _sockets.get(key)
    if sock is not None:
        sock.deliver(kind, data)
        await sock.has_room()     # the answer is the proxy's permit to read on

