"""Streams this process owns: items reported by a producer, back-pressure, ends.

``Streams`` is a part every node holds (``node.streams``): it owns the table of
the streams this process owns (``owned``: stream id -> ``_StreamState``) and
handles their messages, ``ITEM``, ``END`` and ``ACK`` (the driver's own
handlers forward a nested task's stream first, then call these).  A stream's
producer, its expected results, is in the node's ``inflight`` (peer death
fails the stream through ``fail_stream``).
"""
from ray_lite.exceptions import TaskCancelledError

from ray_lite._fast.stream_table import NOT_READY

from ..links import protocol as P
from .entries import _IMMUTABLE, _Entry, _PrivateEntry
from .refs import ObjectRef, _StreamState, error_entry


class Streams:
    """The owner's side of streaming generators (a part of ``Node``, ``node.streams``)."""

    def __init__(self, node):
        self.node = node
        self.owned = {}      # sid -> _StreamState (streams this process owns)

    def new_stream(self, sid, peer, bp, name):
        s = _StreamState(sid, peer, bp, name)
        self.owned[sid] = s
        if peer is not None:
            self.node.inflight.setdefault(peer, {})[sid] = P.STREAM
        return s

    def on_item(self, peer, msg):
        _, sid, index, ok, payload = msg
        s = self.owned.get(sid)
        if s is None or s.done:
            return
        if s.peer is None:
            s.peer = peer    # a pool task's producer is known once it reports
        if s.released:
            if not ok:
                self._end_stream(s, index + 1, payload)
            return
        node = self.node
        if ok:
            # result_entry(payload), inline: it runs per item (B1).
            e = _Entry() if type(payload) in _IMMUTABLE else _PrivateEntry()
            e.value = payload
            e.ready = True
            try:
                s.table.report(index, ObjectRef(node._oid_base | next(node._seq), node.id, e))
            except ValueError:
                if index < s.table.num_reported:
                    self._replayed_item(s, peer)
                    return
                raise
        else:
            # (A run again may fail before the item an earlier run got to.)
            index = max(index, s.table.num_reported)
            s.table.report(index, ObjectRef(node.new_oid(), node.id, error_entry(payload)))
            self._end_stream(s, index + 1, payload)
            return
        if s.waiter is not None:
            w, s.waiter = s.waiter, None
            w()

    def _replayed_item(self, s, peer):
        """An item an earlier run of the stream's task reported (the task runs
        again after its worker died, as Ray reruns a generator): skipped.  The
        new run's worker is the producer now, and it counts acknowledgements
        from none: it is told what was taken, else a full window would hold it
        back for ever."""
        s.peer = peer
        if s.bp > 0:
            self.node.send(peer, P.ack_msg(s.sid, s.table.num_consumed))

    def on_end(self, peer, msg):
        s = self.owned.get(msg[1])
        if s is None or s.done:
            return
        self._end_stream(s, msg[2], None)

    def on_ack(self, peer, msg):
        """Back-pressure acks concern producers (``WorkerNode``); a late one is dropped."""

    def _end_stream(self, s, count, error):
        s.done = True
        self.owned.pop(s.sid, None)
        fl = self.node.inflight.get(s.peer)
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
            s.table.report(index, ObjectRef(self.node.new_oid(), self.node.id, e))
        except ValueError:
            pass
        self._end_stream(s, index + 1, error)

    def fail_owned(self, sid, error):
        """Fail the stream ``sid`` if this process still owns it."""
        s = self.owned.get(sid)
        if s is not None:
            self.fail_stream(s, error)

    def next_item(self, s, timeout):
        """Wait for the next item of ``s``; NOT_READY on timeout."""
        table = s.table
        if not table.is_next_ready():
            self.flush_stream_acks(s)
            # As in get: a pool worker lends its CPU slot while it waits, so
            # that the task producing the stream can run on a full pool.
            node = self.node
            node.block_begin()
            try:
                node.wait_until(table.is_next_ready, timeout)
            finally:
                node.block_end()
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
            self.flush_stream_acks(s)
            bridge = self.node.bridges.for_running_loop()
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
        """After an item of ``s`` was taken: acknowledge every half window."""
        if s.table.num_consumed - s.acked >= s.ack_every:
            self.flush_stream_acks(s)

    def flush_stream_acks(self, s):
        """Acknowledge everything taken from ``s``: before any wait for (or
        look at) a next item that is not there, else a producer held back
        by the window and a consumer waiting for its next item would wait
        for each other."""
        if s.bp > 0 and not s.done:
            consumed = s.table.num_consumed
            if consumed > s.acked:
                s.acked = consumed
                self.node.send(s.peer, P.ack_msg(s.sid, consumed))

    def defer_stream_release(self, s):
        """``s`` was dropped (from ``__del__``, so at any point of any thread):
        released at the next drain (``Node._run_deferred``)."""
        self.node._deferred.append(s)

    def release_stream(self, s):
        # Like Ray, dropping a generator does not cancel its task (completed()
        # still resolves): the items are no longer kept, and a producer held
        # back by back-pressure is let go.
        if not s.done:
            s.released = True
            s.table = None
            if s.bp > 0 and s.peer is not None:
                self.node.send(s.peer, P.ack_msg(s.sid, P.UNLIMITED_ACK))

    def cancel_stream(self, s, force):
        if s.done:
            return
        s.cancelled = True
        self.node.send(s.peer, P.cancel_msg(s.sid, force))
        self.fail_stream(s, TaskCancelledError())
