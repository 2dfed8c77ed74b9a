"""The network side of :class:`ray_lite.MessageQueue`: readers on other nodes.

Shared memory reaches only the processes of one machine.  A reader whose
handle says "remote" gets the writer's messages over one TCP connection
instead, as vLLM's queue does for readers on other nodes: the writer listens
on the address it is given, each remote reader connects, proves it holds the
queue's secret and says its rank, and every message is written to every
connection as one frame::

    u8 kind (DATA, READY, CLOSED) | u64 length | codec frame (msgpack)

Authentication.  Anyone who can reach the address can connect, and frames
may hold pickles, so both ends prove they hold the queue's 32-byte secret
(``authkey``, carried in the exported handle) before anything is decoded,
with HMACs of random nonces as ``multiprocessing.connection``'s authkey
does.  The reader speaks first, as it connects (so that a writer and its
readers may call ``wait_until_ready`` in any order, even from one thread):
``MAGIC | rank | reader nonce | HMAC-SHA256(authkey, "reader" | MAGIC |
rank | reader nonce)``.  The writer admits it (and only then gives it the
rank) when the MAC matches and the nonce is new to this queue (a recorded
hello replayed is refused), and answers ``HMAC-SHA256(authkey, "writer" |
reader nonce)``, which the reader checks before it decodes a frame.  A peer
that fails is dropped: it takes no rank, and the real reader still connects
after it.

TCP's own flow control is the back-pressure (a slow reader's full socket
buffer blocks the writer).  A connection that ends without the CLOSED frame
means the other end died: ``PeerDiedError``; after CLOSED, the reader gets
``ChannelClosedError`` once it has read everything before it.
"""
import os
import selectors
import socket
import struct
import threading
import time

from ray_lite._fast import codec
from ray_lite._lazy import lazy_module
from ray_lite._fast.errors import ChannelClosedError, PeerDiedError
from ray_lite.exceptions import AuthenticationError

# Only a queue with remote readers authenticates: `import ray_lite` does not load them.
hashlib = lazy_module("hashlib", globals())
hmac = lazy_module("hmac", globals())

__all__ = ["NetworkPublisher", "NetworkReader", "CANCELLED_MESSAGE"]

DATA = 0
READY = 1
CLOSED = 2
_HEADER = struct.Struct("<BQ")
_HELLO = struct.Struct("<q")  # the reader's rank, in its hello
_MAGIC = b"rlmq\x00\x01\x00\x00"
_NONCE_BYTES = 32
_MAC_BYTES = 32     # an HMAC-SHA256
_HELLO_BYTES = len(_MAGIC) + _HELLO.size + _NONCE_BYTES + _MAC_BYTES
#: How long the writer waits for one connecting peer's hello: a peer that
#: connects and says nothing must not hold the door for the real readers.
HANDSHAKE_TIMEOUT_S = 10.0
_RECV_BYTES = 1 << 20
# A reader waiting with a ``cancel`` event looks at it this often.
_CANCEL_SLICE_S = 0.05
CANCELLED_MESSAGE = "cancelled"


def _remaining(deadline):
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _deadline(timeout):
    return None if timeout is None else time.monotonic() + timeout


def new_authkey():
    """A queue's secret: what a remote reader must hold to be admitted."""
    return os.urandom(32)


def _mac(authkey, role, *parts):
    return hmac.new(authkey, role + b"".join(parts), hashlib.sha256).digest()


