"""``@ray_lite.method(...)``: options of one actor method, as in Ray."""

# Ray's attribute names: the actor's process and the caller read them.
_ATTRS = {"num_returns": "__ray_num_returns__",
          "concurrency_group": "__ray_concurrency_group__"}


def method(*args, **kwargs):
    """Annotate an actor method: ``@ray_lite.method(concurrency_group="io")``."""
    if args or not kwargs:
        raise ValueError("The @ray_lite.method decorator must be applied using keyword "
                         "arguments only, e.g. @ray_lite.method(concurrency_group='io')")
    for key in kwargs:
        if key not in _ATTRS:
            raise ValueError(f"Unexpected keyword argument to @ray_lite.method: {key!r}; "
                             f"valid ones are {sorted(_ATTRS)}")
    group = kwargs.get("concurrency_group")
    if group is not None and (not isinstance(group, str) or not group):
        raise ValueError(f"concurrency_group must be a non-empty str, got {group!r}")

    def annotate(fn):
        for key, value in kwargs.items():
            setattr(fn, _ATTRS[key], value)
        return fn
    return annotate
