"""The shared-memory object store: large values written once, mapped zero-copy by readers."""
import gc
import os
import signal
import sys
import time

import numpy as np
import pytest

import ray_lite as ray
from ray_lite._fast import shm
from ray_lite._private.objects import object_store, spill as spill_files
from ray_lite.exceptions import ObjectLostError, ObjectStoreFullError
from test_core_objects import Gate

BIG = 4 * object_store.STORE_THRESHOLD // 8        # float64 items: 4x the threshold


def big_array(seed=1):
    return np.arange(BIG, dtype=np.float64) * seed


def stored_segments(node):
    return set(shm.list_segments(node.shm_prefix + "o"))


def wait_until(predicate, timeout=30.0):
    """Poll ``predicate`` (a file-system look) until it holds; bounded."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        gc.collect()
        time.sleep(0.01)
    return True


def data_address(arr):
    return arr.__array_interface__["data"][0]


def mapped_files():
    with open("/proc/self/maps") as f:
        return f.read()


def mapping_of(arr):
    """What a reader sees: is the array read-only, and which file maps its data?"""
    name = None
    for line in mapped_files().splitlines():
        fields = line.split()
        lo, hi = (int(x, 16) for x in fields[0].split("-"))
        if lo <= data_address(arr) < hi:
            name = fields[5] if len(fields) > 5 else None
    return arr.flags.writeable, name, float(arr[-1])


@ray.remote
def describe(arr):
    return (*mapping_of(arr), arr.nbytes)


@ray.remote
class Holder:
    def __init__(self):
        self.kept = self.kept_ref = None

    def keep(self, refs):
        self.kept_ref = refs[0]
        self.kept = ray.get(refs[0])
        return float(self.kept[-1])

    def drop_ref(self):
        self.kept_ref = None
        gc.collect()
        return float(self.kept[-1])

    def drop(self):
        self.kept = self.kept_ref = None
        gc.collect()
        return True

    def ping(self):
        return True

    def pid(self):
        return os.getpid()

    def put_big(self, seed):
        return [ray.put(big_array(seed))]

    def describe(self, arr):
        return (*mapping_of(arr), arr.nbytes)

    def pass_on(self, other):
        """Hand the kept ref on to the actor ``other`` (it keeps it and a view)."""
        return ray.get(other.keep.remote([self.kept_ref]))

    def keep_and_mark(self, refs, mark):
        kept = self.keep(refs)
        open(mark, "w").close()
        return kept

    def pass_on_and_exit(self, other, mark):
        """Hand the kept ref on, then die once ``other`` mapped it, before this
        process drains its links again (where it would report the hand-over)."""
        other.keep_and_mark.remote([self.kept_ref], mark)
        deadline = time.monotonic() + 30
        while not os.path.exists(mark) and time.monotonic() < deadline:
            time.sleep(0.005)        # not a drain: nothing is reported meanwhile
        os._exit(1)

    def kept_sum(self):
        return None if self.kept is None else float(self.kept.sum())

    def describe_kept(self):
        return ray.get(describe.remote(self.kept_ref))


@ray.remote
def make_big(seed):
    return big_array(seed)


def pooled_segments(node):
    return set(shm.list_segments(node.shm_prefix + "p"))


def test_small_values_stay_off_the_store(rt):
    before = stored_segments(rt)
    ref = ray.put(np.arange(16))
    assert stored_segments(rt) == before
    assert ray.get(ref).tolist() == list(range(16))


def test_put_get_is_zero_copy_and_read_only(rt):
    a = big_array(3)
    ref = ray.put(a)
    assert len(stored_segments(rt)) == 1
    x, y = ray.get(ref), ray.get(ref)
    assert data_address(x) == data_address(y)      # both views of the one stored copy
    assert not x.flags.writeable
    with pytest.raises(ValueError):
        x[0] = 1.0
    a[0] = -1.0                                      # put took a snapshot
    assert x[0] == 0.0 and np.array_equal(x[1:], a[1:])


def test_a_task_maps_the_stored_segment(rt):
    ref = ray.put(big_array(2))
    name = next(iter(stored_segments(rt)))
    writeable, mapped, last, nbytes = ray.get(describe.remote(ref))
    assert writeable is False
    assert mapped == shm.segment_path(name)
    assert last == 2.0 * (BIG - 1) and nbytes == BIG * 8


def test_an_actor_maps_a_ref_it_receives(rt):
    ref = ray.put(big_array(5))
    h = Holder.remote()
    assert ray.get(h.keep.remote([ref])) == 5.0 * (BIG - 1)
    # A ref at top level is resolved too (not inlined as a copy by the caller).
    assert ray.get(Holder.remote().keep.remote([ref])) == 5.0 * (BIG - 1)


def put_and_hand_to_an_actor(node, value):
    """``put`` a large value, give its ref to a new ``Holder`` and drop ours:
    the segment's path and the holder."""
    ref = ray.put(value)
    (name,) = stored_segments(node)
    h = Holder.remote()
    ray.get(h.keep.remote([ref]))
    del ref
    gc.collect()
    return shm.segment_path(name), h


