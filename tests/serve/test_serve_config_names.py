"""Ray's ``ray.serve.config`` names, as Serve programs import them:
``AutoscalingConfig`` (a deployment's ``autoscaling_config``, checked when
made), ``HTTPOptions``, ``ProxyLocation``, ``DeploymentMode``,
``gRPCOptions``, ``RequestRouterConfig``; and ``ray.serve.schema``'s status
enums, which ``serve.status()`` reports in."""
import pickle

import pytest

from ray_lite import serve
from ray_lite.serve.config import (AutoscalingConfig, ConfigError, DeploymentMode,
                                   HTTPOptions, ProxyLocation, RequestRouterConfig,
                                   gRPCOptions)

from serve_helpers import http


def test_autoscaling_config_reads_back_with_rays_defaults():
    a = AutoscalingConfig(min_replicas=1, max_replicas=4, target_ongoing_requests=3)
    assert (a.min_replicas, a.max_replicas, a.target_ongoing_requests) == (1, 4, 3)
    assert a.upscale_delay_s == 30.0 and a.downscale_delay_s == 600.0   # Ray's defaults
    assert a.initial_replicas is None
    assert a.dict(exclude_unset=True) == {"min_replicas": 1, "max_replicas": 4,
                                          "target_ongoing_requests": 3}
    assert a.model_dump()["look_back_period_s"] == 30.0
    a.max_replicas = 6
    assert a.max_replicas == 6 and a.dict(exclude_unset=True)["max_replicas"] == 6
    assert pickle.loads(pickle.dumps(a)) == a


@pytest.mark.parametrize("fields, words", [
    ({"min_replicas": 5, "max_replicas": 2}, r"min_replicas \(5\) is greater than max_replicas"),
    ({"max_replica": 2}, "unknown key 'max_replica'"),
    ({"target_ongoing_requests": 0}, "target_ongoing_requests"),
    ({"min_replicas": 1, "max_replicas": 3, "initial_replicas": 9}, "initial_replicas"),
])
def test_autoscaling_config_is_checked_when_made(fields, words):
    with pytest.raises(ValueError, match=words):     # ConfigError, as pydantic's, a ValueError
        AutoscalingConfig(**fields)


def test_a_bad_field_set_later_leaves_the_config_as_it_was():
    a = AutoscalingConfig(min_replicas=1, max_replicas=2)
    with pytest.raises(ConfigError, match="greater than max_replicas"):
        a.min_replicas = 3
    assert a.min_replicas == 1 and a.dict(exclude_unset=True) == {"min_replicas": 1,
                                                                   "max_replicas": 2}


def test_a_deployment_takes_an_autoscaling_config_object():
    @serve.deployment(autoscaling_config=AutoscalingConfig(min_replicas=2, max_replicas=5))
    class Scaled:
        pass
    assert Scaled.num_replicas == 2
    cfg = Scaled.full_config()["autoscaling_config"]
    assert (cfg["min_replicas"], cfg["max_replicas"]) == (2, 5)
    assert Scaled.options(autoscaling_config=AutoscalingConfig(
        min_replicas=1, max_replicas=3, initial_replicas=3)).num_replicas == 3
    with pytest.raises(ConfigError, match="expected a mapping or an AutoscalingConfig, got "
                                          "list"):
        serve.deployment(autoscaling_config=[1, 2])(Scaled.func_or_class)


def test_enums_and_options_objects_spell_rays_values():
    assert [p.value for p in ProxyLocation] == ["Disabled", "HeadOnly", "EveryNode"]
    assert ProxyLocation("EveryNode") is ProxyLocation.EveryNode
    assert ProxyLocation.Disabled == "Disabled"     # a str, as Ray's enum
    assert DeploymentMode.NoServer == "NoServer"
    assert HTTPOptions is serve.HTTPOptions
    assert HTTPOptions(port=8123, location=DeploymentMode.EveryNode).to_dict()["port"] == 8123
    g = gRPCOptions()
    assert (g.port, g.grpc_servicer_functions) == (9000, [])
    r = RequestRouterConfig(request_router_kwargs={"k": 1})
    assert r.request_router_kwargs == {"k": 1}


@serve.deployment
class Hello:
    async def __call__(self, request):
        return "hi"


