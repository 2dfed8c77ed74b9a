"""The driver's state socket: how ``ray-lite status``, ``ray-lite list``,
``ray-lite summary`` and ``ray-lite dashboard`` reach a running program from
another terminal.

Each driver listens on a Unix socket in this user's private directory (mode
0700: ``$XDG_RUNTIME_DIR/ray_lite``, else ``/tmp/ray_lite-<uid>``, the
directory of Serve's control sockets too) named ``state-<pid>.sock`` (mode
0600).  A connection from another user is refused (``SO_PEERCRED``), on top
of those permissions.  No TCP port is opened.

One thread blocks in ``accept`` and answers one request per connection: a
msgpack map preceded by its length (4 bytes, big-endian), answered the same
way.  The answers are made by ``ANSWERS_MODULE`` (above the core: the state
API, Serve's status), imported by its name on the first request, so a
program nobody asks imports nothing more.  The socket of a driver that was
killed (which cannot remove it) is removed by the next driver that starts
and by every client looking for one.
"""
import importlib
import os
import struct
import threading

from ray_lite._fast import shm

__all__ = ["StateSocketError", "runtime_dir", "socket_path", "live_sockets", "find_address",
           "request", "StateServer", "start", "stop", "current"]

ANSWERS_MODULE = "ray_lite.dashboard.data"
_LEN = struct.Struct(">I")
MAX_MESSAGE = 64 * 1024 * 1024
_PREFIX, _SUFFIX = "state-", ".sock"


class StateSocketError(RuntimeError):
    """No running program to ask, or it could not be reached."""


def runtime_dir():
    """This user's private directory for sockets (made 0700; refused when
    another user owns it or others may write in it)."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    if base and os.path.isdir(base):
        path = os.path.join(base, "ray_lite")
    else:
        path = os.path.join("/tmp", f"ray_lite-{os.getuid()}")
    try:
        return shm.private_dir(path)
    except shm.SharedPathError as exc:
        raise StateSocketError(f"not a private directory of this user: {exc}") from None


def socket_path(pid=None):
    """Where the driver with ``pid`` (default: this process) listens."""
    return os.path.join(runtime_dir(), f"{_PREFIX}{pid or os.getpid()}{_SUFFIX}")


def _pid_of(path):
    name = os.path.basename(path)
    pid = name[len(_PREFIX):-len(_SUFFIX)]
    return int(pid) if pid.isdigit() else None


def _listed(directory):
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return sorted(os.path.join(directory, n) for n in names
                  if n.startswith(_PREFIX) and n.endswith(_SUFFIX))


def _answers(path):
    import socket
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(2.0)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def _remove_dead(directory):
    # The owner's pid is in the name: no connection is needed to judge.
    for path in _listed(directory):
        pid = _pid_of(path)
        if pid is not None and not shm.pid_alive(pid):
            try:
                os.unlink(path)
            except OSError:
                pass


def live_sockets():
    """The sockets of this user's running programs, by their driver's pid;
    those of drivers that are gone are removed on the way."""
    live = []
    for path in _listed(runtime_dir()):
        pid = _pid_of(path)
        if pid is not None and not shm.pid_alive(pid):
            try:
                os.unlink(path)
            except OSError:
                pass
        elif _answers(path):
            live.append(path)
    return live


def find_address(address=None):
    """The socket to ask: ``address`` (a socket path, or a driver's pid),
    else the one running program of this user; ``StateSocketError`` saying
    why there is none."""
    if address:
        address = str(address)
        return socket_path(int(address)) if address.isdigit() else address
    live = live_sockets()
    if not live:
        raise StateSocketError(
            "no running ray_lite program found: start one (a script that calls "
            "ray_lite.init()), then run this command again")
    if len(live) > 1:
        pids = ", ".join(str(_pid_of(p)) for p in live)
        raise StateSocketError(f"several ray_lite programs are running (driver pids {pids}); "
                               f"choose one with --address PID")
    return live[0]


def _recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the connection closed mid-message")
        buf += chunk
    return bytes(buf)


def _send(sock, msg):
    import msgpack
    data = msgpack.packb(msg, use_bin_type=True, default=str)
    sock.sendall(_LEN.pack(len(data)) + data)


def _recv(sock):
    import msgpack
    (n,) = _LEN.unpack(_recv_exact(sock, _LEN.size))
    if n > MAX_MESSAGE:
        raise ConnectionError(f"a message of {n} bytes (limit {MAX_MESSAGE})")
    return msgpack.unpackb(_recv_exact(sock, n), raw=False, strict_map_key=False)


def request(address, msg, timeout=30.0):
    """Send ``msg`` (a dict) to the program at ``address``; its answer's
    ``result``, or ``StateSocketError`` with its error."""
    import socket
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        try:
            s.connect(address)
        except (FileNotFoundError, ConnectionRefusedError):
            raise StateSocketError(f"no running ray_lite program at {address}") from None
        try:
            _send(s, msg)
        except (BrokenPipeError, ConnectionResetError):
            pass    # refused before it read: the refusal is there to read
        answer = _recv(s)
    except (ConnectionError, OSError) as exc:   # socket.timeout is an OSError
        if isinstance(exc, StateSocketError):
            raise
        raise StateSocketError(f"the program at {address} did not answer: {exc}") from None
    finally:
        s.close()
    if "error" in answer:
        raise StateSocketError(answer["error"])
    return answer.get("result")


def _peer_uid(conn):
    import _socket
    creds = conn.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


class StateServer:
    """Listens at ``address``; ``handler(msg) -> result`` answers each request
    on this server's thread, which blocks in ``accept``."""

    def __init__(self, address, handler):
        self.address = address
        self._handler = handler
        # The C module: ``socket``'s Python layer costs ``import ray_lite`` ~2 ms.
        import _socket
        self._socket_mod = _socket
        if os.path.lexists(address):
            os.unlink(address)      # this pid's: left by a killed process of the same pid
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
        self._thread = threading.Thread(target=self._serve, name="ray_lite-state", daemon=True)
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
                if _peer_uid(conn) != os.getuid():
                    _send(conn, {"error": "refused: another user's connection"})
                    continue
                conn.settimeout(30.0)
                msg = _recv(conn)
                try:
                    answer = {"result": self._handler(msg)}
                except Exception as exc:   # noqa: BLE001 - the client gets the message
                    answer = {"error": f"{type(exc).__name__}: {exc}"}
                _send(conn, answer)
            except Exception:   # noqa: BLE001 - a client that went away or spoke nonsense
                continue    # a client that went away or spoke nonsense
            finally:
                conn.close()

    def close(self):
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
        if self._thread is not threading.current_thread():
            self._thread.join(5.0)


_server = None


def _answer(msg):
    return importlib.import_module(ANSWERS_MODULE).answer(msg)


def start():
    """Listen for this driver (at ``init``).  A program that cannot make its
    socket (no private directory) runs all the same, unreachable."""
    global _server
    if _server is not None:
        return _server
    try:
        directory = runtime_dir()
        _remove_dead(directory)
        _server = StateServer(os.path.join(directory, f"{_PREFIX}{os.getpid()}{_SUFFIX}"),
                              _answer)
    except (StateSocketError, OSError):
        _server = None
    return _server


def stop():
    """Stop listening (at ``shutdown``) and remove the socket."""
    global _server
    server, _server = _server, None
    if server is not None:
        server.close()


def current():
    """The running server of this process, or None."""
    return _server
