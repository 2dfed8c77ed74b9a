"""The part of the runtime every process has: links, owned objects, streams.

A ``Node`` is this process's end of every link.  Nothing reads the links in
the background: the thread that waits (in ``get``, ``wait``, ``next`` or a
worker's idle loop) *drives* them — it drains every link and dispatches each
message — through ``wait_until``.  When several threads wait, one drives and
the others sleep on a condition that the driver notifies after each round.
An asyncio loop drives them from reader callbacks on the links' descriptors.

Message kinds (tuples; the first element says what it is):

  T  driver -> pool worker    run a task
  M  caller -> actor          run a method
  R  executor -> owner        a task or call finished (oid, ok, payload)
  I  producer -> owner        stream item (sid, index, ok, payload)
  E  producer -> owner        stream end (sid, count)
  K  owner -> producer        stream back-pressure ack (sid, consumed)
  X  owner -> executor        cancel (oid)
  F  borrower -> owner        fetch an object (oid); answered by O (oid, ok, payload)
  Q  worker -> driver         request (req_id, op, args); answered by P (req_id, ok, payload)
  A  driver -> worker         attach the link a peer created (peer, pid, names)
  Z  driver -> worker         exit
"""
import asyncio
import itertools
import os
import threading
import time

from ray_lite.exceptions import ActorDiedError, ObjectLostError, TaskCancelledError, \
    WorkerCrashedError

from ray_lite._fast.stream_table import NOT_READY

from .procutil import open_sentinel
from .refs import ObjectRef, _Entry, error_entry, ready_entry
from .transport import LinkClosed, wait_readable

_OID_SHIFT = 40


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
        self.exported = {}       # oid -> _Entry owned here and referenced elsewhere
        self.fetching = {}       # oid -> [entries] borrowed objects being fetched
        self.fetch_requested = set()
        self.rpc_replies = {}    # req id -> (ok, payload)
        self._deferred = []      # stream releases asked from __del__
        self._seq = itertools.count(1)
        self._rpc_seq = itertools.count(1)
        self._drive_lock = threading.Lock()
        self._cond = threading.Condition(threading.Lock())
        self._sleepers = 0
        self._bridges = {}       # loop -> _LoopBridge
        self.closed = False
        self.handlers = {
            "R": self._on_result, "I": self._on_item, "E": self._on_end,
            "F": self._on_fetch, "O": self._on_fetched, "A": self._on_attach,
            "P": self._on_rpc_reply, "K": self._on_ack,
        }

    # ----------------------------------------------------------------- ids
    def new_oid(self):
        return (self.id << _OID_SHIFT) | next(self._seq)

    def new_oids(self, n):
        first = self.new_oid()
        for _ in range(n - 1):
            self.new_oid()
        return first

    # --------------------------------------------------------------- links
    def add_link(self, peer, link, pid):
        link.on_full = self._on_link_full
        self.links[peer] = link
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

    def remove_peer(self, peer):
        link = self.links.pop(peer, None)
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

    def _on_link_full(self):
        # The peer's ring is full and it may itself be blocked writing to us:
        # read what it sent (if no other thread is already doing so), then retry.
        if self._drive_lock.acquire(False):
            try:
                self._drain()
            finally:
                self._drive_lock.release()
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
    def wait_until(self, pred, timeout=None):
        """Drive the links until ``pred()`` is true or ``timeout`` passes.

        Returns ``pred()``.  Safe from any thread; see the module docstring.
        """
        if pred():
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return pred()
            if self._drive_lock.acquire(False):
                try:
                    if pred():
                        return True
                    self._poll(remaining)
                finally:
                    self._drive_lock.release()
                    if self._sleepers:
                        with self._cond:
                            self._cond.notify_all()
            else:
                with self._cond:
                    self._sleepers += 1
                    try:
                        # Bounded: the driving thread may leave without a round
                        # that concerns us (its own predicate became true).
                        self._cond.wait(0.05 if remaining is None else min(remaining, 0.05))
                    finally:
                        self._sleepers -= 1
            if pred():
                return True
            if self.closed:
                raise RuntimeError("ray_lite was shut down while waiting")

    def _poll(self, timeout):
        if self._drain() or timeout == 0:
            return
        sentinel_fds = list(self.sentinels)
        ready = wait_readable(list(self.links.values()), sentinel_fds, timeout)
        self._drain()
        if ready:
            for fd in ready:
                peer = self.sentinels.get(fd)
                if peer is not None:
                    self._on_peer_died(peer)

    def _drain(self):
        if self._deferred:
            self._run_deferred()
        n = 0
        handlers = self.handlers
        for peer, link in list(self.links.items()):
            try:
                msgs = link.recv_all()
            except (LinkClosed, OSError):
                continue
            for msg in msgs:
                n += 1
                handlers[msg[0]](peer, msg)
        return n

    def drive_nowait(self):
        """One non-blocking round (from an asyncio reader callback).

        False when another thread (or an outer frame of this one) is driving.
        """
        if self._drive_lock.acquire(False):
            try:
                self._drain()
            finally:
                self._drive_lock.release()
                if self._sleepers:
                    with self._cond:
                        self._cond.notify_all()
            return True
        return False

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

    def export(self, oid, entry):
        self.exported[oid] = entry

    def lookup_owned(self, oid):
        e = self.exported.get(oid)
        if e is None:
            e = self.pending.get(oid)
            if type(e) is list:
                e = None
        return e

    def borrowed_entry(self, oid, owner):
        e = _Entry()
        if owner in self.dead_peers:
            e.set_error(ObjectLostError(f"the owner of object {oid:x} died", oid))
        else:
            self.fetching.setdefault(oid, []).append(e)
            self._owner_of_fetch = getattr(self, "_owner_of_fetch", {})
            self._owner_of_fetch[oid] = owner
        return e

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
                if not self.send(peer, ("O", oid, True, entry.value)):
                    pass
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
        e = ready_entry(payload) if ok else error_entry(payload)
        s.table.report(index, ObjectRef(self.new_oid(), self.id, e))
        if not ok:
            self._end_stream(s, index + 1, payload)
        elif s.waiter is not None:
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
        acks = self.__dict__.setdefault("stream_acks", {})
        if acks.get(msg[1], -1) < msg[2]:
            acks[msg[1]] = msg[2]

    def defer_stream_release(self, s):
        self._deferred.append(s)

    def _run_deferred(self):
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
    loop drains every link and re-arms them (re-draining when a message slipped
    in between, which ``arm`` reports).
    """

    def __init__(self, node, loop):
        from .transport import WEAK_SLICE
        self.node = node
        self.loop = loop
        self.thread_id = threading.get_ident()
        self.links = {}     # fd -> link
        self.fds = set()
        self.closed = False
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
        self.loop.add_reader(fd, self.on_readable, link)
        # Not at once: we may be inside a drain of this very loop.
        self.loop.call_soon(self.on_readable, None)

    def on_readable(self, link):
        if link is not None:
            link.disarm()
        node = self.node
        while True:
            if not node.drive_nowait():
                # Someone else is draining (another thread, or an outer frame
                # of this callback): look again shortly rather than spin.
                if not self.closed:
                    self.loop.call_later(0.001, self.on_readable, None)
                return
            again = False
            for lk in list(self.links.values()):
                if not lk.arm():
                    again = True
            if not again:
                return

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
