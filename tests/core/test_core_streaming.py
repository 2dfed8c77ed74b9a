"""Streaming generators: ordering, errors at an index, death mid-stream,
cancel, back-pressure, wait, and the ready-check fast path."""
import asyncio
import os
import signal

import pytest

import ray_lite as ray
from ray_lite._private.objects.refs import ObjectRefGenerator
from ray_lite.exceptions import (RayActorError, RayTaskError, TaskCancelledError,
                                 WorkerCrashedError)

# Public API only: these run on Ray too (--backend=ray; see conftest.py).
pytestmark = pytest.mark.both_backends

T = 60


@ray.remote
def count(n):
    for i in range(n):
        yield i


@ray.remote
def fail_at(n, k):
    for i in range(n):
        if i == k:
            raise ValueError(f"item {k}")
        yield i


@ray.remote
class Streamer:
    def gen(self, n):
        for i in range(n):
            yield i

    async def agen(self, n):
        for i in range(n):
            yield i

    def fail_at(self, n, k):
        for i in range(n):
            if i == k:
                raise ValueError(f"item {k}")
            yield i

    def die_after(self, k):
        for i in range(k):
            yield i
        os.kill(os.getpid(), signal.SIGKILL)
        yield -1

    def pid(self):
        return os.getpid()

    async def endless(self):
        i = 0
        while True:
            yield i
            i += 1
            await asyncio.sleep(0)


def drain(gen):
    return [ray.get(r, timeout=T) for r in gen]


def test_task_and_actor_generators_in_order(rt):
    g = count.remote(50)
    assert isinstance(g, ObjectRefGenerator)
    assert drain(g) == list(range(50))
    s = Streamer.remote()
    assert drain(s.gen.remote(100)) == list(range(100))
    assert drain(s.agen.remote(100)) == list(range(100))
    assert drain(count.options(num_returns="streaming").remote(0)) == []
    with pytest.raises(StopIteration):
        next(count.remote(0))


def test_error_at_index_then_stop(rt):
    for g in (fail_at.remote(10, 3), Streamer.remote().fail_at.remote(10, 3)):
        assert [ray.get(next(g), timeout=T) for _ in range(3)] == [0, 1, 2]
        ref = next(g)
        with pytest.raises(ValueError, match="item 3") as info:
            ray.get(ref, timeout=T)
        assert isinstance(info.value, RayTaskError)
        with pytest.raises(StopIteration):
            next(g)


@pytest.mark.local_only
def test_error_before_first_yield(rt):
    g = fail_at.remote(5, 0)
    with pytest.raises(ValueError):
        ray.get(next(g), timeout=T)
    with pytest.raises(StopIteration):
        next(g)
    with pytest.raises(ValueError):
        ray.get(g.completed(), timeout=T)


@pytest.mark.local_only
def test_ready_check_completed_and_finished(rt):
    s = Streamer.remote()
    g = s.gen.remote(5)
    assert ray.get(g.completed(), timeout=T) is None
    # Everything is reported: next() and get() need no waiting at all.
    assert g.next_ready()
    refs = [next(g) for _ in range(5)]
    assert all(r._e.ready for r in refs)
    assert ray.get(refs) == list(range(5))
    assert not g.next_ready() and g.is_finished()   # exhausted: as in Ray
    with pytest.raises(StopIteration):
        next(g)


def test_next_sync_timeout(rt):
    @ray.remote
    class Slow:
        async def gen(self, event_after):
            yield 0
            await asyncio.Event().wait()   # never set: the stream stalls after item 0
            yield 1
    g = Slow.remote().gen.remote(0)
    assert ray.get(g._next_sync(timeout_s=T), timeout=T) == 0
    r = g._next_sync(timeout_s=0.01)
    assert r.is_nil()
    ray.cancel(g)


def test_wait_on_generators(rt):
    s = Streamer.remote()
    g = s.gen.remote(3)
    ready, not_ready = ray.wait([g], num_returns=1, timeout=T)
    assert ready == [g] and not_ready == []
    assert ray.get(next(g), timeout=T) == 0


def assert_items_then_error(gen, items, error):
    """``gen`` yields ``items``, then a ref that raises ``error``, then ends."""
    assert [ray.get(next(gen), timeout=T) for _ in items] == items
    with pytest.raises(error):
        ray.get(next(gen), timeout=T)
    with pytest.raises(StopIteration):
        next(gen)


@pytest.mark.local_only
def test_actor_death_mid_stream(rt):
    s = Streamer.remote()
    g = s.die_after.remote(3)
    assert_items_then_error(g, [0, 1, 2], RayActorError)


@pytest.mark.local_only
def test_worker_death_mid_stream(rt):
    @ray.remote(max_retries=0)
    def die_after(k):
        for i in range(k):
            yield i
        os.kill(os.getpid(), signal.SIGKILL)
        yield -1
    g = die_after.remote(2)
    assert_items_then_error(g, [0, 1], WorkerCrashedError)


