"""A SIGTERM to a test run ends it with every fixture's teardown
(``sigterm_teardown``), so the processes its tests started end too."""
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap

from serve_helpers import process_gone, wait_until

_TESTS = textwrap.dedent('''
    import subprocess, sys, time
    import pytest

    @pytest.fixture
    def child():
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        with open(sys.argv[-1] + ".pid", "w") as f:
            f.write(str(proc.pid))
        yield proc
        proc.kill()
        proc.wait()

    def test_waits(child):
        while True:
            time.sleep(0.05)
''')


def test_a_terminated_run_tears_its_fixtures_down(tmp_path):
    test_file = tmp_path / "test_waits.py"
    test_file.write_text(_TESTS)
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=here + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            "-p", "sigterm_teardown", "--rootdir", str(tmp_path),
                            "-c", os.devnull, str(test_file)],
                           cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    pid_file = tmp_path / "test_waits.py.pid"
    child = None
    try:
        wait_until(lambda: pid_file.exists() and pid_file.read_text(), "the test's child to start")
        child = int(pid_file.read_text())
        run.send_signal(signal.SIGTERM)
        out, _ = run.communicate(timeout=60)
        assert run.returncode == 2, out       # interrupted, as by Ctrl-C
        wait_until(lambda: process_gone(child), "the test's child to end", timeout=10)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        if child is not None and not process_gone(child):
            os.kill(child, signal.SIGKILL)      # (this test's own grandchild)


def _waits_for_ever(ready, disposition):
    disposition.value = signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    ready.set()
    signal.pause()


def test_a_process_forked_from_the_run_ends_on_sigterm():
    # It gets SIGTERM's default action back at the fork: a multiprocessing
    # pool's terminate() relies on SIGTERM ending its workers, even one
    # stuck where no Python handler would run (it hung in B17's test).
    ctx = multiprocessing.get_context("fork")
    ready, disposition = ctx.Event(), ctx.Value("b", 0)
    proc = ctx.Process(target=_waits_for_ever, args=(ready, disposition))
    proc.start()
    try:
        assert ready.wait(60)
        assert disposition.value == 1
        proc.terminate()
        proc.join(60)
        assert proc.exitcode == -signal.SIGTERM
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join(10)