def test_segment_freed_when_the_last_ref_anywhere_is_gone(rt):
    path, h = put_and_hand_to_an_actor(rt, big_array())
    assert ray.get(h.ping.remote())
    assert os.path.exists(path)                     # the actor still holds it
    assert ray.get(h.drop.remote())
    ray.get(h.ping.remote())                        # its release goes out at its next drain
    assert wait_until(lambda: not os.path.exists(path))


def test_a_view_keeps_the_object_until_it_is_dropped(rt):
    path, h = put_and_hand_to_an_actor(rt, big_array(9))
    # The actor drops its ref but keeps the array it decoded: as in Ray, the
    # object stays (its segment must not be reused under the view) ...
    assert ray.get(h.drop_ref.remote()) == 9.0 * (BIG - 1)
    ray.get(h.ping.remote())
    assert os.path.exists(path)
    assert ray.get(h.drop_ref.remote()) == 9.0 * (BIG - 1)
    # ... until the view goes too.
    assert ray.get(h.drop.remote())
    ray.get(h.ping.remote())
    assert wait_until(lambda: not os.path.exists(path))


def test_dropping_the_only_ref_frees_at_once(rt):
    ref = ray.put(big_array())
    (name,) = stored_segments(rt)
    del ref
    gc.collect()
    assert not os.path.exists(shm.segment_path(name))


def test_an_object_put_by_a_worker_is_freed_by_its_owner(rt):
    h = Holder.remote()
    (ref,) = ray.get(h.put_big.remote(7))
    (name,) = stored_segments(rt)
    x = ray.get(ref)
    assert not x.flags.writeable and x[-1] == 7.0 * (BIG - 1)
    del ref, x
    gc.collect()
    ray.get(h.ping.remote())
    assert wait_until(lambda: not os.path.exists(shm.segment_path(name)))


