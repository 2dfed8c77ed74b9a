"""Arguments checked against the callee's signature at ``.remote()``, as Ray does.

Ray binds a call's arguments to the function's signature when the call is
made, so ``f.remote(1, 2)`` for ``def f(x)`` raises ``TypeError`` right
there, with ``inspect.Signature.bind``'s message, not later at ``get``.

A signature is kept as an *arity*: plain data that pickles with an actor's
handle (a process holding only the handle has no class to look at):
``(lo, hi, params)``, where a call with no keyword arguments and ``lo <=
len(args) <= hi`` fits for sure (two comparisons: this runs on every call,
B11), and ``params`` rebuilds the signature for every other call, whose
binding raises Ray's error or lets it through.
"""
import sys

from ray_lite._lazy import lazy_module

inspect = lazy_module("inspect", globals())

# inspect.Parameter's kinds, an IntEnum, by value: naming them here would
# import inspect with ray_lite.
_POSITIONAL_ONLY, _POSITIONAL_OR_KEYWORD, _VAR_POSITIONAL, _KEYWORD_ONLY = 0, 1, 2, 3
_POSITIONAL = (_POSITIONAL_ONLY, _POSITIONAL_OR_KEYWORD)
_A_DEFAULT = object()       # stands for any default: binding only asks whether there is one

_rebuilt = {}               # params -> inspect.Signature


def arity_of(fn, drop_first=False):
    """``fn``'s arity (see the module docstring), None when it has no signature
    Python can read (a builtin) or no first parameter to drop."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    params = list(sig.parameters.values())
    no_default = inspect.Parameter.empty
    if drop_first:
        if not params or params[0].kind not in _POSITIONAL:
            return None     # def m(*args): self comes in args; nothing to check
        params = params[1:]
    lo = hi = 0
    for p in params:
        if p.kind in _POSITIONAL:
            hi += 1
            if p.default is no_default:
                lo = hi
        elif p.kind == _VAR_POSITIONAL:
            hi = sys.maxsize
        elif p.kind == _KEYWORD_ONLY and p.default is no_default:
            lo, hi = 1, 0   # a call without keyword arguments never fits: bind says why
            break
    return (lo, hi, tuple((p.name, int(p.kind), p.default is not no_default)
                          for p in params))


def constructor_arity(cls):
    """The arity of ``cls(...)``'s arguments (Ray: a class without an
    ``__init__`` of its own takes none)."""
    if cls.__init__ is object.__init__:
        return (0, 0, ())
    return arity_of(cls.__init__, drop_first=True)


def method_arity(cls, name, member):
    """The arity of ``handle.name.remote(...)``: ``self`` is not the caller's."""
    static = inspect.getattr_static(cls, name, None)
    if isinstance(static, staticmethod):
        return arity_of(member)
    if isinstance(static, classmethod) or inspect.ismethod(member):
        return arity_of(member)        # bound: ``cls`` is not in the signature
    return arity_of(member, drop_first=True)


def check_call(arity, args, kwargs):
    """Raise Ray's ``TypeError`` if ``args``/``kwargs`` do not fit ``arity``
    (the slow path: keyword arguments, or a count outside ``lo..hi``)."""
    params = arity[2]
    sig = _rebuilt.get(params)
    if sig is None:
        parameter = inspect.Parameter
        kind_of = type(parameter.POSITIONAL_ONLY)
        sig = _rebuilt[params] = inspect.Signature([
            parameter(name, kind_of(kind), default=_A_DEFAULT if has_default else parameter.empty)
            for name, kind, has_default in params])
    sig.bind(*args, **kwargs)
