"""ray_lite.util.ActorPool: Ray's semantics on ray_lite actors."""
import asyncio
import os

import pytest

import ray_lite
from ray_lite.exceptions import RayActorError
from ray_lite.util import ActorPool

# Public API only: these run on Ray too (--backend=ray; see conftest.py).
pytestmark = pytest.mark.both_backends


@ray_lite.remote
class Doubler:
    def double(self, v):
        return 2 * v

    def pair(self, v):
        return v, -v

    def crash(self, v):
        os._exit(1)


@ray_lite.remote
class Gate:
    """Calls that finish only when told to (no sleeps in the tests)."""

    def __init__(self):
        self.open = asyncio.Event()

    async def through(self, v):
        await self.open.wait()
        return v

    async def release(self):
        self.open.set()

    async def now(self, v):
        return v


def double(a, v):
    return a.double.remote(v)


def test_map_keeps_the_order_of_values(rt):
    pool = ActorPool([Doubler.remote(), Doubler.remote()])
    assert list(pool.map(double, [1, 2, 3, 4, 5])) == [2, 4, 6, 8, 10]
    assert not pool.has_next()


def test_map_unordered_returns_every_result(rt):
    pool = ActorPool([Doubler.remote(), Doubler.remote()])
    assert sorted(pool.map_unordered(double, range(20))) == [2 * v for v in range(20)]


def test_more_values_than_actors_wait_for_a_free_actor(rt):
    pool = ActorPool([Doubler.remote()])
    for v in range(5):
        pool.submit(double, v)
    assert not pool.has_free()
    assert [pool.get_next() for _ in range(5)] == [0, 2, 4, 6, 8]
    assert pool.has_free()


def test_get_next_on_an_empty_pool_stops(rt):
    pool = ActorPool([Doubler.remote()])
    assert not pool.has_next()
    with pytest.raises(StopIteration):
        pool.get_next()
    with pytest.raises(StopIteration):
        pool.get_next_unordered()


def test_get_next_times_out_then_returns_when_ready(rt):
    gate = Gate.remote()
    pool = ActorPool([gate])
    pool.submit(lambda a, v: a.through.remote(v), "x")
    with pytest.raises(TimeoutError):
        pool.get_next(timeout=0.05)
    assert pool.has_next()      # still pending, not dropped
    ray_lite.get(gate.release.remote())
    assert pool.get_next(timeout=30) == "x"


def test_get_next_ignore_if_timedout_skips_the_call(rt):
    gate = Gate.remote()
    pool = ActorPool([Gate.remote(), gate])   # submit takes the last idle actor first
    pool.submit(lambda a, v: a.through.remote(v), "slow")
    pool.submit(lambda a, v: a.now.remote(v), "fast")
    with pytest.raises(TimeoutError, match="ignored"):
        pool.get_next(timeout=0.05, ignore_if_timedout=True)
    assert pool.get_next(timeout=30) == "fast"
    assert not pool.has_next()
    ray_lite.get(gate.release.remote())


def test_get_next_unordered_returns_the_ready_one_first(rt):
    gate = Gate.remote()
    pool = ActorPool([Gate.remote(), gate])   # submit takes the last idle actor first
    pool.submit(lambda a, v: a.through.remote(v), "slow")
    pool.submit(lambda a, v: a.now.remote(v), "fast")
    assert pool.get_next_unordered(timeout=30) == "fast"
    with pytest.raises(TimeoutError):
        pool.get_next_unordered(timeout=0.05)
    with pytest.raises(ValueError, match="get_next_unordered"):
        pool.get_next()
    ray_lite.get(gate.release.remote())
    assert pool.get_next_unordered(timeout=30) == "slow"


@pytest.mark.local_only
def test_get_next_unordered_ignore_if_timedout_drops_the_oldest(rt):
    gate = Gate.remote()
    pool = ActorPool([gate])
    pool.submit(lambda a, v: a.through.remote(v), "slow")
    with pytest.raises(TimeoutError, match="ignored"):
        pool.get_next_unordered(timeout=0.01, ignore_if_timedout=True)
    assert not pool.has_next()
    assert pool.has_free()      # its actor came back to the pool
    ray_lite.get(gate.release.remote())


def test_map_discards_results_still_pending(rt):
    pool = ActorPool([Doubler.remote(), Doubler.remote()])
    pool.submit(double, 100)
    pool.submit(double, 200)
    assert list(pool.map(double, [1, 2])) == [2, 4]


def test_has_free_pop_idle_and_push(rt):
    a1, a2 = Doubler.remote(), Doubler.remote()
    pool = ActorPool([a1])
    pool.submit(double, 1)
    assert not pool.has_free()
    assert pool.pop_idle() is None
    assert pool.get_next() == 2
    assert pool.has_free()
    assert pool.pop_idle() == a1
    assert not pool.has_free()
    pool.push(a2)
    with pytest.raises(ValueError, match="already belongs"):
        pool.push(a2)
    pool.submit(double, 3)
    with pytest.raises(ValueError, match="already belongs"):
        pool.push(a2)       # busy, still a member
    assert pool.get_next() == 6


def test_push_takes_a_waiting_value_at_once(rt):
    a1 = Doubler.remote()
    pool = ActorPool([])
    pool.submit(double, 4)
    assert not pool.has_next()
    pool.push(a1)
    assert pool.has_next()
    assert pool.get_next(timeout=30) == 8


@pytest.mark.local_only
def test_calls_with_several_returns(rt):
    pool = ActorPool([Doubler.remote()])
    pool.submit(lambda a, v: a.pair.options(num_returns=2).remote(v), 3)
    assert pool.get_next() == [3, -3]
    pool.submit(lambda a, v: a.pair.options(num_returns=2).remote(v), 4)
    assert pool.get_next_unordered() == [4, -4]


@pytest.mark.local_only
def test_a_dead_actor_raises_and_leaves_the_pool(rt):
    doomed, survivor = Doubler.remote(), Doubler.remote()
    pool = ActorPool([survivor, doomed])    # submit takes the last idle actor first
    pool.submit(lambda a, v: a.crash.remote(v), 0)
    with pytest.raises(RayActorError):
        pool.get_next(timeout=30)
    assert list(pool.map(double, [1, 2, 3])) == [2, 4, 6]
    assert pool.pop_idle() == survivor
    assert pool.pop_idle() is None


def test_an_error_in_a_call_keeps_the_actor(rt):
    pool = ActorPool([Doubler.remote()])
    pool.submit(lambda a, v: a.double.remote(v), None)
    with pytest.raises(TypeError):
        pool.get_next()
    assert pool.has_free()
    assert list(pool.map(double, [5])) == [10]
