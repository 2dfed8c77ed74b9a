"""Concurrency groups of async and threaded actors (``concurrency_groups={...}``).

Each group has its own limit on the calls of its methods that run at once;
a method is in the group its ``@ray_lite.method(concurrency_group=...)`` names,
or the one a call's ``.options(concurrency_group=...)`` names (the call's
method then travels as ``(method, group)``); other methods are in the
default group, whose limit is ``max_concurrency``.  An actor without groups
never comes here: its calls take the usual path, at the usual cost.
"""
import asyncio

from ray_lite.exceptions import TaskCancelledError

from . import protocol as P
from .aio import AsyncSlots

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


def install_async(node, a):
    """Route an async actor's calls through one ``AsyncSlots`` per group."""
    slots = {g: AsyncSlots(n) for g, n in a["concurrency_groups"].items()}
    slots[None] = AsyncSlots(a["max_concurrency"])
    node._sem = AsyncSlots(1 << 30)     # the groups' slots do the limiting
    router = _Router(node)
    run = node._run_method_async

    def on_method(peer, msg):
        group, msg = router.route(msg)
        node.live.add(msg[1])
        node.running[msg[1]] = node.call_task(
            _in_group(node, slots.get(group, slots[None]), run, peer, msg))

    node.handlers[P.METHOD] = on_method


async def _in_group(node, slots, run, peer, msg):
    try:
        await slots.__aenter__()      # a slot of the call's group
    except asyncio.CancelledError:    # cancelled while it waited for one
        oid = msg[1]
        node._send_failure(peer, oid, msg[6], TaskCancelledError(), node._call_name(msg[2]))
        node.running.pop(oid, None)
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
    while node.tasks:        # calls that came while the constructor ran
        peer, msg = node.tasks.popleft()
        on_method(peer, msg)
        del msg
    node.wait_until(lambda: node.exiting)
