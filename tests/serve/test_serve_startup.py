"""How Serve starts replicas: modules preloaded in the zygote, actors created in
batches, replicas serving as soon as each is ready, and ``max_queued_requests``
given whole to every proxy (Ray's limit is per caller)."""
import os
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

import ray_lite as ray
from ray_lite import serve
from ray_lite._private.api import core as core_api
from ray_lite._private.process import state
from ray_lite.exceptions import ActorDiedError

from serve_helpers import http


@ray.remote
class Probe:
    def __init__(self, fail=False):
        if fail:
            raise ValueError("constructor refused")
        self.started_with = set(sys.modules)

    def had(self, names):
        return [n in self.started_with for n in names]

    def pid(self):
        return os.getpid()

    def env(self, name):
        return os.environ.get(name)


@ray.remote
class Parent:
    def spawn_children(self, n):
        hs = core_api.create_actors(Probe, [((), {})] * n)
        return [ray.get(h.pid.remote()) for h in hs]


def test_preloaded_modules_are_in_workers_started_later(serve_runtime):
    core_api.preload(["json.tool", "ray_lite_no_such_module_x"])
    p = Probe.remote()
    # The missing module is skipped; the zygote goes on forking workers.
    assert ray.get(p.had.remote(["json.tool", "ray_lite_no_such_module_x"]),
                   timeout=60) == [True, False]


def test_serve_preloads_its_modules_for_replicas(serve_runtime):
    serve.start(http_options={"port": 0, "proxies": 1})
    try:
        p = Probe.remote()
        # (Not imported by this module, which the worker imports to build Probe.)
        assert ray.get(p.had.remote(["ray_lite.serve._replica", "ray_lite.serve._proxy",
                                     "starlette.requests", "httptools"]),
                       timeout=60) == [True] * 4
    finally:
        serve.shutdown()


def test_create_actors_makes_distinct_working_actors(serve_runtime):
    hs = core_api.create_actors(Probe, [((), {}), ((False,), {}), ((), {"fail": False})])
    pids = [ray.get(h.pid.remote(), timeout=60) for h in hs]
    assert len(set(pids)) == 3 and os.getpid() not in pids


def test_create_actors_constructor_failure_is_per_actor(serve_runtime):
    ok, bad = core_api.create_actors(Probe, [((), {}), ((True,), {})])
    with pytest.raises(ActorDiedError, match="constructor refused"):
        ray.get(bad.pid.remote(), timeout=60)
    assert isinstance(ray.get(ok.pid.remote(), timeout=60), int)


def test_create_actors_from_inside_an_actor(serve_runtime):
    parent = Parent.remote()
    pids = ray.get(parent.spawn_children.remote(3), timeout=60)
    assert len(set(pids)) == 3


def test_create_actors_refuses_named_classes(serve_runtime):
    with pytest.raises(ValueError):
        core_api.create_actors(ray.remote(name="x")(Probe._cls), [((), {})])
    with pytest.raises(TypeError):
        core_api.create_actors(Probe._cls, [((), {})])


def test_same_name_twice_in_one_batch(serve_runtime):
    node = state.node
    req = Probe._creation_request(node, {"name": "twin", "namespace": "ns",
                                         "get_if_exists": True}, (), {})
    first, second = node.create_actors([req, req])
    assert first is second
    refused = node.create_actors([req[:-1] + (False,)])[0]
    assert isinstance(refused, ValueError)


# ------------------------------------------------------------------ Serve

