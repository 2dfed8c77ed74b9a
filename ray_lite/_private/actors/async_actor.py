"""The calls of an async actor: each runs on the actor's event loop.

A call of a plain ``def`` method that can start at once runs directly from
the handler of its message (``_run_method_now``: no asyncio Task, which is
most of the cost of a small call); every other call runs in a Task of its
own (``_run_method_async``), at most ``max_concurrency`` at once; where
Python has eager tasks (3.12+), a Task made when the loop comes to the call,
its first step run at once (``start_call``).
"""
import collections
import contextvars
import functools
import sys
import types

from ray_lite._lazy import lazy_module
from ray_lite.exceptions import TaskCancelledError

from ..links.protocol import METHOD, RESULT
from ..objects.refs import ObjectRef, stored_result
from ..process.errors import running_task_cancelled
from .method_lookup import actor_method

asyncio = lazy_module("asyncio", globals())
inspect = lazy_module("inspect", globals())

_COROUTINE = types.CoroutineType
# Each call runs in a context of its own that starts empty, as on Ray (whose
# loop thread sets none), not in a copy of whatever dispatched it: a call can
# arrive while another call's Task drives the links (an ``await`` on a ref),
# and a copy of that context would hand it the other call's context
# variables (a Serve replica's request: its id, its HTTP scope).
_new_context = contextvars.Context


if sys.version_info >= (3, 11):
    def _not_started(task):
        coro = task.get_coro()
        return coro.cr_frame is not None and not coro.cr_running and not coro.cr_suspended
else:
    def _not_started(task):
        # (cr_suspended is 3.11's)
        return inspect.getcoroutinestate(task.get_coro()) == inspect.CORO_CREATED


if sys.version_info >= (3, 11):
    def _task_in(context, loop, coro):
        """A Task of ``coro`` that runs in ``context`` (the call's own)."""
        return loop.create_task(coro, context=context)
else:
    def _task_in(context, loop, coro):
        # Python 3.10's Tasks take no context: one made inside ``context``
        # runs in a copy of it, which holds all the call set so far.
        return context.run(loop.create_task, coro)

if sys.version_info >= (3, 12):
    def _eager_task_in(context, loop, coro):
        """``_task_in``, but the Task's first step runs now, inside this call
        (Python's eager tasks; from a loop callback, where no Task runs): a
        call that ends without waiting, as most of a Serve replica's requests
        do, is done when this returns.  The Task is the current task while
        it runs, as any Task's step."""
        return asyncio.Task(coro, loop=loop, context=context, eager_start=True)
else:
    # (3.10 and 3.11 have no eager tasks: a step outside a Task would show
    # the call no current task, which anyio's cancel scopes, FastAPI's among
    # them, need.)
    _eager_task_in = None