def test_serve_start_takes_the_enum_and_grpc_options(serve_runtime):
    from ray_lite.serve.api import _http_port
    with pytest.raises(ValueError, match="no gRPC ingress"):
        serve.start(grpc_options=gRPCOptions(grpc_servicer_functions=["mod.add_servicer"]))
    serve.start(proxy_location=ProxyLocation.EveryNode, grpc_options=gRPCOptions(),
                http_options=HTTPOptions(port=0, proxies=1))
    serve.run(Hello.options(autoscaling_config=AutoscalingConfig(
        min_replicas=1, max_replicas=2)).bind(), name="hello", route_prefix="/hello")
    status, _, body = http(_http_port(), "GET", "/hello")
    assert (status, body) == (200, b"hi")


def test_status_values_are_rays_enums(serve_port):
    from ray_lite.serve.schema import (ApplicationStatus, DeploymentStatus, ReplicaState,
                                       ServeStatus)
    serve.run(Hello.bind(), name="hello", route_prefix="/hello")
    st = serve.status()
    assert isinstance(st, ServeStatus)
    app = st.applications["hello"]
    assert app.status is ApplicationStatus.RUNNING and app.status == "RUNNING"
    dep = app.deployments["Hello"]
    assert dep.status is DeploymentStatus.HEALTHY
    assert dep.replica_states == {ReplicaState.RUNNING: 1} == {"RUNNING": 1}


@serve.deployment
class Echo:
    def __init__(self, word):
        self.word = word

    async def __call__(self, request):
        return self.word


def test_run_many_deploys_every_target_and_returns_their_handles(serve_port):
    handles = serve.run_many([
        serve.RunTarget(Hello.bind(), name="hello", route_prefix="/hello"),
        serve.RunTarget(Echo.bind("two"), name="two", route_prefix="/two"),
        serve.RunTarget(Echo.bind("inner"), name="inner", route_prefix=None),
    ])
    assert [h.__class__.__name__ for h in handles] == ["DeploymentHandle"] * 3
    assert http(serve_port, "GET", "/hello")[::2] == (200, b"hi")
    assert http(serve_port, "GET", "/two")[::2] == (200, b"two")
    assert set(serve.status().applications) == {"hello", "two", "inner"}
    with pytest.raises(ValueError, match="same name: 'a'"):
        serve.run_many([serve.RunTarget(Hello.bind(), name="a", route_prefix="/a"),
                        serve.RunTarget(Hello.bind(), name="a", route_prefix="/b")])
    with pytest.raises(ValueError, match="same route_prefix: '/x'"):
        serve.run_many([serve.RunTarget(Hello.bind(), name="a", route_prefix="/x"),
                        serve.RunTarget(Hello.bind(), name="b", route_prefix="/x")])
    with pytest.raises(TypeError, match="RunTarget"):
        serve.run_many([Hello.bind()])
    with pytest.raises(ValueError, match="No applications provided"):
        serve.run_many([])
    with pytest.raises(TypeError, match="serve.run_many expects an Application"):
        serve.run_many([serve.RunTarget("not an app", name="x", route_prefix="/x")])


def test_shutdown_async_stops_serve_from_a_running_loop(serve_port):
    import asyncio
    serve.run(Hello.bind(), name="hello", route_prefix="/hello")
    assert serve.status().applications

    async def main():
        await asyncio.wait_for(serve.shutdown_async(), 60)
    asyncio.run(main())
    assert serve.status().applications == {}


def test_no_tracing_means_no_trace_context():
    assert serve.get_trace_context() is None


def test_replica_unavailable_error_is_rays_and_travels():
    from ray_lite.serve.exceptions import RayServeException, ReplicaUnavailableError
    err = pickle.loads(pickle.dumps(ReplicaUnavailableError("app#Hello#abc")))
    assert isinstance(err, RayServeException) and err.replica_id == "app#Hello#abc"
    assert str(err) == "Replica app#Hello#abc is unavailable."


@serve.deployment(ray_actor_options={"runtime_env": {"env_vars": {"RL_TEST_FROM_OPTIONS": "yes"}},
                                     "label_selector": {"region": "!us"}})
class EnvReader:
    def __call__(self, request=None):
        import os
        return os.environ.get("RL_TEST_FROM_OPTIONS", "unset")


