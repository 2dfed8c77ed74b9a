"""Objects: put's copy semantics, lifetime (freed with the last ref, borrowers
give their share back), large objects zero-copy, and owners dying mid-fetch."""
import gc
import os
import signal
import weakref

import pytest

import ray_lite as ray
from ray_lite._private.process import state
from ray_lite.exceptions import ObjectLostError, RayActorError, WorkerCrashedError

# Public API only: these run on Ray too (--backend=ray; see conftest.py).
pytestmark = pytest.mark.both_backends

T = 60


@ray.remote
def identity(x):
    return x


@ray.remote
def total(refs):
    return sum(ray.get(refs))


@ray.remote
def count_refs(refs):
    return len(refs)


@ray.remote
def pass_on(refs):
    # A borrower hands the refs on (splitting its weight) before using them.
    return ray.get(total.remote(refs))


@ray.remote
class Gate:
    """Holds back the tasks that wait on it until ``open`` (no sleeps involved)."""

    def __init__(self):
        import asyncio
        self.event = asyncio.Event()

    async def wait(self):
        await self.event.wait()
        return True

    async def open(self):
        self.event.set()
        return True


@ray.remote
def gated(gate, value):
    # Not ready until the gate opens: a ref surely unready when passed on.
    ray.get(gate.wait.remote())
    return value


@ray.remote
class Holder:
    def __init__(self):
        self.kept = None

    def keep(self, refs):
        self.kept = refs
        return len(refs)

    def drop(self):
        self.kept = None
        return True

    def pass_kept_to(self, other):
        return ray.get(other.keep.remote(self.kept))

    def value_of(self, x):
        return x

    def make_ref(self, n):
        # A ref owned by this actor, to an object only this actor has.
        return [ray.put(bytes(n))]

    def pending_ref(self, gate):
        # A ref owned by this actor whose object is not ready before the gate opens.
        return [gated.remote(gate, 1)]

    def pid(self):
        return os.getpid()

    def lend_unfetched(self, gate):
        # A ref this actor owns goes to a task that drops it without a
        # fetch: that worker has no link to us, its share comes back
        # through the driver.
        r = gated.remote(gate, 1)
        assert ray.get(count_refs.remote([r])) == 1
        node = state.node
        released = node.wait_until(lambda: r._id not in node.objects.exported, T)
        return released, r._id in node.objects.exported


def _objects_lent(node):
    """The ids of our objects that other processes hold a share of (actors'
    leases, held by the handles we passed, aside)."""
    from ray_lite._private.actors.lease import _ActorLease
    return {oid for oid, rec in node.objects.exported.items() if type(rec[0]) is not _ActorLease}


def _drained(node):
    """Drive the links until no other process holds a share of our objects."""
    return node.wait_until(lambda: not _objects_lent(node), T)


@pytest.mark.local_only
def test_put_stores_a_copy(rt):
    value = {"a": [1, 2]}
    ref = ray.put(value)
    value["a"].append(3)
    value["b"] = 0
    assert ray.get(ref) == {"a": [1, 2]}
    # Each get is a fresh copy: mutating one does not change the next.
    first = ray.get(ref)
    first["a"].clear()
    assert ray.get(ref) == {"a": [1, 2]}
    # Immutable values need no copy.
    s = "x" * 100
    assert ray.get(ray.put(s)) is s


def test_put_numpy_is_a_snapshot_read_zero_copy(rt):
    np = pytest.importorskip("numpy")
    a = np.arange(1 << 16, dtype=np.int64)      # 512 KiB: stored out of band
    ref = ray.put(a)
    a[:] = -1
    got = ray.get(ref)
    assert got[0] == 0 and got[-1] == (1 << 16) - 1
    assert not got.flags.writeable       # a view of the stored copy, as in Ray
    again = ray.get(ref)
    assert np.shares_memory(got, again)  # both views of the one stored copy


@ray.remote
def writeable(a):
    return a.flags.writeable


@ray.remote
def zeros(n):
    return {"a": __import__("numpy").zeros(n)}


@ray.remote
def zeros_stream(n):
    yield __import__("numpy").zeros(n)


@ray.remote
class ArrayActor:
    def writeable(self, a):
        return a.flags.writeable

    def zeros(self, n):
        return __import__("numpy").zeros(n)


@pytest.mark.parametrize("n", [10, 1 << 17], ids=["small", "large"])
def test_numpy_arrays_arrive_read_only_on_every_path(rt, n):
    # As Ray's: what get returns and what a task is passed are read-only
    # views (small arrays too), so a program that writes into one fails
    # here as it would on Ray instead of only after moving there.
    np = pytest.importorskip("numpy")
    actor = ArrayActor.remote()
    got = {
        "put": ray.get(ray.put(np.zeros(n))),
        "task result": ray.get(zeros.remote(n), timeout=T)["a"],
        "actor result": ray.get(actor.zeros.remote(n), timeout=T),
        "stream item": ray.get(next(zeros_stream.remote(n)), timeout=T),
    }
    for path, value in got.items():
        assert value.shape == (n,) and not value.flags.writeable, path
        with pytest.raises(ValueError, match="read-only"):
            value[0] = 1
    assert ray.get([writeable.remote(np.zeros(n)), writeable.remote(ray.put(np.zeros(n))),
                    actor.writeable.remote(np.zeros(n))], timeout=T) == [False] * 3
    mine = np.zeros(n)
    ray.get(writeable.remote(mine), timeout=T)
    assert mine.flags.writeable     # the caller's own array is not touched


