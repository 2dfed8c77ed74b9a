"""The network side of :class:`ray_lite.MessageQueue`: readers on other nodes.

Shared memory reaches only the processes of one machine.  A reader whose
handle says "remote" gets the writer's messages over one TCP connection
instead, as vLLM's queue does for readers on other nodes: the writer listens
on the address it is given, each remote reader connects and says its rank,
and every message is written to every connection as one frame::

    u8 kind (DATA, READY, CLOSED) | u64 length | codec frame (msgpack)

TCP's own flow control is the back-pressure (a slow reader's full socket
buffer blocks the writer).  A connection that ends without the CLOSED frame
means the other end died: ``PeerDiedError``; after CLOSED, the reader gets
``ChannelClosedError`` once it has read everything before it.
"""
import selectors
import socket
import struct
import time

from ray_lite._fast import codec
from ray_lite._fast.errors import ChannelClosedError, PeerDiedError

__all__ = ["NetworkPublisher", "NetworkReader", "CANCELLED_MESSAGE"]

DATA = 0
READY = 1
CLOSED = 2
_HEADER = struct.Struct("<BQ")
_HELLO = struct.Struct("<q")  # the reader's rank, sent once after connecting
_RECV_BYTES = 1 << 20
# A reader waiting with a ``cancel`` event looks at it this often.
_CANCEL_SLICE_S = 0.05
CANCELLED_MESSAGE = "cancelled"


def _remaining(deadline):
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _deadline(timeout):
    return None if timeout is None else time.monotonic() + timeout


class NetworkPublisher:
    """The writer's end: listens on ``(host, 0)`` for ``n_readers`` readers."""

    def __init__(self, n_readers, host):
        self.n_readers = n_readers
        self._listener = socket.create_server((host, 0))
        self.address = (host, self._listener.getsockname()[1])
        self._conns = {}  # reader rank -> connected socket
        self._closed = False

    @property
    def ready(self):
        return len(self._conns) == self.n_readers

    def wait_until_ready(self, timeout=None):
        """Accept every reader, then tell each one the channel works."""
        deadline = _deadline(timeout)
        while not self.ready:
            self._listener.settimeout(_remaining(deadline))
            try:
                conn, _ = self._listener.accept()
            except socket.timeout:
                raise TimeoutError(f"{self.n_readers - len(self._conns)} remote reader(s) did "
                                   f"not connect within {timeout} s") from None
            conn.setblocking(True)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(_remaining(deadline))
            try:
                rank = _HELLO.unpack(_recv_exactly(conn, _HELLO.size))[0]
            except (OSError, ConnectionError):
                conn.close()  # a reader that died while connecting
                continue
            conn.settimeout(None)
            old = self._conns.pop(rank, None)
            if old is not None:
                old.close()
            self._conns[rank] = conn
            self._send_all(_HEADER.pack(READY, 0), (conn,))
        self._listener.close()

    def publish(self, obj, timeout=None):
        """Send ``obj`` to every remote reader (connecting them first if needed)."""
        if self._closed:
            raise ChannelClosedError("the queue is closed")
        if not self.ready:
            self.wait_until_ready(timeout)
        frame = codec.dumps(obj)
        self._send_all(_HEADER.pack(DATA, len(frame)) + frame, self._conns.values())

    def _send_all(self, data, conns):
        for conn in conns:
            try:
                conn.sendall(data)
            except OSError as exc:
                raise PeerDiedError(f"a remote reader of the queue went away ({exc})") from None

    def close(self):
        if self._closed:
            return
        self._closed = True
        for conn in self._conns.values():
            try:
                conn.settimeout(1.0)
                conn.sendall(_HEADER.pack(CLOSED, 0))
            except OSError:
                pass
            conn.close()
        self._conns.clear()
        self._listener.close()


class NetworkReader:
    """A remote reader's end: one connection to the writer's publisher."""

    def __init__(self, address, rank, timeout=60.0):
        self.rank = rank
        self._sock = socket.create_connection(tuple(address), timeout=timeout)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock.sendall(_HELLO.pack(rank))
        self._sock.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._sock, selectors.EVENT_READ)
        self._buf = bytearray()
        self._ready = False
        self._writer_closed = False
        self._closed = False

    def wait_until_ready(self, timeout=None, cancel=None):
        while not self._ready:
            kind, _ = self._next_frame(_deadline(timeout), cancel, timeout)
            if kind == READY:
                self._ready = True

    def dequeue(self, timeout=None, cancel=None):
        deadline = _deadline(timeout)
        while True:
            kind, payload = self._next_frame(deadline, cancel, timeout)
            if kind == DATA:
                return codec.loads(payload)
            if kind == READY:
                self._ready = True

    def _next_frame(self, deadline, cancel, timeout):
        while True:
            frame = self._take_frame()
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
        if self._closed:
            return
        self._closed = True
        self._selector.close()
        self._sock.close()


def _recv_exactly(conn, n):
    data = b""
    while len(data) < n:
        part = conn.recv(n - len(data))
        if not part:
            raise ConnectionError("connection closed")
        data += part
    return data
