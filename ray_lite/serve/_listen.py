"""The proxies' listening socket: one port that every proxy of one Serve
instance shares (SO_REUSEPORT), and no one else.

The first proxy makes sure the port is free before it binds with
SO_REUSEPORT: a second ``ray-lite serve run`` on a port already serving must
fail with "address already in use", as any server does, instead of having the
kernel split the traffic between two applications.
"""
import socket

from .exceptions import RayServeException


def family_of(host):
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def check_free(host, port):
    """Raise ``RayServeException`` naming ``host:port`` if another socket
    holds it: said once, before any proxy starts, rather than as each
    proxy's death."""
    try:
        free_port(family_of(host), host, port)
    except OSError as exc:
        raise RayServeException(
            f"HTTP cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def free_port(family, host, port):
    """``port`` (a free one for 0) if no socket holds it, else EADDRINUSE:
    a bind without SO_REUSEPORT shares the port with no one."""
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))
        return probe.getsockname()[1]


def shared_socket(family, host, port):
    """A socket bound to ``(host, port)`` that the other proxies share (SO_REUSEPORT)."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock
