"""A pytest plugin: SIGTERM ends the run as Ctrl-C does, with every
fixture's teardown (the child processes, servers and runtimes the tests
started end with it).  Python's default SIGTERM kills at once and a
``ray-lite serve run`` a test started would outlive the run (a CI
timeout, a ``kill`` of a stuck run).

Only in the run's own process.  A process forked from it (a
``multiprocessing`` worker) gets SIGTERM's default action back at once.
A Python handler only runs at the process's next check for signals: one
that lands as a pool worker is about to block (in the wait for the queue's
lock, which ``terminate()`` holds) is never acted on, and the pool's
``terminate()`` waits for that worker for ever."""
import os
import signal


def _default_sigterm_in_child():
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    except ValueError:      # (not the child's main thread: not expected)
        pass


def pytest_configure(config):
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        os.register_at_fork(after_in_child=_default_sigterm_in_child)
