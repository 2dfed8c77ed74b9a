"""The part of the runtime every process has: ``Node``, this process's end of every link.

``Node`` is composed of one part per responsibility, each in its own module:

  links/drive.py         the drive lock, the wait loop and the drain of every link
  links/service.py       ``node.service``: the driver's service thread (serves the
                         links while no one waits), an object the node holds
  objects/ownership.py   ``node.objects``: refs lent and borrowed, fetching values from
                         their owners, an object the node holds
  objects/streams.py     ``node.streams``: the streams this process owns (items,
                         back-pressure, ends), an object the node holds
  links/loop_bridge.py   ``node.bridges``: waiting from asyncio (a loop drives the
                         links through descriptors), an object the node holds

The drive loop is a mixin sharing the node's ``self``: the compiled task
runner, a worker's first base, keeps its fields (the drive lock, the
sleepers) as typed fields.  This module keeps what ties the parts: ids,
links, the results expected from each peer (``pending``, ``inflight``: the
compiled pool book reads them on the node) and ``RESULT``, the weights to
give back (``_releases``: the task runner looks at them after every task),
peer death, requests to the driver, and ``handlers``, the table from a
message's tag to its handler.  The messages are listed in
``links/protocol.py``, their handlers in ``docs/architecture.md``.
"""
import itertools
import os
import threading
import time

from ray_lite._fast import shm
from ray_lite.exceptions import ActorDiedError, OwnerDiedError, WorkerCrashedError

from ..actors import restarts
from ..actors.actor_exit import OUT_OF_SCOPE
from ..links import protocol as P
from ..links.drive import DrivingMixin
from ..links.loop_bridge import LoopBridges
from ..links.service import ServiceThread
from ..links.transport import LinkClosed
from ..objects import object_store
from ..objects.entries import _IMMUTABLE, keep_private
from ..objects.ownership import Objects
from ..objects.refs import LoadedValue, adopt_stored, loaded
from ..objects.streams import Streams
from ..process.interrupts import sleep_point
from ..process.procutil import open_sentinel

_OID_SHIFT = 40


