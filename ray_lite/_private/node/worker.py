"""Worker processes: pool workers run tasks, actor processes host one actor."""
import collections
import itertools
import os
import signal
import sys
import threading
from types import FunctionType

from ray_lite._fast.task_runner import TaskRunner
from ray_lite._lazy import lazy_module
from ray_lite.exceptions import (ActorDiedError, AsyncioActorExit, RayError, RayTaskError,
                                 RuntimeEnvSetupError, TaskCancelledError)

from ..actors import concurrency_groups, restarts
from ..actors.actor_exit import begin_exit, run_exit_handlers
from ..actors.aio import AsyncSlots, new_event_loop
from ..actors.async_actor import AsyncActor
from ..actors.held_calls import HeldCalls
from ..actors.method_lookup import UNSET, class_function, method_table
from ..job.runtime_env import process_runtime_env
from ..links import protocol as P
from ..links.drive import DrivingMixin
from ..links.transport import Link, LinkClosed
from ..objects.refs import _NEVER_STORED, ObjectRef, raisable, stored_result
from ..objects.returns import split_returns
from ..objects.shipping import unship
from ..process import state
from ..process.errors import (ActorExit, make_task_error, running_task_cancelled, sendable_error,
                              unpicklable_task_error)
from ..process.interrupts import in_runtime_section, resend_later
from ..process.procutil import CANCEL_SIGNAL
from . import timeline
from .node import _OID_SHIFT, Node
from .worker_streams import Generators

asyncio = lazy_module("asyncio", globals())
inspect = lazy_module("inspect", globals())
traceback = lazy_module("traceback", globals())

# Set by the zygote in a worker it forked (``zygote.relabel_from_repr``): an
# actor's ``__repr__`` then prefixes its output.  The zygote imports this
# module, not the other way round.
relabel_from_repr = None

_ACTOR_EXITS = (SystemExit, AsyncioActorExit)     # SystemExit: ActorExit included


def _inside_drive(frame):
    """Whether ``frame`` (where a signal interrupted the main thread) is in
    a section that holds the drive lock: a wait or a drain, which look for a
    cancel on their way out (``DrivingMixin``), or the cancel handler itself."""
    while frame is not None:
        if frame.f_code in _DRIVE_CODE:
            return True
        frame = frame.f_back
    return False


