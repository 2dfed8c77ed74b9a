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

A pool worker's cancel signal follows the same rule (``in_runtime_section``
and ``resend_later``): a task's ``KeyboardInterrupt`` is raised in the
task's own code, never inside the runtime code that code called (a
``.remote()``, a ``put``, a ref's release), which would be cut short
halfway through booking a call.

A signal must also *wake* the main thread's sleep in the runtime.  Python
runs a signal's handler when the main thread next runs bytecode; a sleep in
``poll`` ends early only if the signal lands in that thread during that
system call (EINTR).  One that lands a moment before the call, after the
last check (a worker that sends it as soon as its task starts, woken by our
own message: on a busy machine, a common moment), or in another thread,
would leave a wait with no time limit asleep for good.  So ``init`` also
makes a pipe the signal wake-up descriptor (``signal.set_wakeup_fd``, unless
one is set), into which Python's C-level handler writes whichever thread it
runs on, and the main thread's sleeps watch it (``signal_wakeup_fd``).  That
serves every handler, the user's own too (a SIGTERM that shuts down).
"""
import _thread
import os
import signal
import sys
import threading
import time

# The runtime's own files: the package's _private and _fast folders (this
# file is in _private/process).
_RUNTIME_DIRS = tuple(
    os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                 d) + os.sep
    for d in ("_private", "_fast"))
# The standard library: a runtime section may call it (pickle, a lock), and
# the runtime calls user code through it (asyncio's loop).
_STDLIB = sys.stdlib_module_names
_SLEEP_POINTS = set()       # code objects
_previous = None
_redelivery = set()         # the signals whose resend is on its way
_RESEND_AFTER_S = 0.0005
_MAIN_IDENT = threading.main_thread().ident
_wakeup = [-1, -1]          # the wake-up pipe (read end, write end), ours while set


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


def in_runtime_section(frame, outermost):
    """Whether the main thread, interrupted at ``frame``, is in the runtime's
    own code that user code called, and not asleep at one of its sleep
    points.  The walk outward stops at a frame of the code object
    ``outermost`` (the process's entry, which calls the user's code): the
    runtime's frames between it and the user's (the task runner, a
    wrapper) are not such a section."""
    in_runtime = False
    while frame is not None:
        code = frame.f_code
        if code is outermost:
            return False
        filename = code.co_filename
        if filename.startswith(_RUNTIME_DIRS):
            if not in_runtime and code in _SLEEP_POINTS:
                return False
            in_runtime = True
        elif in_runtime and (frame.f_globals.get("__name__") or "").partition(".")[0] \
                not in _STDLIB:
            return True         # user code (or a library it uses) called it
        frame = frame.f_back
    return False


def resend_later(signum):
    """Have ``signum`` sent to the main thread again a moment from now (once,
    however often asked meanwhile): for a handler that found the runtime's
    own code interrupted, to act once that code is done.  A bare thread: the
    threading module's locks may be what was interrupted."""
    if signum not in _redelivery:
        _redelivery.add(signum)
        _thread.start_new_thread(_resend, (threading.main_thread().ident, signum))


def _resend(main_ident, signum):
    time.sleep(_RESEND_AFTER_S)
    _redelivery.discard(signum)
    try:
        signal.pthread_kill(main_ident, signum)
    except (OSError, ValueError):
        pass


def _on_sigint(signum, frame):
    code = _innermost_runtime_code(frame)
    if code is None or code in _SLEEP_POINTS:
        raise KeyboardInterrupt
    # Inside the runtime's bookkeeping: come back when it is done.
    resend_later(signal.SIGINT)


def install():
    """Route SIGINT through ``_on_sigint`` (main thread, default handler only),
    and have signals wake the main thread's sleeps (see the module's docstring)."""
    global _previous
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        current = signal.getsignal(signal.SIGINT)
    except ValueError:
        return
    _watch_signal_wakeups()
    if current is signal.default_int_handler:
        _register_ring_twin()
        signal.signal(signal.SIGINT, _on_sigint)
        _previous = current


def uninstall():
    global _previous
    if threading.current_thread() is not threading.main_thread():
        return
    _unwatch_signal_wakeups()
    if _previous is None:
        return
    try:
        if signal.getsignal(signal.SIGINT) is _on_sigint:
            signal.signal(signal.SIGINT, _previous)
    except ValueError:
        pass
    _previous = None


def signal_wakeup_fd():
    """The descriptor a signal makes readable, for the main thread's sleeps to
    watch (-1 in other threads, or when another wake-up descriptor is set)."""
    return _wakeup[0] if _thread.get_ident() == _MAIN_IDENT else -1


def drain_signal_wakeups(fd):
    """Empty the wake-up pipe ``fd`` (its bytes are signal numbers Python also
    keeps: the handlers run anyway)."""
    try:
        while os.read(fd, 512):
            pass
    except OSError:     # empty (BlockingIOError), or closed by shutdown
        pass


def _watch_signal_wakeups():
    if _wakeup[0] >= 0:
        return
    r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        # A full pipe only means wake-ups are already pending: no warning.
        old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except ValueError:
        old = None
    if old != -1:
        # Someone's own (an event loop's): theirs serves the same purpose.
        if old is not None:
            signal.set_wakeup_fd(old)
        os.close(r)
        os.close(w)
        return
    _wakeup[:] = [r, w]


def _unwatch_signal_wakeups():
    r, w = _wakeup
    if r < 0:
        return
    _wakeup[:] = [-1, -1]
    try:
        current = signal.set_wakeup_fd(-1)
        if current != w:            # replaced since: put the other one back
            signal.set_wakeup_fd(current)
    except ValueError:
        pass
    os.close(r)
    os.close(w)


def _register_ring_twin():
    # The pure-Python ring sleeps in its own code (a futex through ctypes).
    from ray_lite._fast import ring
    if not ring.COMPILED:
        try:
            sleep_point(ring._impl.ShmRing._wait)
        except AttributeError:
            pass
