"""Concurrency groups of async and threaded actors (``concurrency_groups={...}``).

Each group has its own limit on the calls of its methods that run at once;
a method is in the group its ``@ray_lite.method(concurrency_group=...)`` names,
or the one a call's ``.options(concurrency_group=...)`` names (the call's
method then travels as ``(method, group)``); other methods are in the
default group, whose limit is ``max_concurrency``.  An actor without groups
never comes here: its calls take the usual path, at the usual cost.

As in Ray, each group of an async actor, the default one included, runs its
calls on a thread and event loop of its own: a call that blocks its loop (a
blocking call in an ``async def``) stalls its group only.  The main loop
only reads the links and hands each call to its group's loop; objects that
calls of different groups share must be thread-safe (an ``asyncio.Event``
belongs to one loop).
"""
import contextvars
import threading

from ray_lite._lazy import lazy_module
from ray_lite.exceptions import TaskCancelledError

from ..links import protocol as P
from .aio import AsyncSlots, new_event_loop

asyncio = lazy_module("asyncio", globals())

GROUP_ATTR = "__ray_concurrency_group__"


def check_groups(groups):
    """``concurrency_groups`` validated: {name: positive int}, or None."""
    if groups is None or groups == {}:
        return None
    if not isinstance(groups, dict):
        raise TypeError(f"concurrency_groups must be a dict of name to max concurrency, "
                        f"got {groups!r}")
    for name, n in groups.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"concurrency group names must be non-empty strings, got {name!r}")
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"concurrency group {name!r}: max concurrency must be a "
                             f"positive int, got {n!r}")
    return dict(groups)


def method_groups(cls):
    """{method name: group} of the methods decorated with a concurrency group."""
    out = {}
    for name in dir(cls):
        group = getattr(getattr(cls, name, None), GROUP_ATTR, None)
        if group is not None:
            out[name] = group
    return out


def check_method_groups(cls, groups):
    for method, group in method_groups(cls).items():
        if groups is None or group not in groups:
            raise ValueError(f"{cls.__name__}.{method} is in the concurrency group {group!r}, "
                             f"which the actor does not define (concurrency_groups="
                             f"{groups})")


class _Router:
    """Which group a call belongs to (the method's own, looked up once)."""

    def __init__(self, node):
        self.node = node
        self.of_method = {}

    def route(self, msg):
        method = msg[2]
        if type(method) is tuple:
            method, group = method
            return group, msg[:2] + (method,) + msg[3:]
        group = self.of_method.get(method, False)
        if group is False:
            group = getattr(getattr(type(self.node.actor), method, None), GROUP_ATTR, None)
            self.of_method[method] = group
        return group, msg


class _GroupLoop:
    """A concurrency group's thread and event loop, with its slots."""

    def __init__(self, name, limit):
        self.slots = AsyncSlots(limit)      # used on this loop only
        self.loop = new_event_loop()
        started = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(started,), daemon=True,
                                       name=f"ray_lite-group-{name or 'default'}")
        self.thread.start()
        started.wait()

    def _run(self, started):
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(started.set)
        self.loop.run_forever()

    def submit(self, coro):
        """``coro`` as a Task of this loop, in a context of its own (see
        async_actor); its ``concurrent.futures.Future``, whose cancel
        cancels the Task from any thread."""
        return contextvars.Context().run(asyncio.run_coroutine_threadsafe, coro, self.loop)


class _GroupCall:
    """A call running on a group's loop, as ``async_actor.running`` holds it: its
    cancel and done work from any thread (an asyncio Task's do not)."""

    __slots__ = ("future",)

    def __init__(self):
        self.future = None      # set once submitted (a cancel before: see _in_group)

    def cancel(self):
        if self.future is not None:
            self.future.cancel()

    def done(self):
        return self.future is not None and self.future.done()

    def main_loop_future(self):
        """An asyncio Future of the running loop that ends with the call."""
        return asyncio.wrap_future(self.future)


def install_async(node, a):
    """Route an async actor's calls to their group's own loop and slots."""
    loops = {g: _GroupLoop(g, n) for g, n in a["concurrency_groups"].items()}
    loops[None] = _GroupLoop(None, a["max_concurrency"])
    actor = node.async_actor
    actor.slots = AsyncSlots(1 << 30)     # the groups' slots do the limiting
    router = _Router(node)
    run = actor._run_method_async

    def on_method(peer, msg):
        group, msg = router.route(msg)
        group_loop = loops.get(group, loops[None])
        oid = msg[1]
        node.live.add(oid)
        call = actor.running[oid] = _GroupCall()      # before it can start (and end)
        call.future = group_loop.submit(_in_group(node, group_loop.slots, run, peer, msg))

    node.handlers[P.METHOD] = on_method


async def _in_group(node, slots, run, peer, msg):
    oid = msg[1]
    try:
        if oid in node.cancelled:         # cancelled before it was handed over
            raise asyncio.CancelledError
        await slots.__aenter__()          # a slot of the call's group
    except asyncio.CancelledError:        # cancelled while it waited for one
        node._send_failure(peer, oid, msg[6], TaskCancelledError(), node._call_name(msg[2]))
        node.async_actor.running.pop(oid, None)
        node.cancelled.discard(oid)
        node.live.discard(oid)
        return
    try:
        await run(peer, msg)
    finally:
        slots.release()


def serve_threaded(node, a):
    """Run a threaded actor's calls on one thread pool per group (the main
    thread drives the links)."""
    from concurrent.futures import ThreadPoolExecutor
    pools = {g: ThreadPoolExecutor(n, thread_name_prefix=f"actor-{g}")
             for g, n in a["concurrency_groups"].items()}
    pools[None] = node.executor = ThreadPoolExecutor(a["max_concurrency"],
                                                      thread_name_prefix="actor")
    router = _Router(node)

    def on_method(peer, msg):
        group, msg = router.route(msg)
        node.live.add(msg[1])
        pools.get(group, pools[None]).submit(node._run_method, peer, msg)

    node.handlers[P.METHOD] = on_method
    # The calls that came while the constructor ran, and those held for a
    # ref argument then, once it is ready.
    node.held_calls.send_to(on_method)
    node.wait_until(lambda: node.exiting)
