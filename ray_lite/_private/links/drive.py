"""Driving the links: the wait loop every blocking call of a process runs.

The thread that waits (in ``get``, ``wait``, ``next`` or a worker's idle
loop) *drives* the links — it drains every link and dispatches each message
through ``Node.handlers`` — in ``wait_until``.  When several threads wait, one
drives and the others sleep on a condition that the driver notifies after
each round.  An asyncio loop drives them from reader callbacks on the links'
descriptors (``loop_bridge``).

How a wait sleeps: when the waited-for object names the process expected to
fill it (``_Entry.peer``: the worker running the task, the actor called),
the wait first sleeps on that peer's ring alone for up to ``HINT_BUDGET_S``
(the ring's own spin-then-futex wait: the fastest wake-up), after draining
the others; a process with a single link and no other thread (a pool
worker, an actor called by the driver only) always waits that way.
Otherwise it arms every link's descriptor and sleeps in ``poll`` with the
peers' pidfds (``ring.wait_rings_or_fds``) and an eventfd that a thread
adding or removing a link writes (``links_changed``): the sleep then takes
the new set of links, on which that thread may wait for an answer.
"""
import os
import threading
import time

from ray_lite._fast import ring as _ring
from ray_lite._fast.wait_policy import LINK_SPIN_NS, ns_to_s

from ..process.interrupts import drain_signal_wakeups, signal_wakeup_fd, sleep_point
from ..process.procutil import readable_now
from .transport import LinkClosed
from .transport import drain_links as _drain_links

# How long a wait may sleep on the expected peer's ring alone (the others are
# read again after this): covers a typical call's round trip.
HINT_BUDGET_S = 0.002
_wait_rings_or_fds = sleep_point(_ring.wait_rings_or_fds)   # a Ctrl-C ends its sleep
_LINK_SPIN_S = ns_to_s(LINK_SPIN_NS)
# threading.active_count() == 1, without the registry's lock (a worker's
# every idle wait looks: the lock was 4 % of an actor's CPU in B11).  Limbo
# is read first, so that a thread moving from it to _active is not missed.
_limbo, _active = threading._limbo, threading._active


def _clear_eventfd(fd):
    try:
        os.eventfd_read(fd)
    except OSError:     # read already (BlockingIOError), or closed by shutdown
        pass