class AsyncActor:
    """A part of an async actor's ``WorkerNode`` (``worker.async_actor``):
    running its calls on its event loop, and its ``METHOD`` handler
    (``on_method``, registered by ``start``).

    ``loop``: the actor's event loop (None until ``start``); ``slots``: its
    ``max_concurrency`` (an ``AsyncSlots``); ``running``: oid -> the Task of
    a call started and not finished; ``deferred_calls``: calls read and not
    started yet (see ``start_call``); ``sync_methods``: method -> whether it
    is a plain ``def`` (such a call may run at once, ``_run_method_now``).
    """

    def __init__(self, node):
        self.node = node
        self.loop = None
        self.slots = None
        self.running = {}
        self.deferred_calls = ()
        self.sync_methods = {}
        # The node's sets (never replaced), read on every call.
        self.cancelled, self.live = node.cancelled, node.live

    def start(self, loop, slots):
        """Run the actor's calls on ``loop``, at most ``slots`` at once: from
        now on its ``METHOD`` messages come to ``on_method``."""
        self.loop, self.slots = loop, slots
        self.node.handlers[METHOD] = self.on_method

    def on_method(self, peer, msg):
        node = self.node
        if node._releases:
            # (See WorkerNode._on_method.)
            node._send_releases()
        self.live.add(msg[1])
        # (An async def method is known after its first call: no detour.)
        if self.sync_methods.get(msg[2], True) and self._run_method_now(peer, msg):
            return
        self.start_call(peer, msg)

    def call_task(self, coro):
        """The Task that runs one call's ``coro``, in a context of its own."""
        return _task_in(_new_context(), self.loop, coro)

    def start_call(self, peer, msg):
        """Run an async actor's call ``msg`` in a Task of its own.

        Where Python has eager tasks, the call is kept and its start is put
        on the loop's queue, where a Task's first step would have gone: when
        the loop gets there, the Task is made and its first step runs at
        once, so a call that ends without waiting (most of a Serve replica's
        requests) costs no Task scheduled on the loop.  The order against
        everything else on the loop is a plain Task's: run at once, inside
        whatever read the call (the bridge's drain, a constructor, a call
        blocking on the links), it would overtake the callbacks and Task
        steps queued before it (a replica's death seen in the same drain).
        """
        if _eager_task_in is None:
            # Registered now, so that a cancel arriving before it starts finds it.
            task = self.running[msg[1]] = self.call_task(self._run_method_async(peer, msg))
            task.add_done_callback(functools.partial(self._call_cancelled_before_start,
                                                     peer, msg))
            return
        kept = self.deferred_calls
        if not kept:
            kept = self.deferred_calls = collections.deque()
        kept.append((peer, msg))
        self.loop.call_soon(self._start_kept_call)

    def _start_kept_call(self):
        """The first call ``start_call`` kept: its Task, first step at once (a
        loop callback: no other Task runs).  One still running after it is
        in ``running``, for a cancel to find."""
        peer, msg = self.deferred_calls.popleft()
        oid = msg[1]
        if oid in self.cancelled:
            # Cancelled before it started: it does not run (as a Task
            # cancelled before its first step).
            self._answer_cancelled_before_start(peer, msg)
            return
        task = _eager_task_in(_new_context(), self.loop, self._run_method_async(peer, msg))
        if not task.done():
            self.running[oid] = task

    async def _resolve_async(self, args, kwargs):
        if any(type(a) is ObjectRef for a in args):
            args = [await a if type(a) is ObjectRef else a for a in args]
        if kwargs and any(type(v) is ObjectRef for v in kwargs.values()):
            kwargs = {k: (await v if type(v) is ObjectRef else v) for k, v in kwargs.items()}
        return args, kwargs

    def _is_sync_method(self, method):
        sync = self.sync_methods.get(method)
        if sync is None:
            actor = self.node.actor
            if actor is None:
                # The constructor runs: the call waits for it in a Task.  Its
                # method is classified by the first call after, from the
                # actor's class (not from ``type(None)``, which has none).
                return False
            fn = getattr(type(actor), method, None)
            sync = self.sync_methods[method] = (
                callable(fn) and not inspect.iscoroutinefunction(fn)
                and not inspect.isasyncgenfunction(fn) and not inspect.isgeneratorfunction(fn))
        return sync

    def _run_method_now(self, peer, msg):
        """An async actor's call of a plain ``def`` method, run at once (no
        asyncio Task): True when it was run.

        Taken only when the call would start at once anyway (a slot free, no
        one waiting for one, no ref among its arguments, not a stream) and
        every call that came before it has started (calls start in order).  It
        runs in a context of its own, as a Task would.  When the method
        returns an awaitable, that is awaited by a Task (``_run_method_async``
        with ``pending``), which also owns the slot taken here.
        """
        _, oid, method, args, kwargs, nret, stream, bp = msg
        node = self.node
        slots = self.slots
        if stream or slots.free <= 0 or slots.waiters or kwargs or \
                node.actor_init_error is not None or not self._is_sync_method(method):
            return False
        running = self.running
        if self.deferred_calls or (running and _not_started(next(reversed(running.values())))):
            return False        # calls start in order: the last one kept or made tells
        for a in args:
            if type(a) is ObjectRef:
                return False
        name = node._call_name(method)
        try:
            context = _new_context()
            try:
                result = context.run(actor_method(node, method), *args)
                if type(result) is _COROUTINE or inspect.isawaitable(result):
                    slots.free -= 1
                    task = _task_in(context, self.loop,
                                    self._run_method_async(peer, msg, result))
                    task.add_done_callback(functools.partial(
                        self._unstarted_call_cancelled, peer, msg, result))
                    running[oid] = task
                    return True
                if nret != 1:
                    result = node._split(result, nret, name)
            except asyncio.CancelledError:
                node._send_failure(peer, oid, stream, running_task_cancelled(name, oid), name)
                return True
            except BaseException as exc:
                node._send_failure(peer, oid, stream, node._failure(oid, name, exc), name)
                return True
            node.reply(peer, (RESULT, oid, True, stored_result(result)), name)
        finally:
            if oid not in running:
                self.cancelled.discard(oid)
                self.live.discard(oid)
        return True

    def _unstarted_call_cancelled(self, peer, msg, pending, task):
        # A Task cancelled before its first step never runs its coroutine
        # (no finally either): answer and clean up for it here.
        if not task.cancelled():
            return
        if hasattr(pending, "close"):
            pending.close()
        self.slots.release()
        self.running.pop(msg[1], None)
        self._answer_cancelled_before_start(peer, msg)

    def _call_cancelled_before_start(self, peer, msg, task):
        # A Task cancelled before its first step never runs its coroutine
        # (no finally either): the caller is answered and the call forgotten
        # here, once: a coroutine that ran took the call out of ``running``
        # itself.  (Its coroutine took no slot: it takes one once it runs.)
        if task.cancelled() and self.running.pop(msg[1], None) is task:
            self._answer_cancelled_before_start(peer, msg)

    def _answer_cancelled_before_start(self, peer, msg):
        node = self.node
        oid = msg[1]
        self.cancelled.discard(oid)
        self.live.discard(oid)
        name = node._call_name(msg[2])
        node._send_failure(peer, oid, msg[6], running_task_cancelled(name, oid), name)

    async def _run_method_async(self, peer, msg, pending=None):
        # At most max_concurrency calls run at once (Ray's default for async
        # actors: 1000); the others wait here, in arrival order.  One flat
        # coroutine per call: an actor serving many small calls (a Serve
        # replica) spends most of its time on this path.  ``pending``: what
        # the method returned, to await (``_run_method_now`` called it and
        # took the slot).
        _, oid, method, args, kwargs, nret, stream, bp = msg
        node = self.node
        slots = self.slots
        try:
            if pending is not None:
                pass
            elif slots.free > 0 and not slots.waiters:
                slots.free -= 1
            else:
                try:
                    await slots.wait()
                except asyncio.CancelledError:
                    # Cancelled while waiting for a slot.
                    node._send_failure(peer, oid, stream, TaskCancelledError(),
                                       node._call_name(method))
                    return
            try:
                name = node._call_name(method)
                try:
                    if pending is not None:
                        result = pending
                    else:
                        fn = node._method_for(msg)
                        for a in args:
                            if type(a) is ObjectRef:
                                args, kwargs = await self._resolve_async(args, kwargs)
                                break
                        else:
                            if kwargs:
                                args, kwargs = await self._resolve_async(args, kwargs)
                        result = fn(*args, **kwargs)
                    if stream:
                        if inspect.isasyncgen(result):
                            await node.generators.drain_async_gen(peer, oid, result, bp, name)
                            return
                        if inspect.isgenerator(result):
                            node.generators.drain_gen(peer, oid, result, bp, name)
                            return
                        raise TypeError(f"{name} was called with num_returns='streaming' but "
                                        f"returned {type(result).__name__}, not a generator")
                    if type(result) is _COROUTINE or inspect.isawaitable(result):
                        result = await result
                        if oid in self.cancelled:
                            # It caught its cancellation and returned: still
                            # cancelled for the caller, as on Ray.
                            raise asyncio.CancelledError
                    if nret != 1:
                        result = node._split(result, nret, name)
                except asyncio.CancelledError:
                    node._send_failure(peer, oid, stream, running_task_cancelled(name, oid), name)
                    return
                except BaseException as exc:
                    node._send_failure(peer, oid, stream, node._failure(oid, name, exc), name)
                    return
                node.reply(peer, (RESULT, oid, True, stored_result(result)), name)
            finally:
                slots.release()
        finally:
            self.running.pop(oid, None)
            self.cancelled.discard(oid)
            self.live.discard(oid)
