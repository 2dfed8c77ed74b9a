"""Every error a program can get is importable from ``ray_lite.exceptions``
(Serve's from ``ray_lite.serve.exceptions``), under Ray's name where Ray has
one, and a refused option's message says what to do instead."""
import ast
import importlib
import json
import pathlib
import pickle
import subprocess
import sys
import threading

import pytest

import ray_lite
import ray_lite.exceptions as exc_mod
from ray_lite.exceptions import NotOnThisMachineError, RayError

PKG = pathlib.Path(ray_lite.__file__).parent

# Exception classes of ray_lite's modules that no program gets, each with why.
INTERNAL = {
    "ray_lite._fast.errors.BufferTooSmallError": "encode_into's signal to retry with a "
                                                 "bigger buffer, caught by its callers",
    "ray_lite._fast.errors.LinkClosed": "a link between the runtime's processes; "
                                        "callers get ActorDiedError or WorkerCrashedError",
    "ray_lite._fast.errors.RingEmpty": "a non-blocking ring read found nothing; caught "
                                       "by the executor's loop",
    "ray_lite._private.process.errors.ActorExit": "what exit_actor() raises to end its "
                                                  "actor, caught by the actor's loop",
    "ray_lite.serve._control.ControlError": "the CLI's control socket; `ray-lite serve` "
                                            "prints it and exits 1",
    "ray_lite.bench.plot.PlotUnavailable": "`ray-lite bench --plot` prints it",
    "ray_lite._private.links.local_socket.LocalSocketError": "the base of the two below",
    "ray_lite._private.node.state_socket.StateSocketError": "the state CLI's socket; "
                                                            "`ray-lite status` prints it",
    # The llm_server example's engine: its API turns them into HTTP answers.
    "ray_lite._examples.llm_server.engine.EngineOverloaded": "answered 503",
    "ray_lite._examples.llm_server.engine.EngineDeadError": "an error event in the stream",
    "ray_lite._examples.llm_server.engine.RequestAborted": "ends the stream of a client "
                                                           "that hung up",
}

# Walks ray_lite's modules in a fresh interpreter (importing them all here
# would start what some start at import) and prints each exception class
# defined in a module: {"module.Name": [public homes]}.
_FIND_ERRORS = r"""
import importlib, json, pkgutil, sys
import ray_lite, ray_lite.exceptions as core, ray_lite.serve.exceptions as serve
found, skipped, scripts = {}, [], []
for info in pkgutil.walk_packages(ray_lite.__path__, "ray_lite."):
    if info.name.endswith("__main__"):
        continue
    try:
        module = importlib.import_module(info.name)
    except ImportError as e:          # an optional dependency (Ray, matplotlib)
        skipped.append(f"{info.name}: {e}")
        continue
    except Exception:                 # a script that reads its command line at import
        scripts.append(info.name)
        continue
    for name, obj in vars(module).items():
        if (isinstance(obj, type) and issubclass(obj, BaseException)
                and obj.__module__ == info.name and not name.startswith("_")):
            homes = [m.__name__ for m in (core, serve) if getattr(m, name, None) is obj]
            found[f"{obj.__module__}.{name}"] = homes
print(json.dumps({"found": found, "skipped": skipped, "scripts": scripts}))
"""


