"""The event-loop bridge: an asyncio loop drives the links through their descriptors."""
import threading
import time

from ray_lite._lazy import lazy_module

from ..process.procutil import readable_now
from .transport import WEAK_SLICE, spin_readable

asyncio = lazy_module("asyncio", globals())


class LoopBridges:
    """Waiting from asyncio (a part of ``Node``, ``node.bridges``): one
    ``_LoopBridge`` per loop that waits, in ``by_loop``."""

    def __init__(self, node):
        self.node = node
        self.by_loop = {}       # loop -> _LoopBridge

    def for_running_loop(self):
        loop = asyncio.get_running_loop()
        bridge = self.by_loop.get(loop)
        if bridge is None:
            # Loops that have closed since (each asyncio.run() makes one)
            # are forgotten: nothing may be scheduled on them any more.
            for old in [lp for lp in self.by_loop if lp.is_closed()]:
                self.by_loop.pop(old).close()
            bridge = _LoopBridge(self.node, loop)
            self.by_loop[loop] = bridge
        return bridge

    async def wait_entry_async(self, ref):
        e = ref._e
        if e.ready:
            return
        bridge = self.for_running_loop()
        node = self.node
        node.objects.ensure_fetch(ref)
        fut = bridge.loop.create_future()
        e.add_callback(lambda _e: bridge.waker(fut)())
        # A thread driving the links may have filled it meanwhile.
        node.drive_nowait()
        await fut

    def wait_briefly(self, ref, budget):
        """Busy-wait at most ``budget`` s, on this event loop's thread, for ``ref``.

        For a loop that has one call in flight and nothing else to do (a
        Serve proxy at low load): see ``_LoopBridge.wait_briefly``.
        """
        e = ref._e
        if e.ready or e.peer is None:
            return e.ready
        return self.for_running_loop().wait_briefly(e.peer, e, budget)

    def spin_for_messages(self, budget):
        """Busy-wait at most ``budget`` s, on this event loop's thread, for a
        message on any link; see ``_LoopBridge.spin_for_messages``."""
        return self.for_running_loop().spin_for_messages(budget)

    # ------------------------------------------- what the node tells them
    def watch(self, link, fd):
        """A link was added (``fd``: its peer's sentinel, or None)."""
        for bridge in list(self.by_loop.values()):
            bridge.watch(link, fd)

    def unwatch_fd(self, fd):
        for bridge in list(self.by_loop.values()):
            bridge.unwatch_fd(fd)

    def rearm_all(self):
        """A wait that slept in poll disarmed every link's descriptor."""
        for bridge in list(self.by_loop.values()):
            bridge.rearm_soon()

    def rearm_waiting(self):
        """The drive lock is free: the loops that stopped watching their
        links for it (``_LoopBridge._take_drive``) watch again."""
        for bridge in list(self.by_loop.values()):
            if bridge.waiting:
                bridge.waiting = False
                bridge.rearm_soon()

    def forget_closed(self):
        """Forget the loops closed since (``asyncio.run`` for an async task)."""
        for loop in [lp for lp in self.by_loop if lp.is_closed()]:
            del self.by_loop[loop]

    def close(self):
        for bridge in list(self.by_loop.values()):
            bridge.close()
        self.by_loop.clear()


def _wake_future(fut):
    if not fut.done():
        fut.set_result(None)


