"""Streams this process owns: items reported by a producer, back-pressure, ends."""
from ray_lite.exceptions import TaskCancelledError

from ray_lite._fast.stream_table import NOT_READY

from ..links import protocol as P
from .refs import ObjectRef, _Entry, _StreamState, error_entry


class StreamsMixin:
    """The owner's side of streaming generators (part of ``Node``)."""

    def new_stream(self, sid, peer, bp, name):
        s = _StreamState(sid, peer, bp, name)
        self.streams[sid] = s
        if peer is not None:
            self.inflight.setdefault(peer, {})[sid] = P.STREAM
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
            try:
                s.table.report(index, ObjectRef(self._oid_base | next(self._seq), self.id, e))
            except ValueError:
                if index < s.table.num_reported:
                    self._replayed_item(s, peer)
                    return
                raise
        else:
            # (A run again may fail before the item an earlier run got to.)
            index = max(index, s.table.num_reported)
            s.table.report(index, ObjectRef(self.new_oid(), self.id, error_entry(payload)))
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
            self.send(peer, P.ack_msg(s.sid, s.table.num_consumed))

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
            self.flush_stream_acks(s)
            # As in get: a pool worker lends its CPU slot while it waits, so
            # that the task producing the stream can run on a full pool.
            self.block_begin()
            try:
                self.wait_until(table.is_next_ready, timeout)
            finally:
                self.block_end()
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
                self.send(s.peer, P.ack_msg(s.sid, consumed))

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
            if type(s) is int:      # an actor whose last handle went (actor_handle_dropped)
                self.end_dropped_actor(s)
                continue
            if not s.done:
                s.released = True
                s.table = None
                if s.bp > 0 and s.peer is not None:
                    self.send(s.peer, P.ack_msg(s.sid, P.UNLIMITED_ACK))

    def cancel_stream(self, s, force):
        if s.done:
            return
        s.cancelled = True
        self.send(s.peer, P.cancel_msg(s.sid, force))
        self.fail_stream(s, TaskCancelledError())
