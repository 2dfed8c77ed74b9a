"""ray_lite.util.queue.Queue: Ray's semantics, between any processes."""
import asyncio
import pickle
import queue as stdlib_queue
import time

import pytest

import ray_lite
from ray_lite.exceptions import RayActorError, RayError
from ray_lite.util.queue import Empty, Full, Queue

# Public API only: these run on Ray too (--backend=ray; see conftest.py).
pytestmark = pytest.mark.both_backends


@ray_lite.remote
def put_all(q, items):
    for item in items:
        q.put(item)
    return len(items)


@ray_lite.remote
def get_n(q, n):
    return [q.get(timeout=30) for _ in range(n)]


@ray_lite.remote
def kill_when_someone_waits(q, deadline_s):
    # Polls the owner (bounded) until a get is blocked on it, then kills it.
    end = time.monotonic() + deadline_s
    while ray_lite.get(q.actor.waiters.remote())[0] == 0:
        if time.monotonic() > end:
            return False
    ray_lite.kill(q.actor)
    return True


@ray_lite.remote
class Consumer:
    def __init__(self, q):
        self.q = q

    def take(self, n):
        return [self.q.get(timeout=30) for _ in range(n)]


@ray_lite.remote
class AsyncUser:
    async def round_trip(self, q, items):
        for item in items:
            await q.put_async(item)
        return [await q.get_async(timeout=30) for _ in items]

    async def get_empty(self, q):
        try:
            await q.get_async(timeout=0.05)
        except Empty:
            return "empty"

    async def put_full(self, q):
        try:
            await q.put_async("x", block=False)
        except Full:
            return "full"


def test_errors_are_the_stdlib_queue_errors():
    assert issubclass(Empty, stdlib_queue.Empty)
    assert issubclass(Full, stdlib_queue.Full)


def test_fifo_and_sizes(rt):
    q = Queue(maxsize=3)
    assert q.empty() and not q.full() and q.size() == 0 and len(q) == 0
    for item in ["a", {"b": 1}, (2, 3)]:
        q.put(item)
    assert q.full() and q.qsize() == 3 and len(q) == 3
    assert [q.get(), q.get(), q.get()] == ["a", {"b": 1}, (2, 3)]
    assert q.empty()


def test_full_with_and_without_timeout(rt):
    q = Queue(maxsize=1)
    q.put(1)
    with pytest.raises(Full):
        q.put_nowait(2)
    with pytest.raises(Full):
        q.put(2, block=False)
    with pytest.raises(Full):
        q.put(2, timeout=0.05)
    with pytest.raises(stdlib_queue.Full):
        q.put(2, block=True, timeout=0)
    assert q.get() == 1 and q.empty()   # nothing that failed went in


def test_empty_with_and_without_timeout(rt):
    q = Queue()
    with pytest.raises(Empty):
        q.get_nowait()
    with pytest.raises(Empty):
        q.get(block=False)
    with pytest.raises(Empty):
        q.get(timeout=0.05)
    with pytest.raises(stdlib_queue.Empty):
        q.get(timeout=0)
    q.put("late")
    assert q.get(timeout=30) == "late"


def test_negative_timeouts_are_refused(rt):
    q = Queue()
    with pytest.raises(ValueError):
        q.put(1, timeout=-1)
    with pytest.raises(ValueError):
        q.get(timeout=-0.5)


@pytest.mark.local_only
def test_batches_go_in_and_out_whole(rt):
    q = Queue(maxsize=3)
    q.put_nowait_batch([1, 2])
    with pytest.raises(Full):
        q.put_nowait_batch([3, 4])
    assert q.qsize() == 2
    with pytest.raises(Empty):
        q.get_nowait_batch(3)
    assert q.get_nowait_batch(2) == [1, 2]
    assert q.get_nowait_batch(0) == []
    q.put_nowait_batch(x for x in "ab")
    assert q.get_nowait_batch(2) == ["a", "b"]


def test_batch_arguments_are_checked(rt):
    q = Queue()
    with pytest.raises(TypeError):
        q.put_nowait_batch(5)
    with pytest.raises(TypeError):
        q.get_nowait_batch("2")
    with pytest.raises(ValueError):
        q.get_nowait_batch(-1)


def test_a_blocked_get_is_woken_by_a_put_from_a_task(rt):
    q = Queue()
    producer = put_all.remote(q, list(range(50)))
    assert [q.get(timeout=30) for _ in range(50)] == list(range(50))
    assert ray_lite.get(producer, timeout=30) == 50


