"""``ray_lite.runtime_context``: Ray's ``ray.runtime_context`` names."""
from ray_lite._private.api.runtime_context import RuntimeContext, get_runtime_context

__all__ = ["RuntimeContext", "get_runtime_context"]
