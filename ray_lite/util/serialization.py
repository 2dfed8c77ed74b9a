"""Ray's custom serialization: ``register_serializer(cls, serializer=...,
deserializer=...)`` makes instances of ``cls`` travel as what ``serializer``
returns and come back through ``deserializer``, wherever they sit (an
argument, a result, inside a list, inside another object).

As in Ray, the registration is this process's: a task that sends such
objects itself registers in its own process; receiving needs nothing (the
deserializer travels with each object, so it must be serialisable itself).
ray_lite pickles with cloudpickle, which reads Python's ``copyreg`` table:
the registration goes there, so a plain ``pickle.dumps`` in this process
uses it too.
"""
import copyreg

from ray_lite import _ray
from ray_lite._private.process import backend as _backend

__all__ = ["register_serializer", "deregister_serializer"]

# cls -> the reducer registered for it here (deregistering removes only ours).
_ours = {}


def _rebuild(deserializer, serialized):
    return deserializer(serialized)


def register_serializer(cls, *, serializer, deserializer):
    """Serialise instances of ``cls`` as ``serializer(obj)`` and rebuild them
    with ``deserializer(that)``; registering again replaces the pair."""
    if _backend.RAY:
        return _ray.util.UTIL["register_serializer"](cls, serializer=serializer,
                                                     deserializer=deserializer)
    if not isinstance(cls, type):
        raise TypeError(f"register_serializer takes a class, got {cls!r}")
    for name, fn in (("serializer", serializer), ("deserializer", deserializer)):
        if not callable(fn):
            raise TypeError(f"register_serializer: {name} must be callable, got {fn!r}")

    def reduce(obj):
        return _rebuild, (deserializer, serializer(obj))
    copyreg.pickle(cls, reduce)
    _ours[cls] = reduce


def deregister_serializer(cls):
    """Undo ``register_serializer(cls, ...)`` in this process."""
    if _backend.RAY:
        return _ray.util.UTIL["deregister_serializer"](cls)
    reduce = _ours.pop(cls, None)
    if reduce is not None and copyreg.dispatch_table.get(cls) is reduce:
        del copyreg.dispatch_table[cls]
