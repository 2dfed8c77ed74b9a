"""An asyncio loop reading a ``MultiprocExecutor``'s replies (for ``collective_rpc_async``)."""
import weakref

from ray_lite._fast.wait_policy import SLICE_NS, ns_to_s

_SLICE_S = ns_to_s(SLICE_NS)


class AsyncPump:
    """Reads the reply rings from an asyncio loop while async calls wait.

    Registers the rings' descriptors and the pidfds with the loop only while
    some call made on this loop is pending; each wake-up reads every reply
    (which resolves futures, bridged to the loop by ``wrap_future``).
    """

    def __init__(self, ex, loop):
        self._ex = weakref.ref(ex)
        self._loop = loop
        self._registered = False
        self._armed = []
        self._timer = None

    def start(self):
        if not self._registered:
            self._pump()

    def stop(self):
        self._unregister()

    def _register(self, ex):
        if self._registered:
            return
        for ring in ex._rings:
            self._loop.add_reader(ring.fileno(), self._pump)
        for rank, pidfd in enumerate(ex._pidfds):
            self._loop.add_reader(pidfd, self._on_death, rank)
        self._registered = True
        self._timer = self._loop.call_later(_SLICE_S, self._tick)

    def _tick(self):
        # A sync caller on another thread may clear an armed descriptor:
        # re-check now and then while registered (cheap, bounded).
        self._timer = None
        if self._registered:
            self._pump()
            if self._registered and self._timer is None:
                self._timer = self._loop.call_later(_SLICE_S, self._tick)

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
            self._loop.remove_reader(pidfd)

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
                self._unregister()
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
                self._register(ex)
                return
            for ring in armed:
                ring.clear_fd()
