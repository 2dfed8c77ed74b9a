"""This user's local sockets: how another terminal reaches a running program.

Serve's control socket (``serve/_control.py``) and the driver's state
socket (``node/state_socket.py``) are Unix sockets in one private directory
of this user (mode 0700: ``$XDG_RUNTIME_DIR/ray_lite``, else
``/tmp/ray_lite-<uid>``), each created 0600 and named ``<kind>-<pid>.sock``
after the process that listens.  A connection from another user is refused
(``SO_PEERCRED``), on top of those permissions.  No TCP port is opened.

A message is a msgpack map preceded by its length (4 bytes, big-endian); the
server answers each request with one such map and closes the connection.
The server is one thread that blocks in ``accept``.

The C module ``_socket`` is used instead of ``socket``: importing the
latter's Python layer costs ``init()`` about 2 ms, and the state socket
starts at every ``init``.
"""
import os
import struct
import threading

from ray_lite._fast import shm

_LEN = struct.Struct(">I")


class LocalSocketError(RuntimeError):
    """No program to talk to, or it could not be reached."""


def runtime_dir(error=LocalSocketError):
    """This user's directory for local sockets (made 0700; ``error`` when
    another user owns it or others may write in it)."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    if base and os.path.isdir(base):
        path = os.path.join(base, "ray_lite")
    else:
        path = os.path.join("/tmp", f"ray_lite-{os.getuid()}")
    try:
        return shm.private_dir(path)
    except shm.SharedPathError as exc:
        raise error(f"not a private directory of this user: {exc}") from None


def pid_of(path, prefix, suffix=".sock"):
    """The pid in a socket's name ``<prefix><pid><suffix>``, or None."""
    name = os.path.basename(path)
    if not (name.startswith(prefix) and name.endswith(suffix)):
        return None
    pid = name[len(prefix):len(name) - len(suffix)]
    return int(pid) if pid.isdigit() else None


def listed(directory, prefix, suffix=".sock"):
    """The sockets named ``<prefix><pid><suffix>`` in ``directory``, sorted."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return sorted(os.path.join(directory, n) for n in names
                  if pid_of(n, prefix, suffix) is not None)


def answers(path):
    """Whether a server accepts connections at ``path``."""
    import _socket
    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    s.settimeout(2.0)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def remove_dead(directory, prefix):
    """Remove the sockets whose process is gone (one killed by SIGKILL cannot
    remove its own), judged by the pid in their names; the others' paths."""
    kept = []
    for path in listed(directory, prefix):
        if shm.pid_alive(pid_of(path, prefix)):
            kept.append(path)
        else:
            try:
                os.unlink(path)
            except OSError:
                pass
    return kept


def live(directory, prefix):
    """The sockets of running processes that answer (the dead ones removed)."""
    return [path for path in remove_dead(directory, prefix) if answers(path)]


def _recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the connection closed mid-message")
        buf += chunk
    return bytes(buf)


def send(sock, msg):
    import msgpack
    data = msgpack.packb(msg, use_bin_type=True, default=str)
    sock.sendall(_LEN.pack(len(data)) + data)


def recv(sock, limit):
    """One message, refused (``ConnectionError``) when it announces more than
    ``limit`` bytes; ``ValueError`` (msgpack's) when it is not msgpack."""
    import msgpack
    (n,) = _LEN.unpack(_recv_exact(sock, _LEN.size))
    if n > limit:
        raise ConnectionError(f"a message of {n} bytes (limit {limit})")
    return msgpack.unpackb(_recv_exact(sock, n), raw=False, strict_map_key=False)


def request(address, msg, timeout, limit, error=LocalSocketError, what="program"):
    """Send ``msg`` to the server at ``address``; its answer (a dict).
    ``error`` says why there is none (``what`` names the other side)."""
    import _socket
    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    s.settimeout(timeout)
    try:
        try:
            s.connect(address)
        except (FileNotFoundError, ConnectionRefusedError):
            raise error(f"no running {what} at {address}") from None
        try:
            send(s, msg)
        except (BrokenPipeError, ConnectionResetError):
            pass    # refused before it read: the refusal is there to read
        return recv(s, limit)
    except (OSError, ValueError) as exc:   # timeouts and ConnectionError are OSErrors
        raise error(f"the {what} at {address} did not answer: {exc}") from None
    finally:
        s.close()


def peer_uid(conn):
    import _socket
    creds = conn.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


class LocalServer:
    """Listens at ``address`` (created 0600); ``handler(msg) -> dict``
    answers each request of this user, on this server's thread, which blocks
    in ``accept``.  A handler's exception is answered ``{"error": ...}``."""

    def __init__(self, address, handler, limit, name):
        import _socket
        self._socket_mod = _socket
        self.address = address
        self._handler = handler
        self._limit = limit
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
        old_umask = os.umask(0o177)     # the socket is created 0600
        try:
            sock.bind(address)
        finally:
            os.umask(old_umask)
        sock.listen(16)
        self._sock = sock
        self._ino = os.stat(address).st_ino
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self):
        _socket = self._socket_mod
        while not self._closed:
            try:
                fd, _ = self._sock._accept()
            except OSError:
                return      # closed
            conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM, 0, fd)
            try:
                if peer_uid(conn) != os.getuid():
                    send(conn, {"error": "refused: another user's connection"})
                    continue
                conn.settimeout(30.0)
                msg = recv(conn, self._limit)
                conn.settimeout(None)
                try:
                    answer = self._handler(msg)
                except Exception as exc:   # noqa: BLE001 - the client gets the message
                    answer = {"error": f"{type(exc).__name__}: {exc}"}
                send(conn, answer)
            except (OSError, ValueError):
                continue    # a client that went away or spoke nonsense
            finally:
                conn.close()

    def close(self):
        """Stop listening and remove the socket (if it is still this one).
        Not joined: the thread may be answering the request that closes it
        (see ``join``)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._sock.shutdown(self._socket_mod.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        try:
            if os.stat(self.address).st_ino == self._ino:
                os.unlink(self.address)
        except OSError:
            pass

    def join(self, timeout=5.0):
        """Wait until the thread has sent its last answer (after ``close``)."""
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)
