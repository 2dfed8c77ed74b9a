"""Serve's one door into the core runtime: every use of ``ray_lite._private`` by
Serve goes through here.

The core's calls (``get``, ``remote``, ``kill``, ...), cheap access to a ref's
readiness (``on_ready``/``peek``, with a fallback on the public
``ObjectRef.future()`` should the core's internals change), refs that Serve
fills itself (a call a handle holds), and a few questions about the process
this code runs in and the actors it talks to.
"""

from ray_lite._private.process import state as _state
from ray_lite._private.objects.object_store import STORE_THRESHOLD as LARGE_BYTES  # noqa: F401
from ray_lite._private.api.core import (  # noqa: F401 (Serve's calls into the core)
    cancel,
    create_actors,
    get,
    get_actor,
    init,
    is_initialized,
    kill,
    preload,
    remote,
)
from ray_lite._private.objects.refs import ObjectRef, _Entry, error_entry
from ray_lite._private.objects.entries import PRIVATE_TYPES as _PRIVATE_TYPES, unshared_value
from ray_lite._private.api.runtime_context import get_runtime_context  # noqa: F401
from ray_lite._private.node.worker import AsyncSlots as Slots   # noqa: F401 (for the replica)
from ray_lite._private.node.zygote import _recv_exact as recv_exact  # noqa: F401 (framing)


# --------------------------------------------------------------- processes
def current_node():
    """This process's runtime (None before ``init``); a new one after a re-init."""
    return _state.node


def is_driver():
    n = _state.node
    return n is not None and n.id == 0


def runtime_stopping():
    """Whether the runtime asked this process to exit (``ray.shutdown``, or
    the driver's end): the actors it ends die meanwhile, and are not to be
    replaced."""
    n = _state.node
    return n is None or getattr(n, "exiting", False)


# ------------------------------------------------------------------ actors
def actor_id(handle):
    """The id that names ``handle``'s actor in this runtime."""
    return handle._info.actor_id


_NONE_DEAD = frozenset()


def dead_actor_ids():
    """The ids of the actors this process has seen die (a container for ``in``)."""
    n = _state.node
    return _NONE_DEAD if n is None else n.dead_peers


def kill_serve_processes(keep=(), named_in=None):
    """SIGKILL the live processes of Serve's replicas and proxies but for the
    pids in ``keep``; with ``named_in`` (Serve's namespace), those of the
    actors named in it too (deployment actors, the controller, its store).
    Returns their pids.  For what no controller tracks: the replicas a dead
    one had not saved, or all of them when the controller is gone."""
    import os
    import signal
    from ray_lite.util.state import list_actors
    killed = []
    for a in list_actors(filters=[("state", "=", "ALIVE")], limit=1 << 30):
        pid = a.get("pid")
        if not pid or pid in keep or not (
                a.get("class_name") in ("ServeReplica", "ProxyActor") or
                (named_in and a.get("name") and a.get("ray_namespace") == named_in)):
            continue
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except OSError:
            pass
    return killed


# -------------------------------------------------------------------- refs
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


def peek_unshared(ref):
    """``peek`` for a reader that only looks and lets go (the proxy writing an
    answer out), or for the last reader a ref will ever have (a handle's
    stream taking an item whose ref it drops): a mutable result is read
    without leaving a copy behind for later readers, which the core's first
    read of it makes (see ``objects/entries.py``).  A caller that hands the
    value on or changes it while the ref may be read again uses ``peek``."""
    e = getattr(ref, "_e", None)
    if e is None or type(e) not in _PRIVATE_TYPES:
        return peek(ref)
    if not e.ready:
        return None
    if e.error is not None:
        return (False, e.error)
    return (True, unshared_value(e))


def never_sent(ref):
    """True if the call behind ``ref`` failed at once because its actor was
    dead when it was sent (the actor never saw it, so it may go elsewhere)."""
    r = peek(ref)
    return r is not None and not r[0] and getattr(r[1], "never_sent", False)


def pending_ref():
    """A ref this process owns, filled later with ``set_value``/``set_error``."""
    n = _state.get_node()
    return ObjectRef(n.new_oid(), n.id, _Entry())


def error_ref(error):
    """A ref this process owns, ready with ``error``."""
    n = _state.get_node()
    return ObjectRef(n.new_oid(), n.id, error_entry(error))


def set_value(ref, value):
    """Fill a ``pending_ref`` with a value (its waiters and callbacks run)."""
    ref._e.set_value(value)


def set_error(ref, error):
    """Fill a ``pending_ref`` with an error (its waiters and callbacks run)."""
    ref._e.set_error(error)


# ------------------------------------------------------ the loop's thread
def wait_briefly(ref, budget):
    """Busy-wait at most ``budget`` s on this event loop's thread for ``ref``
    (the loop runs nothing else meanwhile); True if it became ready."""
    if getattr(ref, "_e", None) is None:
        return False
    return _state.get_node().bridges.wait_briefly(ref, budget)


def spin_for_messages(budget):
    """Busy-wait at most ``budget`` s on this event loop's thread for a call
    on any link (the loop runs nothing else meanwhile); True if one came."""
    return _state.get_node().bridges.spin_for_messages(budget)
