"""Every process ray_lite starts imports the same ray_lite as its parent.

A driver runs from a folder holding a decoy ``ray_lite/`` package (as when
``ray-lite serve run`` runs from the checkout, whose ``ray_lite/`` may be
uncompiled) with that folder first on ``sys.path``: its workers, actors and
executor workers must still import the driver's ray_lite, and still import
the user's modules from that folder.  A child that runs the pure-Python hot
paths while its parent runs the compiled ones says so on stderr.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

import ray_lite
import ray_lite._fast as fast
from ray_lite.executor import MultiprocExecutor

DRIVER = textwrap.dedent("""
    import json, os, sys
    import ray_lite
    # What `ray-lite serve run` does to import the user's app: the working
    # directory goes first on sys.path, after ray_lite was imported.
    sys.path.insert(0, os.getcwd())
    from ray_lite.executor import MultiprocExecutor

    def where(*_):
        import usermod
        return ray_lite.__file__, usermod.WHERE

    @ray_lite.remote
    def task():
        return where()

    @ray_lite.remote
    class Actor:
        def where(self):
            return where()

    class ExecutorWorker:
        def __init__(self, rank, world_size):
            pass

    ray_lite.init(num_cpus=1)
    try:
        out = {"driver": ray_lite.__file__,
               "task": ray_lite.get(task.remote(), timeout=60),
               "actor": ray_lite.get(Actor.remote().where.remote(), timeout=60)}
    finally:
        ray_lite.shutdown()
    ex = MultiprocExecutor(ExecutorWorker, world_size=1)
    try:
        out["executor"] = ex.collective_rpc(where, timeout=60)[0]
    finally:
        ex.shutdown()
    print("RESULT " + json.dumps(out), flush=True)
""")


def _child_env():
    env = dict(os.environ)
    # Python >= 3.11 would otherwise hide the problem (conftest sets it).
    env.pop("PYTHONSAFEPATH", None)
    return env


def test_children_import_the_drivers_ray_lite_not_a_decoy_in_the_working_directory(tmp_path):
    app = tmp_path / "app"
    (app / "ray_lite").mkdir(parents=True)
    (app / "ray_lite" / "__init__.py").write_text(
        "raise ImportError('the decoy ray_lite in the working directory was imported')\n")
    (app / "usermod.py").write_text("import os\nWHERE = os.path.abspath(__file__)\n")
    script_dir = tmp_path / "bin"
    script_dir.mkdir()
    script = script_dir / "driver.py"
    script.write_text(DRIVER)
    # `python FILE` puts FILE's folder first (not the working directory), as
    # a console script does: the driver itself imports the real ray_lite.
    proc = subprocess.run([sys.executable, str(script)], cwd=str(app), env=_child_env(),
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "decoy" not in proc.stderr
    result = next(json.loads(line[7:]) for line in proc.stdout.splitlines()
                  if line.startswith("RESULT "))
    real = os.path.realpath(ray_lite.__file__)
    assert os.path.realpath(result["driver"]) == real
    user_module = os.path.realpath(app / "usermod.py")
    for kind in ("task", "actor", "executor"):
        module_file, user_file = result[kind]
        assert os.path.realpath(module_file) == real, kind
        assert os.path.realpath(user_file) == user_module, kind


class Worker:
    def __init__(self, rank, world_size):
        self.rank = rank

    def compiled(self):
        return fast.USING_EXTENSIONS


def _needs_compiled_parent():
    if not fast.USING_EXTENSIONS:
        pytest.skip("this process runs the pure-Python twins: no child can fall behind it")


def test_an_executor_worker_on_pure_python_twins_says_so_on_stderr(capfd):
    _needs_compiled_parent()
    ex = MultiprocExecutor(Worker, world_size=2, env={"RAY_LITE_NO_EXTENSIONS": "1"})
    try:
        assert ex.collective_rpc("compiled", timeout=60) == [False, False]
    finally:
        ex.shutdown()
    err = capfd.readouterr().err
    lines = [ln for ln in err.splitlines() if "pure-Python hot paths" in ln]
    assert len(lines) == 2, err
    for rank, line in enumerate(sorted(lines)):
        assert line.startswith(f"ray_lite: the executor worker {rank} (pid ")
        assert "RAY_LITE_NO_EXTENSIONS=1" in line


def test_the_zygote_on_pure_python_twins_says_so_once_for_its_workers(capfd, monkeypatch):
    _needs_compiled_parent()
    # The driver read its setting at import; the zygote it starts now sees this one.
    monkeypatch.setenv("RAY_LITE_NO_EXTENSIONS", "1")
    ray_lite.init(num_cpus=2)
    try:
        @ray_lite.remote
        def compiled():
            return fast.USING_EXTENSIONS
        assert ray_lite.get([compiled.remote() for _ in range(2)], timeout=60) == [False, False]
    finally:
        ray_lite.shutdown()
    err = capfd.readouterr().err
    lines = [ln for ln in err.splitlines() if "pure-Python hot paths" in ln]
    assert len(lines) == 1, err
    assert lines[0].startswith("ray_lite: the zygote (pid ")


def test_children_on_the_same_twins_as_their_parent_say_nothing(capfd):
    ex = MultiprocExecutor(Worker, world_size=1)
    try:
        assert ex.collective_rpc("compiled", timeout=60) == [fast.USING_EXTENSIONS]
    finally:
        ex.shutdown()
    assert "pure-Python hot paths" not in capfd.readouterr().err