class WorkerNode(TaskRunner, Node):
    """The node of a pool worker or an actor process.  Its parts (see
    docs/architecture.md): ``held_calls`` (a sync actor's calls waiting for
    a ref argument), ``generators`` (the streams it produces) and
    ``async_actor`` (an async actor's calls); the task runner, its first
    base, is compiled."""

    def __init__(self, spec):
        super().__init__(spec["node_id"], spec["driver_pid"], spec["shm_prefix"])
        self.kind = spec["kind"]
        # The names the task runner needs (it imports nothing of _private).
        self.ref_type, self.result_op = ObjectRef, P.RESULT
        self.never_stored, self.store_result = _NEVER_STORED, stored_result
        self.lends_slot = self.kind == "pool"     # block_begin/block_end act
        self.namespace = spec.get("namespace")
        self.tasks = collections.deque()
        self.functions = {}
        self.cancelled = set()     # live oids whose cancel arrived
        self.live = set()          # oids of calls received and not finished
        self.current_oid = None    # the pool task running on the main thread,
        self.current_fn = self.current_name = None      # its function and name
        self.task_oids_from = None  # the oids of the calls it makes are these on
        self._in_user_code = False
        self._interrupted = False
        self._task_thread = threading.get_ident()
        self._names = {}           # method -> "Class.method"
        self._class_methods = method_table()    # method -> the class's function, or None
        self._bound_methods = {}   # method -> its function bound to the actor (the common call)
        self.exiting = False
        self.known_pids = {0: spec["driver_pid"]}
        self.blocked_depth = 0
        self.current_thread_busy = False
        self.actor = None
        self.actor_name = None
        self.actor_init_error = None   # or why it exited: every call is refused with it
        self.setup_error = None        # why the job's setup hook failed here (text)
        self.runtime_env = process_runtime_env(spec)    # (see get_runtime_env_string)
        self.loop = None
        self.loop_done = None   # resolved to end an async actor's loop (worker_main)
        self.executor = None
        # Reentrant: connect() on a full ring drains, which may run _on_attach.
        self._connect_lock = threading.RLock()
        self.held_calls = HeldCalls(self)       # calls waiting for a ref argument
        # Its table, also on the node: ``_on_method`` looks at it on every
        # call of a sync actor (B11).  ``self.held_calls.by_peer`` there
        # costs 26.9 ns against 26.5 with the compiled runner, 13.2 against
        # 10.8 with its Python twin (2026-12-05, 2-core Xeon VM, best of 31
        # runs of 5 million looks).
        self._held = self.held_calls.by_peer
        self.generators = Generators(self)      # the streams this process produces
        self.async_actor = AsyncActor(self)     # an async actor's calls (its start sets them up)
        # METHOD: a sync actor's here; a threaded actor's, an async actor's
        # and concurrency groups' replace it when the actor starts.
        self.handlers.update({P.TASK: self._on_task, P.METHOD: self._on_method,
                              P.CANCEL: self._on_cancel, P.EXIT: self._on_exit,
                              P.CANCEL_CALLS_OF: self._on_cancel_calls_of,
                              P.CANCEL_OWNED: lambda peer, msg: self.cancel_own_call(msg[1]),
                              P.ACK: self.generators.on_ack})
        self.add_link(0, Link.attach(spec["link_names"]), spec["driver_pid"])

    # ----------------------------------------------------------- plumbing
    def peer_kind(self, peer):
        return P.POOL_WORKER if peer == 0 else P.ACTOR_CALL

    def on_peer_died(self, peer, kind):
        if peer == 0:  # the driver is gone: nothing left to do for anyone
            os._exit(0)

    def connect(self, peer):
        if peer in self.links:
            return True
        if peer in self.dead_peers:
            return False
        # Two threads of a threaded actor calling the same peer at once must
        # not each make a link: the second would replace (and close) the first.
        with self._connect_lock:
            if peer in self.links:
                return True
            if peer == self.id:
                # An actor calling itself (``current_actor``, a handle to
                # itself): its calls queue behind the running one, as Ray's
                # do.  Through the driver, the link's two ends would both be
                # this process's link to ``peer``, the second replacing the
                # first: the call and its answer were lost.
                self.add_link(peer, Link.loopback(self.shm_prefix), None)
                return True
            pid = self.known_pids.get(peer)
            link = Link.create(self.shm_prefix)
            self.add_link(peer, link, pid)
            if peer in self.dead_peers:
                return False
            self.notify(P.OP_CONNECT, peer, link.names)
            return True

    def _on_attach(self, peer, msg):
        _, requester, pid, names = msg
        self.known_pids[requester] = pid
        try:
            link = Link.attach(names)
        except LinkClosed:   # the requester closed it meanwhile (it died, or let go of us)
            return
        # Under the lock ``connect`` takes: another thread of ours may be
        # making a link to the same peer right now.
        with self._connect_lock:
            if requester in self.links and requester != self.id and \
                    self.peer_pids.get(requester) in (None, pid):
                # It called us first while we called it first: we both made
                # a link.  Replacing ours would lose what we sent on it; each
                # side keeps sending on its own and reads the other's.
                self.add_reading_link(requester, link)
                return
            self.add_link(requester, link, pid)

    def request(self, op, *args):
        """A request to the driver, answered; drives the links while waiting."""
        req = next(self._rpc_seq)
        if not self.send(0, P.request_msg(req, op, args)):
            raise RuntimeError("the driver is gone")
        self.wait_until(lambda: req in self.rpc_replies)
        ok, payload = self.rpc_replies.pop(req)
        if not ok:
            raise payload
        return payload

    def notify(self, op, *args):
        """A request to the driver that needs no answer."""
        self.send(0, P.request_msg(0, op, args))

    def submit_task(self, spec):
        """A nested task (a ``TaskSpec``), scheduled by the driver; its results
        come back through it."""
        self.send(0, (P.REQUEST, 0, P.OP_SUBMIT, spec.wire_fields()))

    def submit_task_placed(self, demand, retry_on, max_calls, *fields):
        """A nested task with a Demand, a retry policy or max_calls (see ``submit_task``)."""
        self.send(0, (P.REQUEST, 0, P.OP_SUBMIT_PLACED, (demand, retry_on, max_calls) + fields))

    def block_begin(self):
        # A pool worker waiting in get lends its CPU back so that the driver
        # can run the task it waits for (no deadlock with a full pool).
        if self.lends_slot and self.current_thread_busy:
            self.blocked_depth += 1
            if self.blocked_depth == 1:
                self.notify(P.OP_BLOCKED, True)

    def block_end(self):
        if self.lends_slot and self.blocked_depth:
            self.blocked_depth -= 1
            if self.blocked_depth == 0:
                self.notify(P.OP_BLOCKED, False)

    def _on_exit(self, peer, msg):
        self.exiting = True
        if self.loop is not None:
            self.loop.call_soon(self._stop_loop)

    def _stop_loop(self):
        done = self.loop_done
        if done is None:
            self.loop.stop()        # still in boot()
        elif not done.done():
            done.set_result(None)

    def _on_cancel(self, peer, msg, in_signal_handler=False):
        oid = msg[1]
        if oid not in self.live:
            return          # finished already (or never ours): nothing to cancel
        self.cancelled.add(oid)
        if self._held and self.held_calls.cancel(oid):
            return
        task = self.async_actor.running.get(oid)
        if task is not None:
            task.cancel()
        w = self.generators.ack_waiters.pop(oid, None)
        if w is not None:
            w()
        if oid == self.current_oid:
            # A sync pool task: interrupt it where it waits for the runtime
            # (wait_until raises), or at once from the signal handler.  Its
            # calls first: once ``_interrupt`` is up, a cancel signal landing
            # here may raise, and what follows would not run.
            if len(msg) > 3 and msg[3]:     # recursive: its calls to actors too
                self._cancel_calls_since(self.task_oids_from, in_signal_handler)
            self._interrupt = oid

    def _cancel_calls_since(self, first, later):
        """Cancel the calls to actors this process made, still running, whose
        oid is ``first`` or later (those of the running task), as Ray's
        recursive cancel does.  ``later``: in the signal handler that
        interrupted the task, maybe inside a send on the very link (its lock
        is not reentrant): the cancels go at the next drain (``_run_deferred``:
        the task's end, or its next call into the runtime)."""
        calls = {(peer, oid) for peer, fl in list(self.inflight.items()) if peer != 0
                 for oid, kind in list(fl.items())
                 if oid >= first and (kind == P.ACTOR_CALL or kind == P.STREAM)}
        pending = self.pending      # (a restartable actor's are kept for a resend)
        calls.update((aid, oid) for aid, kept in list(self.retry_calls.items())
                     for oid in list(kept) if oid >= first and oid in pending)
        if later:
            self._deferred.extend(calls)
            return
        for peer, oid in calls:
            self.send(peer, P.cancel_msg(oid, False))

    def _on_cancel_calls_of(self, peer, msg):
        """The driver: the worker ``msg[1]`` was killed by a recursive
        ``cancel(force=True)``; its calls here are cancelled (without force,
        as Ray does).  What it sent before dying is read first."""
        caller = msg[1]
        self.read_what_peer_sent(caller)
        for oid in [o for o in self.live if o >> _OID_SHIFT == caller]:
            self._on_cancel(caller, P.cancel_msg(oid, False))

    def _raise_interrupt(self):
        oid, self._interrupt = self._interrupt, None
        if threading.get_ident() != self._task_thread or not self._in_user_code:
            # Only the task's own thread, and only from within the task (not
            # the runtime's own code around it, e.g. a generator's reports).
            self._interrupt = oid
            return
        if oid == self.current_oid and not self._interrupted:
            self._interrupted = True
            raise KeyboardInterrupt(f"task {oid:x} was cancelled")

    def _enter_user_code(self):
        # Flag first, then look: a cancel noticed by the signal handler just
        # before the flag was up is raised here instead of getting lost.
        self._in_user_code = True
        if self._cancel_signalled:
            self._cancel_signalled = False
            self.drive_nowait()       # reads the X; raises if it is ours
        if self._interrupt is not None:
            self._raise_interrupt()

    def on_cancel_signal(self, signum, frame):
        """The driver asks to interrupt the running task (it sent an X first)."""
        if self.current_oid is None:
            return
        if self._drive_lock.acquire(False):
            # Read the driver's link for the X (the message says which task:
            # the signal may be late).  Other messages wait in the stash for
            # the next drain: handling them here could re-enter a send that
            # this very thread was interrupted in.
            try:
                link = self.links.get(0)
                if link is not None:
                    for m in link.recv_all():
                        if m[0] == P.CANCEL:
                            self._on_cancel(0, m, True)
                        else:
                            self._stash.append((0, m))
            finally:
                self._release_drive()
        else:
            # Another thread drives, or this one was interrupted while
            # driving (a get in the task, maybe halfway through handling
            # this very X): the wait reads the X on its way out and raises
            # there.  Raising here would cut the drain short.
            self._cancel_signalled = True
            if _inside_drive(frame):
                return
        if self._interrupt is not None and self._in_user_code:
            if in_runtime_section(frame, worker_main.__code__):
                # The task called the runtime (a .remote(), a put, a ref's
                # release) and the signal landed in it: raised there, the
                # interrupt would leave a call half-booked.  Again once the
                # runtime's code is done (microseconds).
                resend_later(CANCEL_SIGNAL)
                return
            self._raise_interrupt()

    # -------------------------------------------------------------- tasks
    # (_on_task and serve_calls, the main loop: the task runner's)
    def _on_method(self, peer, msg):
        """A sync actor's call, queued for ``serve_calls``; one waiting for a
        ref argument is held aside (``held_calls``)."""
        if self._releases:
            # The shares of refs the call's arguments brought are reported
            # before its code runs: should it crash the process, their
            # owners take them back (Objects.release_dead_holder).
            self._send_releases()
        self.live.add(msg[1])
        # The look for a call held or a ref argument is inline: it runs per
        # call (B11).
        if not self._held:
            for a in msg[3]:
                if type(a) is ObjectRef:
                    break
            else:
                if not msg[4]:
                    self.tasks.append((peer, msg))
                    return
            if self.held_calls.unready_arg(msg) is None:
                self.tasks.append((peer, msg))
                return
        self.held_calls.hold(peer, msg)

    def _on_method_threaded(self, peer, msg):
        """A threaded actor's call (``max_concurrency`` > 1), run by its pool."""
        if self._releases:
            self._send_releases()
        self.live.add(msg[1])
        self.executor.submit(self._run_method, peer, msg)

    def _load_function(self, fn_id, blob):
        fn = self.functions.get(fn_id)
        if fn is None:
            fn = unship(blob)
            self.functions[fn_id] = fn
        return fn

    def _resolve(self, args, kwargs):
        for a in args:
            if type(a) is ObjectRef:
                break
        else:
            if not kwargs:
                return args, kwargs
            for a in kwargs.values():
                if type(a) is ObjectRef:
                    break
            else:
                return args, kwargs
        value = self.value_of
        args = [value(a) if type(a) is ObjectRef else a for a in args]
        if kwargs:
            kwargs = {k: value(v) if type(v) is ObjectRef else v for k, v in kwargs.items()}
        return args, kwargs

    def value_of(self, ref):
        """``get(ref)``: its value, waiting for it; raises its error."""
        e = ref._e
        if not e.ready:
            self.wait_ref(ref)
        if e.error is not None:
            raise raisable(e.error)
        return e.value

    def reply(self, peer, msg, name):
        """Send a result; an unserialisable one becomes an error at ``get``."""
        try:
            link = self.links.get(peer)
            if link is None:
                return
            link.send(msg)
        except (ConnectionError, OSError):
            return
        except Exception as exc:
            return self._unsendable(peer, msg, name, exc)
        return True

    def _unsendable(self, peer, msg, name, exc):
        """``msg`` could not be sent (``exc``): its caller gets the error instead."""
        is_result = msg[0] == P.RESULT
        kind = "result" if is_result else f"item {msg[2]}"
        err = RayTaskError(name, f"could not serialize the {kind} of {name}: {exc!r}",
                           TypeError(f"could not serialize the {kind} of {name}: {exc}"),
                           os.getpid())
        for m in ((P.result_msg(msg[1], False, err),) if is_result
                  else P.stream_failed_msgs(msg[1], msg[2], err)):
            self.send(peer, m)
        return False

    def fail_pool_task(self, peer, msg):
        """``run_pool_task`` of a process whose job setup hook failed."""
        oid, stream, name = msg[1], msg[7], msg[9]
        try:
            self._send_failure(peer, oid, stream, RuntimeEnvSetupError(self.setup_error), name)
        finally:
            self.cancelled.discard(oid)
            self.live.discard(oid)

    def _failure(self, oid, name, exc):
        if oid in self.cancelled and oid == self.current_oid:   # an interrupted pool task
            return running_task_cancelled(name, oid)
        if isinstance(exc, _ACTOR_EXITS) and self.kind == "actor":
            return begin_exit(self)     # exit_actor(), or sys.exit() in a method, as in Ray
        if isinstance(exc, KeyboardInterrupt):
            # Ray's answer: the task was cancelled.  An error that is also a
            # KeyboardInterrupt would stop the caller as if Ctrl-C were pressed.
            return running_task_cancelled(name, oid)
        return make_task_error(name, exc)

    def _send_failure(self, peer, oid, stream, err, name):
        err = sendable_error(err, unpicklable_task_error(name))
        for m in P.failure_msgs(oid, stream, err):
            self.send(peer, m)

    # The task runner's (``_fast/task_runner``) ways out of its common case.
    def _send_cancelled(self, peer, oid, name):
        self._send_failure(peer, oid, False, running_task_cancelled(name, oid), name)

    def _await_result(self, coro):
        return asyncio.run(coro)

    def _run_stream(self, peer, oid, result, bp, name):
        if inspect.isasyncgen(result):
            try:
                self._enter_user_code()   # the loop runs user code between our steps
                asyncio.run(self.generators.drain_async_gen(peer, oid, result, bp, name))
            finally:
                self._in_user_code = False
            return
        if not inspect.isgenerator(result):
            raise TypeError(f"{name} was called with num_returns='streaming' but "
                            f"returned {type(result).__name__}, not a generator")
        self.generators.drain_gen(peer, oid, result, bp, name)

    def _lend_slot_for_good(self):
        """A pool task interrupted inside a get: its CPU slot stays lent."""
        self.blocked_depth = 0
        self.notify(P.OP_BLOCKED, False)

    def _close_finished_bridges(self):
        # Loops made by asyncio.run for async functions are closed now.
        self.bridges.forget_closed()

    _split = staticmethod(split_returns)

    # ------------------------------------------------------------- actors
    def await_resources(self):
        """Wait for the driver's word that this actor's resources are held (it
        was created while they were taken); the calls that came meanwhile,
        for after the constructor."""
        early, started = [], []
        on_method = self.handlers[P.METHOD]

        def keep(peer, msg):
            self.live.add(msg[1])       # a cancel that comes meanwhile finds it
            early.append((peer, msg))
        self.handlers[P.METHOD] = keep
        self.handlers[P.START] = lambda peer, msg: started.append(True)
        try:
            self.wait_until(lambda: started)
        finally:
            self.handlers[P.METHOD] = on_method
        return early

    def start_actor(self, a):
        name = a["class_name"]
        if self.setup_error is not None:
            self.actor_init_error = ActorDiedError(
                f"The actor {name} died because the job's worker_process_setup_hook failed "
                f"in its process:\n{self.setup_error}")
            return
        try:
            cls = unship(a["cls_blob"])
            args, kwargs = self._resolve(*unship(a["args_blob"]))   # zygote._as_sent
            self.actor = cls(*args, **kwargs)
            if relabel_from_repr is not None:
                relabel_from_repr(self.actor)   # its __repr__ prefixes its output (Ray)
        except BaseException as exc:
            tb = traceback.format_exc()
            self.actor_init_error = ActorDiedError(
                f"The actor {name} died because of an error raised in its creation task "
                f"{name}.__init__():\n{tb}")
            # Printed so that the user sees it on the terminal, as in Ray.
            print(tb, file=sys.stderr, end="")
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise

    def _method_for(self, msg):
        method = msg[2]
        if self.actor_init_error is not None:
            raise self.actor_init_error
        try:
            # actor_method(self, method), inline: it runs per call (B11)
            fn = self._class_methods.get(method, UNSET)
            if fn is UNSET:
                fn = self._class_methods[method] = class_function(type(self.actor), method)
            if fn is None:
                return getattr(self.actor, method)
            bound = self._bound_methods[method] = fn.__get__(self.actor)
            return bound
        except AttributeError:
            raise AttributeError(f"'{type(self.actor).__name__}' actor has no method "
                                 f"'{method}'") from None

    def _call_name(self, method):
        name = self._names.get(method)
        if name is None:
            name = self._names[method] = f"{type(self.actor).__name__}.{method}"
        return name

    def _run_method(self, peer, msg):
        _, oid, method, args, kwargs, nret, stream, bp = msg
        name = self._names.get(method) or self._call_name(method)
        try:
            if oid in self.cancelled:
                # Cancelled while queued.  A running call of a sync actor is
                # not interrupted (its state could be half updated), as in
                # Ray: it may look (get_runtime_context().is_canceled()).
                self._send_failure(peer, oid, stream, TaskCancelledError(), name)
                return
            # The common call, its looks inline (B11): a method bound before,
            # no keyword and no ref among the arguments.
            fn = self._bound_methods.get(method) if self.actor_init_error is None else None
            if fn is not None and not kwargs:
                for a in args:
                    if type(a) is ObjectRef:
                        fn = None
                        break
            else:
                fn = None
            if fn is None:
                try:
                    fn = self._method_for(msg)
                    args, kwargs = self._resolve(args, kwargs)
                except BaseException as exc:
                    err = exc if isinstance(exc, RayError) else make_task_error(name, exc)
                    self._send_failure(peer, oid, stream, err, name)
                    return
            self._invoke(peer, oid, fn, args, kwargs, nret, stream, bp, name)
        finally:
            if self.cancelled:
                self.cancelled.discard(oid)
            self.live.discard(oid)
            if self.actor_init_error is not None and not self.live:
                # An exiting threaded actor's exit thread waits for the last
                # call to end, maybe asleep in poll (driving the links): no
                # message tells it (``actor_exit._exit_when_idle``).
                self.wake_poll()


