"""The Ray backend: ray_lite's public names mapped onto Ray's.

The package root imports this package, which registers itself with the core
(``backend.ENGINE``, in ``_private/process/backend.py``) and imports Ray only
when a program chooses Ray: ``import ray_lite`` never imports Ray.  ``core``
holds the core API's Ray branches, ``exceptions`` the translation of Ray's
errors, ``util`` the ``ray_lite.util`` names' Ray counterparts; they are
imported when Ray becomes the backend (``_activate``), and the core reaches
them as ``backend.ENGINE.core`` etc. from then on.
"""
import sys

from ray_lite._private.process import backend

__all__ = ["init", "shutdown", "is_initialized", "adopt"]


def init(*, address, num_cpus, namespace, resources, runtime_env, object_store_memory,
         ignore_reinit_error, **kwargs):
    """``ray.init`` with ray_lite's arguments (a local Ray when ``address`` is None)."""
    ray = backend.require_ray()
    if address == "local":
        address = None
    context = ray.init(address=address, num_cpus=num_cpus, namespace=namespace,
                       resources=resources, runtime_env=runtime_env,
                       object_store_memory=object_store_memory,
                       ignore_reinit_error=ignore_reinit_error, **kwargs)
    _activate(ray)
    return context


def adopt():
    """Run on Ray in a process that Ray started (a Ray worker): it is
    connected already (``backend.adopt_ray_worker``)."""
    _activate(backend.require_ray())


def _activate(ray):
    from ray_lite._private.objects.refs import ObjectRef, ObjectRefGenerator
    from ray_lite._private.objects.dynamic_generator import DynamicObjectRefGenerator
    from ray_lite._private.api.actor_handle import ActorHandle
    from ray_lite.exceptions import Empty, Full
    from ray.util import queue as ray_queue

    from . import core, exceptions, util  # noqa: F401 - reached as ray_lite._ray.<module>
    backend.RAY_TWINS.update({ObjectRef: ray.ObjectRef,
                              ObjectRefGenerator: ray.ObjectRefGenerator,
                              DynamicObjectRefGenerator: ray.DynamicObjectRefGenerator,
                              ActorHandle: ray.actor.ActorHandle})
    exceptions.register(ray.exceptions, [(ray_queue.Empty, Empty), (ray_queue.Full, Full)])
    exceptions.translate_generator_errors(ray.ObjectRefGenerator)
    exceptions.translate_task_errors(ray.exceptions.RayTaskError)
    exceptions.translate_awaited_errors(ray._raylet)
    backend.activate(backend.RAY_NAME)


def shutdown():
    ray = backend.require_ray()
    try:
        ray.shutdown()
    finally:
        backend.deactivate()


def is_initialized():
    import ray
    return ray.is_initialized()


backend.register_engine(sys.modules[__name__])
