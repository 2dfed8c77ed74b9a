"""An asyncio loop reading a ``MultiprocExecutor``'s replies (for ``collective_rpc_async``)."""
import asyncio
import threading
import weakref

from ray_lite._fast.wait_policy import SLICE_NS, ns_to_s

_SLICE_S = ns_to_s(SLICE_NS)

# How long shutdown on another thread waits for the loop to drop the
# descriptors before it closes them (a loop busy elsewhere for longer is
# treated as gone: the readers are then removed from the calling thread).
_STOP_WAIT_S = 1.0


class LoopWaiter:
    """What an async call is resolved through: an asyncio future of the caller's loop.

    Replies are usually read on that loop's own thread (the pump's reader
    callback), which resolves the future at once; a reply read on another
    thread (a synchronous caller draining the rings, shutdown) resolves it
    through ``call_soon_threadsafe``.  A future the caller stopped waiting
    for (cancelled, timed out) is left alone.
    """

    __slots__ = ("future", "loop", "thread")

    def __init__(self, loop):
        self.loop = loop
        self.future = loop.create_future()
        self.thread = threading.get_ident()

    def set_result(self, value):
        self._settle(value, None)

    def set_exception(self, exc):
        self._settle(None, exc)

    def _settle(self, value, exc):
        if threading.get_ident() == self.thread:
            _settle(self.future, value, exc)
            return
        try:
            self.loop.call_soon_threadsafe(_settle, self.future, value, exc)
        except RuntimeError:
            pass  # the loop is closed: nobody waits on it any more


def _settle(future, value, exc):
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(value)


class AsyncPump:
    """Reads the reply rings from an asyncio loop while async calls wait.

    The rings' descriptors and the workers' pidfds are added to the loop at
    its first async call and stay there until the executor shuts down or
    fails: a ring's descriptor becomes readable only while armed, and the
    pump arms the rings only while calls are pending, so an idle executor
    costs the loop nothing, and each call pays no registration.  Each
    wake-up reads every reply, which resolves the calls' futures.
    """

    def __init__(self, ex, loop):
        self._ex = weakref.ref(ex)
        self._loop = loop
        self._registered = False
        self._armed = []
        self._timer = None

    def start(self):
        """A call was just sent from the loop's thread: make sure its reply wakes the loop."""
        if not self._armed:
            if not self._registered:
                ex = self._ex()
                if ex is None:
                    return
                self._register(ex)
            self._pump()

    def stop(self):
        """Take the descriptors off the loop, from any thread; done before they are closed."""
        loop = self._loop
        if loop.is_closed():
            self._registered = False
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop or not loop.is_running():
            self._unregister()
            return
        # The loop runs on another thread: its selector is its own to change.
        done = threading.Event()

        def unregister():
            try:
                self._unregister()
            finally:
                done.set()

        try:
            loop.call_soon_threadsafe(unregister)
        except RuntimeError:  # closed meanwhile
            self._registered = False
            return
        if not done.wait(_STOP_WAIT_S):
            self._unregister()

    def _register(self, ex):
        rings, pidfds = ex._rings, ex._pidfds
        if ex._is_shutdown or ex._failure is not None or not pidfds:
            return
        for ring in rings:
            self._loop.add_reader(ring.fileno(), self._on_ring, ring)
        for rank, pidfd in enumerate(pidfds):
            self._loop.add_reader(pidfd, self._on_death, rank)
        self._registered = True

    def _unregister(self):
        for ring in self._armed:
            try:
                ring.clear_fd()
            except Exception:
                pass
        self._armed = []
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._registered:
            return
        self._registered = False
        ex = self._ex()
        if ex is None or self._loop.is_closed():
            return
        for ring in ex._rings:
            try:
                self._loop.remove_reader(ring.fileno())
            except Exception:
                pass
        for pidfd in ex._pidfds:
            try:
                self._loop.remove_reader(pidfd)
            except Exception:
                pass

    def _tick(self):
        # A sync caller on another thread may clear an armed descriptor:
        # re-check now and then while calls are pending (cheap, bounded; it
        # stops by itself once none is).
        self._timer = None
        if self._registered:
            self._pump()

    def _on_ring(self, ring):
        if ring not in self._armed:
            # Armed by a synchronous caller on another thread: drain it, or
            # the loop would find it readable again and again.
            ring.clear_fd()
        self._pump()

    def _on_death(self, rank):
        ex = self._ex()
        if ex is not None:
            ex._poll_rings()
            ex._worker_lost(rank)
        self._unregister()

    def _pump(self):
        ex = self._ex()
        if ex is None or ex._is_shutdown or ex._failure is not None:
            self._unregister()
            return
        for ring in self._armed:
            ring.clear_fd()
        self._armed = []
        while True:
            ex._poll_rings()
            if not ex._pending:
                return
            armed = []
            ready = False
            for ring in ex._rings:
                if ring.arm_fd():
                    armed.append(ring)
                else:
                    ready = True
            if not ready:
                self._armed = armed
                if self._timer is None:
                    self._timer = self._loop.call_later(_SLICE_S, self._tick)
                return
            for ring in armed:
                ring.clear_fd()
