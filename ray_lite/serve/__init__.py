"""``ray_lite.serve``: Ray Serve's programming model on one machine.

    from ray_lite import serve

    @serve.deployment(num_replicas=2)
    class Hello:
        async def __call__(self, request):      # a starlette.requests.Request
            return "hi"

    handle = serve.run(Hello.bind())            # HTTP on 127.0.0.1:8000
    handle.remote(...).result()

The package owns Serve: deployments and applications, the controller, the
HTTP proxies, the replicas, handles, and the ``serve`` CLI.  It sits on top
of ray_lite and may import any of it: the core runtime (``ray_lite._private``,
mostly through ``_core``), ``ray_lite._fast`` (the compiled HTTP connection,
rings), ``ray_lite._config``, ``ray_lite.exceptions``, ``ray_lite.actor``,
``ray_lite.util.metrics``, and for the Ray backend ``ray_lite._ray`` and
``ray.serve``.  Nothing below imports it (the ``ray-lite serve`` command
loads ``cli`` when it runs).

Inside, imports go one way, downwards, with no circle (function-level
imports included):

1. entry points: this package, ``cli``, ``config`` (config files), ``api``;
2. the actors and their parts: ``_controller`` (``_controller_scaling``,
   ``_controller_checkpoint``, ``_autoscaler``), ``_proxy`` (``_proxy_conn``,
   ``_listen``), ``_replica`` (``_asgi``, ``_websocket``, ``_body``), ``_on_ray``
   (the Ray backend);
3. what callers and actors share: ``deployment``, ``handle`` and its
   ``_router``, ``_routing``, ``_demand``, ``_deployment_actors``,
   ``_autoscaling_policy``, ``schema``;
4. low modules: ``context``, ``_request_calls``, ``multiplex``, ``batching``,
   ``_asgi_scope``, ``_http``, ``_json``, ``_logging``, ``_options``,
   ``_metrics``, ``_spin``, ``_defaults``, ``_core``, ``exceptions``, ...

An actor does not import the one it talks to: the controller starts proxies
and replicas by their classes; they reach it through ``context``.
"""
from .api import (
    delete,
    get_app_handle,
    get_deployment_actor,
    get_deployment_actor_context,
    get_deployment_handle,
    get_replica_context,
    run,
    run_many,
    RunTarget,
    shutdown,
    shutdown_async,
    start,
    status,
)
from ._asgi import ingress
from ._http import HTTPOptions
from ._logging import configure_default_serve_logger
from ._start_options import ControllerOptions, TracingConfig
from .batching import batch
from .context import get_trace_context
from .deployment import Application, Deployment, deployment
from .handle import DeploymentHandle, DeploymentResponse, DeploymentResponseGenerator
from .multiplex import get_multiplexed_model_id, multiplexed

__all__ = [
    "deployment", "Deployment", "Application", "run", "run_many", "RunTarget", "start",
    "status", "delete", "shutdown", "shutdown_async",
    "get_app_handle", "get_deployment_handle", "get_replica_context", "batch",
    "get_deployment_actor", "get_deployment_actor_context",
    "ingress", "multiplexed", "get_multiplexed_model_id", "get_trace_context",
    "DeploymentHandle", "DeploymentResponse", "DeploymentResponseGenerator", "HTTPOptions",
    "ControllerOptions", "TracingConfig", "configure_default_serve_logger",
]


def __getattr__(name):
    # ``ray_lite.serve.metrics`` and ``.config`` after ``from ray_lite import
    # serve``, as Ray's are after ``from ray import serve``.
    if name in ("metrics", "config"):
        import importlib
        return importlib.import_module(f"ray_lite.serve.{name}")
    raise AttributeError(f"module 'ray_lite.serve' has no attribute {name!r}")
