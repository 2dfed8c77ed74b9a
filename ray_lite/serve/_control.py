"""The local control endpoint of a running Serve instance.

``ray-lite serve run`` / ``serve start`` listen on a Unix socket so that
``serve status``, ``serve deploy`` and ``serve shutdown`` (other processes)
can reach them: ``serve-<pid>.sock`` in this user's private directory
(``_private/links/local_socket.py``: the directory, the framing, the peer
check) unless ``--address`` names another path.  A client without
``--address`` uses the one live instance there (and asks for ``--address``
when there are several).  The socket of an instance whose process is gone
(one killed by SIGKILL cannot remove it) is removed by the next instance
that starts and by every client command.
"""
import os

from ray_lite._private.links import local_socket
from ray_lite._private.links.local_socket import LocalSocketError

MAX_MESSAGE = 16 * 1024 * 1024
_PREFIX = "serve-"


class ControlError(LocalSocketError):
    """No instance to talk to, or it could not be reached."""


def runtime_dir():
    """This user's directory for control sockets (see ``local_socket``)."""
    return local_socket.runtime_dir(ControlError)


def default_address():
    """Where this process's instance listens unless told otherwise."""
    return os.path.join(runtime_dir(), f"{_PREFIX}{os.getpid()}.sock")


def remove_stale_sockets():
    """Remove this user's control sockets whose instance's process is gone;
    the sockets of the instances that answer."""
    return local_socket.live(runtime_dir(), _PREFIX)


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


def request(address, msg, timeout=None):
    """Send ``msg`` to the instance at ``address``; its answer (a dict)."""
    return local_socket.request(address, msg, timeout, MAX_MESSAGE, ControlError,
                                "Serve instance")


class ControlServer(local_socket.LocalServer):
    """Listens at ``address``; ``handler(msg) -> dict`` answers each request
    (called on this server's thread, which blocks in ``accept``)."""

    def __init__(self, address, handler):
        try:
            remove_stale_sockets()      # left by instances that were killed
        except ControlError:
            pass    # (no private folder: an --address elsewhere is used all the same)
        if os.path.exists(address):
            if local_socket.answers(address):
                raise ControlError(f"a Serve instance already listens at {address}")
            os.unlink(address)      # left by an instance that died
        super().__init__(address, handler, MAX_MESSAGE, "serve-control")
