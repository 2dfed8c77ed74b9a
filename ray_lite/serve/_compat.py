"""Everything Serve needs from the core runtime beyond its public API, in one place.

Cheap access to a ref's readiness (``on_ready``/``peek``), with a fallback on
the public ``ObjectRef.future()`` should the core's internals change, and a
few questions about the process this code runs in.
"""

from ray_lite._private import state as _state
from ray_lite._private.worker import AsyncSlots as Slots   # noqa: F401 (for the replica)



def node():
    return _state.get_node()


def on_ready(ref, callback):
    """Call ``callback(x)`` once ``ref`` is ready, on the thread that drives the links
    (``x``: the core's entry, or a future; read the outcome with ``peek(ref)``)."""
    e = getattr(ref, "_e", None)
    if e is not None and hasattr(e, "add_callback"):
        e.add_callback(callback)
        return
    ref.future().add_done_callback(callback)


def peek(ref):
    """``(True, value)``, ``(False, error)`` for a ready ref, else ``None``."""
    e = getattr(ref, "_e", None)
    if e is None:
        fut = ref.future()
        if not fut.done():
            return None
        exc = fut.exception()
        return (False, exc) if exc is not None else (True, fut.result())
    if not e.ready:
        return None
    if e.error is not None:
        return (False, e.error)
    return (True, e.value)


def wait_briefly(ref, budget):
    """Busy-wait at most ``budget`` s on this event loop's thread for ``ref``
    (the loop runs nothing else meanwhile); True if it became ready."""
    if getattr(ref, "_e", None) is None:
        return False
    return _state.get_node().wait_briefly(ref, budget)


def spin_for_messages(budget):
    """Busy-wait at most ``budget`` s on this event loop's thread for a call
    on any link (the loop runs nothing else meanwhile); True if one came."""
    return _state.get_node().spin_for_messages(budget)


def is_driver():
    n = _state.node
    return n is not None and n.id == 0


def actor_is_dead(handle):
    n = _state.node
    if n is None:
        return False
    return handle._info.actor_id in getattr(n, "dead_peers", ())
