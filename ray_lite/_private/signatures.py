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
import inspect
import sys

_Parameter = inspect.Parameter
_KIND = type(_Parameter.POSITIONAL_ONLY)
_POSITIONAL = (_Parameter.POSITIONAL_ONLY, _Parameter.POSITIONAL_OR_KEYWORD)
_NO_DEFAULT = _Parameter.empty
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
    if drop_first:
        if not params or params[0].kind not in _POSITIONAL:
            return None     # def m(*args): self comes in args; nothing to check
        params = params[1:]
    lo = hi = 0
    for p in params:
        if p.kind in _POSITIONAL:
            hi += 1
            if p.default is _NO_DEFAULT:
                lo = hi
        elif p.kind is _Parameter.VAR_POSITIONAL:
            hi = sys.maxsize
        elif p.kind is _Parameter.KEYWORD_ONLY and p.default is _NO_DEFAULT:
            lo, hi = 1, 0   # a call without keyword arguments never fits: bind says why
            break
    return (lo, hi, tuple((p.name, int(p.kind), p.default is not _NO_DEFAULT)
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
        sig = _rebuilt[params] = inspect.Signature([
            _Parameter(name, _KIND(kind), default=_A_DEFAULT if has_default else _NO_DEFAULT)
            for name, kind, has_default in params])
    sig.bind(*args, **kwargs)
