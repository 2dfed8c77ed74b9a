"""Everything Serve needs from the core runtime beyond its public API, in one place.

Two kinds of things live here:

* cheap access to a ref's readiness (``on_ready``/``peek``), with a fallback
  on the public ``ObjectRef.future()`` should the core's internals change;
* INTERIM (until the core grows it): ``ensure_driver_service`` — a driver-side
  thread that services the links while the user's main thread is not inside
  a ray_lite call.  The core drives links only on the thread that waits, so a
  driver sleeping in ``time.sleep`` (the usual ``serve.run(...); while True:
  sleep``) would never forward the connect/create-actor requests that proxies,
  the controller and replicas send it.  The thread never spins: it sleeps in
  ``poll`` on the links' descriptors (through ``Node.wait_until``), with
  50 ms rounds, and stands aside while another thread drives.
"""
import threading
import time

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
_service = None
_service_lock = threading.Lock()


class _DriverService:
    def __init__(self, nd):
        self.node = nd
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="ray_lite-serve-links",
                                       daemon=True)
        self.thread.start()

    def _done(self):
        return self.stop.is_set() or self.node.closed or _state.node is not self.node

    def _run(self):
        nd = self.node
        lock = getattr(nd, "_drive_lock", None)
        while not self._done():
            if lock is not None and lock.locked():
                # Someone (the user's thread in get/next/...) drives already.
                self.stop.wait(0.05)
                continue
            try:
                nd.wait_until(self._done, 0.05)
            except Exception:   # noqa: BLE001 - shut down under our feet
                if self._done():
                    return
                time.sleep(0.05)
            if getattr(nd, "_sleepers", 0):
                # Let a thread that queued behind us take the links over.
                time.sleep(0.001)

    def close(self):
        self.stop.set()
        if self.thread is not threading.current_thread():
            self.thread.join(2.0)


def ensure_driver_service():
    global _service
    n = _state.node
    if n is None or n.id != 0:
        return
    with _service_lock:
        if _service is not None and _service.node is n and _service.thread.is_alive():
            return
        _service = _DriverService(n)


def stop_driver_service():
    global _service
    with _service_lock:
        s, _service = _service, None
    if s is not None:
        s.close()


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
