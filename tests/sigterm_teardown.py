"""A pytest plugin: SIGTERM ends the run as Ctrl-C does, with every
fixture's teardown (the child processes, servers and runtimes the tests
started end with it).  Python's default SIGTERM kills at once and a
``ray-lite serve run`` a test started would outlive the run (a CI
timeout, a ``kill`` of a stuck run)."""
import signal


def pytest_configure(config):
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, signal.default_int_handler)
