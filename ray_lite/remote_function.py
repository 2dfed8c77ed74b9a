"""Ray's ``ray.remote_function``: the class of what ``@ray_lite.remote`` makes
of a function (for ``isinstance`` checks in programs and libraries)."""
from ray_lite._private.api.remote import RemoteFunction

__all__ = ["RemoteFunction"]