class NetworkPublisher:
    """The writer's end: listens on ``(host, 0)`` for ``n_readers`` readers
    that hold ``authkey``.

    ``close()`` may run while another thread is in ``publish`` (a send
    blocked on a reader that does not read) or ``wait_until_ready``: it
    shuts the connections and the listener down, which wakes that call with
    ``ChannelClosedError``, sends no CLOSED frame (it would land inside the
    frame being sent; the readers see the connection end instead), and the
    sockets are released by the last call to leave.  Closing a socket does
    not wake a send blocked on it."""

    def __init__(self, n_readers, host, authkey):
        self.n_readers = n_readers
        self.authkey = authkey
        self._nonces_seen = set()
        self._listener = socket.create_server((host, 0))
        self.address = (host, self._listener.getsockname()[1])
        self._conns = {}  # reader rank -> connected socket
        self._closed = False
        self._released = False
        self._busy = 0          # calls inside publish/wait_until_ready
        self._lock = threading.Lock()

    @property
    def ready(self):
        return len(self._conns) == self.n_readers

    def _enter(self):
        with self._lock:
            if self._closed:
                raise ChannelClosedError("the queue is closed")
            self._busy += 1

    def _leave(self):
        with self._lock:
            self._busy -= 1
            if not (self._closed and self._busy == 0):
                return
        self._release(say_closed=False)

    def wait_until_ready(self, timeout=None):
        """Accept every reader, then tell each one the channel works.

        Hellos are read from every connecting peer at once (a selector), so
        a peer that connects and says nothing holds no one up: it is
        dropped after ``HANDSHAKE_TIMEOUT_S`` while the others get in."""
        if self.ready:
            return
        self._enter()
        try:
            self._accept_readers(timeout)
        finally:
            self._leave()

    def _accept_readers(self, timeout):
        deadline = _deadline(timeout)
        sel = selectors.DefaultSelector()
        self._listener.setblocking(False)
        sel.register(self._listener, selectors.EVENT_READ)
        pending = {}    # connecting socket -> [hello bytes so far, when it connected]
        try:
            while not self.ready:
                now = time.monotonic()
                for conn in [c for c, (_, t0) in pending.items() if now - t0 >= HANDSHAKE_TIMEOUT_S]:
                    self._drop(sel, pending, conn)
                if deadline is not None and now >= deadline:
                    raise TimeoutError(f"{self.n_readers - len(self._conns)} remote reader(s) "
                                       f"did not connect within {timeout} s")
                waits = [t0 + HANDSHAKE_TIMEOUT_S - now for _, t0 in pending.values()]
                if deadline is not None:
                    waits.append(deadline - now)
                events = sel.select(max(0.0, min(waits)) if waits else None)
                if self._closed:    # close() from another thread woke the select
                    raise ChannelClosedError("the queue is closed")
                for key, _ in events:
                    if key.fileobj is self._listener:
                        try:
                            conn, _ = self._listener.accept()
                        except (BlockingIOError, InterruptedError):
                            continue
                        conn.setblocking(False)
                        pending[conn] = [bytearray(), time.monotonic()]
                        sel.register(conn, selectors.EVENT_READ)
                        continue
                    conn = key.fileobj
                    hello = pending[conn][0]
                    try:
                        data = conn.recv(_HELLO_BYTES - len(hello))
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError:
                        data = b""
                    if not data:            # a reader that died while connecting
                        self._drop(sel, pending, conn)
                        continue
                    hello += data
                    if len(hello) == _HELLO_BYTES:
                        sel.unregister(conn)
                        del pending[conn]
                        self._admit(conn, bytes(hello))
        finally:
            for conn in list(pending):
                self._drop(sel, pending, conn)
            sel.close()
            self._listener.setblocking(True)
        self._listener.close()

    @staticmethod
    def _drop(sel, pending, conn):
        sel.unregister(conn)
        del pending[conn]
        conn.close()

    def _admit(self, conn, hello):
        """Admit the peer on ``conn`` as the rank its ``hello`` names when it
        proved it holds the authkey: send the writer's proof and READY.  A
        peer that did not is closed, and takes no rank."""
        signed, mac = hello[:-_MAC_BYTES], hello[-_MAC_BYTES:]
        nonce = signed[len(_MAGIC) + _HELLO.size:]
        if not hmac.compare_digest(mac, _mac(self.authkey, b"reader", signed)) \
                or nonce in self._nonces_seen:
            conn.close()
            return
        self._nonces_seen.add(nonce)
        rank = _HELLO.unpack_from(signed, len(_MAGIC))[0]
        conn.setblocking(True)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.settimeout(HANDSHAKE_TIMEOUT_S)
        try:
            conn.sendall(_mac(self.authkey, b"writer", nonce) + _HEADER.pack(READY, 0))
        except OSError:
            conn.close()            # it went away: it may connect again
            return
        conn.settimeout(None)
        old = self._conns.pop(rank, None)
        if old is not None:
            old.close()
        self._conns[rank] = conn

    def publish(self, obj, timeout=None):
        """Send ``obj`` to every remote reader (connecting them first if needed)."""
        self._enter()
        try:
            if not self.ready:
                self._accept_readers(timeout)
            frame = codec.dumps(obj)
            self._send_all(_HEADER.pack(DATA, len(frame)) + frame, list(self._conns.values()))
        finally:
            self._leave()

    def _send_all(self, data, conns):
        for conn in conns:
            try:
                conn.sendall(data)
            except OSError as exc:
                if self._closed:    # close() from another thread shut the connection down
                    raise ChannelClosedError("the queue is closed") from None
                raise PeerDiedError(f"a remote reader of the queue went away ({exc})") from None

    def close(self):
        with self._lock:
            if self._closed:
                return
            self._closed = True
            busy = self._busy
        if not busy:
            self._release(say_closed=True)
            return
        for sock in [self._listener, *list(self._conns.values())]:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:     # not connected (or listening) any more: nothing waits on it
                pass

    def _release(self, say_closed):
        with self._lock:
            if self._released:
                return
            self._released = True
        for conn in self._conns.values():
            if say_closed:
                try:
                    conn.settimeout(1.0)
                    conn.sendall(_HEADER.pack(CLOSED, 0))
                except OSError:
                    pass
            conn.close()
        self._conns.clear()
        self._listener.close()