class DrivingMixin:
    """The drive lock, the wait loop and the drain of every link (part of ``Node``).

    A mixin, not a part the node holds: the compiled task runner, a worker's
    first base, keeps the drive loop's fields (the drive lock, the sleepers,
    the flag of a waiting bridge) as its typed fields, read on every task.
    In the driver, a held part would reach the node's tables (links,
    handlers, forward, service) through one more attribute per method: about
    29 instructions each, some 150 per get of an actor call's result out of
    30,700 (callgrind, 2026-12-05), besides moving those typed fields.
    """

    _interrupt = None
    _cancel_signalled = False
    _bridge_waiting = False     # some bridge may be waiting (see _release_drive)
    _relink_fd = -1             # eventfd: ends a sleep in _poll (see links_changed)
    _polling = False            # a wait sleeps (or is about to) in _poll
    lends_slot = False          # block_begin/block_end do something (a pool worker)
    # (DriverNode) oid -> the worker whose nested task it is: while any is
    # on, answers come on other links than the waited-for peer's, which the
    # driver must read and pass on, so a wait does not sleep on one ring.
    forward = ()

    def _release_drive(self):
        """Release the drive lock; wake who waits for it (threads, event loops)."""
        self._drive_lock.release()
        if self._sleepers or self._bridge_waiting:
            self._wake_after_release()

    def _wake_after_release(self):
        """The threads asleep for the drive lock, the event loops that stopped
        watching their links for it: the lock is free now."""
        if self._sleepers:
            with self._cond:
                self._cond.notify_all()
        if self._bridge_waiting:
            # An event loop found the lock taken and stopped watching its
            # links (``_LoopBridge._take_drive``): it watches again now.
            self._bridge_waiting = False
            self.bridges.rearm_waiting()

    def wait_until(self, pred, timeout=None, hint=None):
        """Drive the links until ``pred()`` is true or ``timeout`` passes.

        Returns ``pred()``.  Safe from any thread; see the module docstring.
        ``hint``: the peer expected to answer; for a short while the wait
        sleeps on that peer's ring alone, which wakes fastest.
        """
        if pred():
            return True
        self._waiting.append(None)
        try:
            ok = self._wait_loop(pred, timeout, hint)
        finally:
            self._leave_wait()
        if self._cancel_signalled or self._interrupt is not None:
            self._signals_during_wait()
        return ok

    def _leave_wait(self):
        """What every wait does on its way out (see the service thread)."""
        self._waiting.pop()
        self._wait_epoch += 1
        if self.service.parked or self._fds_touched:
            self._after_wait()

    def _after_wait(self):
        # A thread left wait_until: wake a service thread parked for as long
        # as someone drives.  A wait that slept in poll disarmed the links'
        # descriptors on its way out, under whoever else listens to them: an
        # event loop's bridge, the service thread.  They re-arm.
        service = self.service
        if service.parked:
            service.unpark()
        if self._fds_touched:
            self._fds_touched = False
            self.bridges.rearm_all()
            if service.listening:
                service.kick(False)

    def _signals_during_wait(self):
        if self._cancel_signalled:
            # A cancel signal came while this wait drove the links (so the
            # handler could not read them): read its message now.
            self._cancel_signalled = False
            self.drive_nowait()
        if self._interrupt is not None:
            # Noticed while the wait was ending anyway: still raised here,
            # before the cancelled task's code runs on.
            self._raise_interrupt()

    def wait_ref(self, ref, timeout=None):
        """Wait until ``ref`` is ready (fetching it if it is borrowed); False on timeout."""
        e = ref._e
        if e.ready:
            return True
        if ref._owner != self.id:
            self.objects.ensure_fetch(ref)
        lends = self.lends_slot
        if lends:
            self.block_begin()
        try:
            if timeout is None and self._drive_lock.acquire(False):
                return self._wait_entry_driving(e)
            return self.wait_until(lambda: e.ready, timeout, e.peer)
        finally:
            if lends:
                self.block_end()

    def _wait_entry_driving(self, e):
        """``wait_until(lambda: e.ready, None, e.peer)`` for a caller that took
        the drive lock (it is released here): the common wait, a get of a
        call's result.  It drains every link, then sleeps on the answering
        peer's ring alone for up to ``HINT_BUDGET_S`` (as ``_poll_one``) and
        dispatches its messages right here, without a predicate to call per
        round: each call on this path is a tenth of a microsecond of B11.
        When that ends with ``e`` not ready (the budget passed, the peer
        died, a cancel came, another thread may wait for what arrived), the
        general loop goes on."""
        self._waiting.append(None)
        peer = e.peer
        try:
            try:
                link = self.reading_link(peer)
                if link is not None:
                    handlers = self.handlers
                    deadline = time.monotonic() + HINT_BUDGET_S
                    while not (self._drain() and e.ready):
                        left = deadline - time.monotonic()
                        if left <= 0 or self.forward:
                            peer = None
                            break
                        try:
                            msg = link.recv_wait(left)
                        except (LinkClosed, OSError):
                            self._on_peer_died(peer)
                            peer = None
                            break
                        if msg is not None:
                            handlers[msg[0]](peer, msg)
                            if self._sleepers:
                                break   # they look when the lock is released
                        if e.ready or self._interrupt is not None or self.closed:
                            break
            finally:
                # self._release_drive(), its looks inline (once per get)
                self._drive_lock.release()
                if self._sleepers or self._bridge_waiting:
                    self._wake_after_release()
            if not e.ready:
                if self._interrupt is not None:
                    self._raise_interrupt()
                if self.closed:
                    raise RuntimeError("ray_lite was shut down while waiting")
                self._wait_loop(lambda: e.ready, None, peer)
        finally:
            self._leave_wait()
        if self._cancel_signalled or self._interrupt is not None:
            self._signals_during_wait()
        return True

    def block_begin(self):
        """Hook: a pool worker lends its CPU slot while it waits."""

    def block_end(self):
        """Hook: the end of ``block_begin``."""

    def _wait_loop(self, pred, timeout, hint):
        now = time.monotonic()
        deadline = None if timeout is None else now + timeout
        hint_end = None if hint is None or hint not in self.links else now + HINT_BUDGET_S
        lock = self._drive_lock
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return pred()
            if lock.acquire(False):
                try:
                    if pred():
                        return True
                    if hint_end is not None:
                        left = hint_end - time.monotonic()
                        if left > 0 and not self.forward and self._poll_one(
                                hint, left if remaining is None else min(left, remaining)):
                            continue
                        hint_end = None
                    self._poll(remaining, pred)
                finally:
                    self._release_drive()
            else:
                self._sleep_as_sleeper(remaining)
            if self._interrupt is not None:
                self._raise_interrupt()
            if pred():
                return True
            if self.closed:
                raise RuntimeError("ray_lite was shut down while waiting")

    @sleep_point
    def _sleep_as_sleeper(self, remaining):
        with self._cond:
            self._sleepers += 1
            try:
                # Bounded: the driving thread may leave without a round
                # that concerns us (its own predicate became true).
                self._cond.wait(0.05 if remaining is None else min(remaining, 0.05))
            finally:
                self._sleepers -= 1

    _interrupt = None
    _cancel_signalled = False

    def _raise_interrupt(self):
        """Hook: WorkerNode raises a cancellation noticed while driving."""

    def _poll_one(self, peer, timeout):
        """Wait on ``peer``'s ring only (after draining all); False if it cannot.

        The other links are drained before the wait (while the peer works on
        our request), not after the answer: that would delay the caller.
        """
        if self._drain():
            return True
        link = self.reading_link(peer)
        if link is None:
            return False
        try:
            msg = link.recv_wait(timeout)
        except (LinkClosed, OSError):
            self._on_peer_died(peer)
            return True
        if msg is not None:
            self.handlers[msg[0]](peer, msg)
        return True

    def _poll(self, timeout, pred=None):
        if self._drain() or timeout == 0:
            return
        if (self.single_waiter and len(self.links) == 1 and not self.reading_links
                and len(self.sentinels) <= 1
                and not _limbo and len(_active) == 1):
            # One peer (a worker's driver, an actor's only caller): wait on
            # its ring directly; the ring notices the peer's death itself.
            # No other thread can add a link meanwhile, so the wait needs no
            # time limit of its own: the runtime starts none (single_waiter),
            # and the user's code has none now.  One it started (an actor's
            # background loop) may reach a new peer while we sleep here,
            # where nothing but this ring can wake us: it would wait for its
            # answer, on the new link, until this ring's next message.
            for peer, link in self.links.items():
                try:
                    msg = link.recv_wait(timeout)
                except (LinkClosed, OSError):
                    self._on_peer_died(peer)
                    return
                if msg is not None:
                    # What followed it is read by the next round: this one
                    # is probably what the caller waits for.
                    self.handlers[msg[0]](peer, msg)
                return
        # Sleeping arms and then disarms the links' descriptors, which the
        # service thread (if listening) relies on: it must re-arm them.
        self._fds_touched = True
        wake_fd = self._relink_fd
        if wake_fd < 0:
            wake_fd = self._relink_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        # This sleep watches the links and sentinels there are now; another
        # thread may add one meanwhile (a thread of a threaded actor reaching
        # a new peer), and the answer it then waits for comes on that link.
        # That thread cannot drive (we hold the drive lock), so unless this
        # sleep ends, nobody reads the answer: the call hangs until some
        # other link happens to wake us (with no timeout: for ever).  So the
        # flag goes up before the snapshot, and ``links_changed`` (after any
        # change) writes ``wake_fd`` while it is up: a link added before the
        # snapshot is in it, one added after it wakes the sleep.
        self._polling = True
        try:
            # A thread that changes what ``pred`` looks at, with no message
            # (the last call of an exiting actor ending), wakes the sleep
            # with ``wake_poll`` if it sees the flag up; if it did not, its
            # change is visible here.
            if pred is not None and pred():
                return
            fds = list(self.sentinels)
            fds.append(wake_fd)
            # In the main thread, a signal wakes the sleep even when it came
            # just before it, or to another thread (see interrupts).
            sig_fd = signal_wakeup_fd()
            if sig_fd >= 0:
                fds.append(sig_fd)
            fired = _wait_rings_or_fds([e[1]._rx for e in self._drain_list[0]], fds,
                                       timeout, _LINK_SPIN_S)
        finally:
            self._polling = False
        if fired:
            if wake_fd in fired:
                _clear_eventfd(wake_fd)
            if sig_fd >= 0 and sig_fd in fired:
                drain_signal_wakeups(sig_fd)
        self._drain()
        self.on_sentinels_fired(fired)

    def links_changed(self):
        """A link or sentinel was added or removed: a wait asleep in ``_poll``
        on the old set wakes to take the new one (the driver's service
        thread, asleep on its own set, too)."""
        self.wake_poll()
        self.service.kick()

    def wake_poll(self):
        """End a sleep in ``_poll`` (if one is on): this thread changed what
        that wait may wait for, the links or a state that no message will
        tell it about (resources freed, say: see ``resources_freed``)."""
        if self._polling:
            try:
                os.eventfd_write(self._relink_fd, 1)
            except OSError:
                pass        # closed by shutdown meanwhile: nothing waits any more

    def close_relink_fd(self):
        fd, self._relink_fd = self._relink_fd, -1
        if fd >= 0:
            os.close(fd)

    def on_sentinels_fired(self, fired):
        """The deaths of the peers whose sentinels are among ``fired`` (readable a
        moment ago), those still readable now (``procutil.readable_now``): taking
        a sentinel reused for a restarted actor for its old one's would drop the
        link just made to the new incarnation, and the calls resent over it."""
        dead = [fd for fd in fired if fd in self.sentinels]
        if dead:
            for fd in readable_now(dead):
                peer = self.sentinels.get(fd)
                if peer is not None:
                    self._on_peer_died(peer)

    def _drain(self):
        if self._deferred or self._releases:
            self._run_deferred()
        n = 0
        handlers = self.handlers
        if self._stash:
            stash, self._stash = self._stash, []
            try:
                for peer, msg in stash:
                    n += 1
                    handlers[msg[0]](peer, msg)
            except BaseException:
                self._stash[:0] = stash[n:]
                raise
        entries, polls = self._drain_list
        return n + _drain_links(entries, polls, handlers, self._stash)

    def drive_nowait(self):
        """One non-blocking round (from an asyncio reader callback).

        False when another thread (or an outer frame of this one) is driving.
        """
        if self._drive_lock.acquire(False):
            try:
                self._drain()
            finally:
                self._release_drive()
            self._wait_epoch += 1
            if self._interrupt is not None:
                self._raise_interrupt()
            return True
        return False