class Node(DrivingMixin):
    def __init__(self, node_id, driver_pid, shm_prefix):
        self.id = node_id
        self.driver_pid = driver_pid
        self.shm_prefix = shm_prefix
        self.links = {}          # peer id -> the Link we send to it on
        # peer id -> the Link the peer made when we both made one at once
        # (``add_reading_link``): its messages come on that one, ours go on ours.
        self.reading_links = {}
        self.peer_pids = {}      # peer id -> pid
        self.sentinels = {}      # pidfd -> peer id
        self.dead_peers = {}     # peer id -> error factory kind
        self.death_causes = {}   # actor id -> the text of the error its death gives
        self.inflight = {}       # peer id -> {oid: kind} results expected from that peer
        self.pending = {}        # oid -> _Entry or [entries] (results expected)
        self.rpc_replies = {}    # req id -> (ok, payload)
        self._deferred = []      # streams and actors dropped in __del__, cancels (_run_deferred)
        self._releases = []      # (owner, oid, weight) to give back (objects.send_releases)
        self._stash = []         # (peer, msg) read ahead of a drain (see WorkerNode)
        self._drain_list = ((), ())
        self._seq = itertools.count(1)
        self._oid_base = node_id << _OID_SHIFT
        self._rpc_seq = itertools.count(1)
        self._drive_lock = threading.Lock()
        self._cond = threading.Condition(threading.Lock())
        self._sleepers = 0
        self._waiting = []       # one item per thread inside wait_until (append/pop: atomic)
        self._wait_epoch = 0     # changes whenever a thread leaves wait_until
        self._fds_touched = False
        self.service = ServiceThread(self)   # started by the driver only
        self.streams = Streams(self)         # the streams this process owns
        self.objects = Objects(self)         # objects lent, borrowed and fetched
        # Called by the task runner after a task that left weights to give
        # back, and by the drain: bound once here, 32 ns a call against 55 ns
        # for a method of the node that calls the part's (2026-12-05, 2-core
        # Xeon VM, best of 7 million calls).
        self._send_releases = self.objects.send_releases
        self.bridges = LoopBridges(self)     # one bridge per asyncio loop that waits
        # The bridges' table, also on the node itself: the task runner looks
        # at it after every task (a typed field of the compiled runner).
        # ``self.bridges.by_loop`` there would be one more attribute lookup
        # per task: 10 ns against 7.5 in Python (2026-12-05, 2-core Xeon VM),
        # small beside B11's 3 us, but on every task for nothing.
        self._bridges = self.bridges.by_loop
        self.closed = False
        # The runtime starts no other thread that drives (no service thread,
        # no loop, no pool of method threads): while the user's code starts
        # none either, a wait may block in one ring without missing a link
        # another thread adds meanwhile (see DrivingMixin._poll).
        self.single_waiter = False
        # tag -> bound handler (see protocol.py); subclasses add theirs.
        self.handlers = {
            P.RESULT: self._on_result, P.FETCH: self.objects.on_fetch,
            P.FETCHED: self.objects.on_fetched, P.RELEASE: self.objects.on_release,
            P.ITEM: self.streams.on_item,
            P.END: self.streams.on_end, P.ACK: self.streams.on_ack,
            P.ATTACH: self._on_attach, P.REPLY: self._on_rpc_reply,
        }

    # ----------------------------------------------------------------- ids
    def new_oid(self):
        return self._oid_base | next(self._seq)

    def new_oids(self, n):
        first = self.new_oid()
        for _ in range(n - 1):
            self.new_oid()
        return first

    # ----------------------------------------------------- results expected
    def expect(self, peer, oid, entry, kind):
        """Record that ``peer`` will answer ``oid`` (for failure on its death)."""
        self.pending[oid] = entry
        self.inflight.setdefault(peer, {})[oid] = kind

    def _on_result(self, peer, msg):
        _, oid, ok, payload = msg
        if not ok and self.exc_retries and self.retry_on_exception(oid, payload):
            return      # sent again (retry_exceptions of an actor's method)
        mapped = None
        if type(payload) is LoadedValue:
            ok, payload, mapped = loaded(ok, payload)
        fl = self.inflight.get(peer)
        if fl is not None:
            fl.pop(oid, None)
        target = self.pending.pop(oid, None)
        if target is None:
            return
        if mapped is not None:
            adopt_stored(target, mapped)
        if type(target) is list:
            if ok:
                for e, v in zip(target, payload):
                    if type(v) is P.FailedReturn:     # a generator stopped early
                        e.set_error(v.error)
                    else:
                        if type(v) not in _IMMUTABLE and not e.ready:
                            keep_private(e)
                        e.set_value(v)
            else:
                for e in target:
                    e.set_error(payload)
        elif ok:
            # target.set_value(payload), inline: every call's result comes here.
            if not target.ready:
                if type(payload) not in _IMMUTABLE:
                    keep_private(target)    # before it is ready: no read can precede it
                target.value = payload
                target.ready = True
                if target.callbacks:
                    target._fire()
        else:
            target.set_error(payload)


    # --------------------------------------------------------------- links
    def add_link(self, peer, link, pid):
        link.on_full = self._on_link_full
        old = self.links.get(peer)
        self.links[peer] = link
        if old is not None and old is not link:
            # A new process for the peer (an actor restarted before its old
            # one's death was seen): the old link is read by nobody now, and
            # a loop still watching it would find it readable forever.
            self._drop_link(old)
        extra = self.reading_links.pop(peer, None)
        if extra is not None:
            self._drop_link(extra)
        self._index_links()
        self.inflight.setdefault(peer, {})
        if pid is not None and pid != os.getpid():
            self.peer_pids[peer] = pid
            fd = open_sentinel(pid)
            if fd is None:
                self._on_peer_died(peer)
                return
            self.sentinels[fd] = peer
            self.bridges.watch(link, fd)
        else:
            self.bridges.watch(link, None)
        self.links_changed()

    def add_reading_link(self, peer, link):
        """``peer`` made a link to us while we made ours to it (each of two
        workers called the other first at the same moment): each goes on
        sending on the link it made, so that its messages stay in order, and
        reads the other's too.  ``reading_link`` names the one a peer's
        messages come on."""
        link.on_full = self._on_link_full
        old = self.reading_links.get(peer)
        self.reading_links[peer] = link
        if old is not None:
            self._drop_link(old)
        self._index_links()
        self.bridges.watch(link, None)
        self.links_changed()

    def reading_link(self, peer):
        """The link ``peer``'s messages come on."""
        link = self.reading_links.get(peer)
        return self.links.get(peer) if link is None else link

    def all_links(self):
        links = list(self.links.values())
        if self.reading_links:
            links += self.reading_links.values()
        return links

    def _drop_link(self, link):
        self.bridges.unwatch_fd(link.fileno())
        link.close()

    def remove_peer(self, peer):
        link = self.links.pop(peer, None)
        extra = self.reading_links.pop(peer, None)
        self._index_links()
        if extra is not None:
            self._drop_link(extra)
        for fd, p in list(self.sentinels.items()):
            if p == peer:
                del self.sentinels[fd]
                self.bridges.unwatch_fd(fd)
                os.close(fd)
        if link is not None:
            self.bridges.unwatch_fd(link.fileno())
            link.close()
        self.peer_pids.pop(peer, None)
        self.links_changed()

    def _index_links(self):
        # What _drain walks: a snapshot (handlers may add or remove links
        # meanwhile) with each ring's poll bound once; one attribute, so that
        # a drain on another thread never pairs a new list with old polls.
        entries = tuple((peer, link, link._rx.poll) for peer, link in self.links.items())
        if self.reading_links:
            entries += tuple((peer, link, link._rx.poll)
                             for peer, link in self.reading_links.items())
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

    # ------------------------------------------------- an actor's last handle
    def actor_handle_dropped(self, aid):
        """The last handle to actor ``aid``, this process's (its creator's)
        and every copy, is gone (``_ActorLease.__del__``, so at any point of
        any thread): the actor is ended at the next drain, which the service
        thread (if it is listening) does now."""
        if not self.closed:
            self._deferred.append(aid)      # an int among streams: see _run_deferred
            self.service.kick(False)

    def end_dropped_actor(self, aid):
        """Ray's out-of-scope end (``actor_exit.out_of_scope``): after the
        calls sent before it; its answer is awaited by nobody.

        This runs inside a drain: nothing here may wait (``connect`` from a
        worker asks the driver and waits).  A worker with no link to the
        actor never called it: the driver, linked to every actor, sends the
        end, told by a request that needs no answer."""
        if aid in self.dead_peers or self.closed:
            return
        if aid in self.links:
            self.send(aid, P.method_msg(self.new_oid(), OUT_OF_SCOPE, [], {}, 1, False, 0))
        elif self.id != 0:
            self.notify(P.OP_OUT_OF_SCOPE, aid)

    def _run_deferred(self):
        # What __del__ asked for (at any point of any thread), done in a drain.
        if self._releases:
            self._send_releases()
        items, self._deferred = self._deferred, []
        for x in items:
            if type(x) is int:      # an actor whose last handle went (actor_handle_dropped)
                self.end_dropped_actor(x)
            elif type(x) is tuple:  # (actor, call): a cancel from a signal handler (WorkerNode)
                self.send(x[0], P.cancel_msg(x[1], False))
            else:                   # a dropped generator (Streams.defer_stream_release)
                self.streams.release_stream(x)

    def read_what_peer_sent(self, peer):
        """Handle what ``peer`` (dead, or dying) sent that is not read yet."""
        for link in (self.links.get(peer), self.reading_links.get(peer)):
            if link is not None:
                try:
                    for msg in link.recv_all():
                        self.handlers[msg[0]](peer, msg)
                except (LinkClosed, OSError):
                    pass

    def cancel_own_call(self, oid):
        """Cancel call ``oid`` that this process made to an actor, if it has
        not ended; True if it is one.  (Ray passes the cancel of a ref that
        the canceller borrowed on to its owner: this process.)"""
        for aid, fl in list(self.inflight.items()):
            kind = fl.get(oid)
            if aid != 0 and (kind == P.ACTOR_CALL or kind == P.STREAM):
                return self.send(aid, P.cancel_msg(oid, False))
        for aid, kept in list(self.retry_calls.items()):    # a restartable actor's
            if oid in kept and oid in self.pending:
                return self.send(aid, P.cancel_msg(oid, False))
        return False

    # --------------------------------------------------------- peer death
    def death_error(self, peer, kind):
        if kind == P.ACTOR_CALL or kind == P.FETCH_FROM_ACTOR:
            return ActorDiedError(self.death_causes.get(
                peer, "The actor died unexpectedly before finishing this task."), actor_id=peer)
        if kind == P.FETCH_OBJECT:
            return OwnerDiedError("the process that owns this object died")
        return WorkerCrashedError()

    def peer_kind(self, peer):
        return P.ACTOR_CALL

    def _on_peer_died(self, peer):
        if peer in self.dead_peers:
            return
        self.read_what_peer_sent(peer)   # (before dying: still worth reading)
        kind = self.peer_kind(peer)
        self.dead_peers[peer] = kind
        pid = self.peer_pids.get(peer)
        self.remove_peer(peer)
        if pid and self.id == 0:
            # Its stored objects are lost (readers keep what they mapped).
            object_store.release_dead_owner(self, pid)
            # So are the other segments it made (a Serve replica's cell; its
            # links' peers unlink those): no one else would before shutdown.
            for name in shm.list_segments(f"{self.shm_prefix}{pid}_"):
                shm.unlink_segment(name)
        objects = self.objects
        if objects.holders:
            objects.release_dead_holder(peer)
        if objects.relayed_holders:
            objects.tell_owners_holder_died(peer)
        for oid, k in list(self.inflight.pop(peer, {}).items()):
            err = self.death_error(peer, kind if k != P.FETCH_OBJECT else P.FETCH_OBJECT)
            if k == P.STREAM:
                self.streams.fail_owned(oid, err)
            elif k == P.FETCH_OBJECT:
                objects.fail_fetch(oid, err)
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
    def retry_on_exception(self, oid, error):
        """An actor call failed: True if it was sent again (``retry_exceptions``;
        the objects part asks, the actors layer knows)."""
        return restarts.retry_on_exception(self, oid, error)

    def _on_rpc_reply(self, peer, msg):
        self.rpc_replies[msg[1]] = (msg[2], msg[3])

    def connect(self, peer):
        """Make sure a link to ``peer`` exists; False if it cannot."""
        raise NotImplementedError

    def _on_attach(self, peer, msg):
        raise RuntimeError("only workers attach links made by others")

    def request(self, op, *args):
        """Ask the driver for ``op`` (a ``protocol.OP_*``) and return its answer.

        In the driver, a direct call of the handler; in a worker, a round
        trip (``rpc``).  The same errors either way.
        """
        raise NotImplementedError
