"""How an actor's call finds its method, as in Ray: the class's function.

A method the class defines is called even when the instance has an
attribute of that name (``self.flag = True`` beside ``def flag(self)``); a
class lists in ``__ray_lite_instance_methods__`` the names its instances
replace on purpose (Serve's replica wraps its entry points that way).
"""
import types

from ray_lite._lazy import lazy_module

inspect = lazy_module("inspect", globals())

UNSET = object()


def ray_terminate(actor):
    """``handle.__ray_terminate__``: Ray's graceful end of an actor, as
    ``exit_actor()`` in a method of its own."""
    from .actor_exit import exit_actor
    exit_actor()


def ray_ready(actor):
    """``handle.__ray_ready__``: True once the actor's constructor has run
    (a failed constructor fails it, as any call); Ray's and its libraries'
    way to wait for an actor to start."""
    return True


def method_table():
    """A new actor's method -> function table (filled per method on first use)."""
    from .actor_exit import OUT_OF_SCOPE, out_of_scope
    return {"__ray_terminate__": ray_terminate, "__ray_ready__": ray_ready,
            OUT_OF_SCOPE: out_of_scope}


def class_function(cls, name):
    """``cls``'s plain function ``name`` (what an instance attribute must not
    hide), or None: not a plain function (a staticmethod, a property, one the
    class lets its instances replace), looked up with ``getattr`` instead."""
    if name in getattr(cls, "__ray_lite_instance_methods__", ()):
        return None
    fn = inspect.getattr_static(cls, name, None)
    return fn if type(fn) is types.FunctionType else None


def actor_method(node, method):
    """``node``'s actor's ``method``, bound (``WorkerNode._method_for`` has it inline)."""
    fn = node._class_methods.get(method, UNSET)
    if fn is UNSET:
        fn = node._class_methods[method] = class_function(type(node.actor), method)
    if fn is None:
        return getattr(node.actor, method)
    return fn.__get__(node.actor)