class _LoopBridge:
    """Wakes one asyncio loop through the links' descriptors (no thread, no spin).

    Each link's descriptor is armed while the loop sleeps; when one fires, the
    loop drains every link and re-arms that one at its next turn (re-draining
    when a message slipped in between, which ``arm`` reports).  Until then,
    messages on that link need no wake-up: a busy loop collects the answers to
    what it sent in batches, without a descriptor write and read for each.
    """

    def __init__(self, node, loop):
        self.node = node
        self.loop = loop
        self.thread_id = threading.get_ident()
        self.links = {}     # fd -> link
        self.fds = set()
        self.closed = False
        self.suspended = False   # not watching the links: another thread drives them
        self.waiting = False     # suspended for want of the drive lock (see _take_drive)
        self.unarmed = set()     # links drained, to re-arm at the loop's next turn
        self.rearm_due = False
        for link in list(node.links.values()):
            self.watch(link, None)
        for fd in list(node.sentinels):
            self._watch_sentinel(fd)
        self._weak = WEAK_SLICE
        if self._weak is not None:
            # The pure-Python ring can lose an fd wake-up (no fences): re-check.
            self._call(self.loop.call_later, self._weak, self._tick)

    def _tick(self):
        if self.closed or self.loop.is_closed():
            return
        self.on_readable(None)
        self.loop.call_later(self._weak, self._tick)

    def watch(self, link, sentinel_fd):
        fd = link.fileno()
        if fd not in self.links:
            self.links[fd] = link
            self._call(self._add_link_reader, fd, link)
        if sentinel_fd is not None:
            self._watch_sentinel(sentinel_fd)

    def _add_link_reader(self, fd, link):
        if not self.suspended:
            self.loop.add_reader(fd, self.on_readable, link)
        # Not at once: we may be inside a drain of this very loop.
        self.loop.call_soon(self.on_readable, None)

    def rearm_soon(self):
        """Drain and re-arm from the loop (someone else disarmed the links)."""
        if not self.closed:
            self._call(self.loop.call_soon, self.on_readable, None)

    def on_readable(self, link):
        """Drain; re-arm ``link`` (the one whose descriptor fired) at the
        loop's next turn, or every link at once when ``link`` is None."""
        if self.closed or not self._take_drive():
            return
        try:
            if self.suspended:
                self._resume()
                link = None     # disarmed by the thread that drove: re-arm them all
            if link is not None:
                # Every other link is still armed, or has fired too (its own
                # callback is due), or waits in ``unarmed``: only this one
                # needs re-arming, which keeps a wake-up's cost low with many
                # links (a proxy has one per replica).  Every link is read,
                # though: what was sent before (causally) the message that
                # woke us must be seen with it.
                link.disarm()
                self.node._drain()
                self._rearm_later((link,))
            else:
                self.unarmed.clear()
                self._drain_and_arm(list(self.links.values()))
        finally:
            self._let_go()

    def _rearm_later(self, links):
        """Re-arm ``links`` (after reading them again) at the loop's next turn."""
        self.unarmed.update(links)
        if not self.rearm_due:
            self.rearm_due = True
            self.loop.call_soon(self._rearm)

    def _rearm(self):
        """Re-arm the links drained since the loop's last turn (read them first)."""
        self.rearm_due = False
        if self.closed or not self.unarmed or not self._take_drive():
            return
        try:
            if self.suspended:
                # Another thread drove (and disarmed) every link meanwhile.
                self._resume()
                self.unarmed.clear()
                self._drain_and_arm(list(self.links.values()))
            else:
                unarmed, self.unarmed = self.unarmed, set()
                self._drain_and_arm(unarmed)
        finally:
            self._let_go()

    def _take_drive(self):
        """The node's drive lock, or False after suspending this loop's watch.

        The descriptors' arm state is shared by every listener of a link, so
        it is touched only under the drive lock.  A thread holding it drains
        every link and may sleep in poll on these very descriptors: reading
        them here would steal its wake-up.  So the loop stops watching until
        that thread lets go and re-arms it (``Node._release_drive``, which
        looks at ``waiting``, set before trying so that no release misses it).
        """
        node = self.node
        self.waiting = True
        node._bridge_waiting = True
        if node._drive_lock.acquire(False):
            self.waiting = False
            return True
        self._suspend()
        return False

    def wait_briefly(self, peer, entry, budget):
        """Spin at most ``budget`` s on ``peer``'s ring until ``entry`` is ready.

        Blocks the loop meanwhile, so the caller keeps ``budget`` short and
        calls this only when it expects nothing else.  The link is disarmed
        first: a reply that lands during the spin then costs the peer no
        descriptor write and this loop no wake-up from its selector (each
        tens of microseconds on a VM), which a short sleep in the selector
        would.  Other links are read only when the spin ends.
        """
        link = self.node.reading_link(peer)
        if (link is None or self.closed or self.suspended or entry.ready
                or not self._take_drive()):
            return entry.ready
        try:
            link.disarm()
            try:
                deadline = time.monotonic() + budget
                while not entry.ready:
                    left = deadline - time.monotonic()
                    if left <= 0 or not link.spin_poll(left):
                        break
                    self.node._drain()
            finally:
                # As after a wake-up, whatever a handler raised meanwhile.
                self._rearm_later((link,))
        finally:
            self._let_go()
        return entry.ready

    def spin_for_messages(self, budget):
        """Spin at most ``budget`` s for a message on any link; True if one came.

        For a loop that expects a call within microseconds and has nothing
        else to do (a Serve replica between requests that come in quick
        succession).  The links are disarmed meanwhile: a peer that sends
        during the spin makes no descriptor write, and this process (and
        its CPU, on a VM) is not woken from sleep, each tens of microseconds.
        """
        links = list(self.links.values())
        if not links or self.closed or self.suspended or not self._take_drive():
            return False
        try:
            for link in links:
                link.disarm()
            try:
                came = spin_readable(links, budget)
                if came:
                    self.node._drain()
            finally:
                self._rearm_later(links)
        finally:
            self._let_go()
        return came

    def _drain_and_arm(self, links):
        # Arm each link after reading it; arm() says when a message slipped
        # in between (its wake-up may be lost): read again, re-arm those.
        node = self.node
        while True:
            node._drain()
            links = [lk for lk in links if not lk.arm()]
            if not links:
                return

    def _let_go(self):
        node = self.node
        node._release_drive()
        node._wait_epoch += 1
        if node._interrupt is not None:
            node._raise_interrupt()

    def _suspend(self):
        if not self.suspended:
            self.suspended = True
            for fd in list(self.links):
                try:
                    self.loop.remove_reader(fd)
                except Exception:  # noqa: BLE001 - a closed loop or descriptor
                    pass

    def _resume(self):
        self.suspended = False
        for fd, lk in list(self.links.items()):
            self.loop.add_reader(fd, self.on_readable, lk)

    def _watch_sentinel(self, fd):
        if fd in self.fds:
            return
        self.fds.add(fd)

        def died(fd=fd):
            peer = self.node.sentinels.get(fd)
            if peer is not None and not readable_now((fd,)):
                return      # reused for a live process since it fired: still watched
            self.unwatch_fd(fd)
            if peer is not None:
                self.node._on_peer_died(peer)
        self._call(self.loop.add_reader, fd, died)

    def unwatch_fd(self, fd):
        if fd in self.fds or fd in self.links:
            self.fds.discard(fd)
            self.links.pop(fd, None)
            self._call(self.loop.remove_reader, fd)

    def _call(self, fn, *args):
        if self.closed:
            return
        if self.loop.is_closed():       # asyncio.run() ended: nothing runs it any more
            self.closed = True
            return
        if threading.get_ident() == self.thread_id:
            fn(*args)
        else:
            try:
                self.loop.call_soon_threadsafe(fn, *args)
            except RuntimeError:  # loop closed
                pass

    def waker(self, fut):
        """A callable, safe from any thread, that completes ``fut``."""
        loop = self.loop
        tid = self.thread_id

        def wake():
            if threading.get_ident() == tid:
                _wake_future(fut)
            else:
                try:
                    loop.call_soon_threadsafe(_wake_future, fut)
                except RuntimeError:
                    pass
        return wake

    def close(self):
        self.closed = True
        if self.loop.is_closed():
            return
        for fd in list(self.fds) + list(self.links):
            try:
                self.loop.remove_reader(fd)
            except Exception:
                pass
        self.fds.clear()
        self.links.clear()