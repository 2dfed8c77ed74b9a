"""The Ray backend: ray_lite's public names mapped onto Ray's.

Nothing here is imported unless a program chooses Ray (see
``ray_lite/_private/backend.py``), so ``import ray_lite`` never imports Ray.
"""
from ray_lite._private import backend

__all__ = ["init", "shutdown", "is_initialized"]


def init(*, address, num_cpus, namespace, resources, runtime_env, object_store_memory,
         ignore_reinit_error, **kwargs):
    """``ray.init`` with ray_lite's arguments (a local Ray when ``address`` is None)."""
    ray = backend.require_ray()
    if address == "local":
        address = None
    ray.init(address=address, num_cpus=num_cpus, namespace=namespace, resources=resources,
             runtime_env=runtime_env, object_store_memory=object_store_memory,
             ignore_reinit_error=ignore_reinit_error, **kwargs)
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
