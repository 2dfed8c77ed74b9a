"""Shared fixtures: the twin fixtures, the backend and the leak check every test gets.

``--backend=ray`` (or ``RAY_LITE_BACKEND=ray`` in the environment) runs the
tests marked ``both_backends`` on Ray instead of ray_lite's own runtime: one
local Ray for the whole session (Ray takes seconds to start), which the core
fixtures (``rt``) hand to the tests.  A test (or module) marked
``both_backends`` uses only the public API; ``local_only`` inside such a
module marks a test of what only ray_lite does (its internals, its own
refusals).  Without Ray installed, ``--backend=ray`` skips them all.
"""
import importlib
import os
import signal
import sys

import pytest

# Every segment this test session (and the processes it starts, which inherit
# the environment) creates carries this prefix, so the leak check below sees
# only ours, never those of another ray_lite on the machine.  Set before
# ray_lite is imported: shm reads it once.
TEST_SHM_PREFIX = "rl_t"
os.environ.setdefault("RAY_LITE_SHM_PREFIX", f"{TEST_SHM_PREFIX}{os.getpid()}_")
# Child interpreters the tests start (`python -c ...` in the checkout) must
# import the installed ray_lite, not the uncompiled source tree in the current
# directory (Python >= 3.11 honours this).
os.environ.setdefault("PYTHONSAFEPATH", "1")

# The tests live in one folder per layer (fast, core, util, executor, serve,
# bench, package); the helpers they share (procs.py, serve_helpers.py, ...)
# live here.  Workers start with the driver's sys.path, so they find both.
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if TESTS_DIR not in sys.path:
    sys.path.insert(0, TESTS_DIR)

from ray_lite._fast import NO_EXTENSIONS, shm  # noqa: E402

pytest_plugins = ["sigterm_teardown"]

TWINS = ("compiled", "python")


class Twin:
    """One of the two implementations of the hot paths (``ray_lite._fast``):
    ``Twin("compiled")`` (the ``_x_c`` extension modules) or
    ``Twin("python")`` (the ``_x_py`` modules).

    ``str(twin)`` is its name, which child processes take on their command line.
    """

    __slots__ = ("name",)

    def __init__(self, name):
        if name not in TWINS:
            raise ValueError(f"no twin {name!r}: {TWINS}")
        self.name = name

    @property
    def compiled(self):
        return self.name == "compiled"

    @property
    def suffix(self):
        """The module suffix: ``"c"`` or ``"py"``."""
        return "c" if self.compiled else "py"

    @property
    def other(self):
        return Twin("python" if self.compiled else "compiled")

    def check(self):
        """This twin, unless RAY_LITE_NO_EXTENSIONS asked for a pure-Python
        build and it is the compiled one: the test is skipped then."""
        if self.compiled and NO_EXTENSIONS:
            pytest.skip("RAY_LITE_NO_EXTENSIONS=1: compiled twins are not built")
        return self

    def module(self, hot_path):
        """``ray_lite._fast._<hot_path>_c`` or ``_py``.

        A compiled twin that does not load fails the test (it should have
        been built), unless ``check`` skips it.
        """
        self.check()
        try:
            return importlib.import_module(f"ray_lite._fast._{hot_path}_{self.suffix}")
        except ImportError as exc:
            if not self.compiled:
                raise
            pytest.fail(f"compiled twin of {hot_path} should have been built but did not load: {exc}")

    def __str__(self):
        return self.name

    def __repr__(self):
        return f"Twin({self.name!r})"


@pytest.fixture(params=TWINS)
def twin(request):
    """Each twin in turn; the per-hot-path fixtures below build on it."""
    return Twin(request.param)


def _twin_module_fixture(hot_path):
    """The fixture ``<hot_path>_impl``: that hot path's module of ``twin``."""
    def impl(twin):
        return twin.module(hot_path)
    impl.__doc__ = f"``ray_lite._fast._{hot_path}_c`` or ``_py``, as ``twin`` says."
    return pytest.fixture(name=f"{hot_path}_impl")(impl)


codec_impl = _twin_module_fixture("codec")
ring_impl = _twin_module_fixture("ring")
stream_table_impl = _twin_module_fixture("stream_table")
broadcast_impl = _twin_module_fixture("broadcast")
link_impl = _twin_module_fixture("link")
pool_book_impl = _twin_module_fixture("pool_book")
task_runner_impl = _twin_module_fixture("task_runner")
http_conn_impl = _twin_module_fixture("http_conn")


@pytest.fixture
def pair(ring_impl):
    """A producer and a consumer end of one small ring (4 KiB), in this process."""
    producer = ring_impl.ShmRing.create(4096, side="producer")
    consumer = ring_impl.ShmRing.attach(producer.name, side="consumer")
    yield producer, consumer
    producer.close()
    consumer.close()


@pytest.fixture(params=TWINS)
def peer_twin(request):
    """Each twin in turn for a child process, independently of ``twin``
    (a compiled end talks to a pure-Python one); checked as ``Twin.check``."""
    return Twin(request.param).check()


@pytest.fixture
def twin_pair():
    """``(Twin("compiled"), Twin("python"))``, for tests that compare or
    connect the two (skipped as ``Twin.check`` says)."""
    return Twin("compiled").check(), Twin("python")


# ------------------------------------------------------------------ backend
RAY_NUM_CPUS = 2


def pytest_addoption(parser):
    parser.addoption("--backend", choices=("local", "ray"), default=None,
                     help="run the tests marked both_backends on this backend (default: "
                          "RAY_LITE_BACKEND, else local)")


