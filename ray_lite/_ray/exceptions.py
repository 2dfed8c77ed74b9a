"""Ray's errors as ray_lite's exception classes: what ``except`` catches on Ray.

A program written for ray_lite says ``except ray_lite.exceptions.GetTimeoutError``
(or ``RayActorError``, ``TaskCancelledError``...) and must catch what Ray raises
on the Ray backend.  CPython's ``except`` matches on the real class hierarchy
(``PyType_IsSubtype``), never ``__subclasscheck__``, so a metaclass cannot do it.
Two ways remained:

* make ``ray_lite.exceptions.X`` *be* ``ray.exceptions.X`` on Ray.  It cannot
  work for a program that chose Ray with ``init(backend="ray")``: its modules
  bound the classes (``from ray_lite.exceptions import X``) at import, before
  init, and ``import ray_lite`` must not import Ray.
* translate at the boundary, which is what this module does: where ray_lite
  hands a Ray error to the program (``get``, ``wait``, a streaming generator's
  ``next``, the ``util`` queue), the error becomes an instance of a class that
  derives from Ray's class *and* from ray_lite's counterpart (``translate``).
  ``except ray.exceptions.X``, ``except ray_lite.exceptions.X`` and, for a
  task's error, ``except ValueError`` (the user's class; Ray's ``RayTaskError``
  is already a subclass of it) all catch it; its message, attributes and
  pickling are Ray's.  Errors that Ray raises on its own paths (``await ref``
  in an async actor, a direct ``ray.get``) are Ray's untranslated classes.

The counterpart of a Ray class is ray_lite's class of the same name nearest in
its MRO (``ActorUnavailableError`` -> ``RayActorError``, ``OutOfMemoryError``
-> ``RayError``), so each Ray error maps to the most precise ray_lite class.
"""
from ray_lite import exceptions as _rl

__all__ = ["translate", "register"]

# Ray's class -> ray_lite's class it answers to (filled by ``register``).
_COUNTERPARTS = {}
# Ray's error class -> the class derived from it and its counterpart (or None).
_DUALS = {}


def register(ray_exceptions, extra=()):
    """Map each of Ray's exception classes to ray_lite's of the same name;
    ``extra``: more ``(ray_class, ray_lite_class)`` pairs (the queue's)."""
    for name in _rl.__all__:
        ray_cls = getattr(ray_exceptions, name, None)
        if ray_cls is not None:
            _COUNTERPARTS[ray_cls] = getattr(_rl, name)
    for ray_cls, rl_cls in extra:
        _COUNTERPARTS[ray_cls] = rl_cls


def _counterpart(ray_cls):
    for base in ray_cls.__mro__:
        rl_cls = _COUNTERPARTS.get(base)
        if rl_cls is not None:
            return rl_cls
    return None


def _dual(ray_cls):
    dual = _DUALS.get(ray_cls, False)
    if dual is False:
        dual = None
        rl_cls = _counterpart(ray_cls)
        if rl_cls is not None and not issubclass(ray_cls, rl_cls):
            try:
                dual = type(ray_cls.__name__, (ray_cls, rl_cls),
                            {"__module__": ray_cls.__module__,
                             "__qualname__": ray_cls.__qualname__,
                             "__reduce__": _reduce_dual})
            except TypeError:       # incompatible layouts: keep Ray's class
                dual = None
        _DUALS[ray_cls] = dual
    return dual


def _reduce_dual(self):
    # Sent elsewhere as Ray's own error; translated again where ray_lite reads it.
    return (translate, (self._ray_error,))


def translate(error):
    """``error`` (one of Ray's) as an instance of its class and of ray_lite's
    counterpart; ``error`` itself when it has none or is one already."""
    dual = _dual(type(error))
    if dual is None:
        return error
    try:
        new = dual.__new__(dual)
        new.__dict__.update(error.__dict__)
        new.args = error.args
    except Exception:       # noqa: BLE001 - an exotic class (an ExceptionGroup): keep Ray's
        return error
    new._ray_error = error
    new.__cause__ = error.__cause__
    new.__context__ = error.__context__
    new.__traceback__ = error.__traceback__
    return new
