"""``ray_lite.serve``: Ray Serve's programming model on one machine.

    from ray_lite import serve

    @serve.deployment(num_replicas=2)
    class Hello:
        async def __call__(self, request):      # a starlette.requests.Request
            return "hi"

    handle = serve.run(Hello.bind())            # HTTP on 127.0.0.1:8000
    handle.remote(...).result()
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
