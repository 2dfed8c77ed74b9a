"""Waiting primitives of the pure-Python shared-memory channels (the SPSC
ring's and the broadcast queue's pure twins), through ctypes: futex sleep and
wake on a word of a shared mapping, a full fence and an atomic increment
(libatomic, when the system has it), the CPU we run on, and process liveness.
The compiled twins use the C versions in ``_wait.pxd``.
"""
import ctypes
import errno
import os
import select
import time

from . import shm

__all__ = [
    "futex_wait", "futex_wake", "HAVE_FENCE", "full_fence", "fetch_add_u32", "sched_getcpu",
    "open_pidfd", "process_alive",
]

_FUTEX_WAIT = 0
_FUTEX_WAKE = 1
_SYS_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}.get(os.uname().machine.lower())


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


try:
    _libc = ctypes.CDLL(None, use_errno=True)
    _syscall = _libc.syscall
    _syscall.restype = ctypes.c_long
except (OSError, AttributeError):  # pragma: no cover - no libc
    _libc = None
    _SYS_FUTEX = None


def futex_wait(addr, expected, timeout_ns):
    """Sleep while the u32 at ``addr`` equals ``expected``, at most ``timeout_ns``.

    Not a private futex: the word lives in memory shared by two processes.
    Without futex (another architecture) it is a plain timed sleep: a slice
    then ends the wait, which the callers treat like a spurious wake-up.
    Returns an errno-like code: 0 woken, ETIMEDOUT, EAGAIN (the word had
    changed), EINTR; all mean "look again".
    """
    if _SYS_FUTEX is None:
        time.sleep(timeout_ns / 1e9)
        return errno.ETIMEDOUT
    timeout_ns = max(0, int(timeout_ns))
    ts = _Timespec(timeout_ns // 1_000_000_000, timeout_ns % 1_000_000_000)
    # ctypes releases the GIL for the call.
    r = _syscall(_SYS_FUTEX, ctypes.c_void_p(addr), _FUTEX_WAIT, ctypes.c_uint32(expected),
                 ctypes.byref(ts), None, 0)
    return 0 if r == 0 else ctypes.get_errno()


def futex_wake(addr):
    """Wake every sleeper on the u32 at ``addr``."""
    if _SYS_FUTEX is not None:
        _syscall(_SYS_FUTEX, ctypes.c_void_p(addr), _FUTEX_WAKE, 0x7FFFFFFF, None, None, 0)


try:
    _sched_getcpu = _libc.sched_getcpu
    _sched_getcpu.restype = ctypes.c_int
    _sched_getcpu.argtypes = []
except AttributeError:  # pragma: no cover - no libc, or no sched_getcpu
    _sched_getcpu = None


def sched_getcpu():
    """The CPU this thread runs on, -1 when unknown."""
    return _sched_getcpu() if _sched_getcpu is not None else -1


# Python has no fences; libatomic's out-of-line ones give the store-load
# ordering that a sleep handshake needs ("I changed the state" before "does
# anybody sleep?", and the mirror image on the sleeper's side).
_SEQ_CST = 5


def _load_libatomic():
    # By its soname first: find_library runs ldconfig in a child process
    # (milliseconds, and this module loads with ray_lite).
    try:
        return ctypes.CDLL("libatomic.so.1")
    except OSError:
        from ctypes.util import find_library
        name = find_library("atomic")
        if name is None:
            raise
        return ctypes.CDLL(name)


try:
    _libatomic = _load_libatomic()
    _atomic_fence = _libatomic.atomic_thread_fence
    _atomic_fence.argtypes = [ctypes.c_int]
    _atomic_fence.restype = None
    _fetch_add_4 = _libatomic.__atomic_fetch_add_4
    _fetch_add_4.argtypes = [ctypes.c_void_p, ctypes.c_uint, ctypes.c_int]
    _fetch_add_4.restype = ctypes.c_uint
except (OSError, AttributeError):  # pragma: no cover (no libatomic on this system)
    _atomic_fence = _fetch_add_4 = None

#: Whether full_fence() fences; without it a wake-up may be lost, and the
#: callers bound the cost by sleeping in short slices.
HAVE_FENCE = _atomic_fence is not None


def full_fence():
    """A sequentially consistent fence (nothing without libatomic: see HAVE_FENCE)."""
    if _atomic_fence is not None:
        _atomic_fence(_SEQ_CST)


def fetch_add_u32(addr, value):
    """Atomically add ``value`` to the u32 at ``addr``; False without libatomic (nothing done)."""
    if _fetch_add_4 is None:
        return False
    _fetch_add_4(addr, value, _SEQ_CST)
    return True


def open_pidfd(pid):
    """A pidfd of ``pid`` (readable once it exits), or -1 (no such process, or no pidfds)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return -1


def process_alive(pid, pidfd):
    """False once ``pid`` has exited (a zombie counts as exited); ``pidfd`` -1 if none."""
    if pidfd >= 0:
        p = select.poll()
        p.register(pidfd, select.POLLIN)
        return not any(ev & select.POLLIN for _, ev in p.poll(0))
    if not shm.pid_alive(pid):
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return stat[stat.rindex(b")") + 2:stat.rindex(b")") + 3] not in (b"Z", b"X")
    except (OSError, ValueError):
        return False
