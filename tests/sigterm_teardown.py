"""A pytest plugin: SIGTERM ends the run as Ctrl-C does, with every
fixture's teardown (the child processes, servers and runtimes the tests
started end with it).  Python's default SIGTERM kills at once and a
``ray-lite serve run`` a test started would outlive the run (a CI
timeout, a ``kill`` of a stuck run).

Only in the run's own process: one forked from it (a ``multiprocessing``
worker) inherits the handler, and a worker that got KeyboardInterrupt
where it expected to die hangs its pool's ``terminate()``.  There SIGTERM
ends the process, as by default."""
import os
import signal


def pytest_configure(config):
    if signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        return
    run_pid = os.getpid()

    def on_sigterm(signum, frame):
        if os.getpid() != run_pid:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_sigterm)
