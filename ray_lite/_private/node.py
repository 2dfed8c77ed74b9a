"""The part of the runtime every process has: links, owned objects, streams.

A ``Node`` is this process's end of every link.  The thread that waits (in
``get``, ``wait``, ``next`` or a worker's idle loop) *drives* them — it drains
every link and dispatches each message — through ``wait_until``.  When
several threads wait, one drives and the others sleep on a condition that the
driver notifies after each round.  An asyncio loop drives them from reader
callbacks on the links' descriptors.

How a wait sleeps: when the waited-for object names the process expected to
fill it (``_Entry.peer``: the worker running the task, the actor called),
the wait first sleeps on that peer's ring alone for up to ``HINT_BUDGET_S``
(the ring's own spin-then-futex wait: the fastest wake-up), after draining
the others; a process with a single link (a pool worker, an actor called by
the driver only) always waits that way.  Otherwise it arms every link's
descriptor and sleeps in ``poll`` with the peers' pidfds.

The driver also has a *service thread* (``start_service``) so that its
workers are served while the user's code computes: it takes over the links
only when no thread has driven them for ``SERVICE_IDLE_S``, and then sleeps
in ``poll`` on their descriptors (never spins).  The hand-over is lazy on
purpose: a thread that enters and leaves ``get`` a hundred thousand times a
second pays two attribute updates, not a system call, per wait.

Message kinds (tuples; the first element says what it is):

  T  driver -> pool worker    run a task
  M  caller -> actor          run a method
  R  executor -> owner        a task or call finished (oid, ok, payload)
  I  producer -> owner        stream item (sid, index, ok, payload)
  E  producer -> owner        stream end (sid, count)
  K  owner -> producer        stream back-pressure ack (sid, consumed)
  X  owner -> executor        cancel (oid)
  F  borrower -> owner        fetch an object (oid); answered by O (oid, ok, payload)
  D  borrower -> owner        give back ref weights ([(oid, numerator, denominator)]);
                              via the driver as (batch, owner) when not linked
  Q  worker -> driver         request (req_id, op, args); answered by P (req_id, ok, payload)
  A  driver -> worker         attach the link a peer created (peer, pid, names)
  Z  driver -> worker         exit
"""
import asyncio
import itertools
import operator
import os
import select
import signal
import threading
import time
import weakref
from fractions import Fraction

from ray_lite.exceptions import ActorDiedError, ObjectLostError, TaskCancelledError, \
    WorkerCrashedError

from ray_lite._fast.stream_table import NOT_READY

from .interrupts import sleep_point
from .procutil import open_sentinel
from .refs import ObjectRef, _BorrowedEntry, _Entry, error_entry
from .transport import WEAK_SLICE, LinkClosed, spin_readable, wait_readable

_compress = itertools.compress
_MANY_LINKS = 8     # beyond this, _drain polls from C (fewer: a loop costs less)
_call = getattr(operator, "call", None) or (lambda fn: fn())   # operator.call: 3.11+

_OID_SHIFT = 40
# How long a wait may sleep on the expected peer's ring alone (the others are
# read again after this): covers a typical call's round trip.
HINT_BUDGET_S = 0.002
# The service thread takes the links over once nobody drove them for this long.
SERVICE_IDLE_S = 0.005
_ASYNC_SIGNALS = {s for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT,
                              signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM, signal.SIGCHLD,
                              signal.SIGWINCH, signal.SIGPIPE)}
_ASYNC_SIGNALS.update(range(signal.SIGRTMIN, signal.SIGRTMAX + 1))