def test_a_blocked_put_is_released_by_a_get(rt):
    q = Queue(maxsize=1)
    q.put("first")
    producer = put_all.remote(q, ["second"])     # blocks: the queue is full
    assert q.get(timeout=30) == "first"
    assert q.get(timeout=30) == "second"
    assert ray_lite.get(producer, timeout=30) == 1


def test_shared_with_an_actor_by_passing_it(rt):
    q = Queue()
    consumer = Consumer.remote(q)
    taken = consumer.take.remote(3)
    for item in ("x", "y", "z"):
        q.put(item)
    assert ray_lite.get(taken, timeout=30) == ["x", "y", "z"]
    # A copy (pickled) talks to the same owner.
    copy = pickle.loads(pickle.dumps([q]))[0]
    copy.put(7)
    assert q.get(timeout=30) == 7
    assert copy.maxsize == q.maxsize


def test_two_tasks_talk_through_it(rt):
    q = Queue(maxsize=4)
    consumer = get_n.remote(q, 20)
    producer = put_all.remote(q, list(range(20)))
    assert ray_lite.get(consumer, timeout=30) == list(range(20))
    assert ray_lite.get(producer, timeout=30) == 20


def test_numpy_items_come_out_read_only(rt):
    # As from Ray's queue, an actor: an item is a copy, and its arrays are
    # read-only whether it went through the shared ring or the owner.
    np = pytest.importorskip("numpy")
    q = Queue()
    ray_lite.get(put_all.remote(q, [np.arange(3), np.zeros(1 << 17)]), timeout=30)
    q.put(np.arange(4))
    items = [q.get(timeout=30) for _ in range(3)]
    assert [len(a) for a in items] == [3, 1 << 17, 4]
    assert not any(a.flags.writeable for a in items)


@pytest.mark.local_only
def test_async_put_and_get_in_an_async_actor(rt):
    q = Queue(maxsize=1)
    user = AsyncUser.remote()
    assert ray_lite.get(user.round_trip.remote(q, [1]), timeout=30) == [1]
    assert ray_lite.get(user.get_empty.remote(q), timeout=30) == "empty"
    q.put("occupied")
    assert ray_lite.get(user.put_full.remote(q), timeout=30) == "full"


@pytest.mark.local_only
def test_async_put_and_get_from_the_driver(rt):
    q = Queue()

    async def main():
        await q.put_async("a")
        await q.put_async("b", timeout=1)
        first = await q.get_async()
        second = await q.get_async(block=False)
        with pytest.raises(Empty):
            await q.get_async(timeout=0.01)
        with pytest.raises(ValueError):
            await q.put_async(1, timeout=-1)
        return first, second
    assert asyncio.run(main()) == ("a", "b")


@pytest.mark.local_only
def test_a_dead_owner_raises(rt):
    q = Queue()
    q.put(1)
    ray_lite.kill(q.actor)
    with pytest.raises(RayActorError):
        q.get()
    with pytest.raises(RayActorError):
        q.put(2)
    with pytest.raises(RayActorError):
        q.qsize()


@pytest.mark.local_only
def test_a_get_blocked_when_the_owner_dies_raises(rt):
    q = Queue()
    killer = kill_when_someone_waits.remote(q, 30)
    with pytest.raises(RayActorError):
        q.get(timeout=60)
    assert ray_lite.get(killer, timeout=30) is True


@pytest.mark.local_only
def test_a_task_blocked_when_the_owner_dies_fails(rt):
    q = Queue()
    consumer = get_n.remote(q, 1)
    assert ray_lite.get(kill_when_someone_waits.remote(q, 30), timeout=60) is True
    with pytest.raises(RayError):
        ray_lite.get(consumer, timeout=60)


@pytest.mark.local_only
def test_shutdown_ends_the_owner(rt):
    q = Queue()
    q.put(1)
    owner = q.actor
    q.shutdown()
    assert q.actor is None and owner is not None    # as Ray's
    with pytest.raises(RayActorError):
        q.get(timeout=1)
    q.shutdown()            # twice: nothing more to do
    forced = Queue()
    forced.shutdown(force=True)
    with pytest.raises(RayActorError):
        forced.put(1)


@pytest.mark.local_only
def test_actor_options_reach_the_owner(rt):
    q = Queue(actor_options={"name": "shared-queue"})
    q.put("hello")
    same = ray_lite.get_actor("shared-queue")
    assert ray_lite.get(same.get.remote(None)) == (True, "hello")
