# cython: language_level=3
"""A worker's task runner, compiled twin (layout in ``_task_runner_c.pxd``;
semantics and comments: ``_task_runner_py.py``, the executable specification).

The same steps as the twin, with the worker's fields typed.
"""
from types import CoroutineType as _CoroutineType


cdef class TaskRunner:
    def _on_task(self, peer, msg):
        if self._releases:
            self._send_releases()
        self.live.add(msg[1])
        self.tasks.append((peer, msg))

    def serve_calls(self, run):
        cdef object tasks = self.tasks
        cdef object lock = self._drive_lock
        cdef bint ran = False
        cdef object peer, msg
        while not self.exiting:
            if tasks:
                if ran and lock.acquire(False):
                    try:
                        self._drain()
                    finally:
                        self._release_drive()
                    if self.exiting:
                        break
                peer, msg = tasks.popleft()
                run(peer, msg)
                ran = True
                peer = msg = None
            elif lock.acquire(False):
                ran = False
                try:
                    if not tasks and not self.exiting:
                        self._poll(None)
                finally:
                    lock.release()
                    if self._sleepers or self._bridge_waiting:
                        self._wake_after_release()
            else:
                self.wait_until(lambda: tasks or self.exiting)

    def run_pool_task(self, peer, msg):
        cdef object a, fn, ref_type
        _, oid, fn_id, blob, args, kwargs, nret, stream, bp, name = msg
        self.current_thread_busy = True
        self.current_oid = oid
        self.current_name = name
        self.task_oids_from = self.new_oid()    # (the oids of its calls: these on)
        self._interrupted = False
        try:
            try:
                fn = self.functions.get(fn_id)
                if fn is None:
                    fn = self._load_function(fn_id, blob)
                self.current_fn = fn
                if kwargs:
                    args, kwargs = self._resolve(args, kwargs)
                else:
                    ref_type = self.ref_type
                    for a in args:
                        if type(a) is ref_type:
                            args, kwargs = self._resolve(args, kwargs)
                            break
            except BaseException as exc:
                self._send_failure(peer, oid, stream, self._failure(oid, name, exc), name)
                return
            self._invoke_c(peer, oid, fn, args, kwargs, nret, stream, bp, name)
        finally:
            self.current_oid = self.current_fn = self.current_name = None
            self._interrupt = None
            self.current_thread_busy = False
            if self.cancelled:
                self.cancelled.discard(oid)
            self.live.discard(oid)
            if self.blocked_depth:
                self._lend_slot_for_good()
            if self._bridges:
                self._close_finished_bridges()

    def _invoke(self, peer, oid, fn, args, kwargs, nret, stream, bp, name):
        self._invoke_c(peer, oid, fn, args, kwargs, nret, stream, bp, name)

    cdef _invoke_c(self, peer, oid, fn, args, kwargs, nret, stream, bp, name):
        cdef object result, link, msg
        try:
            try:
                self._in_user_code = True
                if self._cancel_signalled or self._interrupt is not None:
                    self._enter_user_code()
                if kwargs:
                    result = fn(*args, **kwargs)
                else:
                    result = fn(*args)
                if not stream and type(result) is _CoroutineType:
                    result = self._await_result(result)
            finally:
                self._in_user_code = False
            if stream:
                self._run_stream(peer, oid, result, bp, name)
                return
            if nret != 1:
                result = self._split(result, nret, name)
        except BaseException as exc:
            if isinstance(exc, SystemExit) and self.kind != "actor":
                raise
            self._send_failure(peer, oid, stream, self._failure(oid, name, exc), name)
            if isinstance(exc, SystemExit):
                raise
            return
        if self.cancelled and oid in self.cancelled:
            self._send_cancelled(peer, oid, name)
            return
        if type(result) not in self.never_stored:
            result = self.store_result(result)
        link = self.links.get(peer)
        if link is not None:
            msg = (self.result_op, oid, True, result)
            try:
                link.send(msg)
            except (ConnectionError, OSError):
                pass
            except Exception as exc:
                self._unsendable(peer, msg, name, exc)
