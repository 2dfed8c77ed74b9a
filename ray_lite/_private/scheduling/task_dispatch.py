"""The driver's pool tasks: ``submit`` sends a task to an idle pool worker
or queues it, and a worker's result (``_task_finished``) frees it for the
next.  A mixin of ``DriverNode``; everything here runs under ``_sched``.

The driver's common task (plain arguments, one return, no Demand) takes a
shorter way, per call: ``submit_plain`` and ``_task_finished`` are in
``_fast/pool_book`` (compiled, with its pure-Python twin)."""
from ray_lite.exceptions import RayError, RayTaskError

from ..links import protocol as P
from ..links.protocol import TASK
from ..objects.refs import ObjectRef, travels_as_value
from .task_cancel import ChildTasks


class TaskDispatchMixin:
    child_tasks = None      # ChildTasks, from the first task a pool task submits

    def submit(self, spec):
        sched = self._sched
        sched.acquire()     # not ``with``: half the cost (B11); driver only, where a
                            # Ctrl-C in runtime code is deferred (interrupts.py)
        try:
            if spec.owner != self.id:
                w = self.pool.get(spec.owner)
                if w is not None:       # a pool task's child: a recursive cancel reaches it
                    self._note_child(w, spec.oid)
            deps = None
            if spec.has_refs:
                has_refs = False
                for a in spec.args:
                    if type(a) is ObjectRef:
                        has_refs = True
                        if not a._e.ready and a._owner == self.id:
                            deps = [a] if deps is None else deps + [a]
                if spec.kwargs:
                    for a in spec.kwargs.values():
                        if type(a) is ObjectRef:
                            has_refs = True
                            if not a._e.ready and a._owner == self.id:
                                deps = [a] if deps is None else deps + [a]
                spec.has_refs = has_refs
            if deps:
                spec.deps_left = len(deps)
                self.waiting_deps[spec.oid] = spec
                for d in deps:
                    d._e.add_callback(lambda _e, spec=spec: self._dep_ready(spec))
            elif spec.demand is None and not self.queue and not self.nested_queue and \
                    self.idle and \
                    self.busy + 1 <= self.cpu_cap:
                self._send_task(spec)     # the common case: straight to an idle worker
            else:
                self._enqueue(spec)
        finally:
            sched.release()

    # A task of this process (a TaskSpec it owns): scheduled as any other.
    submit_task = submit

    def _note_child(self, w, oid):
        children = self.child_tasks
        if children is None:
            children = self.child_tasks = ChildTasks()
        children.note(w, oid, self.forward.__contains__)

    def _enqueue(self, spec, first=False):
        if spec.demand is None:
            if not self.num_cpus:
                # init(num_cpus=0): a task that asks for a CPU could never run
                # (Ray leaves it pending for ever; here get says why).
                self._fail_task(spec, ValueError(
                    f"{spec.name} asks for {{'CPU': 1}} but this machine has no CPU for "
                    f"tasks (init(num_cpus=0)): give the task num_cpus=0, or init more"))
                return
            queue = self.queue if spec.owner == self.id else self.nested_queue
            if first:
                queue.appendleft(spec)
            else:
                queue.append(spec)
            self._dispatch()
        else:
            self.enqueue_placed(spec)
            self.dispatch_placed()

    def _dep_ready(self, spec):
        with self._sched:
            spec.deps_left -= 1
            if spec.deps_left == 0 and self.waiting_deps.pop(spec.oid, None) is not None:
                self._enqueue(spec)

    @staticmethod
    def _inline(values):
        # Arguments that are ready refs travel as their values (Ray resolves
        # top-level ref arguments before the call).
        out = []
        for a in values:
            if type(a) is ObjectRef and a._e.ready and travels_as_value(a):
                if a._e.error is not None:
                    raise a._e.error
                a = a._e.value
            out.append(a)
        return out

    def _dispatch(self):
        with self._sched:
            nested, own = self.nested_queue, self.queue
            while nested or own:
                if self.busy + 1 > self.cpu_cap:
                    return
                if not self.idle:
                    if len(self.pool) >= self.num_cpus + self.num_blocked + self.light:
                        return
                    self._spawn_pool_workers()
                spec = (nested or own).popleft()
                if spec.cancelled:
                    continue
                if not self._send_task(spec):
                    return

    def _send_task(self, spec):
        """Send ``spec`` to an idle worker (under ``_sched``); False if it was queued again."""
        args, kwargs = spec.args, spec.kwargs
        if spec.has_refs:
            try:
                args = self._inline(args)
                if kwargs:
                    kwargs = dict(zip(kwargs, self._inline(kwargs.values())))
            except BaseException as err:
                if spec.demand is not None:
                    self.release(spec, False)
                # A failed argument: as in Ray, the task's error, of both classes.
                if isinstance(err, RayError) and not isinstance(err, RayTaskError):
                    err = RayTaskError(spec.name, "", err).as_instanceof_cause()
                self._fail_task(spec, err)
                return True
        w = self.idle.pop()
        fn_id = spec.fn_id
        msg = (TASK, spec.oid, fn_id, None if fn_id in w.shipped else spec.blob, args, kwargs,
               spec.nret, spec.stream, spec.bp, spec.name)
        # Booked before the send: a KeyboardInterrupt right after it (the
        # task may make the driver's Ctrl-C itself) must not leave a worker
        # running a task the scheduler does not know about.
        w.task = spec
        if spec.demand is None:
            self.busy += 1        # a task with a Demand took its share in acquire()
        elif spec.demand.capture:
            self.captured[w.id] = spec.demand.pg
        try:
            self.links[w.id].send(msg)
        except BaseException as exc:
            return self._unsent(spec, w, exc)
        w.shipped.add(fn_id)
        target = self.pending.get(spec.oid)
        if target is not None and type(target) is not list:
            target.peer = w.id     # where the waiting thread looks first
        return True

    def _unsent(self, spec, w, exc):
        """The send of ``spec`` to ``w`` raised ``exc``: undo its booking; False
        if it was queued again (a worker that died under it)."""
        w.task = None
        if spec.demand is None:
            self.busy -= 1
        self.idle.append(w)
        if isinstance(exc, (ConnectionError, OSError, KeyError)):
            if spec.demand is None:
                (self.queue if spec.owner == self.id else self.nested_queue).appendleft(spec)
            return False      # dispatch_placed puts a placed task back itself
        if spec.demand is not None:
            self.release(spec, False)
        if not isinstance(exc, Exception):
            raise exc
        # An argument that cannot be serialised.
        self._fail_task(spec, TypeError(f"could not serialize the arguments of {spec.name}: {exc}"))
        return True

    def _fail_task(self, spec, err):
        if spec.owner != self.id:
            for msg in P.failure_msgs(spec.oid, spec.stream, err):
                self.send(spec.owner, msg)
            return
        if spec.stream:
            self.streams.fail_owned(spec.oid, err)
            return
        target = self.pending.pop(spec.oid, None)
        if type(target) is list:
            for e in target:
                e.set_error(err)
        elif target is not None:
            target.set_error(err)

    def _free_worker(self, w, spec):
        """What the task ``spec`` that ``w`` ran took is free again."""
        if self.captured:
            self.captured.pop(w.id, None)
        if self.child_tasks is not None:
            self.child_tasks.forget(w.id)
        blocked = w.blocked
        if blocked:
            w.blocked = False
            self.num_blocked -= 1
        if spec.demand is None:
            if not blocked:
                self.busy -= 1
        else:
            self.release(spec, blocked)