_DRIVE_CODE = frozenset(
    [f.__code__ for f in vars(DrivingMixin).values() if isinstance(f, FunctionType)]
    + [Node._on_link_full.__code__, WorkerNode.on_cancel_signal.__code__])


def _set_up_for_the_job(node, spec):
    """The job's LoggingConfig and worker_process_setup_hook, before this
    process runs any task or constructor (as Ray's workers do).  A hook that
    fails is reported to every caller of this process: each task it gets
    fails with ``RuntimeEnvSetupError``, an actor's calls with
    ``ActorDiedError`` (see ``start_actor``)."""
    if spec.get("logging_config"):
        from ..job.logging_config import LoggingConfig
        LoggingConfig.from_dict(spec["logging_config"])._apply()
    if spec.get("setup_hook"):
        from ..job.runtime_env import run_setup_hook
        node.setup_error = run_setup_hook(spec["setup_hook"])
        if node.setup_error is not None:
            print(node.setup_error, file=sys.stderr, end="", flush=True)


async def _until_done(fut):
    await fut


def worker_main(spec):
    if spec.get("spill_root"):
        from ..objects.spill import use_spill_root
        use_spill_root(spec["spill_root"])
    if spec.get("env_vars"):
        os.environ.update(spec["env_vars"])     # runtime_env (the job's, the actor's)
    node = WorkerNode(spec)
    if spec.get("seq_start"):
        node._seq = itertools.count(spec["seq_start"])   # a restarted actor's new ids
    restarts.install(node)
    state.node = node
    os.chdir(spec.get("cwd", os.getcwd()))
    if spec.get("logging_config") or spec.get("setup_hook"):
        _set_up_for_the_job(node, spec)
    timeline.install(node, "pool" if spec["kind"] == "pool" else "actor")
    if spec["kind"] == "pool":
        node.single_waiter = True
        signal.signal(CANCEL_SIGNAL, node.on_cancel_signal)
        node.serve_calls(node.run_pool_task if node.setup_error is None
                         else node.fail_pool_task)
        return
    a = spec["actor"]
    early = node.await_resources() if a.get("await_resources") else ()
    if a["is_async"]:
        node.actor_name = a.get("name")
        loop = new_event_loop()
        asyncio.set_event_loop(loop)
        node.loop = loop
        node.async_actor.start(loop, AsyncSlots(a["max_concurrency"]))

        async def boot():
            if a.get("concurrency_groups"):
                concurrency_groups.install_async(node, a)
            node.bridges.for_running_loop()
            node.start_actor(a)
            for peer, msg in early:
                node.handlers[P.METHOD](peer, msg)
            # Calls that arrived while the constructor ran.
            node.drive_nowait()
        loop.run_until_complete(boot())
        if not node.exiting:
            # The loop runs one long-lived task (not run_forever): libraries
            # that look for the loop's root task find it.  anyio (under
            # Starlette and FastAPI: run_in_threadpool, every sync endpoint)
            # otherwise takes each call's own task for the root and ends its
            # worker thread with it: a thread started per call, which cost a
            # FastAPI replica more CPU than the endpoint itself (B15).
            node.loop_done = loop.create_future()
            loop.run_until_complete(_until_done(node.loop_done))
        return
    # Calls queue up while the constructor runs; they execute in order after.
    node.single_waiter = a["max_concurrency"] <= 1 and not a.get("concurrency_groups")
    node.actor_name = a.get("name")
    node.start_actor(a)
    for peer, msg in early:
        node.handlers[P.METHOD](peer, msg)
    if a.get("concurrency_groups"):
        concurrency_groups.serve_threaded(node, a)
        return
    if a["max_concurrency"] > 1:
        from concurrent.futures import ThreadPoolExecutor
        node.executor = ThreadPoolExecutor(a["max_concurrency"], thread_name_prefix="actor")
        node.handlers[P.METHOD] = node._on_method_threaded
        # The calls that came while the constructor ran, and those held for
        # a ref argument then, once it is ready: the pool runs them.
        node.held_calls.send_to(node._on_method_threaded)
        node.wait_until(lambda: node.exiting)
        return
    try:
        node.serve_calls(node._run_method)
    except ActorExit:
        run_exit_handlers()

