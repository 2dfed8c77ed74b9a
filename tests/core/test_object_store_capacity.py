"""``init(object_store_memory=...)`` bounds what the runtime keeps in /dev/shm
for its objects: past it they spill to a private directory on disk (Ray's
behaviour), or, with spilling off, ``ObjectStoreFullError`` is raised."""
import gc
import os
import stat
import time

import numpy as np
import pytest

import ray_lite
from ray_lite._fast import shm
from ray_lite._private.objects import object_store, spill as spill_files
from ray_lite._private.process import state
from ray_lite.exceptions import ObjectStoreFullError

CAPACITY = 64 << 20
PIECE = 16 << 20            # 12 pieces: three times the capacity


def _value(seed):
    return np.random.default_rng(seed).integers(0, 256, PIECE, dtype=np.uint8)


def _object_bytes_in_shm(node):
    """Bytes of the runtime's object segments in /dev/shm (its stored objects
    and the free segments its processes keep for reuse)."""
    total = 0
    for name in shm.list_segments(node.shm_prefix):
        if name[len(node.shm_prefix):][:1] in ("o", "p"):
            try:
                total += os.stat(shm.segment_path(name)).st_size
            except FileNotFoundError:
                pass
    return total


def _spill_files(node):
    try:
        return os.listdir(spill_files.spill_dir(node))
    except FileNotFoundError:
        return []


def _wait_until(cond, what, timeout=60):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        gc.collect()
        time.sleep(0.05)


@ray_lite.remote
def _make(seed):
    return _value(seed)


@pytest.fixture
def small_store():
    ray_lite.init(num_cpus=1, object_store_memory=CAPACITY)
    try:
        yield state.node
    finally:
        ray_lite.shutdown()


def test_three_times_the_capacity_spills_and_reads_back_identical(small_store):
    node = small_store
    refs = []
    for seed in range(12):
        # Stored by the driver (put) and by a worker (a task's return value).
        refs.append(ray_lite.put(_value(seed)) if seed % 3 else _make.remote(seed))
        ray_lite.wait([refs[-1]], timeout=60)
        assert _object_bytes_in_shm(node) <= CAPACITY
    spilled = _spill_files(node)
    assert len(spilled) >= 6            # 192 MB in, at most 64 MB of it in shared memory
    spill = spill_files.spill_dir(node)
    assert stat.S_IMODE(os.lstat(spill).st_mode) == 0o700
    for seed, ref in enumerate(refs):
        got = ray_lite.get(ref, timeout=60)
        assert np.array_equal(got, _value(seed)), seed
        del got
    assert _object_bytes_in_shm(node) <= CAPACITY
    del refs, ref
    _wait_until(lambda: not _spill_files(node), "the spill files go with their refs")
    _wait_until(lambda: not shm.list_segments(object_store._store_prefix(node)),
                "the stored objects' segments go with their refs")


def test_with_spilling_off_a_full_store_raises_object_store_full_error():
    ray_lite.init(num_cpus=1, object_store_memory=CAPACITY,
                  _system_config={"automatic_object_spilling_enabled": False})
    try:
        node = state.node
        a = ray_lite.put(np.ones(30 << 20, np.uint8))
        b = ray_lite.put(np.ones(30 << 20, np.uint8))
        with pytest.raises(ObjectStoreFullError, match="spilling is off"):
            ray_lite.put(np.ones(30 << 20, np.uint8))
        assert not _spill_files(node)
        del a
        _wait_until(lambda: _object_bytes_in_shm(node) + (30 << 20) <= CAPACITY,
                    "the freed object's room comes back")
        c = ray_lite.put(np.full(30 << 20, 7, np.uint8))
        assert ray_lite.get(c)[-1] == 7 and ray_lite.get(b)[0] == 1
        assert _object_bytes_in_shm(node) <= CAPACITY
        del b, c
    finally:
        ray_lite.shutdown()


def test_the_spilling_switch_is_checked():
    assert object_store.spilling_enabled(None)
    assert object_store.spilling_enabled({"object_timeout_milliseconds": 5})
    assert not object_store.spilling_enabled({"automatic_object_spilling_enabled": False})
    with pytest.raises(TypeError, match="automatic_object_spilling_enabled"):
        object_store.spilling_enabled({"automatic_object_spilling_enabled": "no"})
    with pytest.raises(TypeError, match="_system_config"):
        object_store.spilling_enabled(["automatic_object_spilling_enabled"])


def test_free_segments_kept_for_reuse_count_against_the_capacity(small_store):
    node = small_store
    pool = f"{node.shm_prefix}p"
    a = ray_lite.put(np.ones(15 << 20, np.uint8))
    del a
    _wait_until(lambda: shm.list_segments(pool), "the freed segment is kept for reuse")
    b = ray_lite.put(np.ones(40 << 20, np.uint8))      # too big to reuse it
    c = ray_lite.put(np.ones(20 << 20, np.uint8))      # fits only if the kept one goes
    assert _object_bytes_in_shm(node) <= CAPACITY
    assert not _spill_files(node)
    assert ray_lite.get(b)[0] == 1 and ray_lite.get(c)[-1] == 1
    del b, c