class Node:
    def __init__(self, node_id, driver_pid, shm_prefix):
        self.id = node_id
        self.driver_pid = driver_pid
        self.shm_prefix = shm_prefix
        self.links = {}          # peer id -> Link
        self.peer_pids = {}      # peer id -> pid
        self.sentinels = {}      # pidfd -> peer id
        self.dead_peers = {}     # peer id -> error factory kind
        self.inflight = {}       # peer id -> {oid: kind} results expected from that peer
        self.pending = {}        # oid -> _Entry or [entries] (results expected)
        self.streams = {}        # sid -> _StreamState (streams this process owns)
        self.exported = {}       # oid -> [_Entry, weight lent out] owned here, held elsewhere
        self.borrowed = weakref.WeakValueDictionary()   # oid -> _BorrowedEntry
        self.fetching = {}       # oid -> [entries] borrowed objects being fetched
        self.fetch_requested = set()
        self.rpc_replies = {}    # req id -> (ok, payload)
        self._deferred = []      # stream releases asked from __del__
        self._releases = []      # (owner, oid, weight) to give back
        self._stash = []         # (peer, msg) read ahead of a drain (see WorkerNode)
        self._drain_list = ((), ())
        self._export_lock = threading.Lock()
        self._seq = itertools.count(1)
        self._oid_base = node_id << _OID_SHIFT
        self._rpc_seq = itertools.count(1)
        self._drive_lock = threading.Lock()
        self._cond = threading.Condition(threading.Lock())
        self._sleepers = 0
        self._waiting = []       # one item per thread inside wait_until (append/pop: atomic)
        self._wait_epoch = 0     # changes whenever a thread leaves wait_until
        self._fds_touched = False
        self._service = None     # the driver's service thread (start_service)
        self._svc_cond = threading.Condition(threading.Lock())
        self._svc_parked = False
        self._svc_listening = False
        self._kick_fd = -1
        self._bridges = {}       # loop -> _LoopBridge
        self.closed = False
        # Only this thread ever drives (no service thread, no loop, no pool
        # of method threads): a wait may block in one ring without missing
        # a link another thread adds meanwhile.
        self.single_waiter = False
        self.handlers = {
            "R": self._on_result, "I": self._on_item, "E": self._on_end,
            "F": self._on_fetch, "O": self._on_fetched, "A": self._on_attach,
            "P": self._on_rpc_reply, "K": self._on_ack, "D": self._on_release,
        }

    # ----------------------------------------------------------------- ids
    def new_oid(self):
        return self._oid_base | next(self._seq)

    def new_oids(self, n):
        first = self.new_oid()
        for _ in range(n - 1):
            self.new_oid()
        return first

    # --------------------------------------------------------------- links
    def add_link(self, peer, link, pid):
        link.on_full = self._on_link_full
        self.links[peer] = link
        self._index_links()
        self.inflight.setdefault(peer, {})
        if pid is not None and pid != os.getpid():
            self.peer_pids[peer] = pid
            fd = open_sentinel(pid)
            if fd is None:
                self._on_peer_died(peer)
                return
            self.sentinels[fd] = peer
            for bridge in list(self._bridges.values()):
                bridge.watch(link, fd)
        else:
            for bridge in list(self._bridges.values()):
                bridge.watch(link, None)
        self._kick()

    def remove_peer(self, peer):
        link = self.links.pop(peer, None)
        self._index_links()
        for fd, p in list(self.sentinels.items()):
            if p == peer:
                del self.sentinels[fd]
                for bridge in list(self._bridges.values()):
                    bridge.unwatch_fd(fd)
                os.close(fd)
        if link is not None:
            for bridge in list(self._bridges.values()):
                bridge.unwatch_fd(link.fileno())
            link.close()
        self.peer_pids.pop(peer, None)
        self._kick()

    def _release_drive(self):
        """Release the drive lock; wake who waits for it (threads, event loops)."""
        self._drive_lock.release()
        if self._sleepers:
            with self._cond:
                self._cond.notify_all()
        if self._bridge_waiting:
            # An event loop found the lock taken and stopped watching its
            # links (``_LoopBridge._take_drive``): it watches again now.
            self._bridge_waiting = False
            for bridge in list(self._bridges.values()):
                if bridge.waiting:
                    bridge.waiting = False
                    bridge.rearm_soon()

    _bridge_waiting = False     # some bridge may be waiting (see _release_drive)

    def _index_links(self):
        # What _drain walks: a snapshot (handlers may add or remove links
        # meanwhile) with each ring's poll bound once; one attribute, so that
        # a drain on another thread never pairs a new list with old polls.
        entries = tuple((peer, link, link._rx.poll) for peer, link in self.links.items())
        self._drain_list = (entries, tuple(e[2] for e in entries))

    @sleep_point
    def _on_link_full(self):
        # The peer's ring is full and it may itself be blocked writing to us:
        # read what it sent (if no other thread is already doing so), then retry.
        if self._drive_lock.acquire(False):
            try:
                self._drain()
            finally:
                self._release_drive()
            if self._interrupt is not None:
                self._raise_interrupt()
        time.sleep(0.0002)

    def send(self, peer, msg):
        """Send to ``peer``; False if it is gone."""
        link = self.links.get(peer)
        if link is None:
            return False
        try:
            link.send(msg)
        except (LinkClosed, OSError):
            return False
        return True

    # ------------------------------------------------------------- driving
    def wait_until(self, pred, timeout=None, hint=None):
        """Drive the links until ``pred()`` is true or ``timeout`` passes.

        Returns ``pred()``.  Safe from any thread; see the module docstring.
        ``hint``: the peer expected to answer; for a short while the wait
        sleeps on that peer's ring alone, which wakes fastest.
        """
        if pred():
            return True
        waiting = self._waiting
        waiting.append(None)
        try:
            ok = self._wait_loop(pred, timeout, hint)
        finally:
            waiting.pop()
            self._wait_epoch += 1
            if self._service is not None or self._fds_touched:
                self._after_wait()
        if self._cancel_signalled:
            # A cancel signal came while this wait drove the links (so the
            # handler could not read them): read its message now.
            self._cancel_signalled = False
            self.drive_nowait()
        if self._interrupt is not None:
            # Noticed while the wait was ending anyway: still raised here,
            # before the cancelled task's code runs on.
            self._raise_interrupt()
        return ok

    def wait_ref(self, ref, timeout=None):
        """Wait until ``ref`` is ready (fetching it if it is borrowed); False on timeout."""
        e = ref._e
        if e.ready:
            return True
        if ref._owner != self.id:
            self.ensure_fetch(ref)
        self.block_begin()
        try:
            return self.wait_until(lambda: e.ready, timeout, e.peer)
        finally:
            self.block_end()

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
                        if left > 0 and self._poll_one(
                                hint, left if remaining is None else min(left, remaining)):
                            continue
                        hint_end = None
                    self._poll(remaining)
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
        link = self.links.get(peer)
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

    def _poll(self, timeout):
        if self._drain() or timeout == 0:
            return
        if self.single_waiter and len(self.links) == 1 and len(self.sentinels) <= 1:
            # One peer (a worker's driver, an actor's only caller): wait on
            # its ring directly; the ring notices the peer's death itself.
            # No other thread can add a link meanwhile (single_waiter), so
            # the wait needs no time limit of its own.
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
        sentinel_fds = list(self.sentinels)
        # Sleeping arms and then disarms the links' descriptors, which the
        # service thread (if listening) relies on: it must re-arm them.
        self._fds_touched = True
        ready = wait_readable(list(self.links.values()), sentinel_fds, timeout)
        self._drain()
        if ready:
            for fd in ready:
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
        if len(polls) > _MANY_LINKS:
            # A proxy has a link per replica, most of them empty at any
            # drain: poll them all from C (map) and visit the ready ones.
            try:
                entries = list(_compress(entries, map(_call, polls)))
            except (OSError, ValueError):
                pass            # a ring closed under us: look at each below
        for peer, link, poll in entries:
            try:
                if not poll():
                    continue
                msgs = link.recv_all()
            except (LinkClosed, OSError, ValueError):
                continue
            i = 0
            try:
                for msg in msgs:
                    i += 1
                    handlers[msg[0]](peer, msg)
            except BaseException:
                # A KeyboardInterrupt (or a bug) must not lose what was read.
                self._stash.extend((peer, m) for m in msgs[i:])
                raise
            n += i
        return n

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

    # ------------------------------------------------------ service thread
    def start_service(self):
        """Start the thread that serves the links while no other thread drives them."""
        self._kick_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        t = threading.Thread(target=self._service_main, name="ray_lite-service", daemon=True)
        self._service = t
        t.start()

    def stop_service(self, timeout=5.0):
        t = self._service
        if t is None:
            return
        self.closed = True
        self._kick()
        with self._svc_cond:
            self._svc_cond.notify_all()
        if t is not threading.current_thread():
            t.join(timeout)
        self._service = None
        fd, self._kick_fd = self._kick_fd, -1
        if fd >= 0:
            os.close(fd)

    def _kick(self, always=True):
        """Make the service thread leave ``poll`` (its set of descriptors changed)."""
        fd = self._kick_fd
        if fd >= 0 and (always or self._svc_listening):
            try:
                os.eventfd_write(fd, 1)
            except OSError:
                pass

    def _after_wait(self):
        # A thread left wait_until: wake a service thread parked for as long
        # as someone drives.  A wait that slept in poll disarmed the links'
        # descriptors on its way out, under whoever else listens to them: an
        # event loop's bridge, the service thread.  They re-arm.
        if self._svc_parked:
            with self._svc_cond:
                self._svc_cond.notify()
        if self._fds_touched:
            self._fds_touched = False
            for bridge in list(self._bridges.values()):
                bridge.rearm_soon()
            if self._svc_listening:
                self._kick(False)

    def _service_main(self):
        # Signals go to the main thread: a Ctrl-C taken by this thread would
        # leave the main thread asleep in poll, never raising KeyboardInterrupt.
        try:
            signal.pthread_sigmask(signal.SIG_BLOCK, _ASYNC_SIGNALS)
        except (OSError, ValueError):
            pass
        seen = -1
        cond = self._svc_cond
        lock = self._drive_lock
        fired = []
        woken = False
        while not self.closed:
            epoch = self._wait_epoch
            if self._waiting or epoch != seen or lock.locked():
                # Someone drives, or did lately (a loop of gets): stand aside.
                # A thread in a long wait lets this one sleep until it leaves
                # (one notify); right after such a wake-up the pause is timed,
                # so a loop of short gets costs at most one notify per pause.
                seen = epoch
                fired = []      # stale once someone else drove (fds get reused)
                with cond:
                    if self.closed:
                        break
                    if self._waiting and not woken:
                        self._svc_parked = True
                        try:
                            woken = cond.wait(1.0)   # 1 s: a backstop, not a tick
                        finally:
                            self._svc_parked = False
                    else:
                        woken = False
                        cond.wait(SERVICE_IDLE_S)
                continue
            woken = False
            if not lock.acquire(False):
                continue
            try:
                if self.closed:
                    break
                self._fds_touched = False
                fds = self._service_round(fired)
            except Exception:  # noqa: BLE001 - a bug here must not end serving
                import traceback
                traceback.print_exc()
                fds = None
            finally:
                self._release_drive()
            if fds is None:
                continue
            self._svc_listening = True
            try:
                if self._waiting or self._wait_epoch != seen or self.closed:
                    fired = []
                    continue
                p = select.poll()
                for fd in fds:
                    p.register(fd, select.POLLIN)
                ms = 1000 if WEAK_SLICE is None else int(WEAK_SLICE * 1000)
                try:
                    fired = [fd for fd, _ in p.poll(ms)]
                except OSError:
                    fired = []
            finally:
                self._svc_listening = False
            if self._kick_fd in fired:
                try:
                    os.eventfd_read(self._kick_fd)
                except OSError:
                    pass

    def _service_round(self, fired):
        """Under the drive lock: handle what woke us, drain, arm; the fds to poll."""
        dead = [fd for fd in fired if fd in self.sentinels]
        if dead:
            # Checked again: only a sentinel readable now means a death.
            p = select.poll()
            for fd in dead:
                p.register(fd, select.POLLIN)
            for fd, _ in p.poll(0):
                peer = self.sentinels.get(fd)
                if peer is not None:
                    self._on_peer_died(peer)
        links = list(self.links.values())
        fired = set(fired)
        for link in links:
            if link.fileno() in fired:
                link.disarm()
        while True:
            self._drain()
            for link in links:
                if not link.arm():
                    break
            else:
                break
        return [lk.fileno() for lk in links] + list(self.sentinels) + [self._kick_fd]

    # ---------------------------------------------------- results & objects
    def expect(self, peer, oid, entry, kind):
        """Record that ``peer`` will answer ``oid`` (for failure on its death)."""
        self.pending[oid] = entry
        self.inflight.setdefault(peer, {})[oid] = kind

    def _on_result(self, peer, msg):
        _, oid, ok, payload = msg
        fl = self.inflight.get(peer)
        if fl is not None:
            fl.pop(oid, None)
        target = self.pending.pop(oid, None)
        if target is None:
            return
        if type(target) is list:
            if ok:
                for e, v in zip(target, payload):
                    e.set_value(v)
            else:
                for e in target:
                    e.set_error(payload)
        elif ok:
            target.set_value(payload)
        else:
            target.set_error(payload)

    # Weighted reference counting of refs that leave the process unready
    # (see refs.py).  Weights are exact fractions: the owner lends 1 per
    # serialisation, a borrower halves what it holds to pass a ref on.
    def lend(self, ref):
        """The weight to send with ``ref`` (unready) serialised for another process."""
        e = ref._e
        oid = ref._id
        with self._export_lock:
            if ref._owner == self.id:
                rec = self.exported.get(oid)
                if rec is None:
                    self.exported[oid] = [e, 1]
                else:
                    rec[1] += 1
                return 1
            w = getattr(e, "weight", 0)
            if not w:
                # Nothing to split (cannot happen for a ref this process
                # received): the receiver will hold no weight.
                return None
            half = Fraction(w) / 2
            e.weight = w - half
            return (half.numerator, half.denominator)

    def lookup_owned(self, oid):
        rec = self.exported.get(oid)
        if rec is not None:
            return rec[0]
        e = self.pending.get(oid)
        if type(e) is list:
            e = None
        return e

    def receive_ref(self, oid, owner, weight):
        """The entry for a ref (not ready when sent) that arrived from another process."""
        if owner == self.id:
            e = self.lookup_owned(oid)
            if weight is not None:
                self._give_back(oid, weight)   # the weight came home
            if e is None:
                e = error_entry(ObjectLostError(
                    f"object {oid:x} is not known to its owner (freed?)", oid))
            return e
        with self._export_lock:
            e = self.borrowed.get(oid)
            if e is None:
                e = _BorrowedEntry(oid, owner, self)
                if owner in self.dead_peers:
                    e.set_error(ObjectLostError(f"the owner of object {oid:x} died", oid))
                self.borrowed[oid] = e
            if weight is not None:
                if e.ready:
                    self.release_later(owner, oid, weight)
                else:
                    w = weight if type(weight) is int else Fraction(*weight)
                    e.weight = e.weight + w if e.weight else w
        return e

    def release_later(self, owner, oid, weight):
        """Give ``weight`` back to ``owner`` at the next drain (safe from __del__)."""
        self._releases.append((owner, oid, weight))

    def _give_back(self, oid, weight):
        if type(weight) is int:
            w = weight
        elif type(weight) is tuple:
            w = Fraction(*weight)
        else:
            w = weight
        with self._export_lock:
            rec = self.exported.get(oid)
            if rec is not None:
                rec[1] -= w
                if rec[1] <= 0:
                    del self.exported[oid]

    def _on_release(self, peer, msg):
        if len(msg) > 2 and msg[2] != self.id:
            # Relayed by the driver for a borrower with no link to the owner.
            self.send(msg[2], ("D", msg[1]))
            return
        for oid, num, den in msg[1]:
            self._give_back(oid, num if den == 1 else Fraction(num, den))

    def _send_releases(self):
        items, self._releases = self._releases, []
        by_owner = {}
        for owner, oid, w in items:
            if type(w) is tuple:
                num, den = w
            else:
                w = Fraction(w)
                num, den = w.numerator, w.denominator
            by_owner.setdefault(owner, []).append((oid, num, den))
        for owner, batch in by_owner.items():
            if owner == self.id:
                for oid, num, den in batch:
                    self._give_back(oid, Fraction(num, den))
            elif owner in self.links:
                self.send(owner, ("D", batch))
            elif self.id != 0 and owner not in self.dead_peers:
                # No link to the owner (we never fetched from it): the
                # driver, linked to everyone, passes it on.
                self.send(0, ("D", batch, owner))

    def object_table_size(self):
        """How many objects this process keeps for others or waits for (for tests)."""
        return len(self.exported) + len(self.pending) + len(self.fetching) + len(self.borrowed)

    def ensure_fetch(self, ref):
        """Ask the owner of a borrowed, unready ref for its value (once)."""
        e = ref._e
        if e.ready or ref._owner == self.id:
            return
        oid = ref._id
        if oid in self.fetch_requested:
            return
        lst = self.fetching.setdefault(oid, [])
        if e not in lst:
            lst.append(e)
        self.fetch_requested.add(oid)
        owner = ref._owner
        if not self.connect(owner) or not self.send(owner, ("F", oid)):
            self._fail_fetch(oid, ObjectLostError(f"the owner of object {oid:x} is gone", oid))
            return
        self.inflight.setdefault(owner, {})[oid] = "fetch"

    def _fail_fetch(self, oid, err):
        self.fetch_requested.discard(oid)
        for e in self.fetching.pop(oid, ()):
            if getattr(e, "weight", 0):
                e.weight = 0     # the owner is gone: nobody to give it back to
            e.set_error(err)

    def _on_fetch(self, peer, msg):
        oid = msg[1]
        e = self.lookup_owned(oid)
        if e is None:
            self.send(peer, ("O", oid, False, ObjectLostError(
                f"object {oid:x} is not known to its owner (freed?)", oid)))
            return

        def answer(entry, peer=peer, oid=oid):
            if entry.error is None:
                try:
                    link = self.links.get(peer)
                    if link is not None:
                        link.send(("O", oid, True, entry.value))
                except (LinkClosed, OSError):
                    pass
                except Exception as exc:  # noqa: BLE001 - the value cannot be serialised
                    self.send(peer, ("O", oid, False, TypeError(
                        f"could not serialize object {oid:x}: {exc}")))
            else:
                self.send(peer, ("O", oid, False, entry.error))
        e.add_callback(answer)

    def _on_fetched(self, peer, msg):
        _, oid, ok, payload = msg
        fl = self.inflight.get(peer)
        if fl is not None:
            fl.pop(oid, None)
        self.fetch_requested.discard(oid)
        for e in self.fetching.pop(oid, ()):
            if ok:
                e.set_value(payload)
            else:
                e.set_error(payload)
            if getattr(e, "weight", 0):
                with self._export_lock:
                    w, e.weight = e.weight, 0
                if w:
                    # The value is here: this process never needs the owner for it again.
                    self.release_later(peer, oid, w)

    # ------------------------------------------------------------- streams
    def new_stream(self, sid, peer, bp, name):
        from .refs import _StreamState
        s = _StreamState(sid, peer, bp, name)
        self.streams[sid] = s
        if peer is not None:
            self.inflight.setdefault(peer, {})[sid] = "stream"
        return s

    def _on_item(self, peer, msg):
        _, sid, index, ok, payload = msg
        s = self.streams.get(sid)
        if s is None or s.done:
            return
        if s.peer is None:
            s.peer = peer    # a pool task's producer is known once it reports
        if s.released:
            if not ok:
                self._end_stream(s, index + 1, payload)
            return
        if ok:
            e = _Entry()
            e.value = payload
            e.ready = True
            s.table.report(index, ObjectRef(self._oid_base | next(self._seq), self.id, e))
        else:
            s.table.report(index, ObjectRef(self.new_oid(), self.id, error_entry(payload)))
            self._end_stream(s, index + 1, payload)
            return
        if s.waiter is not None:
            w, s.waiter = s.waiter, None
            w()

    def _on_end(self, peer, msg):
        s = self.streams.get(msg[1])
        if s is None or s.done:
            return
        self._end_stream(s, msg[2], None)

    def _end_stream(self, s, count, error):
        s.done = True
        self.streams.pop(s.sid, None)
        fl = self.inflight.get(s.peer)
        if fl is not None:
            fl.pop(s.sid, None)
        if s.table is not None:
            try:
                s.table.report_end(count)
            except ValueError:
                pass
        if error is None:
            s.completed.set_value(None)
        else:
            s.completed.set_error(error)
        if s.waiter is not None:
            w, s.waiter = s.waiter, None
            w()

    def fail_stream(self, s, error):
        """End ``s`` with ``error`` at the next index not yet reported."""
        if s.done:
            return
        if s.table is None:
            self._end_stream(s, 0, error)
            return
        index = s.table.num_consumed + s.table.num_unconsumed
        e = error_entry(error)
        try:
            s.table.report(index, ObjectRef(self.new_oid(), self.id, e))
        except ValueError:
            pass
        self._end_stream(s, index + 1, error)

    def next_item(self, s, timeout):
        """Wait for the next item of ``s``; NOT_READY on timeout."""
        table = s.table
        if not table.is_next_ready():
            self.wait_until(table.is_next_ready, timeout)
        return table.try_next()

    async def next_item_async(self, s):
        table = s.table
        while True:
            try:
                item = table.try_next()
            except StopIteration:
                raise StopAsyncIteration from None
            if item is not NOT_READY:
                return item
            bridge = self.bridge_for_running_loop()
            fut = bridge.loop.create_future()
            s.waiter = bridge.waker(fut)
            if table.is_next_ready():
                # Reported by another thread (the service thread, one in a
                # get) between our look and the waiter: no wake-up is coming.
                s.waiter = None
                continue
            try:
                await fut
            finally:
                s.waiter = None

    def ack_stream(self, s):
        consumed = s.table.num_consumed
        if consumed > s.acked and not s.done:
            s.acked = consumed
            self.send(s.peer, ("K", s.sid, consumed))

    def _on_ack(self, peer, msg):
        """Back-pressure acks concern producers (WorkerNode); a late one is dropped."""

    def defer_stream_release(self, s):
        self._deferred.append(s)

    def _run_deferred(self):
        if self._releases:
            self._send_releases()
        # Like Ray, dropping a generator does not cancel its task (completed()
        # still resolves): the items are no longer kept, and a producer held
        # back by back-pressure is let go.
        items, self._deferred = self._deferred, []
        for s in items:
            if not s.done:
                s.released = True
                s.table = None
                if s.bp > 0 and s.peer is not None:
                    self.send(s.peer, ("K", s.sid, 1 << 62))

    def cancel_stream(self, s, force):
        if s.done:
            return
        s.cancelled = True
        self.send(s.peer, ("X", s.sid, force))
        self.fail_stream(s, TaskCancelledError())

    # --------------------------------------------------------- peer death
    def death_error(self, peer, kind):
        if kind == "actor" or kind == "fetch-actor":
            return ActorDiedError("The actor died unexpectedly before finishing this task.",
                                  actor_id=peer)
        if kind == "fetch":
            return ObjectLostError("the process that owns this object died")
        return WorkerCrashedError()

    def peer_kind(self, peer):
        return "actor"

    def _on_peer_died(self, peer):
        if peer in self.dead_peers:
            return
        # Whatever the peer wrote before dying is still worth reading.
        link = self.links.get(peer)
        if link is not None:
            try:
                for msg in link.recv_all():
                    self.handlers[msg[0]](peer, msg)
            except (LinkClosed, OSError):
                pass
        kind = self.peer_kind(peer)
        self.dead_peers[peer] = kind
        self.remove_peer(peer)
        for oid, k in list(self.inflight.pop(peer, {}).items()):
            err = self.death_error(peer, kind if k != "fetch" else "fetch")
            if k == "stream":
                s = self.streams.get(oid)
                if s is not None:
                    self.fail_stream(s, err)
            elif k == "fetch":
                self._fail_fetch(oid, err)
            else:
                target = self.pending.pop(oid, None)
                if type(target) is list:
                    for e in target:
                        e.set_error(err)
                elif target is not None:
                    target.set_error(err)
        self.on_peer_died(peer, kind)

    def on_peer_died(self, peer, kind):
        """Hook for subclasses."""

    # --------------------------------------------------------------- rpc
    def _on_rpc_reply(self, peer, msg):
        self.rpc_replies[msg[1]] = (msg[2], msg[3])

    def connect(self, peer):
        """Make sure a link to ``peer`` exists; False if it cannot."""
        raise NotImplementedError

    def _on_attach(self, peer, msg):
        raise RuntimeError("only workers attach links made by others")

    # ------------------------------------------------------------ asyncio
    def bridge_for_running_loop(self):
        loop = asyncio.get_running_loop()
        bridge = self._bridges.get(loop)
        if bridge is None:
            # Loops that have closed since (each asyncio.run() makes one)
            # are forgotten: nothing may be scheduled on them any more.
            for old in [lp for lp in self._bridges if lp.is_closed()]:
                self._bridges.pop(old).close()
            bridge = _LoopBridge(self, loop)
            self._bridges[loop] = bridge
        return bridge

    async def wait_entry_async(self, ref):
        e = ref._e
        if e.ready:
            return
        bridge = self.bridge_for_running_loop()
        self.ensure_fetch(ref)
        fut = bridge.loop.create_future()
        e.add_callback(lambda _e: bridge.waker(fut)())
        # A thread driving the links may have filled it meanwhile.
        self.drive_nowait()
        await fut

    def wait_briefly(self, ref, budget):
        """Busy-wait at most ``budget`` s, on this event loop's thread, for ``ref``.

        For a loop that has one call in flight and nothing else to do (a
        Serve proxy at low load): see ``_LoopBridge.wait_briefly``.
        """
        e = ref._e
        if e.ready or e.peer is None:
            return e.ready
        return self.bridge_for_running_loop().wait_briefly(e.peer, e, budget)

    def spin_for_messages(self, budget):
        """Busy-wait at most ``budget`` s, on this event loop's thread, for a
        message on any link; see ``_LoopBridge.spin_for_messages``."""
        return self.bridge_for_running_loop().spin_for_messages(budget)

    def close_bridges(self):
        for bridge in list(self._bridges.values()):
            bridge.close()
        self._bridges.clear()


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
        from .transport import WEAK_SLICE
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
        link = self.node.links.get(peer)
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