@pytest.mark.local_only
def test_cancel_ends_stream_without_hanging(rt):
    s = Streamer.remote()
    g = s.endless.remote()
    assert ray.get(next(g), timeout=T) == 0
    ray.cancel(g)
    with pytest.raises(TaskCancelledError):
        for ref in g:
            ray.get(ref, timeout=T)
    # The actor is still usable: the cancelled stream stopped on its side.
    assert ray.get(s.pid.remote(), timeout=T) > 0

    @ray.remote
    def endless_task():
        i = 0
        while True:
            yield i
            i += 1
    g2 = endless_task.options(_generator_backpressure_num_objects=4).remote()
    assert ray.get(next(g2), timeout=T) == 0
    ray.cancel(g2)
    with pytest.raises(TaskCancelledError):
        for ref in g2:
            ray.get(ref, timeout=T)
    # The pool worker was released (the producer reports its end even when cancelled).
    from ray_lite._private.process import state
    node = state.node
    assert node.wait_until(lambda: all(w.task is None for w in node.pool.values()), T)
    assert drain(count.remote(3)) == [0, 1, 2]

    # A pool stream busy in its own code is interrupted too.
    @ray.remote(max_retries=0)
    def slow_stream():
        yield 0
        while True:
            pass
    g3 = slow_stream.remote()
    assert ray.get(next(g3), timeout=T) == 0
    ray.cancel(g3)
    with pytest.raises(TaskCancelledError):
        for ref in g3:
            ray.get(ref, timeout=T)
    assert node.wait_until(lambda: all(w.task is None for w in node.pool.values()), T)


def test_backpressure_is_complete_and_bounded(rt):
    @ray.remote
    class Probe:
        def __init__(self):
            self.produced = 0

        def gen(self, n):
            for i in range(n):
                self.produced = i + 1
                yield i

    p = Probe.remote()
    g = p.gen.options(_generator_backpressure_num_objects=2).remote(20)
    out = []
    for ref in g:
        out.append(ray.get(ref, timeout=T))
    assert out == list(range(20))
    g2 = count.options(_generator_backpressure_num_objects=3).remote(30)
    assert drain(g2) == list(range(30))


@pytest.mark.local_only     # Ray acknowledges each item
def test_the_window_is_acknowledged_every_half_window_and_never_exceeded(rt):
    @ray.remote
    class Probe:
        def __init__(self):
            self.produced = 0

        async def gen(self, n):
            for i in range(n):
                self.produced = i + 1
                yield i

        async def count(self):
            return self.produced

    p = Probe.remote()
    g = p.gen.options(_generator_backpressure_num_objects=8).remote(100)

    def held_at():
        # Calls to count() run between the generator's steps: once three
        # answers agree, the generator waits for an acknowledgement.
        seen = []
        while len(seen) < 3 or len(set(seen[-3:])) > 1:
            assert len(seen) < 1000
            seen.append(ray.get(p.count.remote(), timeout=T))
        return seen[-1]

    assert held_at() == 8                   # nothing taken: the whole window
    for i in range(3):
        assert ray.get(next(g), timeout=T) == i
    assert held_at() == 8                   # 3 taken: not yet acknowledged (every 4)
    assert ray.get(next(g), timeout=T) == 3
    assert held_at() == 12                  # 4 taken: acknowledged
    assert [ray.get(r, timeout=T) for r in g] == list(range(4, 100))


def test_ten_concurrent_async_streams(rt):
    @ray.remote
    class Consumer:
        def __init__(self, producer):
            self.producer = producer

        async def one(self):
            out = []
            async for ref in self.producer.agen.remote(1000):
                out.append(await ref)
            return out

        async def run(self):
            results = await asyncio.gather(*[self.one() for _ in range(10)])
            return all(r == list(range(1000)) for r in results), len(results)
    c = Consumer.remote(Streamer.remote())
    assert ray.get(c.run.remote(), timeout=T) == (True, 10)


def test_async_for_in_driver(rt):
    async def main():
        s = Streamer.remote()
        return [await r async for r in s.agen.remote(20)]
    assert asyncio.run(asyncio.wait_for(main(), T)) == list(range(20))


def test_dropped_generator_still_completes(rt):
    s = Streamer.remote()
    done = s.gen.remote(10).completed()
    assert ray.get(done, timeout=T) is None


@pytest.mark.local_only
def test_generator_yielding_unserialisable_item(rt):
    import threading

    @ray.remote
    def bad():
        yield 1
        yield threading.Lock()
    g = bad.remote()
    assert ray.get(next(g), timeout=T) == 1
    with pytest.raises(TypeError, match="serialize"):
        ray.get(next(g), timeout=T)
    with pytest.raises(StopIteration):
        next(g)
