"""``DeploymentHandle.broadcast``: one call to every running replica, with
Ray Serve's ``DeploymentBroadcastResponse`` (``results``, ``results_async``)."""
import asyncio
import os

import pytest

import ray_lite as ray
from ray_lite import serve

T = 60


@ray.remote
class Gate:
    """Holds calls until opened."""

    def __init__(self):
        self.event = asyncio.Event()
        self.entered = 0

    async def enter(self):
        self.entered += 1
        await self.event.wait()

    async def open(self):
        self.event.set()

    async def wait_entered(self, n):
        while self.entered < n:      # the workload's own poll, bounded by the caller
            await asyncio.sleep(0.005)
        return self.entered


@serve.deployment(num_replicas=3, max_ongoing_requests=1)
class Cache:
    def __init__(self):
        self.value = "cold"

    async def set_value(self, value, *, suffix=""):
        self.value = value + suffix if suffix else value
        return os.getpid()

    async def get(self):
        return self.value, os.getpid()

    async def fail(self):
        raise ValueError(f"replica {os.getpid()} refuses")

    async def hold(self, gate):
        await gate.enter.remote()
        return os.getpid()


@serve.deployment
def plus_one(x):
    return x + 1


def test_broadcast_reaches_every_replica_once(serve_port):
    h = serve.run(Cache.bind(), name="cache", route_prefix=None)
    pids = h.broadcast("set_value", "warm", suffix="!").results(timeout_s=T)
    assert len(pids) == 3 and len(set(pids)) == 3
    # Every replica took it: whichever one a later call reaches says so.
    seen = {}
    for _ in range(60):
        value, pid = h.get.remote().result(timeout_s=T)
        seen[pid] = value
        if len(seen) == 3:
            break
    assert seen == {pid: "warm!" for pid in pids}
    assert repr(h.broadcast("get")) == "DeploymentBroadcastResponse()"


def test_broadcast_resolves_a_response_argument(serve_port):
    h = serve.run(Cache.bind(), name="cache", route_prefix=None)
    add = serve.run(plus_one.bind(), name="add", route_prefix=None)
    h.broadcast("set_value", add.remote(41)).results(timeout_s=T)
    got = h.broadcast("get").results(timeout_s=T)
    assert [value for value, _ in got] == [42, 42, 42] and len({p for _, p in got}) == 3


def test_errors_raise_or_come_back_in_place(serve_port):
    h = serve.run(Cache.bind(), name="cache", route_prefix=None)
    with pytest.raises(ValueError, match="refuses"):
        h.broadcast("fail").results(timeout_s=T)
    errors = h.broadcast("fail").results(timeout_s=T, return_exceptions=True)
    assert len(errors) == 3 and all(isinstance(e, ValueError) for e in errors)
    with pytest.raises(Exception, match="no_such_method"):
        h.broadcast("no_such_method").results(timeout_s=T)
    with pytest.raises(ValueError, match="timeout_s must be None or non-negative"):
        h.broadcast("get").results(timeout_s=-1)
    with pytest.raises(TypeError, match="method_name must be a str"):
        h.broadcast(42)


def test_results_time_out_and_can_be_asked_again(serve_port):
    h = serve.run(Cache.bind(), name="cache", route_prefix=None)
    gate = Gate.remote()
    response = h.broadcast("hold", gate)
    assert ray.get(gate.wait_entered.remote(3), timeout=T) == 3
    with pytest.raises(TimeoutError, match="Timed out waiting for broadcast results."):
        response.results(timeout_s=0.05)
    # Every replica is at max_ongoing_requests=1: a call waits in the
    # handle, a broadcast does not (as Ray's, it skips the handle's queue;
    # each replica runs it once its running call ends).
    waiting = h.get.remote()
    again = h.broadcast("get")
    assert len(h._router.queue) == 1
    ray.get(gate.open.remote(), timeout=T)
    assert len(set(response.results(timeout_s=T))) == 3
    assert [value for value, _ in again.results(timeout_s=T)] == ["cold"] * 3
    assert waiting.result(timeout_s=T)[0] == "cold"


def test_results_async_and_the_sync_refusal_in_a_loop(serve_port):
    h = serve.run(Cache.bind(), name="cache", route_prefix=None)

    async def main():
        response = h.broadcast("set_value", "async")
        with pytest.raises(RuntimeError, match=r"Use `await response.results_async\(\)`"):
            response.results()
        pids = await response.results_async(timeout_s=T)
        errors = await h.broadcast("fail").results_async(return_exceptions=True)
        with pytest.raises(ValueError, match="refuses"):
            await h.broadcast("fail").results_async(timeout_s=T)
        return pids, errors
    pids, errors = asyncio.run(asyncio.wait_for(main(), T))
    assert len(set(pids)) == 3 and all(isinstance(e, ValueError) for e in errors)


def test_results_async_times_out(serve_port):
    h = serve.run(Cache.bind(), name="cache", route_prefix=None)
    gate = Gate.remote()

    async def main():
        with pytest.raises(TimeoutError, match="Timed out waiting for broadcast results."):
            await h.broadcast("hold", gate).results_async(timeout_s=0.05)
    asyncio.run(asyncio.wait_for(main(), T))
    ray.get(gate.open.remote(), timeout=T)
