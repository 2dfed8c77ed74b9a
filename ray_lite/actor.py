"""``ray_lite.actor``: Ray's ``ray.actor`` names (``method``, ``exit_actor``, the handle types)."""
from ray_lite._private.api.method_options import method
from ray_lite._private.api.actor_handle import ActorHandle, ActorMethod
from ray_lite._private.api.remote import ActorClass, ActorClassInheritanceException
from ray_lite._private.api.runtime_context import exit_actor

__all__ = ["method", "exit_actor", "ActorClass", "ActorClassInheritanceException",
           "ActorHandle", "ActorMethod"]
