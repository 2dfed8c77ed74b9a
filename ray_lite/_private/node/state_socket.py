"""The driver's state socket: how ``ray-lite status``, ``ray-lite list``,
``ray-lite summary`` and ``ray-lite dashboard`` reach a running program from
another terminal.

Each driver listens on ``state-<pid>.sock`` in this user's private directory
(``links/local_socket.py``: the directory, the framing, the peer check; the
directory of Serve's control sockets too).  The answers are made by
``ANSWERS_MODULE`` (above the core: the state API, Serve's status),
imported by its name on the first request, so a program nobody asks
imports nothing more.  The socket of a driver that was killed (which cannot
remove it) is removed by the next driver that starts and by every client
looking for one.
"""
import importlib
import os

from ..links import local_socket
from ..links.local_socket import LocalSocketError

__all__ = ["StateSocketError", "runtime_dir", "socket_path", "live_sockets", "find_address",
           "request", "StateServer", "start", "stop", "current"]

ANSWERS_MODULE = "ray_lite.dashboard.data"
MAX_MESSAGE = 64 * 1024 * 1024
_PREFIX = "state-"


class StateSocketError(LocalSocketError):
    """No running program to ask, or it could not be reached."""


def runtime_dir():
    """This user's private directory for sockets (see ``local_socket``)."""
    return local_socket.runtime_dir(StateSocketError)


def socket_path(pid=None):
    """Where the driver with ``pid`` (default: this process) listens."""
    return os.path.join(runtime_dir(), f"{_PREFIX}{pid or os.getpid()}.sock")


def live_sockets():
    """The sockets of this user's running programs, by their driver's pid;
    those of drivers that are gone are removed on the way."""
    return local_socket.live(runtime_dir(), _PREFIX)


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
        pids = ", ".join(str(local_socket.pid_of(p, _PREFIX)) for p in live)
        raise StateSocketError(f"several ray_lite programs are running (driver pids {pids}); "
                               f"choose one with --address PID")
    return live[0]


def request(address, msg, timeout=30.0):
    """Send ``msg`` (a dict) to the program at ``address``; its answer's
    ``result``, or ``StateSocketError`` with its error."""
    answer = local_socket.request(address, msg, timeout, MAX_MESSAGE, StateSocketError,
                                  "ray_lite program")
    if "error" in answer:
        raise StateSocketError(answer["error"])
    return answer.get("result")


class StateServer(local_socket.LocalServer):
    """Listens at ``address``; ``handler(msg) -> result`` answers each request
    on this server's thread, which blocks in ``accept``."""

    def __init__(self, address, handler):
        if os.path.lexists(address):
            os.unlink(address)      # this pid's: left by a killed process of the same pid
        super().__init__(address, lambda msg: {"result": handler(msg)}, MAX_MESSAGE,
                         "ray_lite-state")


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
        local_socket.remove_dead(runtime_dir(), _PREFIX)    # left by drivers that were killed
        _server = StateServer(socket_path(), _answer)
    except (StateSocketError, OSError):
        _server = None
    return _server


def stop():
    """Stop listening (at ``shutdown``) and remove the socket."""
    global _server
    server, _server = _server, None
    if server is not None:
        server.close()
        server.join()


def current():
    """The running server of this process, or None."""
    return _server
