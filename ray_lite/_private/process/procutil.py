"""Process helpers: dying with the parent, process sentinels."""
import ctypes
import os
import select
import signal

_PR_SET_PDEATHSIG = 1
# Sent by the driver to a pool worker to interrupt the task it runs
# (``cancel(force=False)``).  A real-time signal: user code rarely uses them.
CANCEL_SIGNAL = signal.SIGRTMIN + 3
_libc = None


def _get_libc():
    global _libc
    if _libc is None:
        # By glibc's soname first: find_library runs ldconfig in a child
        # process (milliseconds, in the zygote before its first fork).
        try:
            _libc = ctypes.CDLL("libc.so.6", use_errno=True)
        except OSError:
            from ctypes.util import find_library
            _libc = ctypes.CDLL(find_library("c"), use_errno=True)
    return _libc


def die_with_parent(expected_parent, sig=signal.SIGKILL):
    """Ask the kernel to send ``sig`` to this process when its parent exits.

    The parent may already be gone by the time we ask (then the request
    would never fire), hence the check of ``getppid`` afterwards.
    """
    if _get_libc().prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(err)}")
    if os.getppid() != expected_parent:
        os._exit(1)


def open_sentinel(pid):
    """A file descriptor that becomes readable when ``pid`` exits, or None if it is gone.

    Works for processes that are not our children (pidfd, Linux >= 5.3).
    """
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return None


def readable_now(fds):
    """Those of ``fds`` readable at this moment (a sentinel: its process has exited).

    A sentinel that fired a moment ago is checked again with this before its
    peer is taken for dead: a handler run meanwhile may have closed it and
    opened another under the same number, for a live process (an actor's
    next incarnation, on ``RESTARTED``).
    """
    p = select.poll()
    for fd in fds:
        p.register(fd, select.POLLIN)
    return [fd for fd, _ in p.poll(0)]
