"""The driver's Node: the worker pool, the scheduler, actors and names.

``DriverNode`` extends ``Node`` and holds the parts that own their own
state: ``book`` (the compiled pool book: the idle workers, the queues, the
CPUs taken, the common task's per-task steps), ``dispatch`` (pool tasks
submitted, queued, sent and finished), ``resources`` (the ledger of custom
resources, placement demands and what actors hold), ``placement``
(placement groups), ``actor_restarts``, ``owners`` (which process created
which actor), ``retries`` (tasks run again) and ``max_calls`` (workers
retired after their ``max_calls``).  Its message handlers are in
``handlers`` (set below and in ``Node``), its requests in ``requests``.
"""
import collections
import functools
import itertools
import os
import signal
import threading

from ray_lite._fast import shm
from ray_lite._fast.pool_book import PoolBook, PoolWorker
from ray_lite.exceptions import (ActorAlreadyExistsError, ActorDiedError,
                                 TaskCancelledError, WorkerCrashedError)

from ..actors import restarts
from ..actors.actor_owners import ActorOwners, owner_of
from ..actors.restarts import ActorRestarts
from ..links import protocol as P
from ..links.protocol import ActorInfo, PlacedTaskSpec, TaskSpec
from ..links.transport import Link
from ..objects.entries import _Entry, _IMMUTABLE
from ..process import state
from ..process.errors import KILLED, actor_died_message
from ..process.procutil import readable_now
from ..scheduling.cluster import memory_resource
from ..scheduling.placement import PlacementGroups, captured_actor_request, captured_demand
from ..scheduling.scheduler import Resources
from ..scheduling.task_cancel import cancel_task
from ..scheduling.task_dispatch import TaskDispatch
from ..scheduling.task_retries import TaskRetries
from . import introspect
from .node import _OID_SHIFT, Node
from .pool_worker import MaxCalls
from .zygote import ZygoteClient, adopt_early


