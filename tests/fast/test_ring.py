"""The shared-memory SPSC ring, both twins (``ring_impl``), in one process and across
real processes (``ring_peer.Peer``), including a compiled end talking to a
pure-Python end."""
import asyncio
import ctypes
import errno
import os
import queue
import random
import select
import signal
import stat
import subprocess
import sys
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ray_lite._fast import _wait_py, shm
from ray_lite._fast._ring_py import HOT_BYTES
from ray_lite._fast.errors import (
    ChannelClosedError,
    DecodeError,
    MessageTooLargeError,
    PeerDiedError,
    RingEmpty,
    SerializationError,
)
from ray_lite._fast import ring as ring_facade
from ray_lite._fast.ring import get_async, spin_any, wait_any

from ring_peer import Peer

SMALL = 4096


def new_segments(before):
    return sorted(set(shm.list_segments()) - set(before))


def drain(consumer):
    out = []
    while consumer.poll():
        out.append(consumer.get_nowait())
    return out


def wait_until(predicate, timeout=30.0):
    """Poll ``predicate`` (bounded): for states that another thread reaches."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.001)


# ----------------------------------------------------------------- basics ---
def test_fifo_order_and_message_types(pair):
    producer, consumer = pair
    sent = [b"raw", {"k": [1, 2.5, None]}, (1, "two"), b"", "text", 2**70, b"bytes-value"]
    producer.put_bytes(sent[0])
    producer.put(sent[1])
    producer.put(sent[2])
    producer.put_bytes(bytearray(sent[3]))
    producer.put(sent[4])
    producer.put(sent[5])
    producer.put(sent[6])
    got = [consumer.get(timeout=5) for _ in sent]
    assert got == sent
    assert type(got[0]) is bytes and type(got[2]) is tuple and type(got[3]) is bytes


def test_get_nowait_on_empty_ring_raises_ring_empty(pair):
    producer, consumer = pair
    with pytest.raises(RingEmpty):
        consumer.get_nowait()
    assert issubclass(RingEmpty, queue.Empty)
    assert consumer.poll() is False
    producer.put_bytes(b"x")
    assert consumer.poll() is True
    assert consumer.get_nowait() == b"x"
    with pytest.raises(RingEmpty):
        consumer.get_nowait()


def test_wraps_around_many_times_with_random_sizes(pair):
    producer, consumer = pair
    rng = random.Random(7)
    inline_limit = SMALL // 4
    sizes = [0, 1, 7, 8, 9, 63, 200, 511, inline_limit - 8, inline_limit, inline_limit + 1, 3000]
    expected, got = [], []
    total = 0
    while total < 60 * SMALL:
        # Keep a few messages in flight so the producer wraps with a partly full ring.
        for _ in range(rng.randint(1, 6)):
            data = rng.randbytes(rng.choice(sizes))
            try:
                if rng.random() < 0.5:
                    producer.put_bytes(data, timeout=0)
                else:
                    producer.put(data, timeout=0)
            except TimeoutError:
                break
            expected.append(data)
            total += len(data) + 8
        for _ in range(rng.randint(0, 6)):
            if consumer.poll():
                got.append(consumer.get_nowait())
    got.extend(drain(consumer))
    assert got == expected


@pytest.mark.parametrize("put", ["put", "put_bytes"])
def test_a_ring_whose_consumer_keeps_up_stays_in_its_first_pages(ring_impl, put):
    """Past HOT_BYTES with nothing unread, a record starts over at the
    beginning: a busy link touches a few pages, not its whole area (the
    soak's growing proxy memory was 2 x 1 MB of shared pages per replica)."""
    hot = HOT_BYTES
    producer = ring_impl.ShmRing.create(1 << 20, side="producer")
    consumer = ring_impl.ShmRing.attach(producer.name, side="consumer")
    try:
        msg = b"r" * 300
        highest = 0
        for i in range(20000):       # ~6 MB: six laps of the area without the rule
            getattr(producer, put)(msg + i.to_bytes(4, "little"), timeout=0)
            highest = max(highest, producer.offset)
            assert consumer.get_nowait() == msg + i.to_bytes(4, "little")
        assert highest < hot + 400
        assert consumer.offset == producer.offset
        # With records left unread, the producer goes on past the window
        # (and wraps at the end of the area as before): nothing is lost.
        sent = [i.to_bytes(4, "little") * 100 for i in range(600)]
        for m in sent:
            getattr(producer, put)(m, timeout=0)
        assert producer.offset > hot
        assert drain(consumer) == sent
    finally:
        producer.close()
        consumer.close()


def test_full_ring_put_times_out_and_the_ring_stays_consistent(pair):
    producer, consumer = pair
    n = 0
    with pytest.raises(TimeoutError):
        while True:
            producer.put_bytes(n.to_bytes(4, "little") * 25, timeout=0)
            n += 1
    assert n > 10
    with pytest.raises(TimeoutError):
        producer.put(b"m" * 100, timeout=0.05)     # as big as the filler: no room either
    with pytest.raises(TimeoutError):
        producer.put_bytes(b"y" * 100, timeout=0.05)
    got = drain(consumer)
    assert got == [i.to_bytes(4, "little") * 25 for i in range(n)]
    producer.put("after")
    assert consumer.get(timeout=5) == "after"


def test_get_times_out_on_an_empty_ring(pair):
    _, consumer = pair
    with pytest.raises(TimeoutError):
        consumer.get(timeout=0.05)
    with pytest.raises(TimeoutError):
        consumer.get(timeout=0)


def test_oversize_bytes_travel_through_a_side_segment_unlinked_when_read(pair):
    producer, consumer = pair
    before = shm.list_segments()
    data = os.urandom(5 * SMALL)
    producer.put_bytes(data)
    side = new_segments(before)
    assert len(side) == 1
    assert consumer.get(timeout=5) == data
    assert not os.path.exists(shm.segment_path(side[0]))


def test_large_frame_travels_through_a_side_segment(pair):
    producer, consumer = pair
    before = shm.list_segments()
    value = {"text": "x" * (3 * SMALL), "items": list(range(500))}
    producer.put(value)
    assert len(new_segments(before)) == 1
    assert consumer.get(timeout=5) == value
    assert new_segments(before) == []


def test_messages_over_max_message_size_are_refused_before_anything_is_sent(ring_impl):
    with ring_impl.ShmRing.create(SMALL, side="producer", max_message_size=500) as producer, \
            ring_impl.ShmRing.attach(producer.name, side="consumer") as consumer:
        before = shm.list_segments()
        with pytest.raises(MessageTooLargeError):
            producer.put_bytes(b"x" * 501)
        with pytest.raises(MessageTooLargeError):
            producer.put("y" * 600)
        with pytest.raises(MessageTooLargeError):
            producer.put(b"z" * 100_000)             # out-of-band buffer counts too
        assert not consumer.poll()
        assert new_segments(before) == []
        producer.put_bytes(b"x" * 500)
        assert consumer.get(timeout=5) == b"x" * 500
        assert producer.max_message_size == consumer.max_message_size == 500


def test_a_large_frame_just_under_max_message_size_is_sent(ring_impl):
    # Encoded aside in a scratch buffer that grows: growing past the maximum
    # must not refuse a frame that is within it.
    value = "v" * 5000
    with ring_impl.ShmRing.create(SMALL, side="producer", max_message_size=6000) as producer, \
            ring_impl.ShmRing.attach(producer.name, side="consumer") as consumer:
        producer.put(value, timeout=5)
        assert consumer.get(timeout=5) == value
        with pytest.raises(MessageTooLargeError):
            producer.put("w" * 6001)
        assert not consumer.poll()


def test_unserialisable_value_raises_and_leaves_the_ring_untouched(pair):
    producer, consumer = pair
    with pytest.raises(SerializationError):
        producer.put({"ok": 1, "bad": threading.Lock()})
    assert not consumer.poll()
    producer.put("next")
    assert consumer.get_nowait() == "next"
    assert not consumer.poll()


def _mapping_of(address):
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= address < hi:
                return fields[5].strip() if len(fields) > 5 else ""
    return None


def test_numpy_array_arrives_zero_copy_from_a_side_segment(pair):
    np = pytest.importorskip("numpy")
    producer, consumer = pair
    before = shm.list_segments()
    array = np.arange(200_000, dtype=np.float64).reshape(400, 500)
    producer.put({"array": array, "tag": "t"})
    assert len(new_segments(before)) == 1
    got = consumer.get(timeout=5)
    assert got["tag"] == "t"
    assert got["array"].shape == (400, 500)
    assert np.array_equal(got["array"], array)
    # Zero-copy: the array's memory is the (already unlinked) side segment's mapping.
    path = _mapping_of(got["array"].__array_interface__["data"][0])
    assert path is not None and path.startswith(shm.SHM_DIR + "/" + shm.DEFAULT_PREFIX), path
    assert "(deleted)" in path
    assert new_segments(before) == []


@pytest.mark.parametrize("capacity", [1 << 20, 4 << 20])
def test_an_array_up_to_half_the_inline_limit_is_copied_through_the_ring(ring_impl, capacity):
    # A side segment costs far more than a copy at these sizes (see
    # _ring_py.oob_threshold): an array of the codec's threshold and up to
    # half the ring's inline limit (a quarter of its capacity) travels in the
    # ring; one of half the inline limit or more still goes in a side segment.
    np = pytest.importorskip("numpy")
    from ray_lite._fast._codec_py import OOB_THRESHOLD
    half = capacity // 8
    with ring_impl.ShmRing.create(capacity, side="producer") as producer, \
            ring_impl.ShmRing.attach(producer.name, side="consumer") as consumer:
        before = shm.list_segments()
        for nbytes in (OOB_THRESHOLD, half - 4096):
            array = np.arange(nbytes // 4, dtype=np.float32)
            producer.put({"logits": array})
            assert new_segments(before) == [], nbytes
            got = consumer.get(timeout=5)["logits"]
            assert np.array_equal(got, array)
            got[0] = -1.0           # the receiver's own copy
            assert array[0] == 0.0
        array = np.arange(half // 4, dtype=np.float32)
        producer.put({"logits": array})
        assert len(new_segments(before)) == 1
        assert np.array_equal(consumer.get(timeout=5)["logits"], array)
        assert new_segments(before) == []


def test_poll_arm_fd_and_clear_fd(pair):
    producer, consumer = pair
    fd = consumer.fileno()

    def readable():
        return bool(select.select([fd], [], [], 0)[0])

    assert not consumer.poll()
    assert consumer.arm_fd() is True
    assert not readable()
    producer.put_bytes(b"m1")
    assert readable()                       # the producer signalled the armed fd
    assert consumer.poll()
    assert consumer.arm_fd() is False       # a message is there: do not sleep
    consumer.clear_fd()
    assert not readable()
    producer.put_bytes(b"m2")               # not armed: no signal, no system call
    assert not readable()
    assert drain(consumer) == [b"m1", b"m2"]
    assert consumer.arm_fd() is True
    producer.close()                        # closing signals too
    assert readable()
    assert consumer.poll()                  # get_nowait now reports the close
    assert consumer.arm_fd() is False
    consumer.clear_fd()
    with pytest.raises(ChannelClosedError):
        consumer.get_nowait()


def test_get_async_returns_messages_through_the_event_loop(pair):
    producer, consumer = pair

    async def main():
        producer.put("ready")
        first = await get_async(consumer, timeout=5)        # fast path
        loop = asyncio.get_running_loop()
        loop.call_soon(producer.put, {"later": True})
        second = await get_async(consumer, timeout=30)      # through add_reader
        with pytest.raises(TimeoutError):
            await get_async(consumer, timeout=0.05)
        threading.Thread(target=producer.put_bytes, args=(b"from a thread",)).start()
        third = await get_async(consumer, timeout=30)
        return first, second, third

    assert asyncio.run(main()) == ("ready", {"later": True}, b"from a thread")


def test_get_async_reports_a_closed_producer(pair):
    producer, consumer = pair

    async def main():
        asyncio.get_running_loop().call_soon(producer.close)
        with pytest.raises(ChannelClosedError):
            await get_async(consumer, timeout=30)

    asyncio.run(main())


def test_wait_any_sleeps_on_many_rings(ring_impl):
    producers = [ring_impl.ShmRing.create(SMALL, side="producer") for _ in range(4)]
    consumers = [ring_impl.ShmRing.attach(p.name, side="consumer") for p in producers]
    try:
        assert wait_any(consumers, timeout=0.05) == []
        thread = threading.Thread(target=producers[2].put, args=("wake",))
        thread.start()
        assert wait_any(consumers, timeout=30) == [consumers[2]]
        thread.join(30)
        assert consumers[2].get_nowait() == "wake"
        producers[0].put_bytes(b"a")
        producers[3].put_bytes(b"b")
        assert wait_any(consumers, timeout=30) == [consumers[0], consumers[3]]
        drain(consumers[0]), drain(consumers[3])
        producers[1].close()
        assert wait_any(consumers, timeout=30) == [consumers[1]]
        with pytest.raises(ChannelClosedError):
            consumers[1].get_nowait()
        # Nothing stays armed after a wait: no stray signals (the closed one stays readable).
        assert select.select([c.fileno() for c in consumers], [], [], 0)[0] == [consumers[1].fileno()]
    finally:
        for r in producers + consumers:
            r.close()


def test_spin_any_polls_many_rings_without_sleeping(ring_impl):
    producers = [ring_impl.ShmRing.create(SMALL, side="producer") for _ in range(3)]
    consumers = [ring_impl.ShmRing.attach(p.name, side="consumer") for p in producers]
    try:
        with pytest.raises(ValueError):
            spin_any([], 1.0)
        assert spin_any(consumers, 0.002) == []                 # bounded
        assert spin_any(consumers, 0) == []
        producers[1].put_bytes(b"x")
        assert spin_any(consumers, 5.0) == [consumers[1]]
        assert spin_any(consumers[1:2], 5.0) == [consumers[1]]  # one ring: its spin_poll
        drain(consumers[1])
        writer = threading.Thread(target=producers[2].put, args=("late",))
        writer.start()
        try:
            # (Retried: a spin also ends when its CPU went elsewhere for long.)
            assert next(filter(None, (spin_any(consumers, 0.5) for _ in range(60))), None) == \
                [consumers[2]]
        finally:
            writer.join(30)
        assert drain(consumers[2]) == ["late"]
        producers[0].close()
        assert spin_any(consumers, 5.0) == [consumers[0]]       # a close ends it too
        # It never armed anything: only the closed ring's descriptor fired.
        assert select.select([c.fileno() for c in consumers], [], [], 0)[0] == \
            [consumers[0].fileno()]
    finally:
        for r in producers + consumers:
            r.close()


def test_spin_any_gives_up_when_its_cpu_went_elsewhere(pair, monkeypatch):
    """A round that took long means another thread had this CPU: spinning on
    would take it from that thread, so the caller sleeps instead."""
    _, consumer = pair
    clock = iter([0.0, 0.000001, 0.000002, 0.5])     # the last round lost the CPU

    class FakeTime:
        @staticmethod
        def monotonic():
            return next(clock)
    monkeypatch.setattr(ring_facade, "time", FakeTime)
    assert spin_any([consumer, consumer], 10.0) == []    # well before its budget


# ------------------------------------------------------ naming and claims ---
def test_segments_are_private_and_named_after_the_creator(ring_impl):
    with ring_impl.ShmRing.create(SMALL, side="consumer", prefix=shm.DEFAULT_PREFIX + "t_") as ring:
        assert ring.name.startswith(shm.DEFAULT_PREFIX + "t_")
        assert shm.creator_pid(ring.name, shm.DEFAULT_PREFIX + "t_") == os.getpid()
        names = new_segments([])
        assert ring.name in names and ring.name + ".fifo" in names
        for name in (ring.name, ring.name + ".fifo"):
            assert stat.S_IMODE(os.stat(shm.segment_path(name)).st_mode) == 0o600
        assert ring.side == "consumer" and ring.capacity == SMALL and not ring.closed
    assert ring.closed
    assert not os.path.exists(shm.segment_path(ring.name))
    assert not os.path.exists(shm.segment_path(ring.name + ".fifo"))


def test_create_validates_its_arguments(ring_impl):
    with pytest.raises(ValueError):
        ring_impl.ShmRing.create(SMALL, side="both")
    with pytest.raises(ValueError):
        ring_impl.ShmRing.create(5000, side="producer")        # not a power of two
    with pytest.raises(ValueError):
        ring_impl.ShmRing.create(512, side="producer")         # below MIN_CAPACITY
    with pytest.raises(TypeError):
        ring_impl.ShmRing()


def test_a_side_cannot_be_claimed_twice(ring_impl):
    with ring_impl.ShmRing.create(SMALL, side="producer") as producer:
        with pytest.raises(ValueError, match="already claimed"):
            ring_impl.ShmRing.attach(producer.name, side="producer")
        with ring_impl.ShmRing.attach(producer.name, side="consumer"):
            with pytest.raises(ValueError, match="already claimed"):
                ring_impl.ShmRing.attach(producer.name, side="consumer")


def test_attach_refuses_what_is_not_a_ring(ring_impl):
    with pytest.raises(FileNotFoundError):
        ring_impl.ShmRing.attach(shm.new_name(), side="consumer")
    with pytest.raises(ValueError):
        ring_impl.ShmRing.attach("../etc/passwd", side="consumer")
    name, mm = shm.create_segment(2 * SMALL)
    try:
        with pytest.raises(ValueError, match="not a ray_lite ring"):
            ring_impl.ShmRing.attach(name, side="consumer")
    finally:
        mm.close()
        shm.unlink_segment(name)
    with ring_impl.ShmRing.create(SMALL, side="producer") as producer:
        mm = shm.attach_segment(producer.name)
        try:
            mm[8:12] = (99).to_bytes(4, "little")           # layout version
            with pytest.raises(ValueError, match="version"):
                ring_impl.ShmRing.attach(producer.name, side="consumer")
        finally:
            mm.close()


def test_each_end_refuses_the_other_ends_calls(pair):
    producer, consumer = pair
    with pytest.raises(ValueError):
        consumer.put("x")
    with pytest.raises(ValueError):
        consumer.put_bytes(b"x")
    with pytest.raises(ValueError):
        producer.get(timeout=0)
    with pytest.raises(ValueError):
        producer.get_nowait()
    with pytest.raises(ValueError):
        producer.poll()
    with pytest.raises(ValueError):
        producer.fileno()


def test_put_bytes_refuses_non_contiguous_buffers(pair):
    np = pytest.importorskip("numpy")
    producer, consumer = pair
    with pytest.raises(ValueError):
        producer.put_bytes(np.arange(100, dtype=np.uint8)[::2])
    with pytest.raises(TypeError):
        producer.put_bytes("text")
    assert not consumer.poll()


def test_peer_identity_in_one_process(pair):
    producer, consumer = pair
    assert producer.peer_pid == consumer.peer_pid == os.getpid()
    assert producer.peer_alive() and consumer.peer_alive()


def test_rings_cannot_be_pickled(pair):
    import pickle
    with pytest.raises(TypeError):
        pickle.dumps(pair[0])


def test_twins_share_one_layout_in_one_process(twin_pair):
    compiled, python = (t.module("ring") for t in twin_pair)
    rng = random.Random(3)
    for make, join in ((compiled, python), (python, compiled)):
        with make.ShmRing.create(SMALL, side="producer") as producer, \
                join.ShmRing.attach(producer.name, side="consumer") as consumer:
            expected, got = [], []
            for i in range(3000):
                data = rng.randbytes(rng.choice([0, 5, 100, 1000, 1500, 5000]))
                if i % 3 == 0:
                    data = {"i": i, "d": data}
                while True:
                    try:
                        if i % 3:
                            producer.put_bytes(data, timeout=0)
                        else:
                            producer.put(data, timeout=0)
                        break
                    except TimeoutError:             # full: this thread is the consumer too
                        got.append(consumer.get_nowait())
                expected.append(data)
                if rng.random() < 0.5:
                    got.append(consumer.get(timeout=5))
            got.extend(drain(consumer))
            assert got == expected


# -------------------------------------------------------------- closing ---
def test_producer_close_lets_the_consumer_drain_then_raises(pair):
    producer, consumer = pair
    big = os.urandom(2 * SMALL)
    producer.put("a")
    producer.put_bytes(big)
    producer.put(("b",))
    producer.close()
    with pytest.raises(ChannelClosedError):
        producer.put("after close")
    assert consumer.get(timeout=5) == "a"
    assert consumer.get(timeout=5) == big          # its side segment survived the producer's close
    assert consumer.get_nowait() == ("b",)
    with pytest.raises(ChannelClosedError):
        consumer.get(timeout=5)
    with pytest.raises(ChannelClosedError):
        consumer.get_nowait()


def test_consumer_close_fails_the_producer(pair):
    producer, consumer = pair
    consumer.close()
    with pytest.raises(ChannelClosedError):
        producer.put("x")
    with pytest.raises(ChannelClosedError):
        consumer.get_nowait()
    assert consumer.closed and not producer.closed


@pytest.mark.parametrize("first", ["producer", "consumer"])
def test_last_closer_unlinks_side_segments_of_unread_messages(ring_impl, first):
    before = shm.list_segments()
    producer = ring_impl.ShmRing.create(SMALL, side="producer")
    consumer = ring_impl.ShmRing.attach(producer.name, side="consumer")
    producer.put_bytes(os.urandom(3 * SMALL))
    producer.put({"blob": b"q" * 100_000})
    assert len(new_segments(before)) == 4          # ring, FIFO, two side segments
    ends = [producer, consumer] if first == "producer" else [consumer, producer]
    ends[0].close()
    assert len(new_segments(before)) == 2          # names of the ring gone, side segments kept
    ends[1].close()
    assert new_segments(before) == []


def test_close_is_idempotent_and_closed_ends_refuse_work(pair):
    producer, consumer = pair
    consumer.close()
    consumer.close()
    assert consumer.poll() is True                 # get_nowait would raise, not RingEmpty
    for call in (consumer.get_nowait, lambda: consumer.get(timeout=0), consumer.fileno,
                 consumer.arm_fd, consumer.peer_fd):
        with pytest.raises(ChannelClosedError):
            call()
    consumer.clear_fd()                            # harmless after close
    producer.close()
    with pytest.raises(ChannelClosedError):
        producer.put_bytes(b"x")


def test_a_closed_ring_raises_channel_closed_error_in_both_twins(ring_impl):
    # Every entry point, for this end closed and for the peer closed, with
    # one message per case whichever twin raises it.
    producer = ring_impl.ShmRing.create(SMALL, side="producer")
    consumer = ring_impl.ShmRing.attach(producer.name, side="consumer")
    name = producer.name
    producer.close()
    for call in (consumer.get_nowait, lambda: consumer.get(timeout=0), lambda: consumer.get(timeout=5)):
        with pytest.raises(ChannelClosedError, match=f"^ring {name}: the producer closed the channel$"):
            call()
    assert consumer.poll() and consumer.spin_poll(1.0) and consumer.peer_alive()
    consumer.close()
    for call in (consumer.get_nowait, lambda: consumer.get(timeout=0), consumer.fileno, consumer.arm_fd,
                 consumer.peer_fd, consumer.peer_alive, lambda: producer.put(1), lambda: producer.put_bytes(b"x"),
                 lambda: producer.put(b"x" * 100_000), producer.fileno):
        with pytest.raises(ChannelClosedError, match=f"^ring {name} is closed$") as info:
            call()
        assert type(info.value) is ChannelClosedError
    assert consumer.poll() and consumer.spin_poll(0) and producer.spin_poll(0)
    consumer.clear_fd()

    producer = ring_impl.ShmRing.create(SMALL, side="producer")
    consumer = ring_impl.ShmRing.attach(producer.name, side="consumer")
    consumer.close()
    for call in (lambda: producer.put(1), lambda: producer.put_bytes(b"x"), lambda: producer.put(b"x" * 100_000)):
        with pytest.raises(ChannelClosedError, match=f"^ring {producer.name}: the consumer closed the channel$"):
            call()
    producer.close()


def test_channel_error_names_the_channel_and_the_cause():
    from ray_lite._fast.errors import RL_CLOSED, RL_CORRUPT, RL_PEER_DIED, RL_TIMEOUT, channel_error

    cases = [
        (dict(status=RL_TIMEOUT), TimeoutError, "ring r: timed out"),
        (dict(status=RL_TIMEOUT, waiting_for="room"), TimeoutError, "ring r: timed out waiting for room"),
        (dict(status=RL_CLOSED, this_end=True), ChannelClosedError, "ring r is closed"),
        (dict(status=RL_CLOSED, peer="writer"), ChannelClosedError, "ring r: the writer closed the channel"),
        (dict(status=RL_PEER_DIED, peer="reader 2", pid=7), PeerDiedError, "ring r: the reader 2 process 7 died"),
        (dict(status=RL_CORRUPT), DecodeError, "ring r: corrupt record"),
        (dict(status=42), AssertionError, "ring r: unexpected status 42"),
    ]
    for kwargs, cls, message in cases:
        status = kwargs.pop("status")
        err = channel_error(status, "ring r", **kwargs)
        assert type(err) is cls and str(err) == message


def test_spin_poll_ends_with_a_message_or_its_budget_and_never_signals(pair):
    producer, consumer = pair
    fd = consumer.fileno()
    assert consumer.spin_poll(0) is False
    assert consumer.spin_poll(float("nan")) is False
    assert consumer.spin_poll(0.002) is False           # gives up: bounded
    producer.put_bytes(b"ready")
    assert consumer.spin_poll(0) is True                # already there
    assert drain(consumer) == [b"ready"]

    # A message put while it spins ends the spin (the compiled one spins
    # without the GIL; the pure one lets the writer in at each GIL switch).
    # Retried until a deadline: a spin also ends early when its CPU went
    # elsewhere for long.
    writer = threading.Thread(target=producer.put_bytes, args=(b"late",))
    writer.start()
    try:
        deadline = time.monotonic() + 30
        while not consumer.spin_poll(0.5):
            assert time.monotonic() < deadline, "the message put during the spin never came"
    finally:
        writer.join(30)
    assert not select.select([fd], [], [], 0)[0]        # not armed: nothing written to the fd
    assert drain(consumer) == [b"late"]

    with pytest.raises(ValueError):
        producer.spin_poll(0)                           # the consumer's call
    producer.close()
    assert consumer.spin_poll(5.0) is True              # a closed peer ends it at once
    consumer.close()
    assert consumer.spin_poll(0) is True                # as poll(): reading will tell


def _fill_until_closed(producer):
    while True:
        producer.put_bytes(b"x" * 100, timeout=60)


@pytest.mark.parametrize("end,blocking_call", [
    (1, lambda consumer: consumer.get(timeout=60)),
    (0, _fill_until_closed),
], ids=["get", "put"])
def test_close_from_another_thread_wakes_a_blocked_call(pair, end, blocking_call):
    ring = pair[end]
    result = []

    def blocked():
        try:
            blocking_call(ring)
        except BaseException as exc:
            result.append(exc)

    thread = threading.Thread(target=blocked)
    thread.start()
    ring.close()
    thread.join(30)
    assert not thread.is_alive()
    assert len(result) == 1 and isinstance(result[0], ChannelClosedError)


def test_peer_close_wakes_a_blocked_get(pair):
    producer, consumer = pair
    threading.Thread(target=producer.close).start()
    with pytest.raises(ChannelClosedError):
        consumer.get(timeout=60)


def test_one_end_used_by_two_threads_at_once_is_refused(pair):
    _, consumer = pair
    result = []
    thread = threading.Thread(target=lambda: result.append(
        pytest.raises(ChannelClosedError, consumer.get, timeout=60)))
    thread.start()
    try:
        def second_call_refused():
            try:
                consumer.get_nowait()
            except RingEmpty:
                return False            # the other thread has not entered get() yet
            except RuntimeError:
                return True
        wait_until(second_call_refused)
    finally:
        consumer.close()
        thread.join(30)
    assert not thread.is_alive() and len(result) == 1


def test_a_signal_handler_interrupts_a_blocked_get(pair):
    # What Ctrl-C relies on: a signal ends the wait (EINTR, then the handler
    # runs and its exception propagates) instead of waiting for the timeout.
    _, consumer = pair

    class Interrupted(Exception):
        pass

    armed = threading.Event()
    stop = threading.Event()

    def handler(signum, frame):
        if armed.is_set():
            raise Interrupted()

    def signal_until_stopped():
        while not stop.wait(0.005):
            os.kill(os.getpid(), signal.SIGUSR1)

    previous = signal.signal(signal.SIGUSR1, handler)
    sender = threading.Thread(target=signal_until_stopped)
    try:
        sender.start()
        with pytest.raises(Interrupted):
            armed.set()
            consumer.get(timeout=60)
    finally:
        armed.clear()
        stop.set()
        sender.join(30)
        signal.signal(signal.SIGUSR1, previous)


def test_an_end_dropped_without_close_wakes_its_peer_and_unlinks(ring_impl):
    import gc
    producer = ring_impl.ShmRing.create(SMALL, side="producer")
    name = producer.name
    with ring_impl.ShmRing.attach(name, side="consumer") as consumer:
        producer.put("last")
        del producer
        gc.collect()
        assert not os.path.exists(shm.segment_path(name))
        assert consumer.get(timeout=5) == "last"
        with pytest.raises(ChannelClosedError):
            consumer.get(timeout=30)


def test_c_level_api_round_trips_without_python_in_the_loop(twin_pair):
    # ray_lite/bench/_ringbench_c drives rl_ring_write/peek/reserve/publish/release nogil.
    compiled = twin_pair[0].module("ring")
    ringbench = pytest.importorskip("ray_lite.bench._ringbench_c")
    with compiled.ShmRing.create(SMALL, side="producer") as there, \
            compiled.ShmRing.create(SMALL, side="consumer") as back:
        errors = []

        def echo():
            try:
                ringbench.echo(there.name, back.name, 1100, timeout=60)
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=echo)          # echo and ping release the GIL
        thread.start()
        samples = ringbench.ping(there, back, 1000, warmup=100, size=24, timeout=60)
        thread.join(60)
        assert not thread.is_alive() and not errors
        assert len(samples) == 1000 and all(s > 0 for s in samples)
        with pytest.raises(ValueError):
            ringbench.ping(there, back, 1, size=SMALL)   # over the inline limit
    samples = ringbench.c_round_trips(200, warmup=20, timeout=60)   # with its own echo process
    assert len(samples) == 200 and all(s > 0 for s in samples)


# ------------------------------------------ shared waiting primitives ---
# _wait_py: the pure twins' futex and liveness helpers (the compiled twins'
# are the C ones of _wait.pxd, exercised by every compiled test here).

def test_futex_wait_returns_when_the_word_changed_and_times_out():
    word = ctypes.c_uint32(5)
    addr = ctypes.addressof(word)
    if _wait_py._SYS_FUTEX is None:
        pytest.skip("no futex on this architecture: futex_wait is a timed sleep")
    assert _wait_py.futex_wait(addr, 4, 10**10) == errno.EAGAIN  # not 5: no sleep at all
    assert _wait_py.futex_wait(addr, 5, 1_000_000) == errno.ETIMEDOUT


def test_futex_wake_wakes_a_sleeper():
    word = ctypes.c_uint32(0)
    addr = ctypes.addressof(word)
    results = queue.Queue()
    sleeper = threading.Thread(target=lambda: results.put(_wait_py.futex_wait(addr, 0, 30 * 10**9)))
    sleeper.start()
    word.value = 1  # a sleeper that has not slept yet sees the change instead (EAGAIN)
    _wait_py.futex_wake(addr)
    sleeper.join(timeout=20)
    assert not sleeper.is_alive()
    assert results.get(timeout=1) in (0, errno.EAGAIN)


def test_process_liveness_with_and_without_pidfd():
    me = os.getpid()
    fd = _wait_py.open_pidfd(me)
    try:
        assert _wait_py.process_alive(me, fd) and _wait_py.process_alive(me, -1)
    finally:
        if fd >= 0:
            os.close(fd)
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        fd = _wait_py.open_pidfd(proc.pid)
        if fd < 0:
            pytest.skip("no pidfds on this kernel")
        try:
            # Readable once the child exited; it stays a zombie until reaped.
            assert select.select([fd], [], [], 20)[0] == [fd]
            assert not _wait_py.process_alive(proc.pid, fd)
            assert not _wait_py.process_alive(proc.pid, -1)  # the zombie counts as exited
        finally:
            os.close(fd)
    finally:
        proc.wait(timeout=20)
    assert not _wait_py.process_alive(proc.pid, -1)


# ---------------------------------------------------- other processes ---
def test_messages_cross_processes_both_ways(ring_impl, peer_twin):
    with Peer(peer_twin) as peer:
        inbound = ring_impl.ShmRing.create(SMALL, side="consumer")
        outbound = ring_impl.ShmRing.create(SMALL, side="producer")
        try:
            peer.call("attach", inbound.name, "producer")
            assert peer.call("attach", outbound.name, "consumer") == os.getpid()
            sent = [b"x" * n for n in (0, 10, 1000, 3000, 9000)] + [{"v": (1, 2)}, "s" * 5000]
            for item in sent:
                if isinstance(item, bytes):
                    outbound.put_bytes(item)
                else:
                    outbound.put(item)
            assert peer.call("recv", outbound.name, len(sent)) == sent
            peer.call("send", inbound.name, [("value", x) for x in sent])
            assert [inbound.get(timeout=30) for _ in sent] == sent
            assert inbound.peer_pid == peer.pid
        finally:
            inbound.close()
            outbound.close()


def test_peer_killed_while_blocked_in_get_raises_peer_died(ring_impl, peer_twin):
    with Peer(peer_twin) as peer:
        with ring_impl.ShmRing.create(SMALL, side="consumer") as ring:
            peer.call("attach", ring.name, "producer")
            peer.call("send", ring.name, [("bytes", b"last words")])
            killer = threading.Thread(target=peer.kill)
            killer.start()
            assert ring.get(timeout=30) == b"last words"     # drained first
            with pytest.raises(PeerDiedError):                  # not TimeoutError
                ring.get(timeout=60)
            killer.join(30)
            assert not ring.peer_alive()
            with pytest.raises(PeerDiedError):
                ring.get_nowait()


def test_peer_killed_while_blocked_in_put_raises_peer_died(ring_impl, peer_twin):
    with Peer(peer_twin) as peer:
        with ring_impl.ShmRing.create(SMALL, side="producer") as ring:
            peer.call("attach", ring.name, "consumer")
            with pytest.raises(TimeoutError):
                while True:
                    ring.put_bytes(b"f" * 100, timeout=0)
            killer = threading.Thread(target=peer.kill)
            killer.start()
            with pytest.raises(PeerDiedError):
                ring.put_bytes(b"g" * 100, timeout=60)
            killer.join(30)
            with pytest.raises(PeerDiedError):
                ring.put("again")


def test_a_child_blocked_in_get_or_put_sees_its_peer_close(ring_impl, peer_twin):
    with Peer(peer_twin) as peer:
        consumer_side = ring_impl.ShmRing.create(SMALL, side="producer")
        peer.call("attach", consumer_side.name, "consumer")
        peer.send("block", consumer_side.name, "get")
        assert peer.recv() == "blocking"
        consumer_side.close()
        assert peer.recv() == "ChannelClosedError"
        peer.call("close", consumer_side.name)

        producer_side = ring_impl.ShmRing.create(SMALL, side="consumer")
        peer.call("attach", producer_side.name, "producer")
        assert peer.call("fill", producer_side.name) > 10
        peer.send("block", producer_side.name, "put")
        assert peer.recv() == "blocking"
        producer_side.close()
        assert peer.recv() == "ChannelClosedError"
        peer.call("close", producer_side.name)


def test_peer_death_wakes_wait_any_and_get_async(ring_impl):
    with Peer("python") as peer:
        rings = [ring_impl.ShmRing.create(SMALL, side="consumer") for _ in range(2)]
        try:
            for r in rings:
                peer.call("attach", r.name, "producer")
            threading.Thread(target=peer.kill).start()
            assert wait_any(rings, timeout=60) == rings
            with pytest.raises(PeerDiedError):
                rings[0].get_nowait()

            async def main():
                with pytest.raises(PeerDiedError):
                    await get_async(rings[1], timeout=60)

            asyncio.run(main())
        finally:
            for r in rings:
                r.close()


def test_cleanup_removes_the_segments_of_a_killed_creator(ring_impl):
    with Peer("python") as peer:
        name = peer.call("create", SMALL, "producer")
        with ring_impl.ShmRing.attach(name, side="consumer") as ring:
            peer.call("put_big", name, 3 * SMALL)                 # a side segment, named by the child
            theirs = [n for n in shm.list_segments() if shm.creator_pid(n) == peer.pid]
            assert len(theirs) == 3                                # ring, FIFO, side segment
            peer.kill()
            removed = shm.cleanup_stale_segments()
            assert set(theirs) <= set(removed)
            assert not [n for n in shm.list_segments() if shm.creator_pid(n) == peer.pid]
            # The message's side segment went with its dead creator: that message is
            # lost (clearly), and then the ring reports the death.
            with pytest.raises(DecodeError, match="gone"):
                ring.get(timeout=60)
            with pytest.raises(PeerDiedError):
                ring.get(timeout=60)


# ------------------------------------------------ property across processes ---
def _message(draw_kind, size, seed):
    data = random.Random(seed).randbytes(size)
    if draw_kind == "bytes":
        return ("bytes", data)
    if draw_kind == "value":
        return ("value", {"seed": seed, "payload": data, "n": (size, -seed)})
    return ("value", data)             # codec: big bytes go out of band


messages = st.lists(
    st.builds(
        _message,
        st.sampled_from(["bytes", "bytes", "value", "codec-bytes"]),
        st.one_of(st.integers(0, 64), st.integers(65, SMALL // 4), st.integers(SMALL // 2, SMALL),
                  st.integers(SMALL + 1, 3 * SMALL), st.integers(64 * 1024, 80 * 1024)),
        st.integers(0, 2**32),
    ),
    min_size=1, max_size=60,
)


@pytest.fixture
def producer_peer(peer_twin):
    with Peer(peer_twin) as peer:
        yield peer


@settings(max_examples=10, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(sent=messages)
def test_random_message_sequences_cross_processes_in_order(ring_impl, producer_peer, sent):
    # One child per test (the fixture): each example is a fresh small ring the
    # child attaches to, fills with the whole sequence (wrapping many times,
    # waiting on the full ring) and closes.
    with ring_impl.ShmRing.create(SMALL, side="consumer") as ring:
        producer_peer.call("attach", ring.name, "producer")
        producer_peer.send("send", ring.name, sent)
        got = [ring.get(timeout=60) for _ in sent]
        assert producer_peer.recv() == len(sent)
        producer_peer.call("close", ring.name)
        with pytest.raises(ChannelClosedError):
            ring.get(timeout=60)
    assert got == [payload for _, payload in sent]


# ------------------------------------------------------------- links ---
# ``_private.transport.Link`` (a ring each way) raises LinkClosed, and only
# LinkClosed, for a link closed by either end or by its peer's death.

def test_a_link_closed_at_this_end_raises_link_closed():
    from ray_lite._private.links.transport import Link, LinkClosed

    a = Link.create()
    b = Link.attach(a.names)
    try:
        a.send(("hello", 1))
        a.close()
        with pytest.raises(LinkClosed):
            a.send(("more",))
        with pytest.raises(LinkClosed):
            a.recv_wait(0)
        assert a.recv_all() == [] and a.spin_poll(0) and a.arm() and a.has_data()
        a.disarm()
        assert b.recv_all() == [("hello", 1)]           # sent before the close: delivered
        with pytest.raises(LinkClosed):
            b.recv_wait(5)
        with pytest.raises(LinkClosed):
            b.send(("to a closed peer",))
        assert b.spin_poll(5) is True and b.arm() is False and b.recv_all() == []
        b.disarm()
    finally:
        a.close()
        b.close()


def test_a_link_whose_creator_closed_cannot_be_attached():
    from ray_lite._private.links.transport import Link, LinkClosed

    a = Link.create()
    names = a.names
    a.close()
    with pytest.raises(LinkClosed):
        Link.attach(names)


def test_a_link_whose_peer_died_raises_link_closed():
    from ray_lite._private.links.transport import Link, LinkClosed

    link = Link.create()
    try:
        with Peer("python") as peer:
            peer.call("attach", link.names[0], "consumer")
            peer.call("attach", link.names[1], "producer")
            peer.call("send", link.names[1], [("value", ("last", "words"))])
            peer.kill()
            assert link.recv_wait(30) == ("last", "words")    # drained first
            with pytest.raises(LinkClosed):
                link.recv_wait(30)
    finally:
        link.close()


# ------------------------------------------------------- wait policy ---

def test_a_twin_built_with_another_wait_policy_is_refused():
    from ray_lite._fast import wait_policy

    wait_policy.check_twin("some_twin", {"RING_SPIN_NS": wait_policy.RING_SPIN_NS,
                                         "SLICE_NS": wait_policy.SLICE_NS})     # the same numbers
    with pytest.raises(ImportError, match=r"^some_twin was built with another wait policy .*"
                                          r"RING_SPIN_NS=1 \(expected 20000\); rebuild ray_lite$"):
        wait_policy.check_twin("some_twin", {"RING_SPIN_NS": 1, "SLICE_NS": wait_policy.SLICE_NS})
    with pytest.raises(ImportError, match=r"NO_SUCH_NS=5 \(expected None\)"):
        wait_policy.check_twin("some_twin", {"NO_SUCH_NS": 5})


def test_both_twins_wait_with_the_policy_s_numbers(twin_pair):
    from ray_lite._fast import _broadcast_py, _ring_py, wait_policy

    compiled = twin_pair[0].module("ring")      # imported: its C copies passed check_twin
    twin_pair[0].module("broadcast")
    assert compiled._set_wait_policy() == dict(
        spin_gil_ns=wait_policy.RING_SPIN_GIL_NS, spin_ns=wait_policy.RING_SPIN_NS,
        yields=wait_policy.RING_YIELDS, slice_ns=wait_policy.SLICE_NS)
    assert (_ring_py.RING_SPIN_NS, _ring_py.RING_YIELDS, _ring_py.SLICE_NS, _ring_py.SLICE_WEAK_NS) == (
        wait_policy.RING_SPIN_NS, wait_policy.RING_YIELDS, wait_policy.SLICE_NS, wait_policy.SLICE_WEAK_NS)
    assert _broadcast_py.YIELD_S == wait_policy.ns_to_s(wait_policy.BROADCAST_YIELD_NS)
    assert ring_facade.WAIT_ANY_SPIN_S == wait_policy.ns_to_s(wait_policy.MULTI_SPIN_NS)


def test_set_wait_policy_tunes_rings_set_up_afterwards(twin_pair):
    compiled = twin_pair[0].module("ring")
    before = compiled._set_wait_policy()
    try:
        assert compiled._set_wait_policy(spin_ns=0, yields=0)["spin_ns"] == 0
        with compiled.ShmRing.create(SMALL, side="producer") as producer, \
                compiled.ShmRing.attach(producer.name, side="consumer") as consumer:
            with pytest.raises(TimeoutError):
                consumer.get(timeout=0.01)
            producer.put("still works")
            assert consumer.get(timeout=5) == "still works"
    finally:
        compiled._set_wait_policy(**before)
    assert compiled._set_wait_policy() == before