@pytest.mark.local_only
def test_put_keeps_refs_inside_alive(rt):
    inner = ray.put([1, 2, 3])
    entry = weakref.ref(inner._e)
    outer = ray.put({"inner": inner})
    del inner
    gc.collect()
    assert entry() is not None           # the outer object holds it
    assert ray.get(ray.get(outer)["inner"]) == [1, 2, 3]
    # A task gets the nested ref (ready: its value travels with it).
    assert ray.get(identity.remote([ray.get(outer)["inner"]]), timeout=T)[0] == \
        ray.get(outer)["inner"]
    del outer
    gc.collect()
    assert entry() is None


def test_put_refuses_what_cannot_be_serialised(rt):
    import threading
    with pytest.raises(TypeError, match="put"):
        ray.put(threading.Lock())


@pytest.mark.local_only
def test_objects_are_freed_with_their_last_ref(rt):
    node = rt
    entries = []
    for i in range(200):
        r = ray.put([i] * 10)
        assert ray.get(r) == [i] * 10
        t = identity.remote(i)
        assert ray.get(t, timeout=T) == i
        entries.append(weakref.ref(r._e))
        entries.append(weakref.ref(t._e))
    del r, t
    gc.collect()
    assert all(e() is None for e in entries)
    assert node.objects.object_table_size() == 0


@pytest.mark.local_only
def test_memory_stays_flat_over_a_long_put_get_loop(rt):
    node = rt
    gc.collect()
    baseline = len(gc.get_objects())
    for i in range(3000):
        ref = ray.put({"i": i, "payload": [i] * 8})
        assert ray.get(ref)["i"] == i
        assert ray.get(identity.remote(ref), timeout=T)["i"] == i
    del ref
    gc.collect()
    assert node.objects.object_table_size() == 0
    # Nothing accumulates per iteration (a few hundred objects of slack for
    # caches that warm up, against 3000 iterations x several objects each).
    assert len(gc.get_objects()) - baseline < 500


@pytest.mark.local_only
def test_borrowers_give_their_share_back(rt):
    node = rt
    gate = Gate.remote()
    h = Holder.remote()
    refs = [gated.remote(gate, i) for i in range(4)]
    # Unready refs leave the driver inside arguments, through a chain of
    # borrowers, and into an actor that keeps them.
    r1 = total.remote(refs[:2])
    r2 = pass_on.remote(refs[2:])
    kept = h.keep.remote(refs)
    assert ray.get(kept, timeout=T) == 4
    assert _objects_lent(node) == {r._id for r in refs}
    ray.get(gate.open.remote(), timeout=T)
    assert ray.get([r1, r2], timeout=T) == [1, 5]
    # The actor still holds its refs: their objects must stay exported.
    assert ray.get(h.drop.remote(), timeout=T)
    assert _drained(node), f"still lent: {_objects_lent(node)}"
    assert ray.get(refs, timeout=T) == [0, 1, 2, 3]


@pytest.mark.local_only
def test_a_borrower_killed_while_it_holds_refs_gives_their_share_back(rt):
    # Its share cannot come back from the dead process: the owner takes
    # back what the borrower reported holding (reported before the call ran).
    node = rt
    gate = Gate.remote()
    h = Holder.remote()
    refs = [gated.remote(gate, i) for i in range(3)]
    assert ray.get(h.keep.remote(refs), timeout=T) == 3
    assert _objects_lent(node) == {r._id for r in refs}
    os.kill(ray.get(h.pid.remote(), timeout=T), signal.SIGKILL)
    with pytest.raises(RayActorError):
        ray.get(h.pid.remote(), timeout=T)
    assert _drained(node), f"still lent: {_objects_lent(node)}"
    ray.get(gate.open.remote(), timeout=T)
    assert ray.get(refs, timeout=T) == [0, 1, 2]