def pytest_configure(config):
    # A shell starts a background job with SIGINT ignored, and Python then
    # leaves it so: the tests that send themselves or their children a
    # Ctrl-C need Python's handler (children inherit a handler as the default).
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    config.addinivalue_line("markers", "both_backends: uses only the public API; runs on Ray "
                                       "too with --backend=ray")
    config.addinivalue_line("markers", "local_only: tests what only ray_lite's own runtime "
                                       "does (excluded from --backend=ray)")


def backend_under_test(config):
    """``"ray"`` or ``"local"``: what this test run tests."""
    return config.getoption("--backend") or os.environ.get("RAY_LITE_BACKEND") or "local"


def pytest_collection_modifyitems(config, items):
    if backend_under_test(config) != "ray":
        return
    keep, drop = [], []
    for item in items:
        neutral = item.get_closest_marker("both_backends") is not None \
            and item.get_closest_marker("local_only") is None
        (keep if neutral else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep




@pytest.fixture(scope="session")
def ray_session(request):
    """The one Ray of a ``--backend=ray`` session (shut down at its end)."""
    import ray_lite
    try:
        import ray  # noqa: F401
    except ImportError:
        pytest.skip("--backend=ray: Ray is not installed (pip install 'ray_lite[ray]')")
    # Ray's workers import the tests' modules (their functions travel by
    # reference); they inherit the environment of the Ray that starts here.
    # Each test module is imported from its layer's folder, the helpers from this one.
    folders = [TESTS_DIR] + sorted(
        e.path for e in os.scandir(TESTS_DIR) if e.is_dir() and e.name[0] not in "._")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (*folders, os.environ.get("PYTHONPATH")) if p)
    for attempt in range(3):
        try:
            ray_lite.init(backend="ray", num_cpus=RAY_NUM_CPUS, include_dashboard=False)
            break
        except Exception:   # noqa: BLE001 - Ray gives its raylet 30 s: a loaded machine needs more
            ray_lite.shutdown()
            if attempt == 2:
                raise
    yield
    ray_lite.shutdown()


@pytest.fixture
def rt(request):
    """A fresh runtime for one test (init is fast, and the leak check is per
    test); yields the driver's node for tests that look inside.  On
    ``--backend=ray``: the session's Ray, and None."""
    import ray_lite
    from ray_lite._private.process import state

    if backend_under_test(request.config) == "ray":
        request.getfixturevalue("ray_session")
        yield None
        return
    ray_lite.init(num_cpus=2)
    try:
        yield state.node
    finally:
        ray_lite.shutdown()


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


def _is_ray_process(pid):
    # Ray's own daemons (gcs_server, raylet, its Python helpers) run from its package.
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return False
    return b"/ray/" in cmdline or cmdline.startswith(b"ray::")


@pytest.fixture(autouse=True)
def leaves_nothing_behind(request):
    """Fail a test that leaves a child process or a ray_lite segment behind.

    What leaked is cleaned up (our own children, by PID; our segments) so one
    leaking test does not make the following ones fail too.  On
    ``--backend=ray``, Ray is started first: its processes (started with it,
    or later by it) are not the test's.
    """
    on_ray = backend_under_test(request.config) == "ray"
    if on_ray:
        request.getfixturevalue("ray_session")
    children_before = child_pids()
    segments_before = set(shm.list_segments())
    yield
    leaked_children = child_pids() - children_before
    if on_ray:
        leaked_children = {pid for pid in leaked_children if not _is_ray_process(pid)}
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


def pytest_sessionstart(session):
    # What a killed test session left in /dev/shm (a SIGKILL unlinks nothing):
    # init's clean-up looks at the default prefix only, never at ours.  Only
    # the segments of sessions whose process is dead go.
    shm.cleanup_stale_segments(TEST_SHM_PREFIX)
    # Python < 3.11 ignores PYTHONSAFEPATH and puts the current directory first
    # on a child's sys.path: from the checkout's root, the session moves to the
    # tests folder, which holds no ray_lite to shadow the installed one (once
    # pytest has resolved its arguments against where it was started).
    if sys.version_info < (3, 11) and os.path.isdir("ray_lite"):
        os.chdir(os.path.dirname(os.path.abspath(__file__)))


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


def pytest_generate_tests(metafunc):
    # A module that sets SERVE_HTTP_MODES = ("proxies", "direct") runs each of
    # its tests that takes ``serve_http_mode`` (``serve_port`` does) in each mode.
    # Those it names in SERVE_HTTP_PROXIES_ONLY run through the proxies only.
    modes = getattr(metafunc.module, "SERVE_HTTP_MODES", None)
    only = getattr(metafunc.module, "SERVE_HTTP_PROXIES_ONLY", ())
    if "serve_http_mode" in metafunc.fixturenames:
        if metafunc.function.__name__ in only:
            metafunc.parametrize("serve_http_mode", ("proxies",), indirect=True)
        elif modes:
            metafunc.parametrize("serve_http_mode", modes, indirect=True)


@pytest.fixture
def serve_http_mode(request):
    """How Serve takes HTTP: "direct" (Serve's default: the ingress replicas
    listen themselves), or "proxies" (``http_options["direct_ingress"] = False``)."""
    return getattr(request, "param", "direct")


@pytest.fixture
def serve_http_options(serve_http_mode):
    """``serve_http_options(**opts)``: the HTTP options of ``serve_http_mode`` with ``opts``."""
    def options(**opts):
        opts["direct_ingress"] = serve_http_mode == "direct"
        return opts
    return options


@pytest.fixture
def serve_port(serve_runtime, serve_http_options):
    """Serve started on an ephemeral loopback port (one proxy, 10 s request
    timeout, ``serve_http_mode``); yields the port."""
    from ray_lite import serve
    from ray_lite.serve.api import _http_port

    serve.start(http_options=serve_http_options(port=0, proxies=1, request_timeout_s=10))
    yield _http_port()
