"""Standard-library modules that ray_lite's own modules import on first use.

``import ray_lite`` (and the zygote, before it forks the first workers) would
otherwise import asyncio (~40 ms), inspect (~20 ms, with cloudpickle) and
others that most processes need late or never: a driver of sync tasks never
runs an event loop, a pool worker never needs asyncio unless a task is a
coroutine.  A module names them as usual, bound to a stand-in::

    asyncio = lazy_module("asyncio", globals())

The first attribute read (``asyncio.get_running_loop``) imports the module
and rebinds the global to it, so every later read is the plain global
look-up of an ``import asyncio``: no cost on the hot paths once warm.  The
stand-in must not be used at import time (a base class, a decorator, a
default argument), which would import the module at once.

:func:`resolve_loaded` rebinds every stand-in whose module is imported: the
zygote calls it after it imports them, so that the workers it forks later
start exactly as if each module had imported them itself.
"""
import importlib
import sys

__all__ = ["lazy_module", "resolve_loaded"]

#: Every stand-in made, resolved or not (a few dozen at most).
_STAND_INS = []


class LazyModule:
    """Stands for the module ``name`` in the namespace ``namespace`` under ``as_name``."""

    # Names no module has: attribute reads of the module's own names fall
    # through to __getattr__.
    __slots__ = ("_lazy_name", "_lazy_namespace", "_lazy_as")

    def __init__(self, name, namespace, as_name):
        self._lazy_name = name
        self._lazy_namespace = namespace
        self._lazy_as = as_name

    def _lazy_load(self):
        module = importlib.import_module(self._lazy_name)
        if self._lazy_namespace.get(self._lazy_as) is self:
            self._lazy_namespace[self._lazy_as] = module
        return module

    def __getattr__(self, attr):
        return getattr(self._lazy_load(), attr)

    def __repr__(self):
        return f"<module {self._lazy_name!r}, imported on first use>"


def lazy_module(name, namespace, as_name=None):
    """A stand-in for the module ``name``, to be bound in ``namespace`` (a
    module's ``globals()``) as ``as_name`` (default: the last part of ``name``)."""
    as_name = as_name or name.rpartition(".")[2]
    module = sys.modules.get(name)
    if module is not None:
        return module           # already paid for: the module itself
    stand_in = LazyModule(name, namespace, as_name)
    _STAND_INS.append(stand_in)
    return stand_in


def resolve_loaded():
    """Rebind each stand-in whose module has been imported since (by anyone)."""
    for stand_in in _STAND_INS:
        if stand_in._lazy_name in sys.modules and \
                stand_in._lazy_namespace.get(stand_in._lazy_as) is stand_in:
            stand_in._lazy_load()
