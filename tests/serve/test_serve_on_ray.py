"""ray_lite.serve on Ray Serve: a program written against ray_lite's Serve API
(deployments built at import time, a FastAPI ingress, composition, batching,
multiplexing) deployed on Ray Serve when the Ray backend is active.

One Ray and one Ray Serve for the whole module (each start takes seconds)."""
import json
import socket
import urllib.request

import pytest

from ray_helpers import ship_by_value, start_local_ray

pytest.importorskip("ray.serve")
fastapi = pytest.importorskip("fastapi")

import ray_lite  # noqa: E402
from ray_lite import serve  # noqa: E402

pytestmark = pytest.mark.ray


@serve.deployment
class Doubler:
    def __init__(self, offset):
        self.offset = offset

    async def __call__(self, x):
        return 2 * x + self.offset

    def cpus(self):
        import ray
        return ray.get_runtime_context().get_assigned_resources().get("CPU", 0.0)

    def backend_in_replica(self):
        return ray_lite.backend()

    def gang(self):
        g = serve.get_replica_context().gang_context
        return None if g is None else (g.rank, g.world_size)

    async def count(self, n):
        for i in range(n):
            yield i

    @serve.batch(max_batch_size=4, batch_wait_timeout_s=0.01)
    async def batched(self, xs):
        return [(x, len(xs)) for x in xs]

    @serve.multiplexed(max_num_models_per_replica=2)
    async def load(self, model_id):
        return f"model:{model_id}"

    async def which_model(self):
        return await self.load(serve.get_multiplexed_model_id())


@ray_lite.remote
class Tally:
    def __init__(self, start):
        self.n = start

    def bump(self):
        self.n += 1
        return self.n

    def where(self):
        c = serve.get_deployment_actor_context()
        return c.app_name, c.deployment, c.actor_name


@serve.deployment(num_replicas=1)
class UsesTally:
    def __call__(self):
        return ray_lite.get(serve.get_deployment_actor("tally").bump.remote())

    def where(self):
        return ray_lite.get(serve.get_deployment_actor("tally").where.remote())


api = fastapi.FastAPI()


@serve.deployment(num_replicas=1)
@serve.ingress(api)
class Front:
    def __init__(self, doubler):
        self.doubler = doubler

    @api.get("/double/{x}")
    async def double(self, x: int):
        return {"result": await self.doubler.remote(x)}


@pytest.fixture(scope="module")
def ray_serve_port():
    ray = pytest.importorskip("ray")
    start_local_ray(lambda: ray_lite.init(backend="ray", num_cpus=2, include_dashboard=False))
    undo = ship_by_value(__name__, (ray.cloudpickle,))
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        serve.start(http_options={"host": "127.0.0.1", "port": port, "proxies": 1})
        yield port
    finally:
        try:
            serve.shutdown()
        finally:
            undo()
            ray_lite.shutdown()


def test_app_runs_on_ray_serve_by_handle_and_http(ray_serve_port):
    assert ray_lite.backend() == "ray"
    handle = serve.run(Front.bind(Doubler.bind(1)), name="front", route_prefix="/front")
    assert type(handle).__module__.startswith("ray.serve")
    with urllib.request.urlopen(f"http://127.0.0.1:{ray_serve_port}/front/double/20",
                                timeout=60) as resp:
        assert json.loads(resp.read()) == {"result": 41}
    st = serve.status()
    assert st.applications["front"].status == "RUNNING"
    # The same Deployment object translates once.
    from ray_lite.serve import _on_ray
    assert _on_ray.to_ray_deployment(Doubler) is _on_ray.to_ray_deployment(Doubler)
    doubler = serve.get_deployment_handle("Doubler", "front")
    assert doubler.remote(5).result(timeout_s=60) == 11
    serve.delete("front")
    assert "front" not in serve.status().applications


def test_handle_features_and_ray_lite_defaults_on_ray(ray_serve_port):
    handle = serve.run(Doubler.bind(0), name="plain", route_prefix=None)
    assert serve.get_app_handle("plain").remote(3).result(timeout_s=60) == 6
    # Replicas are not charged against num_cpus (ray_lite's default) ...
    assert handle.cpus.remote().result(timeout_s=60) == 0.0
    # ... and ray_lite inside a replica is on Ray as well.
    assert handle.backend_in_replica.remote().result(timeout_s=60) == "ray"
    stream = handle.options(stream=True).count.remote(3)
    assert list(stream) == [0, 1, 2]
    batched = [handle.batched.remote(x) for x in range(3)]
    results = [r.result(timeout_s=60) for r in batched]
    assert [x for x, _ in results] == [0, 1, 2] and all(1 <= n <= 4 for _, n in results)
    model = handle.options(multiplexed_model_id="m7").which_model.remote()
    assert model.result(timeout_s=60) == "model:m7"
    # A program's own setting wins over ray_lite's default.
    charged = Doubler.options(name="Charged", ray_actor_options={"num_cpus": 0.5})
    h2 = serve.run(charged.bind(0), name="charged", route_prefix=None)
    assert h2.cpus.remote().result(timeout_s=60) == 0.5
    serve.delete("plain")
    serve.delete("charged")


def test_run_many_and_logging_config_on_ray(ray_serve_port):
    from ray_lite.serve.schema import LoggingConfig
    one, two = serve.run_many([
        serve.RunTarget(Doubler.bind(1), name="one", route_prefix=None,
                        logging_config=LoggingConfig(log_level="DEBUG")),
        serve.RunTarget(Doubler.options(name="Two", logging_config={"encoding": "JSON"})
                        .bind(2), name="two", route_prefix=None),
    ])
    assert type(one).__module__.startswith("ray.serve")
    assert one.remote(1).result(timeout_s=60) == 3
    assert two.remote(1).result(timeout_s=60) == 4
    serve.delete("one")
    serve.delete("two")


def test_deployment_actors_on_ray(ray_serve_port):
    from ray_lite.serve.config import DeploymentActorConfig
    app = UsesTally.options(deployment_actors=[
        DeploymentActorConfig(name="tally", actor_class=Tally, init_args=(10,))]).bind()
    handle = serve.run(app, name="tally", route_prefix=None)
    # Ray's DeploymentActorConfig registers the actor's module to be pickled
    # by value and then unregisters it, even when it was registered before.
    import ray
    ship_by_value(__name__, (ray.cloudpickle,))
    assert [handle.remote().result(timeout_s=60) for _ in range(2)] == [11, 12]
    assert handle.where.remote().result(timeout_s=60) == ("tally", "UsesTally", "tally")
    serve.delete("tally")


def test_gang_scheduling_on_ray(ray_serve_port):
    from ray_lite.serve.config import GangSchedulingConfig
    app = Doubler.options(name="Ganged", num_replicas=2,
                          gang_scheduling_config=GangSchedulingConfig(gang_size=2)).bind(0)
    handle = serve.run(app, name="ganged", route_prefix=None)
    seen = {handle.gang.remote().result(timeout_s=60) for _ in range(20)}
    assert seen <= {(0, 2), (1, 2)} and seen
    serve.delete("ganged")
