"""The wake-up sockets of the broadcast queue's asyncio waiters (both twins).

Not a hot path (a socket is only poked while an end waits on ``fileno()``),
so there is one implementation, used by ``_broadcast_c`` and ``_broadcast_py``
alike; the segment layout that publishes the names is theirs.

A reader that attaches by handle may run in any process, so the two ends find
each other by name: datagram sockets in the abstract Unix namespace.  That
namespace has no permissions and lists every name in ``/proc/net/unix``, so
names are not secrets and the kernel must do the guarding:

- Every name carries 64 random bits drawn when it is bound, and a name that
  is taken is replaced by a fresh draw: nobody can make an end fail by
  binding its name first.
- Reader ``r`` and the writer talk through one pair of sockets, each
  *connected* to the other: the writer's socket ``w<r>`` (bound when the
  queue is created, its token in reader slot ``r``) and the reader's ``r<r>``
  (connected to ``w<r>`` before it is bound, its token published at attach).
  The kernel refuses (EPERM) a datagram or a ``connect`` from any socket but
  a connected socket's peer, so another process, whoever runs it, cannot wake
  a reader or cost it any CPU.  The writer connects ``w<r>`` back to ``r<r>``
  when it first waits on ``fileno()`` (an epoll descriptor over those sockets
  and an eventfd for a ``close()`` from another thread); until then ``w<r>``
  is nobody's wake-up (datagrams sent to it are dropped on connection).
- A reader that attaches while the writer already waits on ``fileno()`` is
  taken into the epoll set at the writer's next wake-up or sleep slice.
"""
import errno
import os
import select
import socket

__all__ = ["WriterWakeSockets", "ReaderWakeSocket", "wake_address"]

#: Fresh names drawn before giving up on binding (each collision is a 2**-64
#: accident or somebody squatting on a name they saw: either way draw again).
_BIND_TRIES = 16


def _new_token():
    """A random non-zero 64-bit token (0 means "not published yet")."""
    # secrets.randbits(64) without importing secrets (hmac, hashlib): both
    # are the kernel's random bytes.
    return int.from_bytes(os.urandom(8), "little") | 1


def wake_address(queue_name, role, token):
    """The abstract-namespace address of one end's socket (role ``w<r>`` or ``r<r>``)."""
    return f"\0{queue_name}.{role}.{token:016x}".encode()


def _dgram_socket():
    return socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)


def _bind_fresh(sock, queue_name, role):
    """Bind ``sock`` to a name nobody holds; return its token."""
    for _ in range(_BIND_TRIES):
        token = _new_token()
        try:
            sock.bind(wake_address(queue_name, role, token))
            return token
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
    raise OSError(errno.EADDRINUSE, f"no free wake-up socket name for {queue_name}.{role}")


def _drain(sock):
    try:
        while sock.recv(64):
            pass
    except OSError:     # empty (EAGAIN)
        pass


def _poke(sock, address):
    try:
        sock.sendto(b"\1", address)
    except OSError:
        pass  # its buffer is full (poked already), or it is gone


