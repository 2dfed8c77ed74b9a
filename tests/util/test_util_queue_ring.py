"""util.queue.Queue's shared-memory ring: the direct path, what falls back to
the owner, and what a dead owner leaves behind (ray_lite's runtime only)."""
import fcntl
import os
import pickle
import select
import subprocess
import sys
import threading

import pytest

import ray_lite
from ray_lite._fast import shm
from ray_lite.exceptions import RayActorError, RayError
from ray_lite.util._queue_ring import QueueRing
from ray_lite.util.queue import Empty, Queue
from serve_helpers import wait_until
from test_util_queue import Consumer, put_all

BIG = 400 * 1024        # over the ring's item limit (a quarter of 1 MiB)


def _ring(q):
    ring = q._direct()
    assert ring is not None
    return ring


@ray_lite.remote
def get_nowait_in_a_task(q):
    return q.get_nowait()


@ray_lite.remote
def kill_owner(q):
    ray_lite.kill(q.actor)
    return True


# --------------------------------------------------------- the ring alone
@pytest.fixture
def small_ring():
    ring = QueueRing.create(f"{shm.DEFAULT_PREFIX}test{os.getpid()}_", capacity=4096)
    try:
        yield ring
    finally:
        ring.close()


def test_ring_keeps_order_across_the_wrap(small_ring):
    ring = small_ring
    sizes = [1, 7, 8, 9, 100, 1000, 1023, 0, 17, 999] * 20
    backlog = []
    for i, n in enumerate(sizes):
        data = bytes([i % 251]) * n
        with ring:
            assert ring.push(data)
            backlog.append(data)
            if len(backlog) > 2:
                assert ring.pop() == backlog.pop(0)
    with ring:
        while backlog:
            assert ring.pop() == backlog.pop(0)
        assert ring.state()[0] == 0


def test_ring_refuses_what_does_not_fit(small_ring):
    ring = small_ring
    with ring:
        assert not ring.push(b"x" * (ring.item_limit + 1))
        pushed = 0
        while ring.push(b"y" * 1000):
            pushed += 1
        assert pushed == 4096 // 1008 and ring.state()[0] == pushed
        assert ring.pop() == b"y" * 1000
        assert ring.push(b"z" * 1000)       # the freed room is used again


def test_ring_fast_paths_defer_to_waiters_and_overflow(small_ring):
    ring = small_ring
    assert ring.try_put(b"a", 0) and ring.try_get() == b"a"
    assert ring.try_get() is None
    with ring:
        ring.add_getters(1)
    assert not ring.try_put(b"b", 0)        # a get waits in the owner: it gets the item
    with ring:
        ring.add_getters(-1)
        ring.set_overflow(1)
    assert not ring.try_put(b"b", 0)        # would overtake the owner's items
    with ring:
        ring.set_overflow(0)
    assert ring.try_put(b"b", 1) and not ring.try_put(b"c", 1)     # maxsize 1
    with ring:
        ring.add_putters(1)
    assert ring.try_get() is None           # a put waits in the owner for this room
    with ring:
        ring.add_putters(-1)
        ring.set_closed()
    assert ring.try_get() is None and ring.size() is None


def test_ring_spins_answer_at_once_when_the_owner_must_decide(small_ring):
    ring = small_ring
    assert not ring.spin_until_items()          # nothing came: ask the owner
    assert ring.spin_until_room(1)
    assert ring.try_put(b"a", 1)
    assert ring.spin_until_items() and not ring.spin_until_room(1)
    with ring:
        ring.set_overflow(1)
    assert not ring.spin_until_room(5)          # the owner's items go first
    with ring:
        ring.pop()
    assert not ring.spin_until_items()          # only the owner holds items


def test_a_mapping_unlinks_nothing_and_the_owner_unlinks_on_close():
    ring = QueueRing.create(f"{shm.DEFAULT_PREFIX}test{os.getpid()}_", capacity=4096)
    other = QueueRing.attach(ring.name, os.getpid())
    assert other.try_put(b"shared", 0) and ring.try_get() == b"shared"
    other.close()
    assert os.path.exists(shm.segment_path(ring.name))
    ring.close()
    ring.close()
    assert not os.path.exists(shm.segment_path(ring.name))


HOLD_THE_LOCK = """
import sys
from ray_lite.util._queue_ring import QueueRing
ring = QueueRing.attach(sys.argv[1], int(sys.argv[2]))
ring.lock()
print("locked", flush=True)
sys.stdin.read()
"""


