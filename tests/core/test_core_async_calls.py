"""An async actor's plain ``def`` methods run without an asyncio Task: the
same answers, order, context and cancellation as calls that run in one.  Its
``async def`` calls each run in a Task of their own, started eagerly where
Python has eager tasks (3.12+)."""
import asyncio
import contextvars
import sys

import pytest

import ray_lite
from ray_lite.exceptions import RayTaskError, TaskCancelledError

@ray_lite.remote
class Mixed:
    def __init__(self):
        self.value = None
        self.gate = None
        self.seen = contextvars.ContextVar("seen", default=None)

    async def set_value(self, v):
        self.value = v          # before any await: done when the call starts

    def value_now(self):
        return self.value

    def mark_context(self, v):
        before = self.seen.get()
        self.seen.set(v)
        return before

    def task_id(self):
        return ray_lite.get_runtime_context().get_task_id()

    def pair(self):
        return 1, 2

    def fail(self):
        raise KeyError("nope")

    def later(self, v):
        # A plain method whose answer is an awaitable: awaited for the caller.
        async def wait_then(v):
            await asyncio.sleep(0)
            return v * 2
        return wait_then(v)

    def block(self):
        # Waits (in a Task) until release() is called.
        self.gate = asyncio.get_running_loop().create_future()
        return self.gate

    def release(self):
        self.gate.set_result("released")

    def waiting(self):
        return self.gate is not None

    async def ping(self):
        return "pong"

    async def swallow_cancel(self):
        self.gate = asyncio.get_running_loop().create_future()
        try:
            await self.gate
        except asyncio.CancelledError:
            return "caught its cancellation"


def _wait_for(pred, timeout=30):
    import time
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "condition not reached in time"


def test_plain_method_sees_what_an_earlier_async_call_did(rt):
    a = Mixed.remote()
    ray_lite.get(a.ping.remote())
    for i in range(200):
        a.set_value.remote(i)
        assert ray_lite.get(a.value_now.remote()) == i


def test_plain_methods_run_in_a_context_of_their_own(rt):
    a = Mixed.remote()
    assert ray_lite.get([a.mark_context.remote(i) for i in range(50)]) == [None] * 50


def test_plain_method_answers_errors_and_num_returns(rt):
    a = Mixed.remote()
    tid = ray_lite.get(a.task_id.remote())
    assert isinstance(tid, str) and tid
    assert ray_lite.get(a.task_id.remote()) != tid      # one id per call
    x, y = a.pair.options(num_returns=2).remote()
    assert ray_lite.get([x, y]) == [1, 2]
    with pytest.raises(RayTaskError) as info:
        ray_lite.get(a.fail.remote())
    assert isinstance(info.value, KeyError)


def test_plain_method_returning_an_awaitable_is_awaited(rt):
    a = Mixed.remote()
    assert ray_lite.get([a.later.remote(i) for i in range(20)]) == [2 * i for i in range(20)]
    blocked = a.block.remote()
    _wait_for(lambda: ray_lite.get(a.waiting.remote()))
    assert ray_lite.get(a.value_now.remote()) is None     # not blocked behind it
    a.release.remote()
    assert ray_lite.get(blocked, timeout=30) == "released"


# block: a plain method waiting on an awaitable; swallow_cancel: one that
# catches its cancellation and returns (still cancelled for the caller, as
# on Ray, whatever it returned).
@pytest.mark.parametrize("method", ["block", "swallow_cancel"])
def test_cancel_of_a_call_waiting_on_an_awaitable(rt, method):
    a = Mixed.remote()
    blocked = getattr(a, method).remote()
    _wait_for(lambda: ray_lite.get(a.waiting.remote()))
    ray_lite.cancel(blocked)
    with pytest.raises(TaskCancelledError):
        ray_lite.get(blocked, timeout=30)
    assert ray_lite.get(a.later.remote(3)) == 6          # the slot came back


# An async method's call runs in a Task of its own; where Python has eager
# tasks (3.12+) the Task is made when the loop comes to the call, and its
# first step runs at once (async_actor.start_call).
@ray_lite.remote
class Tasks:
    async def own_task(self):
        task = asyncio.current_task()
        # anyio's cancel scopes (FastAPI's thread pool) need the call's Task.
        return task.get_name(), task.cancelling() if hasattr(task, "cancelling") else 0

    async def waits_then_answers(self):
        await asyncio.sleep(0)
        return asyncio.current_task().get_name()


def test_async_calls_run_in_a_task_of_their_own(rt):
    a = Tasks.remote()
    names = [n for n, cancelling in ray_lite.get([a.own_task.remote() for _ in range(20)])]
    assert len(set(names)) == 20
    assert ray_lite.get(a.own_task.remote())[1] == 0
    later = ray_lite.get([a.waits_then_answers.remote() for _ in range(20)])
    assert len(set(later)) == 20


@ray_lite.remote
def _gated(q):
    return q.get(timeout=60)


@ray_lite.remote
class BuiltSlowly:
    def __init__(self, started, refs):
        # Reads the links while it waits for the driver's object: the call
        # sent meanwhile arrives here first (the object comes after it on
        # the same ring), and must wait for the constructor to end.
        started.put(True)
        self.built = ray_lite.get(refs[0])

    async def value(self):
        return self.built


def test_async_call_arriving_during_the_constructor_waits_for_it(rt):
    from ray_lite.util.queue import Queue
    started, gate = Queue(), Queue()
    a = BuiltSlowly.remote(started, [_gated.remote(gate)])
    assert started.get(timeout=60)
    ref = a.value.remote()      # sent while the constructor waits
    gate.put("built")
    assert ray_lite.get(ref, timeout=60) == "built"


@pytest.mark.skipif(sys.version_info < (3, 12), reason="eager tasks are Python 3.12's")
def test_a_first_step_raising_past_its_call_does_not_stop_the_calls_after_it():
    import types

    from ray_lite._private.actors.async_actor import AsyncActor

    class Calls(AsyncActor):
        def __init__(self, loop):
            super().__init__(types.SimpleNamespace(cancelled=set(), live=set(), handlers={}))
            self.start(loop, None)
            self.ran = []

        async def _run_method_async(self, peer, msg):
            if msg[2] == "interrupted":
                raise KeyboardInterrupt     # past the call's own handling
            self.ran.append((msg[1], asyncio.current_task() is not None))

    loop = asyncio.new_event_loop()
    try:
        calls = Calls(loop)
        for oid, method in ((1, "interrupted"), (2, "m"), (3, "m")):
            calls.start_call(0, ("M", oid, method))
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(asyncio.sleep(0))
        assert calls.ran == []
        loop.run_until_complete(asyncio.wait_for(asyncio.sleep(0), 30))
        # Each ran in a Task of its own, done in its first step.
        assert calls.ran == [(2, True), (3, True)] and calls.running == {}
    finally:
        loop.close()