class WriterWakeSockets:
    """The writer's side: socket ``w<r>`` per reader, and ``fileno()``'s epoll set.

    ``reader_token(r)`` (an argument of the methods that need it) reads the
    token reader ``r`` published, 0 while it has not attached.
    """

    __slots__ = ("_queue_name", "_socks", "tokens", "_reader_addresses", "_unconnected",
                 "_epoll", "_eventfd")

    def __init__(self, queue_name, n_readers):
        self._queue_name = queue_name
        self._socks = []
        self._epoll = None
        self._eventfd = -1
        try:
            for r in range(n_readers):
                self._socks.append(_dgram_socket())
            #: The token of ``w<r>``, for the creator to publish in slot ``r``.
            self.tokens = [_bind_fresh(s, queue_name, f"w{r}") for r, s in enumerate(self._socks)]
        except BaseException:
            self.close()
            raise
        self._reader_addresses = [None] * n_readers
        self._unconnected = set(range(n_readers))

    def _reader_address(self, r, reader_token):
        address = self._reader_addresses[r]
        if address is None:
            token = reader_token(r)
            if token:
                address = self._reader_addresses[r] = wake_address(self._queue_name, f"r{r}", token)
        return address

    def poke(self, r, reader_token):
        """Make reader ``r``'s ``fileno()`` readable (a no-op before it attached)."""
        address = self._reader_address(r, reader_token)
        if address is not None:
            _poke(self._socks[r], address)

    def fileno(self, reader_token):
        if self._epoll is None:
            epoll = select.epoll()
            try:
                self._eventfd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
                epoll.register(self._eventfd, select.EPOLLIN)
            except BaseException:
                epoll.close()
                raise
            self._epoll = epoll
        self._connect_readers(reader_token)
        return self._epoll.fileno()

    def _connect_readers(self, reader_token):
        """Connect ``w<r>`` to each reader that attached since, and watch it."""
        for r in sorted(self._unconnected):
            address = self._reader_address(r, reader_token)
            if address is None:
                continue
            self._unconnected.discard(r)
            sock = self._socks[r]
            try:
                sock.connect(address)
            except OSError:
                continue  # the reader is gone: nothing will come from it
            _drain(sock)  # what anybody sent before the connection
            self._epoll.register(sock.fileno(), select.EPOLLIN)

    def drain(self, reader_token):
        """After a wake-up (or a sleep slice): empty the sockets, take in new readers."""
        if self._epoll is None:
            return
        for r, sock in enumerate(self._socks):
            if r not in self._unconnected:
                _drain(sock)
        try:
            os.eventfd_read(self._eventfd)
        except OSError:     # not signalled (EAGAIN)
            pass
        if self._unconnected:
            self._connect_readers(reader_token)

    def wake_self(self):
        """Wake a waiter of this process on ``fileno()`` (a ``close()`` from another thread)."""
        if self._eventfd >= 0:
            try:
                os.eventfd_write(self._eventfd, 1)
            except OSError:
                pass

    def close(self):
        for sock in self._socks:
            sock.close()
        self._socks = []
        if self._epoll is not None:
            self._epoll.close()
            self._epoll = None
        if self._eventfd >= 0:
            os.close(self._eventfd)
            self._eventfd = -1


class ReaderWakeSocket:
    """A reader's side: socket ``r<rank>``, connected to the writer's ``w<rank>``."""

    __slots__ = ("_sock", "token", "_writer_address")

    def __init__(self, queue_name, rank, writer_token):
        sock = self._sock = _dgram_socket()
        try:
            # Connected before it has a name: from its first moment on, only
            # the writer's socket can reach it.
            self._writer_address = None
            if writer_token:
                address = wake_address(queue_name, f"w{rank}", writer_token)
                try:
                    sock.connect(address)
                    self._writer_address = address
                except OSError:     # the writer closed or died
                    pass
            #: The token of ``r<rank>``, for the reader to publish in its slot.
            self.token = _bind_fresh(sock, queue_name, f"r{rank}")
            if self._writer_address is None:
                # Nobody is left to poke us: connected to itself, it is closed to everybody else.
                sock.connect(wake_address(queue_name, f"r{rank}", self.token))
        except BaseException:
            sock.close()
            raise

    def poke_writer(self):
        """Make the writer's ``fileno()`` readable (when it already waits on it)."""
        if self._writer_address is not None:
            # By address, not send(): a send() to a dead peer would disconnect
            # the socket, and open it to everybody.
            _poke(self._sock, self._writer_address)

    def fileno(self):
        return self._sock.fileno()

    def drain(self, reader_token=None):
        _drain(self._sock)

    def wake_self(self):
        """Wake a waiter of this process on ``fileno()`` (a ``close()`` from
        another thread): a shut-down socket stays readable."""
        try:
            self._sock.shutdown(socket.SHUT_RD)
        except OSError:
            pass

    def close(self):
        self._sock.close()
