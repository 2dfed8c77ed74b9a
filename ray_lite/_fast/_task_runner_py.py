"""A worker's task runner, pure-Python twin: the executable specification of
``_task_runner_c`` (see ``task_runner.py`` for the contract).

These are the steps a pool worker takes per task and an actor per method
call, between the message's arrival and the result's send: they are the
worker's half of B11's round trip.  What is not the common case (a function
not loaded yet, a ref among the arguments, a failure, a stream, a coroutine,
a cancel) goes to the worker's methods, named in the contract.
"""
from types import CoroutineType as _CoroutineType

__all__ = ["TaskRunner"]


class TaskRunner:
    """A base of ``WorkerNode`` (the first: its fields are the worker's)."""

    def _on_task(self, peer, msg):
        if self._releases:
            # The shares of refs the task's arguments brought are reported
            # before its code runs (see WorkerNode._on_method).
            self._send_releases()
        self.live.add(msg[1])
        self.tasks.append((peer, msg))

    def serve_calls(self, run):
        """The main loop of a pool worker or a sync actor: run calls as they arrive.

        Idle, it drives the links itself (see ``Node._poll``: with one link,
        a sleep on that ring).
        """
        tasks = self.tasks
        lock = self._drive_lock
        ran = False
        while not self.exiting:
            if tasks:
                if ran and lock.acquire(False):
                    # A call queued behind the one that just ran: read what
                    # came meanwhile first (a cancel of it, say).
                    try:
                        self._drain()
                    finally:
                        self._release_drive()
                    if self.exiting:
                        break
                peer, msg = tasks.popleft()
                run(peer, msg)
                ran = True
                # Not kept while idle: the arguments' objects (and the
                # shares of borrowed refs) go back at once.
                peer = msg = None
            elif lock.acquire(False):
                ran = False
                try:
                    if not tasks and not self.exiting:
                        self._poll(None)
                finally:
                    # self._release_drive(), its looks inline: the call that
                    # just came runs next (B11)
                    lock.release()
                    if self._sleepers or self._bridge_waiting:
                        self._wake_after_release()
            else:
                self.wait_until(lambda: tasks or self.exiting)

    def run_pool_task(self, peer, msg):
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
            self._invoke(peer, oid, fn, args, kwargs, nret, stream, bp, name)
        finally:
            self.current_oid = self.current_fn = self.current_name = None
            self._interrupt = None
            self.current_thread_busy = False
            if self.cancelled:
                self.cancelled.discard(oid)
            self.live.discard(oid)
            if self.blocked_depth:
                # Interrupted inside a get: the CPU slot is lent back for good.
                self._lend_slot_for_good()
            if self._bridges:
                self._close_finished_bridges()

    def _invoke(self, peer, oid, fn, args, kwargs, nret, stream, bp, name):
        try:
            try:
                # self._enter_user_code(), its looks inline: this runs per call.
                self._in_user_code = True
                if self._cancel_signalled or self._interrupt is not None:
                    self._enter_user_code()
                result = fn(*args, **kwargs) if kwargs else fn(*args)
                if not stream and type(result) is _CoroutineType:  # inspect.iscoroutine
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
                # sys.exit() in a task ends its worker: the caller gets Ray's
                # WorkerCrashedError (after the task's retries), not the exit.
                raise
            self._send_failure(peer, oid, stream, self._failure(oid, name, exc), name)
            if isinstance(exc, SystemExit):
                raise
            return
        if self.cancelled and oid in self.cancelled:
            # Cancelled while it ran, and the cancel was read meanwhile
            # (is_canceled(), or a wait of the call's): as in Ray, the
            # caller gets TaskCancelledError, whatever the call returned.
            self._send_cancelled(peer, oid, name)
            return
        if type(result) not in self.never_stored:     # (store_result's first look)
            result = self.store_result(result)
        # self.reply(peer, msg, name), its steps inline.
        link = self.links.get(peer)
        if link is not None:
            msg = (self.result_op, oid, True, result)
            try:
                link.send(msg)
            except (ConnectionError, OSError):
                pass        # the caller is gone: nobody to answer
            except Exception as exc:
                self._unsendable(peer, msg, name, exc)
