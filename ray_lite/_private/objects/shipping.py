"""Shipping functions and classes to workers, with tracebacks that still show source.

A remote function or actor class is pickled by value (cloudpickle): the
module attribute is the ``RemoteFunction``/``ActorClass`` wrapper, not the
object itself, so it cannot go by reference.  cloudpickle (>= 3.1) replaces
the file name of code pickled by value with ``<dynamic-code>``, which makes
the remote traceback of a ``RayTaskError`` lose its source lines.  The blob
therefore carries the original file name, and the worker puts it back.
"""
import types

from ray_lite._lazy import lazy_module

# cloudpickle imports inspect, typing, dataclasses and logging (~20 ms):
# paid by the first function shipped or loaded, not by import ray_lite.
cloudpickle = lazy_module("cloudpickle", globals())
inspect = lazy_module("inspect", globals())

_DYNAMIC = "<dynamic-code>"
_TAG = "ray_lite.ship/1"


def _origin(obj):
    try:
        return inspect.getsourcefile(obj) or inspect.getfile(obj)
    except (TypeError, OSError):
        return None


def shipped_form(obj):
    """What ``ship`` pickles for ``obj``: it, and the file name to restore."""
    return (_TAG, obj, _origin(obj))


def ship(obj):
    """The blob of a function or class: ``unship`` in the worker (in each
    worker it is sent to: the refs it captured are pinned, see refs.py)."""
    from .refs import pinning_refs
    with pinning_refs():
        return cloudpickle.dumps(shipped_form(obj))


def _recode(code, filename):
    consts = tuple(_recode(c, filename) if isinstance(c, types.CodeType) else c
                   for c in code.co_consts)
    if code.co_filename == _DYNAMIC:
        return code.replace(co_filename=filename, co_consts=consts)
    return code.replace(co_consts=consts)


def _fix_function(fn, filename, seen=None):
    """Restores ``fn``'s file name, and that of the functions of its module it
    calls: cloudpickle took those by value too (a helper in ``__main__``)."""
    seen = set() if seen is None else seen
    if id(fn) in seen:
        return
    seen.add(id(fn))
    code = getattr(fn, "__code__", None)
    if isinstance(code, types.CodeType):
        try:
            fn.__code__ = _recode(code, filename)
        except (TypeError, ValueError):
            pass
    module = getattr(fn, "__module__", None)
    for value in list(getattr(fn, "__globals__", {}).values()):
        if inspect.isfunction(value) and value.__module__ == module \
                and value.__code__.co_filename == _DYNAMIC:
            _fix_function(value, filename, seen)


def unship(blob):
    """The function or class ``ship`` packed, with its file name restored."""
    obj = cloudpickle.loads(blob)
    if not (type(obj) is tuple and len(obj) == 3 and obj[0] == _TAG):
        return obj   # a plain cloudpickle blob
    _, obj, filename = obj
    if filename:
        if inspect.isclass(obj):
            for member in vars(obj).values():
                if isinstance(member, (staticmethod, classmethod)):
                    member = member.__func__
                elif isinstance(member, property):
                    for f in (member.fget, member.fset, member.fdel):
                        if f is not None:
                            _fix_function(f, filename)
                    continue
                if inspect.isfunction(member):
                    _fix_function(member, filename)
        elif inspect.isfunction(obj):
            _fix_function(obj, filename)
    return obj
