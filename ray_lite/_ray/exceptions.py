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
  pickling are Ray's.  A streaming generator's ``next`` is Ray's own method
  (the generators are Ray's objects, made by Ray's actor handles too): its
  ``__next__``/``__anext__`` are wrapped once, in this process, to translate
  likewise (``translate_generator_errors``); what they raise stays an
  instance of Ray's class, so Ray code in the same process is unaffected.
  ``await ref`` (Ray's ``ObjectRef``, whose methods cannot be wrapped) turns
  a task's error into the instance it raises with Ray's
  ``RayTaskError.as_instanceof_cause``, which is wrapped likewise
  (``translate_task_errors``), and sets every other error (an actor that
  died, a cancelled task) on its future with a function of Ray's core
  module that is wrapped likewise (``translate_awaited_errors``): ``await``
  of a ref, in the driver or in an async actor, and of an item of a
  streaming generator raise translated errors.  A direct ``ray.get`` keeps
  Ray's classes.

The counterparts of a Ray class are ray_lite's classes of the same name in its
MRO, the nearest of each line (``ActorUnavailableError`` -> ``RayActorError``,
``OutOfMemoryError`` -> ``RayError``; a task's ``RayTaskError(Full)`` from
Ray's queue -> ``RayTaskError`` and ``ray_lite.util.queue.Full``).
"""
import functools
import inspect
from ray_lite import exceptions as _rl

__all__ = ["translate", "register", "translate_generator_errors", "translate_task_errors",
           "translate_awaited_errors"]

# Ray's class -> ray_lite's class it answers to (filled by ``register``).
_COUNTERPARTS = {}
# Ray's error class -> the class derived from it and its counterpart (or None).
_DUALS = {}


def register(ray_exceptions, extra=()):
    """Map each of Ray's exception classes to ray_lite's of the same name;
    ``extra``: more ``(ray_class, ray_lite_class)`` pairs (the queue's)."""
    for name in _rl.__all__:
        ray_cls = getattr(ray_exceptions, name, None)
        if isinstance(ray_cls, type):      # (not RAY_EXCEPTION_TYPES, a list)
            _COUNTERPARTS[ray_cls] = getattr(_rl, name)
    for ray_cls, rl_cls in extra:
        _COUNTERPARTS[ray_cls] = rl_cls


def _counterparts(ray_cls):
    found = []
    for base in ray_cls.__mro__:
        rl_cls = _COUNTERPARTS.get(base)
        if rl_cls is not None and not issubclass(ray_cls, rl_cls) and \
                not any(issubclass(f, rl_cls) for f in found):
            found.append(rl_cls)
    return tuple(found)


def _dual(ray_cls):
    dual = _DUALS.get(ray_cls, False)
    if dual is False:
        dual = None
        rl_classes = _counterparts(ray_cls)
        if rl_classes:
            try:
                dual = type(ray_cls.__name__, (ray_cls, *rl_classes),
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


def translate_generator_errors(generator_cls):
    """Wrap ``generator_cls``'s ``__next__``/``__anext__`` (Ray's
    ``ObjectRefGenerator``) to raise translated errors; once per process."""
    if generator_cls.__dict__.get("_ray_lite_translates"):
        return
    import ray
    errors = ray.exceptions.RayError

    def sync(method):
        @functools.wraps(method)
        def call(self):
            try:
                return method(self)
            except errors as exc:
                raise translate(exc) from exc.__cause__
        return call

    def async_(method):
        @functools.wraps(method)
        async def call(self):
            try:
                return await method(self)
            except errors as exc:
                raise translate(exc) from exc.__cause__
        return call
    generator_cls.__next__ = sync(generator_cls.__next__)
    anext = generator_cls.__anext__
    generator_cls.__anext__ = async_(anext) if inspect.iscoroutinefunction(anext) else sync(anext)
    generator_cls._ray_lite_translates = True


def translate_task_errors(task_error_cls):
    """Wrap ``task_error_cls.as_instanceof_cause`` (Ray's ``RayTaskError``:
    what ``await ref`` raises is made by it) to return the translated error;
    once per process."""
    if task_error_cls.__dict__.get("_ray_lite_translates"):
        return
    as_cause = task_error_cls.as_instanceof_cause

    @functools.wraps(as_cause)
    def as_instanceof_cause(self):
        return translate(as_cause(self))
    task_error_cls.as_instanceof_cause = as_instanceof_cause
    task_error_cls._ray_lite_translates = True


def translate_awaited_errors(raylet):
    """Wrap ``raylet._set_future_helper`` (the function of Ray's core module
    that completes the future ``await ref`` and ``ref.future()`` wait on) to
    set translated errors; once per process.  A task's error is left to
    ``translate_task_errors`` (the helper makes it with
    ``as_instanceof_cause``)."""
    helper = getattr(raylet, "_set_future_helper", None)
    if helper is None or getattr(helper, "_ray_lite_translates", False):
        return
    import ray
    errors, task_error = ray.exceptions.RayError, ray.exceptions.RayTaskError

    @functools.wraps(helper)
    def set_future(result, *args, **kwargs):
        if isinstance(result, errors) and not isinstance(result, task_error):
            result = translate(result)
        return helper(result, *args, **kwargs)
    set_future._ray_lite_translates = True
    raylet._set_future_helper = set_future
