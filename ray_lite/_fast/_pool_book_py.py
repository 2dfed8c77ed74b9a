"""The driver's pool book, pure-Python twin (the executable specification).

``PoolWorker`` is a pool worker as the driver schedules onto it.
``PoolBook`` holds the two per-task steps of the driver's common task
(plain arguments, one return, no Demand): ``submit_plain`` books it on an
idle worker and sends it, or queues it; ``_task_finished`` frees the worker
at its result.  It owns the counters and queues those steps read on every
task; the driver's parts (``_private/scheduling``: task dispatch, the
resource ledger) read and write the same fields under the same ``_sched``
lock, and the book calls back into them through bound methods it is given
once (``enqueue``, ``unsent``, ``free_worker``, ``dispatch_queued``,
``used_up``, ``resources_freed``, ``on_result``).
"""

__all__ = ["PoolBook", "PoolWorker", "plain_call"]

# The types of a common task's arguments: values that need no look before
# they travel (no ref inside, always serialisable).  The runtime's one
# definition (``pool_book.PLAIN_TYPES``); the compiled twin tests the same.
PLAIN_TYPES = frozenset((int, float, str, bytes, bool, type(None)))


def plain_call(args, kwargs, arity):
    """True when a call is the driver's common task's: no keyword arguments,
    a number of positional ones that ``arity`` (``(lo, hi, ...)`` or None)
    allows, and each an int, float, str, bytes, bool or None (exactly those
    types).  False sends the call the general way, which checks it all."""
    if kwargs:
        return False
    if arity is not None and not arity[0] <= len(args) <= arity[1]:
        return False
    for a in args:
        if type(a) not in PLAIN_TYPES:
            return False
    return True


class PoolWorker:
    __slots__ = ("id", "pid", "shipped", "task", "blocked", "calls")

    def __init__(self, wid, pid):
        self.id = wid
        self.pid = pid
        self.shipped = set()
        self.task = None
        self.blocked = False
        self.calls = None       # fn id -> tasks run, of functions with max_calls


class PoolBook:
    # The fields (set by the driver, which holds the book): _sched, idle,
    # queue, nested_queue, placed_queue, res_waiters, busy, cpu_cap, links,
    # task_op, spec_type; those of a result: pending, inflight, pool,
    # forward, entry_type, kept_types; and the callbacks: enqueue, unsent,
    # free_worker, dispatch_queued, used_up, resources_freed, on_result.

    def submit_plain(self, oid, fn_id, blob, args, kwargs, bp, retries, name, target):
        """``submit`` of the driver's common task: plain arguments, one return,
        no Demand; ``target`` is its entry.  ``submit`` and ``_send_task`` in
        one, with only the looks such a task needs: it runs per call (B11)."""
        sched = self._sched
        sched.acquire()     # not ``with``: half the cost; driver only, where a
                            # Ctrl-C in runtime code is deferred (interrupts.py)
        try:
            idle = self.idle
            if idle and not self.queue and not self.nested_queue and \
                    self.busy + 1 <= self.cpu_cap:
                w = idle.pop()
                self.busy += 1
                try:
                    self.links[w.id].send((self.task_op, oid, fn_id,
                                           None if fn_id in w.shipped else blob,
                                           args, kwargs, 1, False, bp, name))
                except BaseException as exc:
                    self.unsent(self.spec_type(oid, fn_id, blob, args, kwargs, 1, False, bp,
                                               retries, name, 0, False), w, exc)
                    return
                # The spec is made and booked after the send, while the task
                # already runs (B11): still under _sched, which every reader
                # of ``w.task`` but the worker's own requests takes; its result
                # cannot come before it was sent; and the driver defers a
                # Ctrl-C in runtime code (interrupts.py), so nothing comes
                # between the send and this line.
                w.task = self.spec_type(oid, fn_id, blob, args, kwargs, 1, False, bp, retries,
                                        name, 0, False)
                w.shipped.add(fn_id)
                target.peer = w.id     # where the waiting thread looks first
            else:
                self.enqueue(self.spec_type(oid, fn_id, blob, args, kwargs, 1, False, bp,
                                            retries, name, 0, False))
        finally:
            sched.release()

    def _task_finished(self, w, oid):
        """Pool worker ``w`` ended its task ``oid``: it is idle (and its CPU free)."""
        # ``w.task`` is read under the lock only: submit_plain books it just
        # after the send, under the lock, and another thread may drain the
        # result meanwhile.
        sched = self._sched
        sched.acquire()     # see submit_plain
        try:
            spec = w.task
            if spec is None or spec.oid != oid:
                return
            if type(spec) is self.spec_type and not w.blocked:
                self.busy -= 1        # the common task (no Demand, no max_calls), inline
                w.task = None
                self.idle.append(w)
            else:
                self.free_worker(w, spec)
                w.task = None
                if not spec.max_calls or not self.used_up(w, spec):
                    self.idle.append(w)
            if self.queue or self.nested_queue:
                self.dispatch_queued()
            if self.placed_queue or self.res_waiters:
                self.resources_freed()
        finally:
            sched.release()

    def _on_pool_result(self, peer, msg):
        """The driver's handler of a RESULT message ``(RESULT, oid, ok, payload)``.

        The common one (a value, for an entry of this process that waits,
        not a nested task's to forward, of an immutable type: not a value
        mapped from the store nor one to keep private copies of)
        is set here, and its pool worker freed: ``Node._on_result`` and
        ``DriverNode._on_result`` in one, with only the looks it needs; it
        comes once per task (B11).  Any other goes to ``on_result``."""
        oid = msg[1]
        payload = msg[3]
        if msg[2] and not self.forward and type(payload) in self.kept_types:
            pending = self.pending
            target = pending.get(oid)
            if type(target) is self.entry_type:
                del pending[oid]
                inflight = self.inflight
                if inflight:
                    fl = inflight.get(peer)
                    if fl is not None:
                        fl.pop(oid, None)
                if not target.ready:
                    target.value = payload
                    target.ready = True
                    if target.callbacks:
                        target._fire()
                w = self.pool.get(peer)
                if w is not None:           # an actor's result frees no worker
                    self._task_finished(w, oid)
                return
        self.on_result(peer, msg)
