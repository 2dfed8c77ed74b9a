"""The proxies' listening socket: one port that every proxy of one Serve
instance shares (SO_REUSEPORT), and no one else.

The first proxy makes sure the port is free before it binds with
SO_REUSEPORT: a second ``ray-lite serve run`` on a port already serving must
fail with "address already in use", as any server does, instead of having the
kernel split the traffic between two applications.

A socket that leaves the port's listeners while the others stay (a replica
of a redeployed application stopping, a proxy stepping aside) would have
the kernel reset the connections it queued on that socket between the
owner's last ``accept`` and the ``close``, and the handshakes still under way
on it.  ``refuse_syns`` closes that window: from then on the kernel drops
the SYNs the port's hash sends to this socket, so no connection starts on
it; its client sends the SYN again a second later and that lands on a
socket still listening.  Where the kernel moves such connections itself
(Linux 5.14+, ``net.ipv4.tcp_migrate_req=1``) it is left to do so.
"""
import ctypes
import socket
import struct
import sys

# <linux/filter.h>: a classic BPF socket filter (asm-generic numbers, those
# of x86 and arm).  Run on a segment with its TCP header at offset 0.
_SO_ATTACH_FILTER = 26
_SO_DETACH_FILTER = 27
_SYN_DROPPING = (
    (0x30, 0, 0, 13),            # ldb [13]: the TCP flags
    (0x45, 0, 1, 0x02),          # jset #SYN: next (drop), else skip one (keep)
    (0x06, 0, 0, 0),             # ret #0: drop the segment
    (0x06, 0, 0, 0xFFFFFFFF),    # ret #-1: keep it whole
)
_MIGRATE_SYSCTL = "/proc/sys/net/ipv4/tcp_migrate_req"

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


def _kernel_migrates():
    try:
        with open(_MIGRATE_SYSCTL, "rb") as f:
            return f.read().strip() == b"1"
    except OSError:
        return False


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8),
                ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def refuse_syns(sock):
    """From now on the kernel drops the SYNs that reach listening socket
    ``sock`` (the port's other sockets take them when sent again); the
    handshakes under way and the connections queued on it are not touched.
    True if it does; False where it cannot or need not (not Linux, the
    kernel moves such connections itself, or the filter was refused: the
    socket then queues as before)."""
    if not sys.platform.startswith("linux") or _kernel_migrates():
        return False
    code = (_SockFilter * len(_SYN_DROPPING))(*[_SockFilter(*i) for i in _SYN_DROPPING])
    prog = _SockFprog(len(_SYN_DROPPING), code)
    try:
        sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, bytes(prog))
    except OSError:
        return False
    return True


def take_syns(sock):
    """Undo ``refuse_syns``: ``sock`` takes new connections again."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, _SO_DETACH_FILTER, struct.pack("i", 0))
    except OSError:     # ENOENT: none attached
        pass