def test_past_the_capacity_objects_spill_to_disk_and_come_back():
    ray.init(num_cpus=1, object_store_memory=3 * object_store.STORE_THRESHOLD)
    try:
        node = ray._private.process.state.node
        in_memory = ray.put(np.zeros(object_store.STORE_THRESHOLD // 8))
        assert len(stored_segments(node)) == 1
        spilled = ray.put(big_array(11))
        spill = spill_files.spill_dir(node)
        (name,) = os.listdir(spill)
        assert len(stored_segments(node)) == 1      # not in shared memory
        x = ray.get(spilled)
        assert not x.flags.writeable and x[-1] == 11.0 * (BIG - 1)
        writeable, mapped, last, _ = ray.get(describe.remote(spilled))
        assert mapped == os.path.join(spill, name) and last == 11.0 * (BIG - 1)
        del spilled, x
        gc.collect()
        assert wait_until(lambda: not os.path.exists(os.path.join(spill, name)))
        assert ray.get(in_memory).nbytes == object_store.STORE_THRESHOLD
    finally:
        ray.shutdown()
    assert not os.path.exists(spill)


def test_store_full_names_the_sizes(monkeypatch):
    ray.init(num_cpus=1, object_store_memory=3 * object_store.STORE_THRESHOLD)
    try:
        room = object_store._room
        monkeypatch.setattr(object_store, "_room",
                            lambda d: room(d) if d == shm.SHM_DIR else 1000)
        keep = ray.put(np.zeros(object_store.STORE_THRESHOLD // 8))
        with pytest.raises(ObjectStoreFullError) as info:
            ray.put(big_array())
        msg = str(info.value)
        asked = int(msg.split("object of ")[1].split()[0])
        assert asked >= BIG * 8 and str(3 * object_store.STORE_THRESHOLD) in msg
        assert "has 1000 bytes free" in msg
        assert ray.get(keep).nbytes == object_store.STORE_THRESHOLD
    finally:
        ray.shutdown()


@pytest.mark.parametrize("bad", [0, -1, 1.5, "1GB", True])
def test_object_store_memory_is_checked(bad):
    with pytest.raises(ValueError):
        ray.init(num_cpus=1, object_store_memory=bad)
    assert not ray.is_initialized()


def test_a_reader_killed_while_it_maps_an_object(rt):
    ref = ray.put(big_array(4))
    (name,) = stored_segments(rt)
    h = Holder.remote()
    assert ray.get(h.keep.remote([ref])) == 4.0 * (BIG - 1)    # keeps the ref and a view
    pid = ray.get(h.pid.remote())       # its report of the weight it holds went out before
    os.kill(pid, signal.SIGKILL)
    # The object is intact for the owner and for other readers.
    assert ray.get(describe.remote(ref))[2] == 4.0 * (BIG - 1)
    assert ray.get(ref)[-1] == 4.0 * (BIG - 1)
    # The dead reader's weight was taken back: the last ref frees it.
    del ref
    gc.collect()
    assert wait_until(lambda: not os.path.exists(shm.segment_path(name)))


def test_a_reader_killed_after_passing_an_object_on_leaves_it_to_the_next_reader(rt):
    # The dead reader's report that it passed half of its share on went out
    # before it died: the owner takes back only what it still held.
    ref = ray.put(big_array(5))
    (name,) = stored_segments(rt)
    b, c = Holder.remote(), Holder.remote()
    assert ray.get(b.keep.remote([ref])) == 5.0 * (BIG - 1)
    assert ray.get(b.pass_on.remote(c)) == 5.0 * (BIG - 1)
    peer = b._info.actor_id
    os.kill(ray.get(b.pid.remote()), signal.SIGKILL)
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(b.ping.remote(), timeout=60)
    assert rt.wait_until(lambda: peer not in rt.objects.holders, 60)    # its death handled
    del ref
    gc.collect()
    # c's share keeps the object: c can still pass it on (to describe).
    assert ray.get(c.kept_sum.remote()) == 5.0 * BIG * (BIG - 1) / 2
    assert ray.get(c.describe_kept.remote())[2] == 5.0 * (BIG - 1)
    assert stored_segments(rt) == {name}
    ray.get(c.drop.remote())
    assert wait_until(lambda: not os.path.exists(shm.segment_path(name)))


def test_a_reader_killed_before_it_reported_passing_an_object_on(rt, tmp_path):
    # It died right after passing the object on: the owner takes back all
    # it had received, the share passed on included, so the count ends
    # while the next reader still has a view.  Its bytes must not change:
    # the segment is only unlinked, neither pooled for the next object nor
    # emptied.
    ref = ray.put(big_array(5))
    (name,) = stored_segments(rt)
    b, c = Holder.remote(), Holder.remote()
    assert ray.get(b.keep.remote([ref])) == 5.0 * (BIG - 1)
    mark = str(tmp_path / "mapped")
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(b.pass_on_and_exit.remote(c, mark), timeout=60)
    assert os.path.exists(mark)
    del ref
    assert wait_until(lambda: not os.path.exists(shm.segment_path(name)))
    assert not pooled_segments(rt)
    again = ray.put(big_array(7))           # would take a pooled segment of this size
    assert name not in stored_segments(rt)
    assert ray.get(c.kept_sum.remote()) == 5.0 * BIG * (BIG - 1) / 2
    assert ray.get(again)[-1] == 7.0 * (BIG - 1)


def test_the_owner_killed_while_readers_hold_views(rt):
    h = Holder.remote()
    pid = ray.get(h.pid.remote())
    (ref,) = ray.get(h.put_big.remote(6))
    view = ray.get(ref)
    (name,) = stored_segments(rt)
    os.kill(pid, signal.SIGKILL)
    # The driver notices the death and unlinks the dead owner's objects...
    assert wait_until(lambda: not os.path.exists(shm.segment_path(name)))
    # ...but what a reader mapped stays valid until it drops it.
    assert view[-1] == 6.0 * (BIG - 1) and float(view.sum()) == 6.0 * BIG * (BIG - 1) / 2
    assert ray.get(ref)[-1] == 6.0 * (BIG - 1)
    # A process that had not mapped it yet cannot any more: the object is lost.
    with pytest.raises(ObjectLostError):
        ray.get(describe.remote(ref))


@ray.remote
def make_big(seed):
    return big_array(seed)


@ray.remote
def first_byte_and_len(data):
    return data[0], len(data)


def test_a_task_result_is_stored_once_and_passed_on_as_is(rt):
    ref = make_big.remote(8)
    ray.get(ref)
    (name,) = stored_segments(rt)                # stored by the worker that made it
    writeable, mapped, last, _ = ray.get(describe.remote(ref))
    assert stored_segments(rt) == {name}
    assert mapped == shm.segment_path(name) and not writeable and last == 8.0 * (BIG - 1)
    # Later readers (top level or nested) map the same segment: no new copy.
    assert ray.get(describe.remote(ref))[1] == mapped
    h = Holder.remote()
    assert ray.get(h.keep.remote([ref])) == 8.0 * (BIG - 1)
    assert stored_segments(rt) == {name}
    assert ray.get(h.drop.remote())
    del ref
    gc.collect()
    assert wait_until(lambda: not os.path.exists(shm.segment_path(name)))


def test_large_bytes_put_travel_through_the_store(rt):
    data = b"\x07" * (2 * object_store.STORE_THRESHOLD)
    ref = ray.put(data)
    assert ray.get(ref) is data                  # immutable: kept by reference
    assert ray.get(first_byte_and_len.remote(ref)) == (7, len(data))
    (name,) = stored_segments(rt)
    del ref
    gc.collect()
    assert wait_until(lambda: not os.path.exists(shm.segment_path(name)))


@ray.remote
def make_big_after(_gate, seed):
    return big_array(seed)


@ray.remote
def describe_nested(refs):
    return mapping_of(ray.get(refs[0]))


def test_a_fetched_large_result_arrives_as_a_mapping(rt):
    gate = Gate.remote()
    big = make_big_after.remote(gate.wait.remote(), 12)
    reader = describe_nested.remote([big])        # sent unready: the reader fetches it
    assert ray.get(gate.open.remote())
    writeable, mapped, last = ray.get(reader)
    (name,) = stored_segments(rt)
    assert mapped == shm.segment_path(name) and last == 12.0 * (BIG - 1)
    assert writeable is False
    del big
    gc.collect()
    assert wait_until(lambda: not os.path.exists(shm.segment_path(name)))


def test_a_result_first_passed_inside_a_list_is_stored(rt):
    ref = make_big.remote(13)
    ray.get(ref)
    writeable, mapped, last = ray.get(describe_nested.remote([ref]))
    (name,) = stored_segments(rt)
    assert mapped == shm.segment_path(name) and last == 13.0 * (BIG - 1) and not writeable
    del ref
    gc.collect()
    assert wait_until(lambda: not os.path.exists(shm.segment_path(name)))


def test_a_large_argument_by_value_is_stored_once_and_mapped(rt):
    h = Holder.remote()
    for seed in (6, 7):
        writeable, mapped, last, nbytes = ray.get(h.describe.remote(big_array(seed)))
        # The worker's array is a read-only view of an object segment, as in Ray.
        assert writeable is False and last == seed * (BIG - 1.0) and nbytes == BIG * 8
        assert mapped.startswith(shm.segment_path(rt.shm_prefix + "o"))
    ray.get(h.ping.remote())           # its releases go out at its next drain
    # No object is left once the calls are done: the segments went back to the pool.
    assert wait_until(lambda: stored_segments(rt) == set())
    assert 1 <= len(pooled_segments(rt)) <= object_store.SegmentPool.MAX_SEGMENTS


def test_large_keyword_and_task_arguments_by_value(rt):
    writeable, mapped, last, _ = ray.get(describe.remote(big_array(3)))
    assert writeable is False and last == 3.0 * (BIG - 1)
    assert mapped.startswith(shm.segment_path(rt.shm_prefix))
    h = Holder.remote()
    assert ray.get(h.describe.remote(arr=big_array(2)))[2] == 2.0 * (BIG - 1)


def test_a_freed_segment_is_reused_under_a_new_name(rt):
    ref = ray.put(big_array(1))
    (first,) = stored_segments(rt)
    inode = os.stat(shm.segment_path(first)).st_ino
    del ref
    gc.collect()
    assert stored_segments(rt) == set()
    ref = ray.put(big_array(2))
    (second,) = stored_segments(rt)
    # The same pages, warm, under a name the old object's descriptor cannot reach.
    assert second != first and os.stat(shm.segment_path(second)).st_ino == inode
    assert ray.get(ref)[-1] == 2.0 * (BIG - 1)


def test_a_view_in_the_owner_keeps_its_segment_from_reuse(rt):
    x = ray.get(ray.put(big_array(4)))       # the ref is gone at once, the view stays
    gc.collect()
    for seed in (5, 6, 7):
        assert ray.get(ray.put(big_array(seed)))[-1] == seed * (BIG - 1.0)
        gc.collect()
    assert x[-1] == 4.0 * (BIG - 1) and np.array_equal(x, big_array(4))


def test_a_large_task_result_is_stored_by_the_worker(rt):
    for seed in (3, 4):
        r = ray.get(make_big.remote(seed))
        writeable, mapped, last = mapping_of(r)
        assert writeable is False and last == seed * (BIG - 1.0)
        assert mapped.startswith(shm.segment_path(rt.shm_prefix + "o"))
        del r
        gc.collect()
    assert wait_until(lambda: stored_segments(rt) == set())


class BroadcastReader:
    def __init__(self, rank, world_size):
        self.rank = rank

    def last(self, arr):
        return float(arr[-1]), arr.nbytes


def test_collective_rpc_writes_a_large_argument_once(monkeypatch):
    from ray_lite.executor import MultiprocExecutor
    ex = MultiprocExecutor(BroadcastReader, world_size=2)
    try:
        written = []
        create = shm.create_segment

        def counting(size, *args, **kwargs):
            written.append(size)
            return create(size, *args, **kwargs)
        monkeypatch.setattr(shm, "create_segment", counting)
        arr = big_array(8)
        assert ex.collective_rpc("last", args=(arr,)) == [(8.0 * (BIG - 1), BIG * 8)] * 2
        # One segment for both workers, not one each.
        assert len(written) == 1 and BIG * 8 <= written[0] < 2 * BIG * 8
    finally:
        ex.shutdown()


@ray.remote
def sum_of_nested_result(seed):
    # The result comes back through the driver (it forwards a nested task's
    # reply): the descriptor must survive the relay.
    arr = ray.get(make_big.remote(seed))
    return float(arr[-1]), arr.flags.writeable


def test_a_large_result_of_a_nested_task_reaches_its_caller(rt):
    assert ray.get(sum_of_nested_result.remote(5)) == (5.0 * (BIG - 1), False)
    assert wait_until(lambda: stored_segments(rt) == set())


def rss_kb_at(address):
    """Resident kB of this process's mapping that holds ``address`` (its page tables' view)."""
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == "Rss:":
                return int(line.split()[1])
    raise LookupError(f"no mapping holds {address:#x}")


@ray.remote
class Reader:
    """Reads stored objects and drops them at once: what ``get`` leaves mapped."""

    def read(self, refs):
        arr = ray.get(refs[0])
        return float(arr.sum()), data_address(arr), object_store.cached_mappings()

    def mappings(self):
        gc.collect()
        return object_store.cached_mappings()

    def rss_kb_at(self, address):
        return rss_kb_at(address)


@ray.remote
class Owner:
    def make(self):
        self.ref = ray.put(big_array(4))
        return [self.ref]


@pytest.mark.local_only
def test_the_driver_unmaps_a_dead_owners_segment_it_kept_idle(rt):
    """The driver keeps the mapping of a segment it read (for the owner's next
    object in it); when the owner dies and its segments are unlinked, the
    driver unmaps it too, so that its pages go at once."""
    gc.collect()
    before = object_store.cached_mappings()
    owner = Owner.remote()
    (ref,) = ray.get(owner.make.remote(), timeout=60)
    arr = ray.get(ref, timeout=60)
    assert float(arr[-1]) == float(big_array(4)[-1])
    del arr, ref        # (the ref's entry holds the value too)
    gc.collect()
    mapped, idle = object_store.cached_mappings()
    assert (mapped, idle) == (before[0] + 1, before[1] + 1)    # kept, idle
    ray.kill(owner)
    assert wait_until(lambda: object_store.cached_mappings() == before)


@pytest.mark.local_only
def test_a_reader_maps_the_next_object_of_a_segment_through_its_idle_mapping(rt):
    r = Reader.remote()
    ref = ray.put(big_array(2))
    (first,) = stored_segments(rt)
    total, addr, counts = ray.get(r.read.remote([ref]))
    assert total == big_array(2).sum() and counts == (1, 0)
    # Its view gone, the reader gives its weight back although it keeps the
    # mapping: the segment is freed (and pooled) as before.
    assert ray.get(r.mappings.remote()) == (1, 1)
    del ref
    assert wait_until(lambda: not stored_segments(rt))
    ref = ray.put(big_array(3))                     # written into the pooled segment
    (second,) = stored_segments(rt)
    assert second != first
    total, addr2, counts = ray.get(r.read.remote([ref]))
    # The new object's bytes, through the same pages of the same mapping.
    assert total == big_array(3).sum() and addr2 == addr and counts == (1, 0)


@pytest.mark.local_only
def test_a_reader_keeps_few_idle_mappings(rt):
    r = Reader.remote()
    refs = [ray.put(big_array(seed)) for seed in range(1, object_store.MAX_IDLE_MAPPINGS + 3)]
    assert len(stored_segments(rt)) == len(refs)    # each in a segment of its own
    for seed, ref in enumerate(refs, 1):
        assert ray.get(r.read.remote([ref]))[0] == big_array(seed).sum()
    n = object_store.MAX_IDLE_MAPPINGS
    assert ray.get(r.mappings.remote()) == (n, n)


@pytest.mark.local_only
def test_an_idle_mapping_keeps_no_pages_of_a_discarded_segment(rt):
    r = Reader.remote()
    ref = ray.put(big_array(4))
    _, addr, _ = ray.get(r.read.remote([ref]))
    assert ray.get(r.rss_kb_at.remote(addr)) >= BIG * 8 // 1024    # every page was read
    del ref
    assert wait_until(lambda: not stored_segments(rt) and pooled_segments(rt))
    object_store.clear_pool()            # the owner discards it (room, shutdown)
    assert not pooled_segments(rt)
    # Still mapped by the reader, idle, but its memory went with the segment.
    assert ray.get(r.mappings.remote()) == (1, 1)
    assert ray.get(r.rss_kb_at.remote(addr)) == 0


def test_views_in_the_owner_and_after_reuse_stay_read_only(rt):
    ref = ray.put(big_array(5))
    x = ray.get(ref)
    assert x.base is not None and not x.flags.writeable
    with pytest.raises(ValueError):
        x[0] = 1.0
    del x, ref
    gc.collect()
    y = ray.get(ray.put(big_array(6)))      # the pooled segment again, mapped again
    assert not y.flags.writeable and np.array_equal(y, big_array(6))


@pytest.mark.local_only
def test_a_driver_using_numpy_has_its_zygote_import_it(rt):
    # Workers forked after init share the zygote's numpy instead of each
    # importing a private copy at its first array.  A spawn waits for the
    # zygote's preload: once an actor answers, numpy is in the zygote.
    assert "numpy" in sys.modules
    assert ray.get(Reader.remote().mappings.remote()) == (0, 0)
    with open(f"/proc/{rt.zygote.proc.pid}/maps") as f:
        assert "_multiarray_umath" in f.read()
