"""The Ray backend: what maps to what, and the switch itself.

The tests that need Ray run only with ``--backend=ray`` (one Ray per session,
see conftest.py); the others (the switch without Ray installed) always run.
"""
import os
import subprocess
import sys
import textwrap
import time

import pytest

import ray_lite
from ray_lite.exceptions import (ActorDiedError, GetTimeoutError, RayActorError, RayError,
                                 RayTaskError, TaskCancelledError)

T = 60


@pytest.fixture
def on_ray(request):
    """The session's Ray; the test is skipped on the local backend."""
    from conftest import backend_under_test
    if backend_under_test(request.config) != "ray":
        pytest.skip("needs --backend=ray (Ray is started once per session)")
    request.getfixturevalue("ray_session")


# Decorated at import, before any backend was chosen (as programs do).
@ray_lite.remote
def add_one(x):
    return x + 1


@ray_lite.remote
def fails(message):
    raise KeyError(message)


@ray_lite.remote
def calls_add_one(x):
    # Runs in a Ray worker, which runs on Ray as soon as it imports ray_lite.
    return ray_lite.backend(), ray_lite.get(add_one.remote(x))


@ray_lite.remote
def count_to(n):
    for i in range(n):
        yield i


@ray_lite.remote(num_gpus=0, memory=10 * 2**20)
def with_ray_only_meaning():
    return "ran"


@ray_lite.remote
class Counter:
    def __init__(self, start=0):
        self.n = start

    def incr(self):
        self.n += 1
        return self.n

    @ray_lite.method(num_returns=2)
    def pair(self):
        return self.n, -self.n

    def stream(self, k):
        for i in range(k):
            yield i * 10


pytestmark = pytest.mark.both_backends


def _run(code, **env):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=T, env={**os.environ, **env})


def test_without_ray_the_ray_backend_says_how_to_install_it():
    # `import ray` fails as it does when Ray is not installed.
    code = """
        import sys
        sys.modules["ray"] = None
        import ray_lite
        assert ray_lite.backend() == "ray"
        try:
            ray_lite.init()
        except ImportError as exc:
            print("ERR", exc)
        else:
            print("started?")
        assert not ray_lite.is_initialized() and ray_lite.backend() == "ray"
    """
    out = _run(code, RAY_LITE_BACKEND="ray")
    assert out.returncode == 0, out.stderr
    assert "ERR" in out.stdout and "pip install 'ray_lite[ray]'" in out.stdout, out.stdout


def test_ray_objects_pass_for_ray_lite_ones(on_ray):
    ref = add_one.remote(1)
    assert isinstance(ref, ray_lite.ObjectRef)
    assert type(ref).__module__.startswith("ray")
    gen = count_to.remote(2)
    assert isinstance(gen, ray_lite.ObjectRefGenerator)
    counter = Counter.remote()
    assert isinstance(counter, ray_lite.actor.ActorHandle)
    assert not isinstance(counter, ray_lite.ObjectRef)
    assert ray_lite.get(ref, timeout=T) == 2
    assert [ray_lite.get(r, timeout=T) for r in gen] == [0, 1]
    assert ray_lite.backend() == "ray" and ray_lite.is_initialized()


def test_remote_functions_made_once_and_nested_calls_run_on_ray(on_ray):
    assert ray_lite.get(calls_add_one.remote(4), timeout=T) == ("ray", 5)
    made = add_one._ray_remote
    add_one.remote(0)
    assert add_one._ray_remote is made
    assert ray_lite.get(add_one.options(name="renamed").remote(9), timeout=T) == 10


def test_options_ray_lite_ignores_locally_act_on_ray(on_ray):
    assert ray_lite.get(with_ray_only_meaning.remote(), timeout=T) == "ran"
    # Refused on one machine, meaningful on Ray: accepted there.
    detached = Counter.options(name="rl_detached", lifetime="detached").remote(5)
    try:
        assert ray_lite.get(ray_lite.get_actor("rl_detached").incr.remote(), timeout=T) == 6
    finally:
        ray_lite.kill(detached)


def test_task_error_is_ray_lite_and_ray_and_the_user_class(on_ray):
    import ray
    with pytest.raises(KeyError) as info:
        ray_lite.get(fails.remote("nope"), timeout=T)
    err = info.value
    assert isinstance(err, RayTaskError) and isinstance(err, RayError)
    assert isinstance(err, ray.exceptions.RayTaskError)
    assert "nope" in str(err)
    # Pickled (sent to another process), it is Ray's error, translated again.
    again = ray.cloudpickle.loads(ray.cloudpickle.dumps(err))
    assert isinstance(again, ray.exceptions.RayTaskError) and isinstance(again, RayTaskError)
    assert isinstance(again, KeyError)