def test_a_process_killed_holding_the_lock_blocks_nobody(small_ring):
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD_THE_LOCK, small_ring.name, str(os.getpid())],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        assert ready and proc.stdout.readline().strip() == "locked"
        with pytest.raises(BlockingIOError):     # it does hold the lock
            fcntl.flock(small_ring._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        proc.kill()
        proc.wait(60)
        proc.stdin.close()
        proc.stdout.close()
    assert small_ring.try_put(b"after", 0) and small_ring.try_get() == b"after"


# ------------------------------------------------------ through the Queue
def test_a_put_with_room_and_a_get_go_through_the_ring(rt):
    q = Queue()
    q.put("direct")
    assert _ring(q).state()[:2] == (1, 0)     # in the ring, nothing held by the owner
    assert q.qsize() == 1 and not q.empty()
    assert q.get() == "direct" and q.empty()


def test_an_expired_get_leaves_the_direct_path_usable(rt):
    q = Queue()
    with pytest.raises(Empty):
        q.get(timeout=0.05)                 # waited in the owner
    assert _ring(q).state()[2] == 0         # no waiter counted any more
    q.put(1)
    assert _ring(q).state()[0] == 1


def test_large_items_wait_in_the_owner_in_order(rt):
    q = Queue()
    items = ["a", b"x" * BIG, "b", {"big": b"y" * BIG}, "c"]
    assert ray_lite.get(put_all.remote(q, items), timeout=60) == len(items)
    assert q.qsize() == len(items)
    assert [q.get(timeout=30) for _ in items] == items
    assert _ring(q).state()[:2] == (0, 0)
    q.put("small again")
    assert _ring(q).state()[0] == 1         # the direct path is back


def test_an_unbounded_queue_outgrows_its_ring(rt):
    q = Queue()
    items = [bytes([i]) * 100_000 for i in range(30)]    # 3 MB through a 1 MiB ring
    for item in items:
        q.put(item)
    assert q.qsize() == 30 and _ring(q).state()[1] > 0
    assert [q.get(timeout=30) for _ in items] == items
    assert q.empty()


def test_producers_and_consumers_in_several_processes(rt):
    q = Queue(maxsize=5)        # small: puts also wait in the owner
    n = 150
    consumers = [Consumer.remote(q) for _ in range(2)]
    taken = [c.take.remote(n) for c in consumers]
    producers = [put_all.remote(q, [(p, i) for i in range(n)]) for p in range(2)]
    assert ray_lite.get(producers, timeout=120) == [n, n]
    got = ray_lite.get(taken, timeout=120)
    for seq in got:             # FIFO: each producer's items in the order put
        for p in range(2):
            mine = [i for (pp, i) in seq if pp == p]
            assert mine == sorted(mine)
    assert sorted(x for seq in got for x in seq) == [(p, i) for p in range(2) for i in range(n)]
    assert q.empty()


def test_threads_of_one_process_share_its_mapping(rt):
    q = Queue()
    copy = pickle.loads(pickle.dumps(q))
    assert _ring(copy) is _ring(q)
    got, errors = [], []

    def work(k):
        try:
            for i in range(200):
                (q if i % 2 else copy).put((k, i))
            for _ in range(200):
                got.append(q.get(timeout=30))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and not any(t.is_alive() for t in threads)
    assert sorted(got) == [(k, i) for k in range(4) for i in range(200)]


def test_an_owner_killed_elsewhere_raises_and_its_ring_goes(rt):
    q = Queue()
    q.put("left behind")
    ring = _ring(q)
    path = shm.segment_path(ring.name)
    assert os.path.exists(path)
    assert ray_lite.get(kill_owner.remote(q), timeout=30)
    wait_until(lambda: not ring.owner_alive(), "the owner's death to show")
    with pytest.raises(RayActorError):
        q.get_nowait()
    with pytest.raises(RayActorError):
        q.put(1)
    wait_until(lambda: not os.path.exists(path), f"{path} to go")


def test_shutdown_closes_the_ring_for_every_copy(rt):
    q = Queue()
    q.put(1)
    ring = _ring(q)
    q.shutdown()
    assert ring.state()[4] == 1             # closed: copies stop using the ring
    with pytest.raises(RayError):
        ray_lite.get(get_nowait_in_a_task.remote(q), timeout=60)
