"""``ray_lite.actor``: Ray's ``ray.actor`` names (``method``, ``exit_actor``, the handle types)."""
from ray_lite._private.method_options import method
from ray_lite._private.actor_handle import ActorHandle, ActorMethod
from ray_lite._private.remote import ActorClass, ActorClassInheritanceException
from ray_lite._private.runtime_context import exit_actor

__all__ = ["method", "exit_actor", "ActorClass", "ActorClassInheritanceException",
           "ActorHandle", "ActorMethod"]