class NetworkReader:
    """A remote reader's end: one connection to the writer's publisher.

    The handshake runs as the writer's bytes arrive (the writer answers only
    in its ``wait_until_ready``); until the writer has proved it holds
    ``authkey`` no frame is decoded, and a wrong proof raises
    ``AuthenticationError``.

    ``close()`` may run while another thread waits in ``dequeue`` or
    ``wait_until_ready``: it shuts the socket down, which wakes that wait
    (and any wait entered later) with ``ChannelClosedError``, and the
    socket and selector are released by the last call to leave.  Releasing
    them under the waiting thread would lose its wake-up: epoll drops a
    closed socket's pending event, and a wait on a closed epoll instance
    never returns."""

    def __init__(self, address, rank, authkey, timeout=60.0):
        if not authkey:
            raise ValueError("a remote reader needs the queue's authkey (from export_handle())")
        self.rank = rank
        self._authkey = authkey
        self._nonce = os.urandom(_NONCE_BYTES)
        self._authenticated = False
        self._sock = socket.create_connection(tuple(address), timeout=timeout)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        signed = _MAGIC + _HELLO.pack(rank) + self._nonce
        self._sock.sendall(signed + _mac(authkey, b"reader", signed))
        self._sock.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._sock, selectors.EVENT_READ)
        self._buf = bytearray()
        self._ready = False
        self._writer_closed = False
        self._closed = False
        self._released = False
        self._busy = 0          # calls inside wait_until_ready/dequeue
        self._lock = threading.Lock()

    def _enter(self):
        with self._lock:
            if self._closed:
                raise ChannelClosedError("this end of the queue is closed")
            self._busy += 1

    def _leave(self):
        with self._lock:
            self._busy -= 1
            if not (self._closed and self._busy == 0):
                return
        self._release()

    def wait_until_ready(self, timeout=None, cancel=None):
        if self._ready:
            return
        self._enter()
        try:
            while not self._ready:
                kind, _ = self._next_frame(_deadline(timeout), cancel, timeout)
                if kind == READY:
                    self._ready = True
        finally:
            self._leave()

    def dequeue(self, timeout=None, cancel=None):
        deadline = _deadline(timeout)
        self._enter()
        try:
            while True:
                kind, payload = self._next_frame(deadline, cancel, timeout)
                if kind == DATA:
                    return codec.loads(payload)
                if kind == READY:
                    self._ready = True
        finally:
            self._leave()

    def _handshake(self):
        """True once the writer's proof has arrived and is right
        (``AuthenticationError`` when the peer is not the queue's writer)."""
        buf = self._buf
        if len(buf) < _MAC_BYTES:
            return False
        proof = bytes(buf[:_MAC_BYTES])
        del buf[:_MAC_BYTES]
        if not hmac.compare_digest(proof, _mac(self._authkey, b"writer", self._nonce)):
            self._fail("the peer at the queue's address does not hold the queue's authkey")
        self._authenticated = True
        return True

    def _fail(self, why):
        self._buf.clear()
        self.close()
        raise AuthenticationError(f"{why}: refused (nothing it sent was decoded)")

    def _next_frame(self, deadline, cancel, timeout):
        while True:
            frame = self._take_frame() if self._authenticated or self._handshake() else None
            if frame is not None:
                if frame[0] == CLOSED:
                    self._writer_closed = True
                    raise ChannelClosedError("the writer closed the queue")
                return frame
            if self._closed:
                raise ChannelClosedError("this end of the queue is closed")
            if self._writer_closed:
                raise ChannelClosedError("the writer closed the queue")
            wait = _remaining(deadline)
            if cancel is not None:
                wait = _CANCEL_SLICE_S if wait is None else min(wait, _CANCEL_SLICE_S)
            readable = self._selector.select(wait)
            if self._closed:        # close() from another thread woke the select
                raise ChannelClosedError("this end of the queue is closed")
            if cancel is not None and cancel.is_set():
                raise RuntimeError(CANCELLED_MESSAGE)
            if not readable:
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"no message within {timeout} s")
                continue
            try:
                data = self._sock.recv(_RECV_BYTES)
            except BlockingIOError:
                continue
            except OSError as exc:
                raise PeerDiedError(f"the queue's writer went away ({exc})") from None
            if not data:
                raise PeerDiedError("the queue's writer went away (connection closed "
                                    "without closing the queue)")
            self._buf += data

    def _take_frame(self):
        buf = self._buf
        if len(buf) < _HEADER.size:
            return None
        kind, length = _HEADER.unpack_from(buf)
        end = _HEADER.size + length
        if len(buf) < end:
            return None
        payload = bytes(buf[_HEADER.size:end])
        del buf[:end]
        return kind, payload

    def close(self):
        with self._lock:
            if self._closed:
                return
            self._closed = True
            busy = self._busy
        if busy:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:     # not connected any more: it reads as ended already
                pass
            return
        self._release()

    def _release(self):
        with self._lock:
            if self._released:
                return
            self._released = True
        self._selector.close()
        self._sock.close()