@serve.deployment(num_replicas=2, ray_actor_options={"num_cpus": 0})
class OneSlow:
    """The second replica to start waits for the test's signal file."""

    def __init__(self, slot_dir):
        slot = 0
        while True:
            try:
                os.close(os.open(os.path.join(slot_dir, f"slot{slot}"),
                                 os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                break
            except FileExistsError:
                slot += 1
        if slot > 0:
            release = os.path.join(slot_dir, "release")
            deadline = time.monotonic() + 60
            while not os.path.exists(release) and time.monotonic() < deadline:
                time.sleep(0.01)
        self.slot = slot

    async def __call__(self, request):
        return f"slot{self.slot}"


def test_a_replica_serves_before_the_others_are_ready(serve_runtime, tmp_path):
    serve.start(http_options={"port": 0, "proxies": 1})
    try:
        from ray_lite.serve.api import _http_port
        port = _http_port()
        done = threading.Event()
        errors = []

        def deploy():
            try:
                serve.run(OneSlow.bind(str(tmp_path)))
            except BaseException as exc:   # noqa: BLE001 - reported below
                errors.append(exc)
            finally:
                done.set()
        t = threading.Thread(target=deploy)
        t.start()
        try:
            body = None
            deadline = time.monotonic() + 60
            while body is None and time.monotonic() < deadline:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as r:
                        body = r.read()
                except urllib.error.HTTPError as exc:
                    assert exc.code == 404, "before its first replica the route is unknown"
                    time.sleep(0.01)   # pacing the poll on 2 cores, not synchronisation
                except urllib.error.URLError:
                    time.sleep(0.01)   # the proxy is not listening yet
            assert body == b"slot0"
            assert not done.is_set(), "serve.run returned before every replica was ready"
            st = serve.status().applications["default"]
            assert st.status == "DEPLOYING"
        finally:
            (tmp_path / "release").touch()
            t.join(90)
        assert done.is_set() and not errors
        st = serve.status().applications["default"]
        assert st.status == "RUNNING"
        assert st.deployments["OneSlow"].replica_states == {"RUNNING": 2}
    finally:
        serve.shutdown()


@serve.deployment(max_queued_requests=3, ray_actor_options={"num_cpus": 0})
def queued(request):
    return "ok"


def test_every_proxy_enforces_the_whole_max_queued_requests(serve_runtime):
    serve.start(http_options={"port": 0, "proxies": 2})
    try:
        from ray_lite.serve import context
        from ray_lite.serve.api import _http_port
        serve.run(queued.bind())
        ctl = context.get_controller()
        for index in range(2):
            _, routes, accept = ray.get(ctl.listen_routes.remote(index, -1), timeout=60)
            assert accept
            app, ingress, replicas, max_ongoing, max_queued, *_ = routes["/"]
            assert (ingress, len(replicas), max_queued) == ("queued", 1, 3)
        assert http(_http_port(), "GET", "/")[2] == b"ok"
    finally:
        serve.shutdown()


@ray.remote
class LooksItselfUp:
    def __init__(self, name):
        # What the Serve controller does: its own handle, from its name.
        self.me = ray.get_actor(name)

    def same(self, name):
        return self.me == ray.get_actor(name)


def test_an_actor_finds_its_own_name_in_its_constructor(serve_runtime):
    # What the Serve controller does.  A worker starts in about a millisecond,
    # so its lookup can reach the driver right when the driver starts reading
    # its link: the name must be registered by then.  Here the driver waits,
    # once it reads the new actor's link, until the lookup has been answered.
    node = state.node
    answered = threading.Event()
    real_add_link, real_request = node.add_link, node.handlers["Q"]

    def add_link(peer, link, pid):
        real_add_link(peer, link, pid)
        answered.wait(30)

    def on_request(peer, msg):
        real_request(peer, msg)
        if msg[2] == "get_actor":
            answered.set()
    node.add_link, node.handlers["Q"] = add_link, on_request
    try:
        h = LooksItselfUp.options(name="me").remote("me")
        assert answered.is_set(), "the constructor did not look its name up during creation"
    finally:
        node.add_link, node.handlers["Q"] = real_add_link, real_request
    assert ray.get(h.same.remote("me"), timeout=60)


def test_num_replicas_with_autoscaling_config_is_refused():
    from ray_lite import serve
    with pytest.raises(ValueError, match="num_replicas"):
        serve.deployment(num_replicas=3, autoscaling_config={"min_replicas": 1})
    with pytest.raises(ValueError, match="num_replicas"):
        serve.deployment(num_replicas=-1)


class _GrpcOptions:
    """Shaped like Ray's gRPCOptions (attributes, not a dict)."""
    port = 9000
    grpc_servicer_functions = ["service_pb2_grpc.add_ModelServicer_to_server"]


def test_start_refuses_what_it_cannot_honour_naming_it():
    for grpc in ({"port": 9000, "grpc_servicer_functions": ["m.add_X_to_server"]},
                 _GrpcOptions()):
        with pytest.raises(ValueError, match="grpc_options.*no gRPC ingress"):
            serve.start(grpc_options=grpc)
    with pytest.raises(ValueError, match="tracing_config.*exports no traces"):
        serve.start(tracing_config={"enabled": True, "exporter_import_path": "tracing:setup"})
    with pytest.raises(ValueError, match="only supports"):
        serve.start(controller_options={"runtime_env": {"working_dir": "."}})
    with pytest.raises(TypeError, match="http_port"):
        serve.start(http_port=8000)


def test_start_takes_ray_signature_and_harmless_options(serve_runtime):
    with pytest.warns(UserWarning, match="logging_config"):
        serve.start(None, {"port": 0, "proxies": 1},
                    grpc_options={"port": 9000, "grpc_servicer_functions": []},
                    logging_config={"log_level": "INFO"}, detached=True,
                    tracing_config=serve.TracingConfig(enabled=False))
    try:
        @serve.deployment
        def hello(request):
            return "hello"
        serve.run(hello.bind())
        from ray_lite.serve.api import _http_port
        assert http(_http_port(), "GET", "/")[0] == 200
    finally:
        serve.shutdown()


def test_create_actors_takes_a_class_with_options(serve_runtime):
    """``C.options(...)`` as Serve's controller passes it (a deployment's
    ray_actor_options): each actor gets those options."""
    hs = core_api.create_actors(Probe.options(runtime_env={"env_vars": {"RL_PROBE": "set"}}),
                                [((), {}), ((), {})])
    assert ray.get([h.env.remote("RL_PROBE") for h in hs], timeout=60) == ["set", "set"]
    with pytest.raises(TypeError, match="expects a @remote class"):
        core_api.create_actors(Parent.spawn_children, [((), {})])



def test_proxies_that_die_while_the_runtime_stops_are_not_replaced(monkeypatch, capsys):
    # The runtime tells every process to exit at once (ray.shutdown, or a
    # driver that raised): the controller could see its proxies go before
    # it read its own exit and "replace" them (2 runs in 3 printed so).
    import asyncio
    import types
    from ray_lite.serve._controller import ServeController

    class DeadProxy:
        class wait_forever:
            @staticmethod
            async def remote():
                raise ActorDiedError("the proxy exited")

    proxy = DeadProxy()
    controller = types.SimpleNamespace(shutting_down=False, proxies=[proxy], http_port=8000)
    monkeypatch.setattr(state, "node", types.SimpleNamespace(exiting=True))
    asyncio.run(ServeController._replace_proxy_when_dead(controller, 0, proxy))
    assert controller.proxies == [proxy]
    assert "replacement" not in capsys.readouterr().err


@serve.deployment(num_replicas=1)
class HeapProbe:
    def __init__(self):
        self.marker = [["made in the constructor"]]     # tracked by the collector

    def __call__(self):
        import gc
        # A frozen object is in the permanent generation, which the
        # collector (and gc.get_objects) no longer walks.
        walked = any(o is self.marker for o in gc.get_objects())
        return {"walked": walked, "tracked": gc.is_tracked(self.marker)}


@pytest.mark.parametrize("setting", [None, "0"])
def test_a_ready_replica_has_frozen_what_its_start_up_made(serve_runtime, setting):
    """As Ray Serve (RAY_SERVE_FREEZE_GC_ON_STARTUP, on by default): once a
    replica is ready, its start-up's objects are in the collector's
    permanent generation, so a full collection does not walk them again
    while requests wait; 0 turns it off."""
    options = {} if setting is None else {
        "runtime_env": {"env_vars": {"RAY_SERVE_FREEZE_GC_ON_STARTUP": setting}}}
    handle = serve.run(HeapProbe.options(ray_actor_options=options).bind(),
                       name="heap", route_prefix=None)
    seen = handle.remote().result(timeout_s=30)
    assert seen["tracked"], seen
    assert seen["walked"] is (setting == "0"), seen
