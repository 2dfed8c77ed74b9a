"""``ray_lite.serve`` on Ray Serve (the Ray backend, ``ray_lite.backend() == "ray"``).

A program's deployments are ray_lite ``Deployment`` objects built at import
time; ``serve.run`` translates each one (once) into a Ray Serve deployment
and deploys the application on Ray Serve.  Handles are Ray's
(``.remote()``, ``.options(stream=True)``).  Inside a replica the Ray
backend is switched on before the user's constructor runs, so whatever the
replica calls in ray_lite (``get_multiplexed_model_id``, handles, tasks)
works on Ray too.

ray_lite's defaults that differ from Ray's hold unless the program sets
them: a replica is not charged against ``num_cpus``
(``ray_actor_options={"num_cpus": 0}``).
"""
import functools
import inspect
import weakref

from ray_lite._private.process import backend

from ._autoscaling_policy import AutoscalingConfig, AutoscalingPolicy
from .deployment import Application, Deployment

__all__ = ["run", "start", "status", "delete", "shutdown", "get_app_handle",
           "get_deployment_handle", "get_replica_context", "to_ray_deployment"]

# ray_lite Deployment -> its Ray Serve deployment (translated once).
_translated = weakref.WeakKeyDictionary()

# Options of ray_lite's http_options that Ray Serve's HTTPOptions knows.
_HTTP_KEYS = ("host", "port", "root_path", "request_timeout_s", "keep_alive_timeout_s")


def _serve():
    backend.require_ray()
    from ray import serve
    return serve


def _on_ray_class(cls):
    """``cls`` whose replicas switch ray_lite to the Ray backend first."""
    def __init__(self, *args, **kwargs):
        _activate_in_replica()
        cls.__init__(self, *args, **kwargs)
    return type(cls.__name__, (cls,), {"__init__": __init__, "__module__": cls.__module__,
                                       "__qualname__": cls.__qualname__,
                                       "__doc__": cls.__doc__})


def _on_ray_function(fn):
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def call(*args, **kwargs):
            _activate_in_replica()
            return await fn(*args, **kwargs)
    else:
        @functools.wraps(fn)
        def call(*args, **kwargs):
            _activate_in_replica()
            return fn(*args, **kwargs)
    return call


def _activate_in_replica():
    if not backend.RAY:
        backend.activate(backend.RAY_NAME)


def _ray_options(dep, serve):
    known = inspect.signature(serve.deployment).parameters
    options = {k: v for k, v in dep._config.items() if k in known and k != "name"}
    if isinstance(options.get("autoscaling_config"), AutoscalingConfig):
        options["autoscaling_config"] = options["autoscaling_config"].dict(exclude_unset=True)
    auto = options.get("autoscaling_config")
    if isinstance(auto, dict) and isinstance(auto.get("policy"), AutoscalingPolicy):
        options["autoscaling_config"] = dict(auto, policy=auto["policy"].dict())
    if options.get("logging_config") is not None:
        from ._logging import logging_config_dict
        options["logging_config"] = logging_config_dict(options["logging_config"])
    if options.get("deployment_actors"):
        options["deployment_actors"] = [_ray_deployment_actor(c)
                                        for c in options["deployment_actors"]]
    if options.get("gang_scheduling_config"):
        from ray.serve.config import GangSchedulingConfig
        options["gang_scheduling_config"] = GangSchedulingConfig(
            **options["gang_scheduling_config"])
    actor_options = dict(options.get("ray_actor_options") or {})
    # ray_lite's default: replicas cost no CPU.  (A gang's placement group on
    # Ray needs some resource in each bundle: a hundredth of a CPU then.)
    actor_options.setdefault("num_cpus", 0.01 if options.get("gang_scheduling_config") else 0)
    options["ray_actor_options"] = actor_options
    return options


def _ray_deployment_actor(cfg):
    """Ray Serve's ``DeploymentActorConfig`` of ray_lite's (its class made Ray's)."""
    from ray.serve.config import DeploymentActorConfig
    from ray_lite._ray import core
    return DeploymentActorConfig(name=cfg.name, actor_class=core.actor_class(
        cfg.get_actor_class()), init_args=cfg.init_args, init_kwargs=cfg.init_kwargs,
        actor_options=cfg.actor_options)


