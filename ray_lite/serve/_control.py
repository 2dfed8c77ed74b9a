"""The local control endpoint of a running Serve instance.

``ray-lite serve run`` / ``serve start`` listen on a Unix socket so that
``serve status``, ``serve deploy`` and ``serve shutdown`` (other processes)
can reach them.  The socket lives in a per-user directory (mode 0700:
``$XDG_RUNTIME_DIR/ray_lite``, else ``/tmp/ray_lite-<uid>``) as
``serve-<pid>.sock`` unless ``--address`` names another path; a client
without ``--address`` uses the one live instance there (and asks for
``--address`` when there are several).  The socket of an instance whose
process is gone (one killed by SIGKILL cannot remove it) is removed by the
next instance that starts and by every client command.  A connection from
another user is refused (``SO_PEERCRED``), on top of the directory's and
the socket's permissions.  No TCP port is opened.

A message is a msgpack map preceded by its length (4 bytes, big-endian); the
server answers each request with one such map and closes the connection.
"""
import glob
import os
import socket
import struct
import threading

import msgpack

from ray_lite._fast import shm

from ._core import recv_exact

_LEN = struct.Struct(">I")
MAX_MESSAGE = 16 * 1024 * 1024


class ControlError(RuntimeError):
    """No instance to talk to, or it could not be reached."""


def runtime_dir():
    """This user's directory for control sockets (created 0700; refused when
    someone else owns it or others may write in it)."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    if base and os.path.isdir(base):
        path = os.path.join(base, "ray_lite")
    else:
        path = os.path.join("/tmp", f"ray_lite-{os.getuid()}")
    try:
        return shm.private_dir(path)
    except shm.SharedPathError as exc:
        raise ControlError(f"not a private directory of this user: {exc}") from None


def default_address():
    """Where this process's instance listens unless told otherwise."""
    return os.path.join(runtime_dir(), f"serve-{os.getpid()}.sock")


def _alive(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(2.0)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def _owner_gone(path):
    """Whether ``serve-<pid>.sock``'s process no longer exists (an instance
    killed before it could remove its socket)."""
    name = os.path.basename(path)
    pid = name[len("serve-"):-len(".sock")]
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:
        pass        # another user's process: that pid is not ours to judge
    return False


def remove_stale_sockets():
    """Remove this user's control sockets whose instance's process is gone;
    the sockets of the instances that answer."""
    live = []
    for p in sorted(glob.glob(os.path.join(runtime_dir(), "serve-*.sock"))):
        if _alive(p):
            live.append(p)
        elif _owner_gone(p):
            try:
                os.unlink(p)
            except OSError:
                pass
    return live


def find_address(address=None):
    """The control socket to use: ``address``, else the one live instance of
    this user; ``ControlError`` saying why there is none.  Sockets of
    instances whose process is gone are removed on the way."""
    if address:
        return address
    live = remove_stale_sockets()
    if not live:
        raise ControlError("no running Serve instance found (start one with "
                           "`ray-lite serve run` or `ray-lite serve start`)")
    if len(live) > 1:
        raise ControlError("several Serve instances are running; choose one with "
                           "--address: " + ", ".join(live))
    return live[0]


def _send(sock, msg):
    data = msgpack.packb(msg, use_bin_type=True)
    sock.sendall(_LEN.pack(len(data)) + data)


def _recv(sock):
    try:
        (n,) = _LEN.unpack(recv_exact(sock, _LEN.size))
        if n > MAX_MESSAGE:
            raise ConnectionError(f"a control message of {n} bytes (limit {MAX_MESSAGE})")
        return msgpack.unpackb(recv_exact(sock, n), raw=False)
    except EOFError:
        raise ConnectionError("the connection closed mid-message") from None


def request(address, msg, timeout=None):
    """Send ``msg`` to the instance at ``address``; its answer (a dict)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        try:
            s.connect(address)
        except (FileNotFoundError, ConnectionRefusedError):
            raise ControlError(f"no running Serve instance at {address}") from None
        _send(s, msg)
        return _recv(s)
    except (ConnectionError, socket.timeout) as exc:
        raise ControlError(f"the Serve instance at {address} did not answer: {exc}") from None
    finally:
        s.close()


def _peer_uid(conn):
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


class ControlServer:
    """Listens at ``address``; ``handler(msg) -> dict`` answers each request
    (called on this server's thread, which blocks in ``accept``)."""

    def __init__(self, address, handler):
        self.address = address
        self._handler = handler
        try:
            remove_stale_sockets()      # left by instances that were killed
        except ControlError:
            pass    # (no private folder: an --address elsewhere is used all the same)
        if os.path.exists(address):
            if _alive(address):
                raise ControlError(f"a Serve instance already listens at {address}")
            os.unlink(address)      # left by an instance that died
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)     # the socket is created 0600
        try:
            sock.bind(address)
        finally:
            os.umask(old_umask)
        sock.listen(8)
        self._sock = sock
        self._ino = os.stat(address).st_ino
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="serve-control", daemon=True)
        self._thread.start()

    def _serve(self):
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return      # closed
            try:
                with conn:
                    if _peer_uid(conn) != os.getuid():
                        _send(conn, {"error": "refused: another user's connection"})
                        continue
                    conn.settimeout(30.0)
                    msg = _recv(conn)
                    conn.settimeout(None)
                    try:
                        answer = self._handler(msg)
                    except Exception as exc:   # noqa: BLE001 - the client gets the message
                        answer = {"error": f"{type(exc).__name__}: {exc}"}
                    _send(conn, answer)
            except (OSError, ValueError, msgpack.UnpackException):
                continue    # a client that went away or spoke nonsense

    def close(self):
        if self._closed:
            return
        self._closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        try:
            if os.stat(self.address).st_ino == self._ino:
                os.unlink(self.address)
        except OSError:
            pass
        # Not joined here: its thread may be answering a shutdown request,
        # which completes after this returns (see ``join``).

    def join(self, timeout=5.0):
        """Wait until the thread has sent its last answer (after ``close``)."""
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)
