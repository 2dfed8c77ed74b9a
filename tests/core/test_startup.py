"""Start-up: what ``import ray_lite`` loads, and what the zygote loads when.

``import ray_lite`` leaves asyncio, inspect, cloudpickle and a few more to
first use (``ray_lite._lazy``): a driver of sync tasks never needs asyncio.
The zygote forks the initial pool before it imports asyncio (init waits for
that fork), then imports it for the workers it forks later: an actor starts
with it loaded, as before.  ``ray-lite serve run`` starts the zygote before
it imports Serve and the application; init adopts it.
"""
import os
import subprocess
import sys
import textwrap
import threading

import ray_lite
from ray_lite._private.process import state
from ray_lite._private.node import zygote

# Each costs milliseconds to import, and ray_lite uses them late or never.
DEFERRED = {"asyncio", "inspect", "cloudpickle", "dataclasses", "typing", "secrets", "hmac",
            "uuid", "platform", "tempfile", "shutil", "fractions", "decimal", "logging",
            "hashlib", "subprocess", "traceback"}


def _run(code):
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _modules_after(code):
    return set(_run(code + "\nimport sys\nprint(' '.join(sys.modules))\n").split())


def test_import_ray_lite_leaves_the_heavy_modules_to_first_use():
    loaded = _modules_after("import ray_lite") - _modules_after("pass")
    assert "ray_lite._private.api.core" in loaded
    assert not loaded & DEFERRED, sorted(loaded & DEFERRED)


def test_the_zygotes_first_imports_leave_asyncio_for_later():
    # What the zygote imports before it forks the initial pool workers.
    loaded = _modules_after("import ray_lite._private.node.zygote, ray_lite._private.node.worker")
    assert "asyncio" not in loaded
    assert "ray_lite._private.actors.async_actor" in loaded


def test_a_lazy_module_is_imported_at_first_use_then_is_the_module_itself():
    _run("""
        import sys
        from ray_lite._lazy import LazyModule, lazy_module, resolve_loaded

        ns = {}
        ns["colorsys"] = lazy_module("colorsys", ns)
        assert "colorsys" not in sys.modules and isinstance(ns["colorsys"], LazyModule)
        assert ns["colorsys"].rgb_to_hsv(1.0, 0.0, 0.0) == (0.0, 1.0, 1.0)
        assert ns["colorsys"] is sys.modules["colorsys"]        # rebound at first use

        other = {}
        other["wave"] = lazy_module("wave", other)
        import wave                                             # by someone else
        resolve_loaded()
        assert other["wave"] is wave

        assert lazy_module("os", {}) is sys.modules["os"]       # loaded already: itself
    """)


def test_the_initial_pool_is_forked_before_asyncio_and_actors_after(rt):
    # Both initial pool workers must run a task at the same time: the tasks
    # meet in a threaded actor before they look.
    @ray_lite.remote(max_concurrency=2)
    class Meeting:
        def __init__(self):
            self.barrier = threading.Barrier(2)

        def meet(self):
            self.barrier.wait(timeout=60)

        def has_asyncio(self):
            return "asyncio" in sys.modules

    @ray_lite.remote
    def look(meeting):
        ray_lite.get(meeting.meet.remote(), timeout=60)
        return os.getpid(), "asyncio" in sys.modules, "cloudpickle" in sys.modules

    meeting = Meeting.remote()
    seen = ray_lite.get([look.remote(meeting), look.remote(meeting)], timeout=60)
    assert len({pid for pid, _, _ in seen}) == 2          # both initial workers
    assert [(a, c) for _, a, c in seen] == [(False, True), (False, True)]
    # The actor was forked after the zygote's warm-up: asyncio came with the fork.
    assert ray_lite.get(meeting.has_asyncio.remote(), timeout=60) is True


def test_init_adopts_a_zygote_started_early_with_the_sys_path_init_has(tmp_path, monkeypatch):
    (tmp_path / "late_module.py").write_text("WHERE = 'found'\n")
    zygote.start_early()
    early = zygote._early
    # As `serve run` puts the application's folder first: after the zygote
    # started; and the application's import may set variables its workers
    # need (OMP_NUM_THREADS, HF_HOME...).
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("RL_SET_AFTER_THE_ZYGOTE", "seen")
    monkeypatch.chdir(tmp_path)
    ray_lite.init(num_cpus=1)
    try:
        assert state.node.zygote is early

        @ray_lite.remote
        def where():
            import late_module
            return late_module.WHERE, os.environ.get("RL_SET_AFTER_THE_ZYGOTE"), os.getcwd()

        @ray_lite.remote
        class Where:
            def env(self):
                return os.environ.get("RL_SET_AFTER_THE_ZYGOTE")

        assert ray_lite.get(where.remote(), timeout=60) == ("found", "seen", str(tmp_path))
        assert ray_lite.get(Where.remote().env.remote(), timeout=60) == "seen"
    finally:
        ray_lite.shutdown()


def test_a_zygote_started_early_that_no_init_adopts_is_stopped():
    zygote.start_early()
    proc = zygote._early.proc
    zygote.discard_early()
    assert proc.poll() is not None and zygote._early is None