def test_every_exception_class_is_importable_from_an_exceptions_module(tmp_path):
    out = subprocess.run([sys.executable, "-c", _FIND_ERRORS], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    found = result["found"]
    # Only the benchmarks' workload scripts fail to import as modules.
    assert all(name.startswith("ray_lite.bench.") for name in result["scripts"]), result
    assert "ray_lite.exceptions.RayTaskError" in found      # the walk saw the classes
    assert "ray_lite.serve.exceptions.BackPressureError" in found
    nowhere = sorted(name for name, homes in found.items() if not homes and name not in INTERNAL)
    assert nowhere == [], f"not importable from ray_lite.exceptions: {nowhere}"
    # The list of internal ones names classes that exist.
    assert not [name for name in INTERNAL if name not in found
                and not any(s.startswith(name.rsplit(".", 1)[0] + ":")
                            for s in result["skipped"])], found


def test_every_name_in_all_is_there_and_an_exception():
    import ray_lite.serve.exceptions as serve_exc
    for module in (exc_mod, serve_exc):
        for name in module.__all__:
            obj = getattr(module, name)
            if name != "RAY_EXCEPTION_TYPES":
                assert isinstance(obj, type) and issubclass(obj, BaseException), name


@pytest.mark.parametrize("name, home", [
    ("SerializationError", "ray_lite._fast.errors"),
    ("ChannelClosedError", "ray_lite.message_queue"),
    ("PeerDiedError", "ray_lite.message_queue"),
    ("WorkerDiedError", "ray_lite.executor"),
    ("ExecutorShutdownError", "ray_lite.executor"),
    ("FunctionRaisedActorError", "ray_lite.util.multiprocessing.pool"),
    ("Empty", "ray_lite.util.queue"),
    ("Full", "ray_lite.util.queue"),
    ("RayDeprecationWarning", "ray_lite.util.annotations"),
    ("ActorClassInheritanceException", "ray_lite.actor"),
])
def test_an_error_of_a_module_is_the_same_class_in_ray_lite_exceptions(name, home):
    # One class under both names: `except` with either catches it.
    assert getattr(importlib.import_module(home), name) is getattr(exc_mod, name)


def test_serves_config_error_is_in_serve_exceptions():
    from ray_lite.serve import config
    from ray_lite.serve.exceptions import ConfigError, RayServeException
    assert config.ConfigError is ConfigError
    assert issubclass(ConfigError, ValueError) and issubclass(ConfigError, RayServeException)


def test_the_errors_keep_their_fields_through_pickling():
    from ray_lite.exceptions import WorkerDiedError
    err = pickle.loads(pickle.dumps(WorkerDiedError("worker 1 died", rank=1, pid=42,
                                                    exitcode=-9)))
    assert (str(err), err.rank, err.pid, err.exitcode) == ("worker 1 died", 1, 42, -9)
    err = pickle.loads(pickle.dumps(NotOnThisMachineError.for_option("num_gpus", 2)))
    assert isinstance(err, NotOnThisMachineError) and "num_gpus=2" in str(err)


def test_the_codecs_serialisation_error_is_public(codec_impl):
    # Both twins raise the class ray_lite.exceptions exports.
    with pytest.raises(exc_mod.SerializationError, match="_thread.lock"):
        codec_impl.dumps([1, threading.Lock()])


# -- an option this machine cannot honour ----------------------------------------------

def assert_says_what_to_do(err, option):
    text = str(err)
    assert isinstance(err, NotOnThisMachineError)
    assert isinstance(err, ValueError) and isinstance(err, RayError)
    assert text.startswith(option), text
    assert f"Leave {option.split('=')[0]} out" in text
    assert "RAY_LITE_BACKEND=ray" in text
    assert "README" not in text


def gpu_task():
    return 1


class GpuActor:
    def ping(self):
        return 1


@pytest.mark.parametrize("options, option", [
    ({"num_gpus": 1}, "num_gpus=1"),
    ({"num_gpus": 0.5}, "num_gpus=0.5"),
    ({"accelerator_type": "A100"}, "accelerator_type='A100'"),
])
def test_an_accelerator_option_is_refused_with_what_to_do(rt, options, option):
    # Declaring is accepted (a module declaring one still imports); calling is refused.
    task = ray_lite.remote(**options)(gpu_task)
    with pytest.raises(NotOnThisMachineError) as info:
        task.remote()
    assert_says_what_to_do(info.value, option)
    assert "task's options" in str(info.value)
    with pytest.raises(NotOnThisMachineError) as info:
        ray_lite.remote(gpu_task).options(**options).remote()
    assert_says_what_to_do(info.value, option)
    actor_cls = ray_lite.remote(**options)(GpuActor)
    with pytest.raises(NotOnThisMachineError) as info:
        actor_cls.remote()
    assert_says_what_to_do(info.value, option)
    assert "actor's options" in str(info.value)
    assert ray_lite.get(ray_lite.remote(gpu_task).options(num_gpus=0).remote(), timeout=60) == 1


def test_an_option_of_the_other_kind_is_refused_with_what_to_do(rt):
    with pytest.raises(ValueError) as info:
        ray_lite.remote(gpu_task).options(max_restarts=2).remote()
    text = str(info.value)
    assert not isinstance(info.value, NotOnThisMachineError)
    assert text.startswith("max_restarts=2: max_restarts is an option of actors")
    assert "leave it out" in text and "README" not in text


def test_a_serve_deployment_asking_for_a_gpu_is_refused_with_what_to_do():
    serve = pytest.importorskip("ray_lite.serve")
    for key, value in (("num_gpus", 1), ("accelerator_type", "H100")):
        with pytest.raises(NotOnThisMachineError) as info:
            @serve.deployment(ray_actor_options={key: value})
            class Model:
                def __call__(self, request):
                    return "ok"
        assert_says_what_to_do(info.value, f"{key}={value!r}")
        assert "in ray_actor_options" in str(info.value)


# -- no message sends the reader to another document --------------------------------------

def _messages(tree):
    """The string parts of what each ``raise`` and ``warnings.warn`` says."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and node.exc is not None:
            yield node.lineno, node.exc
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "warn" and node.args):
            yield node.lineno, node.args[0]


def test_no_error_message_says_see_the_readme():
    offenders = []
    for path in sorted(PKG.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for lineno, expr in _messages(tree):
            for const in ast.walk(expr):
                if isinstance(const, ast.Constant) and isinstance(const.value, str) \
                        and "README" in const.value:
                    offenders.append(f"{path.relative_to(PKG.parent)}:{lineno}")
    assert offenders == []


@pytest.mark.ray
@pytest.mark.parametrize("name, ray_home", [
    ("ActorClassInheritanceException", "ray.actor"),
    ("RayDeprecationWarning", "ray.util.annotations"),
    ("Empty", "ray.util.queue"),
    ("Full", "ray.util.queue"),
])
def test_rays_errors_outside_ray_exceptions_keep_rays_names(name, ray_home):
    pytest.importorskip("ray")
    theirs = getattr(importlib.import_module(ray_home), name)
    ours = getattr(exc_mod, name)
    # The same name and the same standard-library base, so `except` clauses port.
    assert theirs.__name__ == ours.__name__
    stdlib = ("builtins", "_queue", "queue")
    assert [b for b in theirs.__mro__ if b.__module__ in stdlib] == \
        [b for b in ours.__mro__ if b.__module__ in stdlib]


@pytest.mark.parametrize("kwargs, says", [
    ({"local_mode": True}, "leave local_mode out"),
    ({"storage": "/tmp/x"}, "leave storage out"),
    ({"_node_ip_address": "10.0.0.1"}, "leave _node_ip_address out"),
])
def test_init_refuses_what_it_cannot_honour_saying_what_to_do(kwargs, says):
    # Refused before anything starts: no runtime to shut down.
    with pytest.raises(ValueError) as info:
        ray_lite.init(**kwargs)
    key, value = next(iter(kwargs.items()))
    assert str(info.value).startswith(f"init({key}={value!r}): ")
    assert says in str(info.value)
    assert not ray_lite.is_initialized()


def test_a_job_config_ray_lite_cannot_honour_is_refused_saying_what_to_do():
    from ray_lite.job_config import JobConfig
    with pytest.raises(ValueError, match="leave jvm_options or code_search_path out"):
        ray_lite.init(job_config=JobConfig(jvm_options=["-Xmx1g"]))
    with pytest.raises(ValueError, match="give lifetime='detached' to the actors"):
        ray_lite.init(job_config=JobConfig(default_actor_lifetime="detached"))
    assert not ray_lite.is_initialized()


def test_a_serve_config_with_target_capacity_is_refused_saying_what_to_do():
    from ray_lite.serve import config
    from ray_lite.serve.exceptions import ConfigError
    with pytest.raises(ConfigError, match="remove target_capacity from the config"):
        config.parse({"target_capacity": 50, "applications": []})
