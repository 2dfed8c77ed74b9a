"""``method(...)``: options declared on an actor method, as Ray's ``ray.method``.

The decorator only records the options on the function, under Ray's
attribute names (``__ray_num_returns__``, ``__ray_concurrency_group__``...);
the actor class reads them once, when its methods are first looked at, and
each handle's method starts from them (``.options()`` overrides them).
"""
from ray_lite._lazy import lazy_module

inspect = lazy_module("inspect", globals())

# option -> the attribute Ray records it under
METHOD_OPTIONS = {
    "num_returns": "__ray_num_returns__",
    "concurrency_group": "__ray_concurrency_group__",
    "max_task_retries": "__ray_max_task_retries__",
    "retry_exceptions": "__ray_retry_exceptions__",
    "_generator_backpressure_num_objects": "__ray_generator_backpressure_num_objects__",
    "enable_task_events": "__ray_enable_task_events__",
}


def method(*args, **kwargs):
    """Annotate an actor method: ``@ray_lite.method(num_returns=2)``.

    Refused as in Ray (an ``AssertionError``): positional arguments, no
    argument at all, or a keyword that is not one of ``METHOD_OPTIONS``.
    """
    valid = list(METHOD_OPTIONS)
    if args or not kwargs:
        raise AssertionError(
            f"The @ray.method decorator must be applied using at least one of the arguments "
            f"in the list {valid}, for example '@ray.method(num_returns=2)'.")
    for key in kwargs:
        if key not in METHOD_OPTIONS:
            raise AssertionError(f"Unexpected keyword argument to @ray.method: '{key}'. The "
                                 f"supported keyword arguments are {valid}")

    if kwargs.get("num_returns") == "dynamic":
        from .call_options import warn_dynamic
        warn_dynamic()

    def annotate_method(fn):
        for key, value in kwargs.items():
            if key == "enable_task_events" and value is None:
                continue
            setattr(fn, METHOD_OPTIONS[key], value)
        return fn
    return annotate_method


def declared_options(member):
    """The options ``method(...)`` recorded on ``member`` (a dict, often empty)."""
    fn = inspect.unwrap(member) if callable(member) else member
    fn = getattr(fn, "__func__", fn)        # a classmethod's or staticmethod's function
    found = {}
    for key, attr in METHOD_OPTIONS.items():
        value = getattr(fn, attr, getattr(member, attr, _MISSING))
        if value is not _MISSING:
            found[key] = value
    return found


_MISSING = object()
