"""Shared fixtures: the twin fixtures and the leak check every test gets."""
import importlib
import os
import signal

import pytest

# Every segment this test session (and the processes it starts, which inherit
# the environment) creates carries this prefix, so the leak check below sees
# only ours, never those of another ray_lite on the machine.  Set before
# ray_lite is imported: shm reads it once.
os.environ.setdefault("RAY_LITE_SHM_PREFIX", f"rl_t{os.getpid()}_")
# Child interpreters the tests start (`python -c ...` in the checkout) must
# import the installed ray_lite, not the uncompiled source tree in the current
# directory (Python >= 3.11 honours this).
os.environ.setdefault("PYTHONSAFEPATH", "1")

from ray_lite._fast import NO_EXTENSIONS, shm  # noqa: E402

TWINS = ["compiled", "python"]


def load_twin_module(name, twin):
    """The ``_<name>_c`` or ``_<name>_py`` module of a hot path.

    A missing compiled twin fails the test (it should have been built) unless
    RAY_LITE_NO_EXTENSIONS asked for a pure-Python build, where it is skipped.
    """
    if twin == "python":
        return importlib.import_module(f"ray_lite._fast._{name}_py")
    if NO_EXTENSIONS:
        pytest.skip("RAY_LITE_NO_EXTENSIONS=1: compiled twins are not built")
    try:
        return importlib.import_module(f"ray_lite._fast._{name}_c")
    except ImportError as exc:
        pytest.fail(f"compiled twin of {name} should have been built but did not load: {exc}")


@pytest.fixture
def rt():
    """A fresh runtime for one test (init is fast, and the leak check is per
    test); yields the driver's node for tests that look inside."""
    import ray_lite
    from ray_lite._private import state

    ray_lite.init(num_cpus=2)
    try:
        yield state.node
    finally:
        ray_lite.shutdown()


@pytest.fixture(params=TWINS)
def codec_impl(request):
    return load_twin_module("codec", request.param)


@pytest.fixture(params=TWINS)
def ring_impl(request):
    return load_twin_module("ring", request.param)


@pytest.fixture(params=TWINS)
def stream_table_impl(request):
    return load_twin_module("stream_table", request.param)


def child_pids():
    """Live (or zombie) processes whose parent is this process."""
    me = os.getpid()
    pids = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name may contain spaces and parentheses; fields after the last ')'.
        fields = stat[stat.rindex(b")") + 2:].split()
        if int(fields[1]) == me:
            pids.add(int(entry))
    return pids


@pytest.fixture(autouse=True)
def leaves_nothing_behind():
    """Fail a test that leaves a child process or a ray_lite segment behind.

    What leaked is cleaned up (our own children, by PID; our segments) so one
    leaking test does not make the following ones fail too.
    """
    children_before = child_pids()
    segments_before = set(shm.list_segments())
    yield
    leaked_children = child_pids() - children_before
    leaked_segments = set(shm.list_segments()) - segments_before
    for pid in leaked_children:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
    for name in leaked_segments:
        shm.unlink_segment(name)
    problems = []
    if leaked_children:
        problems.append(f"child processes left running: {sorted(leaked_children)}")
    if leaked_segments:
        problems.append(f"shared-memory segments left behind: {sorted(leaked_segments)}")
    if problems:
        pytest.fail("; ".join(problems), pytrace=False)


# ------------------------------------------------------------------ Serve
@pytest.fixture
def serve_runtime():
    """A one-CPU runtime for a Serve test; Serve (if the test started it) and
    the runtime are shut down after."""
    import ray_lite
    from ray_lite import serve

    ray_lite.init(num_cpus=1)
    try:
        yield
    finally:
        try:
            serve.shutdown()
        finally:
            ray_lite.shutdown()


@pytest.fixture
def serve_port(serve_runtime):
    """Serve started on an ephemeral loopback port (one proxy, 10 s request
    timeout); yields the port."""
    from ray_lite import serve
    from ray_lite.serve.api import _http_port

    serve.start(http_options={"port": 0, "proxies": 1, "request_timeout_s": 10})
    yield _http_port()