@pytest.mark.local_only
def test_a_borrower_killed_after_passing_refs_on_gives_back_only_what_it_kept(rt):
    node = rt
    gate = Gate.remote()
    first, second = Holder.remote(), Holder.remote()
    refs = [gated.remote(gate, i) for i in range(2)]
    assert ray.get(first.keep.remote(refs), timeout=T) == 2
    assert ray.get(first.pass_kept_to.remote(second), timeout=T) == 2
    peer = first._info.actor_id
    assert peer in node.objects.holders             # it reported what it received
    os.kill(ray.get(first.pid.remote(), timeout=T), signal.SIGKILL)
    with pytest.raises(RayActorError):
        ray.get(first.pid.remote(), timeout=T)
    # Its death handled (what it held taken back), the second holder's
    # share still keeps the objects lent.
    assert node.wait_until(lambda: peer not in node.objects.holders, T)
    assert _objects_lent(node) == {r._id for r in refs}
    assert all(w > 0 for held in node.objects.holders.values() for w in held.values())
    assert ray.get(second.drop.remote(), timeout=T)
    assert _drained(node), f"still lent: {_objects_lent(node)}"
    assert not {oid for held in node.objects.holders.values() for oid in held} & {r._id for r in refs}


@pytest.mark.local_only
def test_actor_call_with_an_unready_ref_argument(rt):
    node = rt
    gate = Gate.remote()
    h = Holder.remote()
    pending = gated.remote(gate, 41)
    out = h.value_of.remote(pending)         # resolved in the actor before the call
    ray.get(gate.open.remote(), timeout=T)
    assert ray.get(out, timeout=T) == 41
    assert _drained(node)


@pytest.mark.local_only
def test_borrower_without_a_link_gives_back_through_the_driver(rt):
    gate = Gate.remote()
    h = Holder.remote()
    assert ray.get(h.lend_unfetched.remote(gate), timeout=T) == (True, False)
    ray.get(gate.open.remote(), timeout=T)


@pytest.mark.local_only
def test_large_result_is_zero_copy(rt):
    np = pytest.importorskip("numpy")
    from ray_lite._fast import shm

    @ray.remote
    def make(n):
        return np.full(n, 7, dtype=np.uint8)
    a = ray.get(make.remote(8 << 20), timeout=T)
    assert a.shape == (8 << 20,) and int(a[0]) == 7 and int(a[-1]) == 7
    # The array's memory is the shared segment the worker wrote: no copy.
    start = a.__array_interface__["data"][0]
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= start and start + a.nbytes <= hi:
                break
        else:
            pytest.fail("the array lies in no mapping")
    assert fields[1].startswith("r--s") and fields[5].startswith(shm.segment_path(rt.shm_prefix))


@pytest.mark.local_only
def test_large_stream_items_survive_the_producer_being_killed(rt):
    np = pytest.importorskip("numpy")

    @ray.remote(max_retries=0)
    def produce(n):
        for i in range(2):
            yield np.full(n, i + 1, dtype=np.uint8)
        os.kill(os.getpid(), signal.SIGKILL)
        yield None
    g = produce.remote(4 << 20)
    first, second = ray.get(next(g), timeout=T), ray.get(next(g), timeout=T)
    with pytest.raises(WorkerCrashedError):
        ray.get(next(g), timeout=T)
    # Zero-copy views stay valid after the producer is gone.
    assert int(first.sum()) == 4 << 20 and int(second[-1]) == 2


def test_owner_killed_during_get_of_a_large_object(rt):
    h = Holder.remote()
    (ref,) = ray.get(h.make_ref.remote(8 << 20), timeout=T)
    assert len(ray.get(ref, timeout=T)) == 8 << 20      # fetched from the actor
    # An object the actor owns and will never finish: get waits on the
    # owner, which is killed under it.
    gate = Gate.remote()
    (never,) = ray.get(h.pending_ref.remote(gate), timeout=T)
    pid = ray.get(h.pid.remote(), timeout=T)
    ready, _ = ray.wait([never], timeout=0.05)
    assert ready == []
    os.kill(pid, signal.SIGKILL)
    with pytest.raises((ObjectLostError, RayActorError)):
        ray.get(never, timeout=T)
    # What was fetched before stays valid; the driver still works.
    assert ray.get(identity.remote(3), timeout=T) == 3


@pytest.mark.local_only
def test_a_failing_ready_callback_does_not_cost_the_others_theirs():
    from ray_lite._private.objects.refs import _Entry
    e = _Entry()
    seen = []

    def bad(_e):
        raise RuntimeError("callback failed")
    e.add_callback(lambda _e: seen.append("first"))
    e.add_callback(bad)
    e.add_callback(lambda _e: seen.append("third"))
    with pytest.raises(RuntimeError, match="callback failed"):
        e.set_value(1)
    assert seen == ["first", "third"]


def test_a_ref_as_an_asyncio_future(rt):
    # Ray's ref.as_future(): an asyncio Future of the running loop; a failed
    # task's error comes out of it.
    import asyncio

    @ray.remote
    def fails():
        raise KeyError("no")

    async def main():
        fut = ray.put(41).as_future()
        assert isinstance(fut, asyncio.Future)
        value = await fut
        with pytest.raises(KeyError):
            await fails.remote().as_future()
        return value
    assert asyncio.run(asyncio.wait_for(main(), 30)) == 41
