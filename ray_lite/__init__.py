"""ray_lite: a Cython-accelerated, single-machine runtime with Ray's API.

    import ray_lite as ray          # later: import ray, unchanged

The names here are Ray's and mean what they mean in Ray; where ray_lite differs,
the manual's compatibility page (docs/compatibility.md) says how and why.
"""
from ray_lite._version import __version__

from ray_lite import exceptions
from ray_lite import _ray  # noqa: F401 - the Ray engine registers itself (imports no Ray)
from ray_lite._private.api.core import (
    ObjectRef,
    ObjectRefGenerator,
    cancel,
    get,
    get_actor,
    init,
    is_initialized,
    kill,
    put,
    remote,
    shutdown,
    wait,
)
from ray_lite._private.scheduling.cluster import (
    available_resources,
    cluster_resources,
    get_gpu_ids,
    nodes,
)
from ray_lite._private.objects.dynamic_generator import DynamicObjectRefGenerator
from ray_lite._private.api.method_options import method
from ray_lite._private.api.runtime_context import SCRIPT_MODE, WORKER_MODE, get_runtime_context
from ray_lite.message_queue import MessageQueue
from ray_lite import actor  # noqa: E402  (Ray's ray.actor: exit_actor, method)
from ray_lite._private.process.backend import current as backend
from ray_lite._private.process.ids import (ActorClassID, ActorID, FunctionID, JobID, NodeID,
                                   PlacementGroupID, TaskID, UniqueID, WorkerID)
ObjectID = ObjectRef        # Ray's old name, still there in Ray 2.60
# Ray's worker modes (``SCRIPT_MODE`` a driver, ``WORKER_MODE`` a task's or
# actor's process; ray_lite has no spill or restore workers).
SPILL_WORKER_MODE = 2
RESTORE_WORKER_MODE = 3

__all__ = [
    "__version__", "exceptions", "init", "shutdown", "is_initialized", "remote", "get",
    "wait", "put", "kill", "cancel", "get_actor", "ObjectRef", "ObjectRefGenerator",
    "DynamicObjectRefGenerator",
    "MessageQueue", "method", "get_runtime_context", "available_resources",
    "cluster_resources", "nodes", "get_gpu_ids", "actor", "backend",
    "ActorClassID", "ActorID", "FunctionID", "JobID", "NodeID", "ObjectID",
    "PlacementGroupID", "TaskID", "UniqueID", "WorkerID", "LoggingConfig",
    "SCRIPT_MODE", "WORKER_MODE", "SPILL_WORKER_MODE", "RESTORE_WORKER_MODE",
    "timeline",
]


_LAZY_SUBMODULES = ("util", "runtime_env", "job_config", "remote_function", "runtime_context",
                    "dag")


def __getattr__(name):
    # ``ray_lite.util`` (and the others) are imported on first use, as
    # ``ray.util`` is reachable after ``import ray``, without slowing down
    # ``import ray_lite``.
    if name in _LAZY_SUBMODULES:
        import importlib
        return importlib.import_module(f"ray_lite.{name}")
    if name == "LoggingConfig":
        from ray_lite._private.job.logging_config import LoggingConfig
        return LoggingConfig
    if name == "timeline":
        from ray_lite._private.api.observability import timeline
        return timeline
    if name == "cloudpickle":
        # ``from ray import cloudpickle``: Ray's vendored copy; the same package.
        import cloudpickle
        return cloudpickle
    raise AttributeError(f"module 'ray_lite' has no attribute {name!r}")

# In a process Ray started for a task or an actor, ray_lite runs on Ray.
_private.process.backend.adopt_ray_worker()