class DriverNode(Node):
    # The pool book is held (``self.book``), not a base: its per-task steps
    # read their fields on the book itself, at C level either way, and the
    # driver's look-ups through the book's short MRO cost less than through
    # the driver's: about 300 fewer instructions per task than the book as a
    # base (callgrind, 2026-12-05: 21,070 against 21,380 in the driver's
    # main thread per submit_plain + RESULT + get of a ready ref).
    def __init__(self, num_cpus, namespace, resources=None, env_vars=None, job_setup=None):
        pid = os.getpid()
        try:
            # Segments of drivers that were killed before they could unlink them.
            shm.cleanup_stale_segments()
        except OSError:  # never let clean-up of others' leftovers block init
            pass
        super().__init__(0, pid, f"{shm.DEFAULT_PREFIX}{pid}_")
        self.num_cpus = num_cpus
        self.namespace = namespace
        self.env_vars, self.job_setup = env_vars or {}, job_setup or {}   # see JobSetup
        self.pool = {}         # worker id -> PoolWorker
        self.forward = {}      # oid/sid -> owner of a nested task
        # The pool book owns the idle workers, the queues and the CPUs
        # taken; the parts below read and write them there.
        self.book = book = PoolBook()
        book._sched = self._sched = threading.RLock()
        book.idle = []
        book.queue = collections.deque()
        # Tasks that workers and actors submit go first: their submitter is
        # often blocked in get on them, lending its CPU.  Served after the
        # driver's own, a thousand queued f's that each get(g.remote()) would
        # all start (a process each) before the first g ran (Ray schedules
        # each function's tasks fairly for the same reason).
        book.nested_queue = collections.deque()
        book.placed_queue = []     # tasks with a Demand waiting for resources
        book.res_waiters = []      # callables retried when resources are freed
        book.busy = 0          # CPUs of the node taken by running tasks (not blocked)
        book.cpu_cap = num_cpus    # the node's CPUs less what actors and groups hold
        # The node's tables it reads (never rebound), what it sends and books,
        # and what it tells in a result.
        book.links, book.pending, book.inflight = self.links, self.pending, self.inflight
        book.pool, book.forward = self.pool, self.forward
        book.task_op, book.spec_type = P.TASK, TaskSpec
        book.entry_type, book.kept_types = _Entry, _IMMUTABLE
        self.resources = Resources(self, num_cpus,
                                   {"memory": memory_resource(), **(resources or {})})
        self.dispatch = TaskDispatch(self)   # pool tasks submitted, queued, sent, finished
        self.actor_restarts = ActorRestarts(self)   # what restarts each restartable actor
        restarts.install(self)
        self.placement = PlacementGroups(self)   # the placement groups
        self.max_calls = MaxCalls(self)     # pool workers retired after their max_calls
        self.actors = {}       # actor id -> ActorInfo (alive)
        self.owners = ActorOwners(self)     # creator (a worker) -> its actors
        self.named = {}        # (namespace, name) -> ActorInfo
        self.retries = TaskRetries(self)    # tasks run again on retry_exceptions
        self.pids = {0: pid}
        self._ids = itertools.count(1)
        # What the book calls when a task is not the common one: bound once.
        dispatch = self.dispatch
        book.enqueue, book.unsent = dispatch.enqueue, dispatch.unsent
        book.free_worker, book.dispatch_queued = dispatch.free_worker, dispatch.dispatch_queued
        book.used_up, book.resources_freed = self.max_calls.used_up, self.resources.freed
        book.on_result = self._on_result
        # The driver's common task is submitted here (api/remote.py), any
        # other task of this process (a TaskSpec it owns) there.
        self.submit_plain = book.submit_plain
        self.submit_task = dispatch.submit
        self.handlers.update({P.REQUEST: self._on_request, P.RESULT: book._on_pool_result,
                              P.ITEM: self._on_item, P.END: self._on_end,
                              P.ACK: self._on_ack})
        # op -> handler(peer, *args): what ``request`` (here) and a worker's
        # REQUEST message (``_on_request``) run.
        self.requests = {
            P.OP_SUBMIT: self._req_submit, P.OP_BLOCKED: self._req_blocked,
            P.OP_CONNECT: self._req_connect, P.OP_PID_OF: self._req_pid_of,
            P.OP_CREATE_ACTOR: self._req_create_actor,
            P.OP_CREATE_ACTORS: self._req_create_actors,
            P.OP_GET_ACTOR: self._req_get_actor, P.OP_KILL: self._req_kill,
            P.OP_OUT_OF_SCOPE: lambda peer, actor_id: self.end_dropped_actor(actor_id),
            P.OP_CANCEL: self._req_cancel, P.OP_SUBMIT_PLACED: self._req_submit_placed,
            P.OP_ACTOR_PID: self._req_actor_pid,
            P.OP_PG_CREATE: lambda peer, *a: self.placement.create(*a),
            P.OP_PG_REMOVE: lambda peer, pg_id: self.placement.remove(pg_id),
            P.OP_PG_GET: lambda peer, name: self.placement.get(name),
            P.OP_PG_TABLE: lambda peer, pg_id: self.placement.table(pg_id),
            P.OP_RESOURCES: lambda peer: (self.resources.cluster_resources(),
                                          self.resources.available_resources()),
        }
        self.requests.update(introspect.requests(self))
        self.zygote = adopt_early() or ZygoteClient()
        try:
            self._spawn_pool_workers(num_cpus)
        except BaseException:
            self.zygote.stop()
            raise
        # Workers ask the driver for things (objects it owns, nested tasks,
        # actors) while the user's code may be busy elsewhere.
        self.service.start()

    # --------------------------------------------------------------- pool
    def _spawn_spec(self, node_id, kind, link):
        return {"node_id": node_id, "kind": kind, "driver_pid": self.driver_pid,
                "shm_prefix": self.shm_prefix, "env_vars": self.env_vars, **self.job_setup,
                "link_names": link.names, "namespace": self.namespace, "cwd": os.getcwd()}

    def _spawn_pool_workers(self, n=1):
        """``n`` pool workers in one round trip to the zygote (see zygote.WARM_UP_MODULES)."""
        links = []
        try:
            for _ in range(n):
                links.append((next(self._ids), Link.create(self.shm_prefix)))
            pids = self.zygote.spawn_many(
                [(self._spawn_spec(wid, "pool", link), "") for wid, link in links])
        except BaseException:
            for _, link in links:
                link.close()
            raise
        failed = [pid for pid in pids if isinstance(pid, Exception)]
        for (wid, link), pid in zip(links, pids):
            if isinstance(pid, Exception):
                link.close()
                continue
            self.pids[wid] = pid
            w = self.pool[wid] = PoolWorker(wid, pid)
            self.book.idle.append(w)
            self.add_link(wid, link, pid)
        if failed:
            raise failed[0]

    def peer_kind(self, peer):
        return (P.POOL_WORKER if peer in self.pool or peer in self.max_calls.retired
                else P.ACTOR_CALL)

    def _on_result(self, peer, msg):
        if not msg[2] and self.retries.retry_on_error(peer, msg):
            return
        owner = self.forward.pop(msg[1], None) if self.forward else None
        if owner is not None:
            self.send(owner, msg)
        else:
            Node._on_result(self, peer, msg)
        w = self.pool.get(peer)
        if w is not None:           # an actor's result frees no worker
            self.book._task_finished(w, msg[1])

    def _on_item(self, peer, msg):
        retries = self.retries
        if retries.stream_replayed and retries.skip_replayed_item(msg):
            return
        if not msg[3] and retries.retry_stream_on_error(peer, msg):
            return
        owner = self.forward.get(msg[1])
        if owner is not None:
            self.send(owner, msg)
        else:
            self.streams.on_item(peer, msg)

    def _on_end(self, peer, msg):
        retries = self.retries
        if retries.stream_replayed and retries.drop_stale_end(peer, msg):
            return
        owner = self.forward.pop(msg[1], None)
        if owner is not None:
            self.send(owner, msg)
        else:
            self.streams.on_end(peer, msg)
        w = self.pool.get(peer)
        if w is not None:
            self.book._task_finished(w, msg[1])

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
            if peer in self.max_calls.retired:
                return self.max_calls.retired_died(peer)
            w = self.pool.pop(peer, None)
            if w is None:
                self.actors.pop(peer, None)
                for key, info in list(self.named.items()):
                    if info.actor_id == peer:
                        del self.named[key]
                Node._on_peer_died(self, peer)
                self.owners.end_owned(peer)
                if peer in self.actor_restarts:
                    self.actor_restarts.after_actor_died(peer)
                if peer not in self.actors:
                    self.resources.release_actor(peer)
                return
            idle = self.book.idle
            if w in idle:
                idle.remove(w)
            if w.task is not None:
                self.dispatch.free_worker(w, w.task)
            spec = w.task
            Node._on_peer_died(self, peer)
            self.owners.end_owned(peer)
            if spec is not None:
                if spec.cancelled:
                    self.dispatch.fail_task(spec, TaskCancelledError())
                elif spec.retries != 0 and not (spec.stream and spec.oid not in self.streams.owned
                                                and spec.owner == self.id):
                    spec.retries -= 1
                    self.retries.resubmit_later(spec, first=True)
                else:
                    self.forward.pop(spec.oid, None)
                    self.dispatch.fail_task(spec, WorkerCrashedError(
                        f"The worker (pid={w.pid}) running {spec.name} died unexpectedly."))
            self.resources.freed()     # its CPU may be what a task with a Demand waits for

    # ------------------------------------------------------------- actors
    def create_actor(self, *request, await_resources=False):
        info = self.create_actors([request], await_resources)[0]
        if isinstance(info, Exception):
            raise info
        return info

    def create_actors(self, requests, await_resources=False):
        """Create one actor per request (``create_actor``'s arguments), forking
        them all in one round trip to the zygote; a list of ``ActorInfo``, with
        the exception in place of each actor that could not be created.

        ``await_resources``: their resources are taken now; each process waits
        for the word (``START``) before its constructor runs, sent once they
        are free (``start_when_free``), and its calls queue meanwhile."""
        out = [None] * len(requests)
        todo = []           # (index, actor id, link, spawn spec, request)
        ledger = self.resources
        with self._sched:
            try:
                for i, req in enumerate(requests):
                    (cls_blob, class_name, methods, is_async, args, kwargs, max_concurrency,
                     name, namespace, get_if_exists) = req[:10]
                    extra = req[10] if len(req) > 10 else None
                    if name is not None:
                        existing = self._named_alive(namespace, name)
                        if existing is None and any(r[7] == name and r[8] == namespace
                                                    for _, _, _, _, r in todo):
                            # The same name twice in one batch: settle the first.
                            self._spawn_actors(todo, out)
                            todo = []
                            existing = self.named.get((namespace, name))
                        if existing is not None:
                            out[i] = existing if get_if_exists else ActorAlreadyExistsError(
                                f"Actor with name '{name}' already exists in the "
                                f"namespace {namespace}")
                            continue
                    aid = next(self._ids)
                    demand = extra.get("demand") if extra else None
                    try:
                        ledger.check_actor_feasible(demand, f"The actor {class_name}")
                        if not await_resources:
                            if not ledger.actor_fits(demand):
                                raise ValueError(f"The actor {class_name} asks for "
                                                 f"{demand.as_dict()}, which is not free now")
                            ledger.hold_for_actor(aid, demand)
                    except ValueError as err:
                        out[i] = err
                        continue
                    link = Link.create(self.shm_prefix)
                    spec = self._spawn_spec(aid, "actor", link)
                    spec["actor"] = {"cls_blob": cls_blob, "class_name": class_name,
                                     "args": args, "kwargs": kwargs, "is_async": is_async,
                                     "max_concurrency": max_concurrency, "name": name,
                                     "await_resources": await_resources}
                    if extra:
                        spec["env_vars"] = {**self.env_vars, **(extra.get("env_vars") or {})}
                        spec["actor"]["concurrency_groups"] = extra.get("concurrency_groups")
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
        for (i, aid, link, spec, req), pid in zip(todo, pids):
            if isinstance(pid, Exception):
                link.close()
                self.resources.release_actor(aid)
                out[i] = pid
                continue
            _, class_name, methods, is_async, _, _, _, name, namespace, _ = req[:10]
            extra = req[10] if len(req) > 10 else None
            self.pids[aid] = pid
            info = ActorInfo(aid, pid, class_name, methods, is_async, name, namespace)
            if extra:
                groups = extra.get("concurrency_groups")
                info.groups = tuple(groups) if groups else None
                restarts_ = extra.get("max_restarts", 0)
                info.max_task_retries = extra.get("max_task_retries", 0)
                info.restartable = bool(restarts_)
                self.actor_restarts.remember(aid, {k: v for k, v in spec.items()
                                                if k != "link_names"},
                                          class_name, restarts_, info)
            self.actors[aid] = info
            if name is not None:
                self.named[(namespace, name)] = info
            # Its messages are read from here on: registered first, so that
            # an actor looking up its own name in its constructor finds it.
            self.add_link(aid, link, pid)
            out[i] = info
            if spec["actor"]["await_resources"]:
                start = functools.partial(self.resources.start_when_free, aid,
                                          extra["demand"])
                if not start():
                    self.book.res_waiters.append(start)

    def _named_alive(self, namespace, name):
        """The actor named so, unless its process has ended: a name must not
        lead to an actor that died a moment ago, before the loop handled its
        death (another process may have seen it die already: a caller whose
        call failed, looking the name up again).  The death itself is left
        to the loop (the thread driving it); one that restarts keeps its name."""
        info = self.named.get((namespace, name))
        if info is not None and info.actor_id not in self.actor_restarts:
            fds = [fd for fd, p in list(self.sentinels.items()) if p == info.actor_id]
            if fds and readable_now(fds):
                return None
        return info

    def get_actor(self, name, namespace):
        info = self._named_alive(namespace, name)
        if info is None:
            raise ValueError(f"Failed to look up actor with name '{name}'. This could "
                             f"because 1. You are trying to look up a named actor you didn't "
                             f"create. 2. The named actor died. 3. You did not use a namespace "
                             f"matching the namespace of the actor.")
        return info

    def kill_actor(self, aid, no_restart=True, cause=KILLED):
        """SIGKILL actor ``aid``; its calls then fail saying ``cause``."""
        if no_restart:
            with self._sched:
                self.actor_restarts.forbid(aid)
        pid = self.pids.get(aid)
        info = self.actors.get(aid)
        if pid is not None and info is not None:
            self.death_causes[aid] = actor_died_message(info, cause)
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

    def _on_request(self, peer, msg):
        _, req, op, args = msg
        try:
            result = self._request_handler(op)(peer, *args)
            ok = True
        except Exception as exc:
            ok, result = False, exc
        if req:
            self.send(peer, P.reply_msg(req, ok, result))

    def submit_task_placed(self, demand, retry_on, max_calls, *fields):
        """Schedule a task of this process that has a Demand, a retry policy or max_calls."""
        self.submit_task(PlacedTaskSpec(demand, retry_on, max_calls, *fields, owner=0))

    def _req_submit_placed(self, peer, demand, retry_on, max_calls, *fields):
        captured = self.resources.captured
        if captured:
            demand = captured_demand(captured, peer, demand, "task")
        spec = PlacedTaskSpec(demand, retry_on, max_calls, *fields, owner=peer)
        self.forward[spec.oid] = peer
        if demand is not None:
            try:
                with self._sched:
                    self.resources.check_feasible(demand, spec.name)
            except ValueError as err:
                self.forward.pop(spec.oid, None)
                self.dispatch.fail_task(spec, err)
                return
        self.submit_task(spec)

    def _req_submit(self, peer, *fields):
        captured = self.resources.captured
        if captured and peer in captured:
            return self._req_submit_placed(peer, None, None, 0, *fields)
        spec = TaskSpec(*fields, owner=peer)
        if peer != self.id:
            self.forward[spec.oid] = peer      # its results go back to that worker
        self.submit_task(spec)

    def _req_blocked(self, peer, blocked):
        with self._sched:
            w = self.pool.get(peer)
            if w is not None and w.task is not None:
                self.dispatch.set_blocked(w, blocked)

    def _req_connect(self, peer, target, names):
        if target in self.links:
            self.send(target, P.attach_msg(peer, self.pids.get(peer), names))
        elif target in self.actor_restarts:
            # Being restarted (its spawn drives the links meanwhile): the new
            # process gets the link once it is there, or the caller would
            # send into a link nobody reads.
            self.actor_restarts.attach_later.setdefault(target, []).append((peer, names))

    def _req_pid_of(self, peer, actor_id):
        return self.pids.get(actor_id)

    def _req_create_actor(self, peer, *request):
        ledger = self.resources
        if ledger.captured and peer in ledger.captured:
            request = captured_actor_request(ledger.captured, peer, request)
        demand = request[10].get("demand") if len(request) > 10 and request[10] else None
        if demand is not None:
            with self._sched:
                ledger.check_actor_feasible(demand, f"The actor {request[1]}")
                fits = ledger.actor_fits(demand)
            if not fits:
                # Its resources are taken now: as in Ray, the handle comes at
                # once and the actor starts when they are free.
                return self.owners.owned_by(owner_of(peer, request),
                                     self.create_actor(*request, await_resources=True))
        return self.owners.owned_by(owner_of(peer, request), self.create_actor(*request))

    def _req_create_actors(self, peer, requests):
        captured = self.resources.captured
        if captured and peer in captured:
            requests = [captured_actor_request(captured, peer, r) for r in requests]
        return [self.owners.owned_by(owner_of(peer, r), info)
                for r, info in zip(requests, self.create_actors(requests))]

    def _req_get_actor(self, peer, name, namespace):
        return self.get_actor(name, namespace)

    def _req_kill(self, peer, actor_id, no_restart=True):
        self.kill_actor(actor_id, no_restart)

    def _req_actor_pid(self, peer, aid):
        """The pid of actor ``aid`` if it lives, else None."""
        return self.pids.get(aid) if aid in self.actors else None

    def _req_cancel(self, peer, oid, force, recursive=True):
        if cancel_task(self, oid, force, recursive):
            return True
        # Not a pool task: a call to an actor that another process made
        # (the oid says which) and ``peer`` borrowed its ref; its owner
        # cancels it, as Ray passes such a cancel on to the owner.
        owner = oid >> _OID_SHIFT
        if owner == 0:
            return self.cancel_own_call(oid)
        if owner != peer:
            return self.send(owner, P.cancel_owned_msg(oid))
        return False

    # ----------------------------------------------------------- shutdown
    def shutdown(self):
        self.service.stop()
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
            self.bridges.close()
            self.close_relink_fd()
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
