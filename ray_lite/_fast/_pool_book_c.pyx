# cython: language_level=3
"""The driver's pool book, compiled twin (layout in ``_pool_book_c.pxd``;
semantics and comments: ``_pool_book_py.py``, the executable specification).

The same steps as the twin, with the fields typed: the scheduler's state is
read and written at C level, and the worker's fields through its struct.
"""


def plain_call(args, kwargs, arity):
    # Any sequence, as the twin takes (the runtime passes tuples).
    cdef object t
    if kwargs:
        return False
    if arity is not None and not arity[0] <= len(args) <= arity[1]:
        return False
    for a in args:
        t = type(a)
        if not (t is int or t is float or t is str or t is bytes or t is bool or a is None):
            return False
    return True


cdef class PoolWorker:
    def __init__(self, wid, pid):
        self.id = wid
        self.pid = pid
        self.shipped = set()
        self.task = None
        self.blocked = False
        self.calls = None


cdef class PoolBook:
    def submit_plain(self, oid, fn_id, blob, args, kwargs, bp, retries, name, target):
        cdef PoolWorker w
        cdef object sched = self._sched
        sched.acquire()
        try:
            if self.idle and not self.queue and not self.nested_queue and \
                    self.busy + 1 <= self.cpu_cap:
                w = self.idle.pop()
                self.busy += 1
                try:
                    self.links[w.id].send((self.task_op, oid, fn_id,
                                           None if fn_id in w.shipped else blob,
                                           args, kwargs, 1, False, bp, name))
                except BaseException as exc:
                    self.unsent(self.spec_type(oid, fn_id, blob, args, kwargs, 1, False, bp,
                                                retries, name, 0, False), w, exc)
                    return
                w.task = self.spec_type(oid, fn_id, blob, args, kwargs, 1, False, bp, retries,
                                        name, 0, False)
                w.shipped.add(fn_id)
                target.peer = w.id
            else:
                self.enqueue(self.spec_type(oid, fn_id, blob, args, kwargs, 1, False, bp,
                                            retries, name, 0, False))
        finally:
            sched.release()

    def _task_finished(self, PoolWorker w, oid):
        cdef object sched = self._sched
        cdef object spec
        sched.acquire()
        try:
            spec = w.task
            if spec is None or spec.oid != oid:
                return
            if type(spec) is self.spec_type and not w.blocked:
                self.busy -= 1
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
        cdef object oid = msg[1]
        cdef object payload = msg[3]
        cdef object target, fl, w
        if msg[2] and not self.forward and type(payload) in self.kept_types:
            target = self.pending.get(oid)
            if type(target) is self.entry_type:
                del self.pending[oid]
                if self.inflight:
                    fl = self.inflight.get(peer)
                    if fl is not None:
                        fl.pop(oid, None)
                if not target.ready:
                    target.value = payload
                    target.ready = True
                    if target.callbacks:
                        target._fire()
                w = self.pool.get(peer)
                if w is not None:
                    self._task_finished(w, oid)
                return
        self.on_result(peer, msg)
