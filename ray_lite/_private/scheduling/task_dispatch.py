"""The driver's pool tasks: ``TaskDispatch``, a part of the driver's node
(``driver.dispatch``).  ``submit`` sends a task to an idle pool worker or
queues it, and a worker's result (``PoolBook._task_finished``) frees it for
the next.  Everything here runs under the driver's ``_sched`` lock.

The driver's common task (plain arguments, one return, no Demand) takes a
shorter way, per call: ``submit_plain`` and ``_task_finished`` are in
``_fast/pool_book`` (compiled, with its pure-Python twin).  The book owns the
counters and queues it reads on every task (``idle``, ``queue``,
``nested_queue``, ``busy``, ``cpu_cap``); this part reads and writes them
there, and the book calls ``enqueue``, ``unsent``, ``free_worker`` and
``dispatch_queued`` through bound methods it was given once."""
from ray_lite.exceptions import RayError, RayTaskError

from ..links import protocol as P
from ..links.protocol import TASK
from ..objects.refs import ObjectRef, travels_as_value
from .task_cancel import ChildTasks


class TaskDispatch:
    """Submitting, queueing, sending and finishing the driver's pool tasks.

    Owns the tasks waiting for their ref arguments (``waiting_deps``), the
    count of pool workers lending their CPU while blocked in get
    (``num_blocked``) and the pool tasks each running task submitted
    (``child_tasks``, for a recursive cancel)."""

    def __init__(self, driver):
        self.driver = driver
        self.book = driver.book        # the idle workers, the queues, busy, cpu_cap
        self.waiting_deps = {}         # oid -> TaskSpec waiting for its ref arguments
        self.num_blocked = 0           # pool workers lending their CPU while blocked in get
        self.child_tasks = None        # ChildTasks, from the first task a pool task submits

    def submit(self, spec):
        d, book = self.driver, self.book
        sched = d._sched
        sched.acquire()     # not ``with``: half the cost (B11); driver only, where a
                            # Ctrl-C in runtime code is deferred (interrupts.py)
        try:
            if spec.owner != d.id:
                w = d.pool.get(spec.owner)
                if w is not None:       # a pool task's child: a recursive cancel reaches it
                    self._note_child(w, spec.oid)
            deps = None
            if spec.has_refs:
                has_refs = False
                for a in spec.args:
                    if type(a) is ObjectRef:
                        has_refs = True
                        if not a._e.ready and a._owner == d.id:
                            deps = [a] if deps is None else deps + [a]
                if spec.kwargs:
                    for a in spec.kwargs.values():
                        if type(a) is ObjectRef:
                            has_refs = True
                            if not a._e.ready and a._owner == d.id:
                                deps = [a] if deps is None else deps + [a]
                spec.has_refs = has_refs
            if deps:
                spec.deps_left = len(deps)
                self.waiting_deps[spec.oid] = spec
                for d_ in deps:
                    d_._e.add_callback(lambda _e, spec=spec: self._dep_ready(spec))
            elif spec.demand is None and not book.queue and not book.nested_queue and \
                    book.idle and \
                    book.busy + 1 <= book.cpu_cap:
                self.send_task(spec)      # the common case: straight to an idle worker
            else:
                self.enqueue(spec)
        finally:
            sched.release()

    def _note_child(self, w, oid):
        children = self.child_tasks
        if children is None:
            children = self.child_tasks = ChildTasks()
        children.note(w, oid, self.driver.forward.__contains__)

    def enqueue(self, spec, first=False):
        """Queue ``spec`` (at the head with ``first``) and start what fits."""
        d = self.driver
        if spec.demand is None:
            if not d.num_cpus:
                # init(num_cpus=0): a task that asks for a CPU could never run
                # (Ray leaves it pending for ever; here get says why).
                self.fail_task(spec, ValueError(
                    f"{spec.name} asks for {{'CPU': 1}} but this machine has no CPU for "
                    f"tasks (init(num_cpus=0)): give the task num_cpus=0, or init more"))
                return
            book = self.book
            queue = book.queue if spec.owner == d.id else book.nested_queue
            if first:
                queue.appendleft(spec)
            else:
                queue.append(spec)
            self.dispatch_queued()
        else:
            resources = d.resources
            resources.enqueue_placed(spec)
            resources.dispatch_placed()

    def _dep_ready(self, spec):
        with self.driver._sched:
            spec.deps_left -= 1
            if spec.deps_left == 0 and self.waiting_deps.pop(spec.oid, None) is not None:
                self.enqueue(spec)

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

    def dispatch_queued(self):
        """Send the queued tasks without a Demand while CPUs and workers allow."""
        d, book = self.driver, self.book
        with d._sched:
            nested, own = book.nested_queue, book.queue
            while nested or own:
                if book.busy + 1 > book.cpu_cap:
                    return
                if not book.idle:
                    if len(d.pool) >= d.num_cpus + self.num_blocked + d.resources.light:
                        return
                    d._spawn_pool_workers()
                spec = (nested or own).popleft()
                if spec.cancelled:
                    continue
                if not self.send_task(spec):
                    return

    def send_task(self, spec):
        """Send ``spec`` to an idle worker (under ``_sched``); False if it was queued again."""
        d, book = self.driver, self.book
        args, kwargs = spec.args, spec.kwargs
        if spec.has_refs:
            try:
                args = self._inline(args)
                if kwargs:
                    kwargs = dict(zip(kwargs, self._inline(kwargs.values())))
            except BaseException as err:
                if spec.demand is not None:
                    d.resources.release(spec, False)
                # A failed argument: as in Ray, the task's error, of both classes.
                if isinstance(err, RayError) and not isinstance(err, RayTaskError):
                    err = RayTaskError(spec.name, "", err).as_instanceof_cause()
                self.fail_task(spec, err)
                return True
        w = book.idle.pop()
        fn_id = spec.fn_id
        msg = (TASK, spec.oid, fn_id, None if fn_id in w.shipped else spec.blob, args, kwargs,
               spec.nret, spec.stream, spec.bp, spec.name)
        # Booked before the send: a KeyboardInterrupt right after it (the
        # task may make the driver's Ctrl-C itself) must not leave a worker
        # running a task the scheduler does not know about.
        w.task = spec
        if spec.demand is None:
            book.busy += 1        # a task with a Demand took its share in acquire()
        elif spec.demand.capture:
            d.resources.captured[w.id] = spec.demand.pg
        try:
            d.links[w.id].send(msg)
        except BaseException as exc:
            return self.unsent(spec, w, exc)
        w.shipped.add(fn_id)
        target = d.pending.get(spec.oid)
        if target is not None and type(target) is not list:
            target.peer = w.id     # where the waiting thread looks first
        return True

    def unsent(self, spec, w, exc):
        """The send of ``spec`` to ``w`` raised ``exc``: undo its booking; False
        if it was queued again (a worker that died under it)."""
        d, book = self.driver, self.book
        w.task = None
        if spec.demand is None:
            book.busy -= 1
        book.idle.append(w)
        if isinstance(exc, (ConnectionError, OSError, KeyError)):
            if spec.demand is None:
                (book.queue if spec.owner == d.id else book.nested_queue).appendleft(spec)
            return False      # dispatch_placed puts a placed task back itself
        if spec.demand is not None:
            d.resources.release(spec, False)
        if not isinstance(exc, Exception):
            raise exc
        # An argument that cannot be serialised.
        self.fail_task(spec, TypeError(f"could not serialize the arguments of {spec.name}: {exc}"))
        return True

    def fail_task(self, spec, err):
        """The caller of ``spec`` gets ``err`` (a worker's through its link)."""
        d = self.driver
        if spec.owner != d.id:
            for msg in P.failure_msgs(spec.oid, spec.stream, err):
                d.send(spec.owner, msg)
            return
        if spec.stream:
            d.streams.fail_owned(spec.oid, err)
            return
        target = d.pending.pop(spec.oid, None)
        if type(target) is list:
            for e in target:
                e.set_error(err)
        elif target is not None:
            target.set_error(err)

    def free_worker(self, w, spec):
        """What the task ``spec`` that ``w`` ran took is free again."""
        d = self.driver
        captured = d.resources.captured
        if captured:
            captured.pop(w.id, None)
        if self.child_tasks is not None:
            self.child_tasks.forget(w.id)
        blocked = w.blocked
        if blocked:
            w.blocked = False
            self.num_blocked -= 1
        if spec.demand is None:
            if not blocked:
                self.book.busy -= 1
        else:
            d.resources.release(spec, blocked)

    def set_blocked(self, w, blocked):
        """Pool worker ``w`` (running a task) blocks in get, lending its CPUs,
        or takes them back (under ``_sched``)."""
        if w.blocked == blocked:
            return
        book = self.book
        w.blocked = blocked
        self.num_blocked += 1 if blocked else -1
        if w.task.demand is None:
            book.busy += -1 if blocked else 1
        else:
            cpus = self.driver.resources.node_cpus(w.task)
            book.busy = round(book.busy + (-cpus if blocked else cpus), 4)
        self.driver.resources.freed()
