"""Ctrl-C in the driver without corrupting the runtime.

A ``KeyboardInterrupt`` is raised by Python at whatever bytecode the main
thread happens to run.  Raised inside the runtime's own bookkeeping (between
taking the drive lock and the ``try`` that releases it, halfway through
booking a task), it would leave the runtime hung for every later call.  Yet
it must end a blocking ``get``/``wait``/``next`` at once, as in Ray.

So, while the runtime runs in the driver, SIGINT goes through ``_on_sigint``:
when the innermost frame of ray_lite's own code is a *sleep point* (where a
wait sleeps: every state is consistent there) or when no runtime code is on
the stack, it raises as usual; inside any other runtime code it returns, and
has the signal sent again a moment later (from a short-lived thread: sent
from the handler itself, it would run the handler again at once, nested), so
that the interrupt is raised once that code is done (a short section:
microseconds).

Installed by ``init`` only over Python's default handler, and put back by
``shutdown``; a handler of the user's own is left alone.
"""
import _thread
import os
import signal
import threading
import time

_RUNTIME_DIRS = tuple(
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), d) + os.sep
    for d in ("_private", "_fast"))
_SLEEP_POINTS = set()       # code objects
_previous = None
_redelivery = [False]       # a resend is on its way
_RESEND_AFTER_S = 0.0005


def sleep_point(fn):
    """Mark ``fn`` as a place where an interrupt may be raised at once."""
    _SLEEP_POINTS.add(fn.__code__)
    return fn


def _innermost_runtime_code(frame):
    while frame is not None:
        code = frame.f_code
        if code in _SLEEP_POINTS:
            return code
        if code.co_filename.startswith(_RUNTIME_DIRS):
            return code
        frame = frame.f_back
    return None


def _resend(main_ident):
    time.sleep(_RESEND_AFTER_S)
    _redelivery[0] = False
    try:
        signal.pthread_kill(main_ident, signal.SIGINT)
    except (OSError, ValueError):
        pass


def _on_sigint(signum, frame):
    code = _innermost_runtime_code(frame)
    if code is None or code in _SLEEP_POINTS:
        raise KeyboardInterrupt
    # Inside the runtime's bookkeeping: come back when it is done.  A bare
    # thread: the threading module's locks may be what we interrupted.
    if not _redelivery[0]:
        _redelivery[0] = True
        _thread.start_new_thread(_resend, (threading.main_thread().ident,))


def install():
    """Route SIGINT through ``_on_sigint`` (main thread, default handler only)."""
    global _previous
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        current = signal.getsignal(signal.SIGINT)
    except ValueError:
        return
    if current is signal.default_int_handler:
        _register_ring_twin()
        signal.signal(signal.SIGINT, _on_sigint)
        _previous = current


def uninstall():
    global _previous
    if _previous is None or threading.current_thread() is not threading.main_thread():
        return
    try:
        if signal.getsignal(signal.SIGINT) is _on_sigint:
            signal.signal(signal.SIGINT, _previous)
    except ValueError:
        pass
    _previous = None


def _register_ring_twin():
    # The pure-Python ring sleeps in its own code (a futex through ctypes).
    from ray_lite._fast import ring
    if not ring.COMPILED:
        try:
            sleep_point(ring._impl.ShmRing._wait)
        except AttributeError:
            pass
