"""Ray Serve's small pydantic config models (``BackpressureConfig``,
``GangSchedulingConfig``...) as plain classes: one base for what they share."""


class PlainConfig:
    """A config whose ``dict()`` (and Ray's ``model_dump()``) gives its
    fields; two are equal when their fields are."""

    FIELDS = ()

    def dict(self, **_):
        return {name: getattr(self, name) for name in self.FIELDS}

    def model_dump(self, **kw):
        return self.dict(**kw)

    def __eq__(self, other):
        return type(other) is type(self) and self.dict() == other.dict()

    __hash__ = None

    def __repr__(self):
        return f"{type(self).__name__}({self.dict()})"


def normalized(cls, value, where, error=ValueError):
    """``value`` (a ``cls``, a dict of its fields, Ray's own model, or None)
    as the plain dict of its fields, or None; ``error`` names what is wrong."""
    if value is None:
        return None
    if isinstance(value, dict):
        unknown = sorted(str(k) for k in value if k not in cls.FIELDS)
        if unknown:
            raise error(f"{where}: unknown key{'s' if len(unknown) > 1 else ''} "
                        f"{', '.join(map(repr, unknown))} (allowed: "
                        f"{', '.join(sorted(cls.FIELDS))})")
        value = cls(**value)
    elif not isinstance(value, cls):
        dump = getattr(value, "model_dump", None)        # Ray's own
        if not callable(dump):
            raise error(f"{where}: expected a {cls.__name__} or a mapping, got "
                        f"{type(value).__name__}")
        value = cls(**dump(mode="json"))
    return value.dict()
