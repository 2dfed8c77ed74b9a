"""The driver's Node: the worker pool, the scheduler, actors and names."""
import collections
import itertools
import os
import signal
import threading

from ray_lite._fast import shm
from ray_lite.exceptions import ActorDiedError, TaskCancelledError, WorkerCrashedError

from . import protocol as P
from . import state
from .node import Node
from .procutil import CANCEL_SIGNAL
from .protocol import TASK, ActorInfo, TaskSpec
from .refs import ObjectRef, travels_as_value
from .transport import Link
from .zygote import ZygoteClient


class _PoolWorker:
    __slots__ = ("id", "pid", "shipped", "task", "blocked")

    def __init__(self, wid, pid):
        self.id = wid
        self.pid = pid
        self.shipped = set()
        self.task = None
        self.blocked = False


class DriverNode(Node):
    def __init__(self, num_cpus, namespace):
        pid = os.getpid()
        try:
            # Segments of drivers that were killed before they could unlink them.
            shm.cleanup_stale_segments()
        except OSError:  # never let clean-up of others' leftovers block init
            pass
        super().__init__(0, pid, f"{shm.DEFAULT_PREFIX}{pid}_")
        self.num_cpus = num_cpus
        self.namespace = namespace
        self.pool = {}
        self.idle = []
        self.queue = collections.deque()
        self.waiting_deps = {}
        self.num_blocked = 0   # pool workers lending their CPU while blocked in get
        self.busy = 0          # pool workers running a task and not blocked
        self.actors = {}       # actor id -> ActorInfo (alive)
        self.named = {}        # (namespace, name) -> ActorInfo
        self.forward = {}      # oid/sid -> owner of a nested task
        self.pids = {0: pid}
        self._ids = itertools.count(1)
        self._sched = threading.RLock()
        self.handlers.update({P.REQUEST: self._on_request, P.ACK: self._on_ack})
        # op -> handler(peer, *args): what ``request`` (here) and a worker's
        # REQUEST message (``_on_request``) run.
        self.requests = {
            P.OP_SUBMIT: self._req_submit, P.OP_BLOCKED: self._req_blocked,
            P.OP_CONNECT: self._req_connect, P.OP_PID_OF: self._req_pid_of,
            P.OP_CREATE_ACTOR: self._req_create_actor,
            P.OP_CREATE_ACTORS: self._req_create_actors,
            P.OP_GET_ACTOR: self._req_get_actor, P.OP_KILL: self._req_kill,
            P.OP_CANCEL: self._req_cancel,
        }
        self.zygote = ZygoteClient()
        try:
            for _ in range(num_cpus):
                self._spawn_pool_worker()
        except BaseException:
            self.zygote.stop()
            raise
        # Workers ask the driver for things (objects it owns, nested tasks,
        # actors) while the user's code may be busy elsewhere.
        self.start_service()

    # --------------------------------------------------------------- pool
    def _spawn_spec(self, node_id, kind, link):
        return {"node_id": node_id, "kind": kind, "driver_pid": self.driver_pid,
                "shm_prefix": self.shm_prefix,
                "link_names": link.names, "namespace": self.namespace, "cwd": os.getcwd()}

    def _spawn_pool_worker(self):
        wid = next(self._ids)
        link = Link.create(self.shm_prefix)
        try:
            pid = self.zygote.spawn(self._spawn_spec(wid, "pool", link))
        except BaseException:
            link.close()
            raise
        self.pids[wid] = pid
        w = _PoolWorker(wid, pid)
        self.pool[wid] = w
        self.idle.append(w)
        self.add_link(wid, link, pid)
        return w

    def peer_kind(self, peer):
        return P.POOL_WORKER if peer in self.pool else P.ACTOR_CALL

    def submit(self, spec):
        with self._sched:
            deps = None
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
            elif not self.queue and self.idle and self.busy < self.num_cpus:
                self._send_task(spec)     # the common case: straight to an idle worker
            else:
                self.queue.append(spec)
                self._dispatch()

    def _dep_ready(self, spec):
        with self._sched:
            spec.deps_left -= 1
            if spec.deps_left == 0 and self.waiting_deps.pop(spec.oid, None) is not None:
                self.queue.append(spec)
                self._dispatch()

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
            queue = self.queue
            while queue:
                if self.busy >= self.num_cpus:
                    return
                if not self.idle:
                    if len(self.pool) >= self.num_cpus + self.num_blocked:
                        return
                    self._spawn_pool_worker()
                spec = queue.popleft()
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
        self.busy += 1
        try:
            self.links[w.id].send(msg)
        except BaseException as exc:
            w.task = None
            self.busy -= 1
            self.idle.append(w)
            if isinstance(exc, (ConnectionError, OSError, KeyError)):
                self.queue.appendleft(spec)
                return False
            if not isinstance(exc, Exception):
                raise
            # An argument that cannot be serialised.
            self._fail_task(spec, TypeError(
                f"could not serialize the arguments of {spec.name}: {exc}"))
            return True
        w.shipped.add(fn_id)
        target = self.pending.get(spec.oid)
        if target is not None and type(target) is not list:
            target.peer = w.id     # where the waiting thread looks first
        return True

    def _fail_task(self, spec, err):
        if spec.owner != self.id:
            for msg in P.failure_msgs(spec.oid, spec.stream, err):
                self.send(spec.owner, msg)
            return
        if spec.stream:
            s = self.streams.get(spec.oid)
            if s is not None:
                self.fail_stream(s, err)
            return
        target = self.pending.pop(spec.oid, None)
        if type(target) is list:
            for e in target:
                e.set_error(err)
        elif target is not None:
            target.set_error(err)

    def _task_finished(self, peer, oid):
        w = self.pool.get(peer)
        if w is not None and w.task is not None and w.task.oid == oid:
            with self._sched:
                if w.task is None or w.task.oid != oid:
                    return
                if w.blocked:
                    w.blocked = False
                    self.num_blocked -= 1
                else:
                    self.busy -= 1
                w.task = None
                self.idle.append(w)
                if self.queue:
                    self._dispatch()

    def _on_result(self, peer, msg):
        owner = self.forward.pop(msg[1], None)
        if owner is not None:
            self.send(owner, msg)
        else:
            Node._on_result(self, peer, msg)
        self._task_finished(peer, msg[1])

    def _on_item(self, peer, msg):
        owner = self.forward.get(msg[1])
        if owner is not None:
            self.send(owner, msg)
        else:
            Node._on_item(self, peer, msg)

    def _on_end(self, peer, msg):
        owner = self.forward.pop(msg[1], None)
        if owner is not None:
            self.send(owner, msg)
        else:
            Node._on_end(self, peer, msg)
        self._task_finished(peer, msg[1])

    def _on_ack(self, peer, msg):
        # Back-pressure acks of a nested task's stream reach us (the items
        # were forwarded through us): pass them to the worker producing it.
        if msg[1] in self.forward:
            for w in self.pool.values():
                if w.task is not None and w.task.oid == msg[1]:
                    self.send(w.id, msg)
                    return

    def _on_peer_died(self, peer):
        with self._sched:
            w = self.pool.pop(peer, None)
            if w is None:
                self.actors.pop(peer, None)
                for key, info in list(self.named.items()):
                    if info.actor_id == peer:
                        del self.named[key]
                return Node._on_peer_died(self, peer)
            if w in self.idle:
                self.idle.remove(w)
            if w.task is not None:
                if w.blocked:
                    self.num_blocked -= 1
                else:
                    self.busy -= 1
            spec = w.task
            Node._on_peer_died(self, peer)
            if spec is not None:
                if spec.cancelled:
                    self._fail_task(spec, TaskCancelledError())
                elif spec.retries != 0 and not (spec.stream and spec.oid not in self.streams
                                                and spec.owner == self.id):
                    spec.retries -= 1
                    self.queue.appendleft(spec)
                else:
                    self.forward.pop(spec.oid, None)
                    self._fail_task(spec, WorkerCrashedError(
                        f"The worker (pid={w.pid}) running {spec.name} died unexpectedly."))
            self._dispatch()

    def cancel_task(self, oid, force):
        """Cancel a pool task this driver scheduled; True if it was found."""
        with self._sched:
            for spec in self.queue:
                if spec.oid == oid:
                    spec.cancelled = True
                    self._fail_task(spec, TaskCancelledError())
                    return True
            spec = self.waiting_deps.pop(oid, None)
            if spec is not None:
                spec.cancelled = True
                self._fail_task(spec, TaskCancelledError())
                return True
            for w in self.pool.values():
                if w.task is not None and w.task.oid == oid:
                    w.task.cancelled = True
                    if force:
                        try:
                            os.kill(w.pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                    else:
                        # The message says which task; the signal interrupts
                        # it (a KeyboardInterrupt in the task, as in Ray) if
                        # it is still that one when the worker looks.
                        self.send(w.id, P.cancel_msg(oid, False))
                        try:
                            os.kill(w.pid, CANCEL_SIGNAL)
                        except ProcessLookupError:
                            pass
                        self._fail_task(w.task, TaskCancelledError())
                    return True
        return False

    # ------------------------------------------------------------- actors
    def create_actor(self, cls_blob, class_name, methods, is_async, args, kwargs,
                     max_concurrency, name, namespace, get_if_exists):
        info = self.create_actors([(cls_blob, class_name, methods, is_async, args, kwargs,
                                    max_concurrency, name, namespace, get_if_exists)])[0]
        if isinstance(info, Exception):
            raise info
        return info

    def create_actors(self, requests):
        """Create one actor per request (``create_actor``'s arguments), forking
        them all in one round trip to the zygote; a list of ``ActorInfo``, with
        the exception in place of each actor that could not be created."""
        out = [None] * len(requests)
        todo = []           # (index, actor id, link, spawn spec, request)
        with self._sched:
            try:
                for i, req in enumerate(requests):
                    (cls_blob, class_name, methods, is_async, args, kwargs, max_concurrency,
                     name, namespace, get_if_exists) = req
                    if name is not None:
                        existing = self.named.get((namespace, name))
                        if existing is None and any(r[7] == name and r[8] == namespace
                                                    for _, _, _, _, r in todo):
                            # The same name twice in one batch: settle the first.
                            self._spawn_actors(todo, out)
                            todo = []
                            existing = self.named.get((namespace, name))
                        if existing is not None:
                            out[i] = existing if get_if_exists else ValueError(
                                f"Actor with name '{name}' already exists in the "
                                f"namespace {namespace}")
                            continue
                    aid = next(self._ids)
                    link = Link.create(self.shm_prefix)
                    spec = self._spawn_spec(aid, "actor", link)
                    spec["actor"] = {"cls_blob": cls_blob, "class_name": class_name,
                                     "args": args, "kwargs": kwargs, "is_async": is_async,
                                     "max_concurrency": max_concurrency}
                    todo.append((i, aid, link, spec, req))
            except BaseException:
                for _, _, link, _, _ in todo:
                    link.close()
                raise
            self._spawn_actors(todo, out)
        return out

    def _spawn_actors(self, todo, out):
        try:
            pids = self.zygote.spawn_many([(spec, req[1]) for _, _, _, spec, req in todo])
        except BaseException:
            for _, _, link, _, _ in todo:
                link.close()
            raise
        for (i, aid, link, _, req), pid in zip(todo, pids):
            if isinstance(pid, Exception):
                link.close()
                out[i] = pid
                continue
            _, class_name, methods, is_async, _, _, _, name, namespace, _ = req
            self.pids[aid] = pid
            info = ActorInfo(aid, pid, class_name, methods, is_async, name, namespace)
            self.actors[aid] = info
            if name is not None:
                self.named[(namespace, name)] = info
            # Its messages are read from here on: registered first, so that
            # an actor looking up its own name in its constructor finds it.
            self.add_link(aid, link, pid)
            out[i] = info

    def get_actor(self, name, namespace):
        info = self.named.get((namespace, name))
        if info is None:
            raise ValueError(f"Failed to look up actor with name '{name}'. This could "
                             f"because 1. You are trying to look up a named actor you didn't "
                             f"create. 2. The named actor died. 3. You did not use a namespace "
                             f"matching the namespace of the actor.")
        return info

    def kill_actor(self, aid):
        pid = self.pids.get(aid)
        if pid is not None and aid in self.actors:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def connect(self, peer):
        return peer in self.links

    # ----------------------------------------------------------- requests
    def request(self, op, *args):
        return self._request_handler(op)(0, *args)

    def _request_handler(self, op):
        handler = self.requests.get(op)
        if handler is None:
            raise ValueError(f"unknown request {op!r}")
        return handler

    def submit_task(self, oid, fn_id, blob, args, kwargs, nret, stream, bp, retries, name):
        """Schedule a task of this process (``TaskSpec``'s fields but the owner)."""
        self.submit(TaskSpec(oid, fn_id, blob, args, kwargs, nret, stream, bp, retries, name, 0))

    def _on_request(self, peer, msg):
        _, req, op, args = msg
        try:
            result = self._request_handler(op)(peer, *args)
            ok = True
        except Exception as exc:
            ok, result = False, exc
        if req:
            self.send(peer, P.reply_msg(req, ok, result))

    def _req_submit(self, peer, *fields):
        spec = TaskSpec(*fields, owner=peer)
        if peer != self.id:
            self.forward[spec.oid] = peer      # its results go back to that worker
        self.submit(spec)

    def _req_blocked(self, peer, blocked):
        with self._sched:
            w = self.pool.get(peer)
            if w is not None and w.task is not None and w.blocked != blocked:
                w.blocked = blocked
                self.num_blocked += 1 if blocked else -1
                self.busy += -1 if blocked else 1
                self._dispatch()

    def _req_connect(self, peer, target, names):
        if target in self.links:
            self.send(target, P.attach_msg(peer, self.pids.get(peer), names))

    def _req_pid_of(self, peer, actor_id):
        return self.pids.get(actor_id)

    def _req_create_actor(self, peer, *request):
        return self.create_actor(*request)

    def _req_create_actors(self, peer, requests):
        return self.create_actors(requests)

    def _req_get_actor(self, peer, name, namespace):
        return self.get_actor(name, namespace)

    def _req_kill(self, peer, actor_id):
        self.kill_actor(actor_id)

    def _req_cancel(self, peer, oid, force):
        return self.cancel_task(oid, force)

    # ----------------------------------------------------------- shutdown
    def shutdown(self):
        self.stop_service()
        self.closed = True
        for peer in list(self.links):
            self.send(peer, P.exit_msg())
        try:
            self.zygote.stop()
        finally:
            for peer in list(self.links):
                self.remove_peer(peer)
            for fd in list(self.sentinels):
                try:
                    os.close(fd)
                except OSError:
                    pass
            self.sentinels.clear()
            self.close_bridges()
            try:
                for name in shm.list_segments(self.shm_prefix):
                    shm.unlink_segment(name)
            except Exception:
                pass
            err = ActorDiedError("ray_lite was shut down")
            for target in list(self.pending.values()):
                for e in (target if type(target) is list else [target]):
                    e.set_error(err)
            self.pending.clear()
            if state.node is self:
                state.node = None