def test_ray_actor_options_runtime_env_and_label_selector_reach_the_replicas(serve_port):
    """The replicas are made with the deployment's ray_actor_options: its
    env_vars are theirs, and a label_selector that no node matches fails the
    deployment with the reason (Ray Serve would leave it starting for good)."""
    handle = serve.run(EnvReader.bind(), name="env", route_prefix="/env")
    assert handle.remote().result(timeout_s=30) == "yes"
    assert http(serve_port, "GET", "/env")[::2] == (200, b"yes")
    unmatched = EnvReader.options(ray_actor_options={"label_selector": {"region": "us"}})
    with pytest.raises(RuntimeError, match=r"label_selector=\{'region': 'us'\} matches no node"):
        serve.run(unmatched.bind(), name="nowhere", route_prefix="/nowhere")
    fallback = EnvReader.options(ray_actor_options={
        "label_selector": {"region": "us"}, "fallback_strategy": [
            {"label_selector": {"region": "!us"}}]})
    assert serve.run(fallback.bind(), name="fallback",
                     route_prefix="/fallback").remote().result(timeout_s=30) == "unset"
    with pytest.raises(ValueError, match="Invalid label selector value `in\\(\\)`"):
        EnvReader.options(ray_actor_options={"label_selector": {"region": "in()"}})


def test_run_takes_rays_signature():
    import inspect
    params = inspect.signature(serve.run).parameters
    assert list(params)[:8] == ["target", "blocking", "name", "route_prefix", "logging_config",
                                "_local_testing_mode", "external_scaler_enabled",
                                "controller_options"]
    assert params["blocking"].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD


def test_controller_options_are_checked_as_rays():
    from ray_lite.serve.config import ControllerOptions
    from ray_lite.serve._start_options import controller_env_vars
    assert serve.ControllerOptions is ControllerOptions
    opts = ControllerOptions(runtime_env={"env_vars": {"K": "v"}})
    assert opts.model_dump() == {"runtime_env": {"env_vars": {"K": "v"}}}
    assert controller_env_vars(opts) == controller_env_vars(opts.dict()) == {"K": "v"}
    assert controller_env_vars(None) is None and controller_env_vars({}) is None
    assert ControllerOptions().runtime_env is None
    for runtime_env, words in (({"pip": ["x"]}, r"only supports \['env_vars'\].*\['pip'\]"),
                               ("env", "runtime_env must be a dict, got str"),
                               ({"env_vars": ["K"]}, "env_vars must be a dict"),
                               ({"env_vars": {"": "v"}}, "non-empty str"),
                               ({"env_vars": {"K": 1}}, r"env_vars\['K'\] must be str")):
        with pytest.raises(ValueError, match=words):
            ControllerOptions(runtime_env=runtime_env)
    with pytest.raises(TypeError, match="controller_options must be a dict, ControllerOptions"):
        controller_env_vars(["env_vars"])
    with pytest.raises(ValueError, match="unknown key 'runtim_env'"):
        controller_env_vars({"runtim_env": {}})


def test_tracing_config_has_rays_defaults_and_checks(monkeypatch):
    from ray_lite.serve.schema import TracingConfig
    assert serve.TracingConfig is TracingConfig
    monkeypatch.delenv("RAY_SERVE_TRACING_EXPORTER_IMPORT_PATH", raising=False)
    monkeypatch.delenv("RAY_SERVE_TRACING_SAMPLING_RATIO", raising=False)
    assert TracingConfig().dict() == {"enabled": False, "exporter_import_path": "",
                                      "sampling_ratio": 0.01}
    monkeypatch.setenv("RAY_SERVE_TRACING_EXPORTER_IMPORT_PATH", "mod:exporter")
    assert TracingConfig().enabled and TracingConfig().exporter_import_path == "mod:exporter"
    with pytest.raises(ValueError, match="sampling_ratio must be between 0.0 and 1.0, got 1.5"):
        TracingConfig(sampling_ratio=1.5)


def test_configure_default_serve_logger_logs_to_standard_error(capsys):
    import logging
    logger = logging.getLogger("ray.serve")
    saved = (logger.handlers[:], logger.level, logger.propagate)
    try:
        serve.configure_default_serve_logger()
        logger.info("configured here")
        err = capsys.readouterr().err
        assert "INFO" in err and " serve " in err and "-- configured here" in err
    finally:
        logger.handlers[:], logger.level, logger.propagate = saved