def to_ray_deployment(dep):
    """The Ray Serve deployment of the ray_lite ``Deployment`` ``dep``."""
    ray_dep = _translated.get(dep)
    if ray_dep is not None:
        return ray_dep
    serve = _serve()
    from ._asgi import _ASGI_ATTR
    target = dep.func_or_class
    if inspect.isclass(target):
        app = target.__dict__.get(_ASGI_ATTR)
        target = _on_ray_class(target)
        if app is not None:
            target = serve.ingress(app)(target)
    else:
        target = _on_ray_function(target)
    ray_dep = serve.deployment(target, name=dep.name, **_ray_options(dep, serve))
    _translated[dep] = ray_dep
    return ray_dep


def _to_ray_app(app, seen):
    """The Ray Serve application of ray_lite's ``app`` (bound arguments too)."""
    done = seen.get(id(app))
    if done is not None:
        return done

    args, kwargs = app.bound_args(lambda bound: _to_ray_app(bound, seen))
    ray_app = to_ray_deployment(app.deployment).bind(*args, **kwargs)
    seen[id(app)] = ray_app
    return ray_app


def run(target, *, blocking=False, name="default", route_prefix="/", logging_config=None,
        external_scaler_enabled=False, controller_options=None):
    if isinstance(target, Deployment):
        target = target.bind()
    if not isinstance(target, Application):
        raise TypeError(f"serve.run expects an Application (deployment.bind(...)), got "
                        f"{type(target).__name__}")
    from ._logging import logging_config_dict
    return _serve().run(_to_ray_app(target, {}), blocking=blocking, name=name,
                        route_prefix=route_prefix,
                        logging_config=logging_config_dict(logging_config),
                        external_scaler_enabled=external_scaler_enabled,
                        controller_options=_plain(controller_options))


def run_many(targets, blocking=False, wait_for_ingress=True, wait_for_running=True,
             controller_options=None):
    """ray_lite's ``RunTarget``s deployed by Ray Serve's ``run_many``."""
    from ._logging import logging_config_dict
    serve = _serve()
    return serve.run_many([
        serve.RunTarget(target=_to_ray_app(t.target.bind() if isinstance(t.target, Deployment)
                                           else t.target, {}),
                        name=t.name, route_prefix=t.route_prefix,
                        logging_config=logging_config_dict(t.logging_config),
                        external_scaler_enabled=t.external_scaler_enabled)
        for t in targets], blocking=blocking, wait_for_ingress_deployment_creation=wait_for_ingress,
        wait_for_applications_running=wait_for_running,
        controller_options=_plain(controller_options))


async def shutdown_async():
    return await _serve().shutdown_async()


def start(proxy_location=None, http_options=None, grpc_options=None, logging_config=None,
          tracing_config=None, controller_options=None, **kwargs):
    if http_options is not None and isinstance(http_options, dict):
        # ray_lite's own keys (proxies, max_body_size) mean nothing to Ray Serve.
        http_options = {k: v for k, v in http_options.items() if k in _HTTP_KEYS}
    kwargs.pop("detached", None)
    return _serve().start(proxy_location=proxy_location, http_options=http_options,
                          grpc_options=grpc_options, logging_config=logging_config,
                          tracing_config=_plain(tracing_config),
                          controller_options=_plain(controller_options), **kwargs)


def _plain(config):
    """ray_lite's ``ControllerOptions`` / ``TracingConfig`` as the dict Ray's take."""
    from ._plain_config import PlainConfig
    return config.dict() if isinstance(config, PlainConfig) else config


def status():
    return _serve().status()


def delete(name, _blocking=True):
    return _serve().delete(name, _blocking=_blocking)


def shutdown():
    return _serve().shutdown()


def get_app_handle(name):
    return _serve().get_app_handle(name)


def get_deployment_handle(deployment_name, app_name=None):
    return _serve().get_deployment_handle(deployment_name, app_name)


def get_replica_context():
    return _serve().get_replica_context()


def get_deployment_actor(actor_name):
    return _serve().get_deployment_actor(actor_name)


def get_deployment_actor_context():
    return _serve().get_deployment_actor_context()

