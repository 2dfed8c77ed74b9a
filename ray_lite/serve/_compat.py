"""Everything Serve needs from the core runtime beyond its public API, in one place.

Two kinds of things live here:

* cheap access to a ref's readiness (``on_ready``/``peek``), with a fallback
  on the public ``ObjectRef.future()`` should the core's internals change;
* INTERIM (until the core fixes it): ``rearm_loop``, below.

(A driver-side thread that served the links while the user's thread was not
in a ray_lite call lived here too; the core's driver now serves its links
itself, and two drivers of the same links lost each other's wake-ups.)
"""

from ray_lite._private import state as _state

_MISSING = object()


def node():
    return _state.get_node()


def on_ready(ref, callback):
    """Call ``callback()`` once ``ref`` is ready, on the thread that drives the links."""
    e = getattr(ref, "_e", None)
    if e is not None and hasattr(e, "add_callback"):
        e.add_callback(lambda _e: callback())
        return
    ref.future().add_done_callback(lambda _f: callback())


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


def is_driver():
    n = _state.node
    return n is not None and n.id == 0


def actor_is_dead(handle):
    n = _state.node
    if n is None:
        return False
    return handle._info.actor_id in getattr(n, "dead_peers", ())


# ------------------------------------------------------------------ INTERIM
def rearm_loop():
    """INTERIM for a core bug: call after a blocking ray_lite wait on an event loop's thread.

    ``Node.wait_until`` (``get``, and the driver requests behind actor
    creation, ``kill`` and ``get_actor``) disarms every link when its poll
    ends, while the loop's ``_LoopBridge`` still believes them armed: the loop
    would then sleep through the next messages.  Draining and re-arming from
    the loop restores the wake-ups.
    """
    import asyncio
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    n = _state.node
    bridges = getattr(n, "_bridges", None)
    if not bridges:
        return
    bridge = bridges.get(loop)
    if bridge is not None:
        loop.call_soon(bridge.on_readable, None)


def blocking(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` (which may wait on the links), then :func:`rearm_loop`."""
    try:
        return fn(*args, **kwargs)
    finally:
        rearm_loop()
