"""Ray's API annotations (``ray.util.annotations``), for libraries written
against Ray that mark their own API with them: ``@PublicAPI``,
``@PublicAPI(stability="beta")``, ``@DeveloperAPI``, ``@Deprecated(message=...,
warning=True)``.  Each returns the object itself, with a note on its
docstring and its kind recorded (``_annotated``); ``Deprecated(warning=True)``
also warns with ``RayDeprecationWarning`` on each call or instantiation."""
import enum
import functools
import inspect
import warnings

from ray_lite.exceptions import RayDeprecationWarning

__all__ = ["PublicAPI", "DeveloperAPI", "Deprecated", "RayDeprecationWarning",
           "AnnotationType"]

_STABILITIES = ("stable", "beta", "alpha")


class AnnotationType(enum.Enum):
    PUBLIC_API = "PublicAPI"
    DEVELOPER_API = "DeveloperAPI"
    DEPRECATED = "Deprecated"
    UNKNOWN = "Unknown"


def _mark(obj, kind, note=None, api_group=None):
    if note:
        doc = (obj.__doc__ or "").rstrip()
        obj.__doc__ = f"{doc}\n\n    {note}" if doc else note
    obj._annotated = obj.__qualname__ if hasattr(obj, "__qualname__") else obj
    obj._annotated_type = kind
    if api_group is not None:
        obj._annotated_api_group = api_group
    return obj


def PublicAPI(*args, **kwargs):
    """Mark a public API; ``stability`` is "stable" (default), "beta" or "alpha"."""
    if len(args) == 1 and not kwargs and callable(args[0]):
        return PublicAPI()(args[0])
    stability = kwargs.pop("stability", "stable")
    api_group = kwargs.pop("api_group", "Others")
    if args or kwargs:
        raise ValueError(f"Unknown arguments of PublicAPI: {args or ''}{list(kwargs) or ''}")
    if stability not in _STABILITIES:
        raise ValueError(f"stability must be one of {_STABILITIES}, got {stability!r}")

    def wrap(obj):
        note = None
        if stability in ("alpha", "beta"):
            note = (f"PublicAPI ({stability}): This API is in {stability} and may change "
                    f"before becoming stable.")
        return _mark(obj, AnnotationType.PUBLIC_API, note, api_group)
    return wrap


def DeveloperAPI(*args, **kwargs):
    """Mark an API for advanced users, which may change across minor versions."""
    if len(args) == 1 and not kwargs and callable(args[0]):
        return DeveloperAPI()(args[0])
    if args or kwargs:
        raise ValueError(f"Unknown arguments of DeveloperAPI: {args or ''}{list(kwargs) or ''}")
    return lambda obj: _mark(obj, AnnotationType.DEVELOPER_API,
                             "DeveloperAPI: This API may change across minor Ray releases.")


def Deprecated(*args, **kwargs):
    """Mark a deprecated API; ``message`` says what to use instead, and
    ``warning=True`` warns (``RayDeprecationWarning``) at each use."""
    if len(args) == 1 and not kwargs and callable(args[0]):
        return Deprecated()(args[0])
    message = kwargs.pop("message", None)
    warn = kwargs.pop("warning", False)
    if args or kwargs:
        raise ValueError(f"Unknown kwargs: {kwargs.keys()}")
    text = "This API is deprecated and may be removed in future Ray releases."
    if message:
        text += " " + message

    def wrap(obj):
        _mark(obj, AnnotationType.DEPRECATED, f"Deprecated: {text}")
        if not warn:
            return obj
        if inspect.isclass(obj):
            original = obj.__init__

            @functools.wraps(original)
            def init_with_warning(self, *a, **kw):
                warnings.warn(text, RayDeprecationWarning, stacklevel=2)
                original(self, *a, **kw)
            obj.__init__ = init_with_warning
            return obj

        @functools.wraps(obj)
        def call_with_warning(*a, **kw):
            warnings.warn(text, RayDeprecationWarning, stacklevel=2)
            return obj(*a, **kw)
        return call_with_warning
    return wrap
