"""An async actor's plain ``def`` methods run without an asyncio Task: the
same answers, order, context and cancellation as calls that run in one."""
import asyncio
import contextvars

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