def test_timeouts_cancellation_and_dead_actors_are_ray_lite_errors(on_ray):
    @ray_lite.remote
    def sleeps():
        import time
        time.sleep(T)

    ref = sleeps.remote()
    with pytest.raises(GetTimeoutError):
        ray_lite.get(ref, timeout=0.01)
    with pytest.raises(TimeoutError):           # GetTimeoutError is a TimeoutError
        ray_lite.get(ref, timeout=0.01)
    ray_lite.cancel(ref, force=True)
    with pytest.raises(TaskCancelledError):
        ray_lite.get(ref, timeout=T)
    counter = Counter.remote()
    assert ray_lite.get(counter.incr.remote(), timeout=T) == 1
    ray_lite.kill(counter)
    # Ray's kill is asynchronous: a call made right after it may still be
    # answered (about 1 in 15 here), so call until one fails, with a bound.
    deadline = time.monotonic() + T
    with pytest.raises(ActorDiedError) as info:
        while time.monotonic() < deadline:
            ray_lite.get(counter.incr.remote(), timeout=T)
    assert isinstance(info.value, RayActorError)



def test_create_actors_takes_a_class_with_options_on_ray(on_ray):
    """ray_lite's own strategy object, in ``C.options(...)``, becomes Ray's."""
    from ray_lite._private.api import core as core_api
    from ray_lite.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    here = ray_lite.get_runtime_context().get_node_id()
    options = Counter.options(scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False))
    handles = core_api.create_actors(options, [((5,), {}), ((), {})])
    assert ray_lite.get([h.incr.remote() for h in handles], timeout=T) == [6, 1]
    for h in handles:
        ray_lite.kill(h)

def test_actor_methods_num_returns_and_streams(on_ray):
    counter = Counter.remote(2)
    assert ray_lite.get(counter.incr.remote(), timeout=T) == 3
    first, second = counter.pair.remote()
    assert ray_lite.get([first, second], timeout=T) == [3, -3]
    assert [ray_lite.get(r, timeout=T) for r in counter.stream.remote(3)] == [0, 10, 20]
    with pytest.warns(DeprecationWarning, match="num_returns='dynamic' is deprecated"):
        dynamic = counter.stream.options(num_returns="dynamic")     # Ray's warning
    items = ray_lite.get(dynamic.remote(2), timeout=T)
    assert isinstance(items, ray_lite.DynamicObjectRefGenerator)
    assert [ray_lite.get(r, timeout=T) for r in items] == [0, 10]
    ready, not_ready = ray_lite.wait([counter.incr.remote()], num_returns=1, timeout=T)
    assert len(ready) == 1 and not not_ready
    ray_lite.kill(counter)


def test_context_resources_and_util_are_rays(on_ray):
    import ray
    assert ray_lite.cluster_resources()["CPU"] == 2
    assert ray_lite.get_runtime_context().get_job_id() == ray.get_runtime_context().get_job_id()
    assert ray_lite.nodes()[0]["Alive"]
    from ray_lite.util.queue import Empty, Queue
    q = Queue()
    assert isinstance(q, ray.util.queue.Queue)
    with pytest.raises(Empty):
        q.get(block=False)
    q.shutdown()
    pool = ray_lite.util.ActorPool([Counter.remote()])
    assert isinstance(pool, ray.util.ActorPool)
    assert list(pool.map(lambda a, _: a.incr.remote(), range(3))) == [1, 2, 3]
    import ray.util.metrics
    from ray_lite.util import metrics
    for made, rays in ((metrics.Counter("c", tag_keys=("a",)), ray.util.metrics.Counter),
                       (metrics.Gauge("g"), ray.util.metrics.Gauge),
                       (metrics.Histogram("h", boundaries=[1.0]), ray.util.metrics.Histogram)):
        assert type(made) is rays


def test_job_config_logging_config_and_runtime_env_become_rays(on_ray):
    import ray
    import ray.job_config
    from ray_lite._private.job.job_setup import ray_init_kwargs
    from ray_lite.job_config import JobConfig
    from ray_lite.runtime_env import RuntimeEnv
    jc = JobConfig(runtime_env={"env_vars": {"A": "1"}}, metadata={"k": "v"},
                   ray_namespace="ns")
    jc.set_py_logging_config(ray_lite.LoggingConfig(encoding="JSON"))
    env, kwargs = ray_init_kwargs(RuntimeEnv(env_vars={"B": "2"}),
                                  {"job_config": jc, "logging_config": ray_lite.LoggingConfig()})
    assert env == {"env_vars": {"B": "2"}} and type(env) is dict
    rays = kwargs["job_config"]
    assert type(rays) is ray.job_config.JobConfig
    assert (rays.metadata, rays.ray_namespace) == ({"k": "v"}, "ns")
    assert rays.runtime_env == {"env_vars": {"A": "1"}}
    assert rays.py_logging_config.encoding == "JSON"
    assert type(kwargs["logging_config"]) is ray.LoggingConfig


@ray_lite.remote
class Quitter:
    def quit(self):
        ray_lite.actor.exit_actor()

    def ping(self):
        return "pong"


def test_exit_actor_and_resources_on_ray(on_ray):
    q = Quitter.remote()
    assert ray_lite.get(q.ping.remote(), timeout=T) == "pong"
    with pytest.raises(RayActorError):
        ray_lite.get(q.quit.remote(), timeout=T)
    with pytest.raises(RayActorError):
        ray_lite.get(q.ping.remote(), timeout=T)
    assert ray_lite.get_gpu_ids() == []
    assert 0 <= ray_lite.available_resources().get("CPU", 0) <= 2
