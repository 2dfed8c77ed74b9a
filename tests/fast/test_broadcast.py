"""The shared-memory broadcast MessageQueue, both twins (``broadcast_impl`` fixture)."""
import asyncio
import json
import os
import select
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ray_lite._fast import shm
from ray_lite._fast.errors import ChannelClosedError, PeerDiedError

WAIT = 30  # seconds: bound on every wait that should end much sooner


def _closing(*queues):
    for q in queues:
        q.close()


# --------------------------------------------------------------- basics

def test_peer_watch_sees_a_zombie_and_a_reaped_process_as_dead(broadcast_impl):
    me = broadcast_impl._PeerWatch(os.getpid())
    try:
        assert me.alive() and me.pid == os.getpid()
    finally:
        me.close()
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                            stdin=subprocess.PIPE)
    try:
        watch = broadcast_impl._PeerWatch(proc.pid)
        assert watch.alive()
        exited = os.pidfd_open(proc.pid)
        try:
            proc.stdin.close()  # the child exits; unreaped, it stays a zombie
            assert select.select([exited], [], [], WAIT)[0] == [exited]
        finally:
            os.close(exited)
        assert not watch.alive()
        assert not watch.alive()  # and stays dead
        watch.close()
    finally:
        proc.wait(timeout=WAIT)
    gone = broadcast_impl._PeerWatch(proc.pid)  # reaped: no such process
    try:
        assert not gone.alive()
    finally:
        gone.close()


def test_every_reader_gets_every_message_in_order(broadcast_impl):
    w = broadcast_impl.MessageQueue(3, max_chunk_bytes=1024, max_chunks=4)
    readers = [broadcast_impl.MessageQueue.attach(w.export_handle(), r) for r in range(3)]
    try:
        values = [None, True, 7, -2**70, 1.5, "héllo", b"\0bytes", [1, [2]], {"k": (1, 2)}, (), bytearray(b"ba")]
        sent = 0
        for round_ in range(5):  # 55 messages through 4 chunks: wraps many times
            for v in values:
                w.enqueue(v)
                sent += 1
                for r in readers:
                    got = r.dequeue(timeout=WAIT)
                    assert got == v and type(got) is type(v)
        assert sent > 4 * w.max_chunks
    finally:
        _closing(w, *readers)


def test_properties_and_handle(broadcast_impl):
    w = broadcast_impl.MessageQueue(2, max_chunk_bytes=300, max_chunks=3)
    r = broadcast_impl.MessageQueue.attach(w.export_handle(), 1)
    try:
        assert w.is_writer and w.reader_rank is None
        assert not r.is_writer and r.reader_rank == 1
        assert (w.n_readers, w.max_chunks) == (2, 3) == (r.n_readers, r.max_chunks)
        assert w.max_chunk_bytes >= 300 and w.max_chunk_bytes == r.max_chunk_bytes
        assert w.name == r.name and w.name.startswith(shm.DEFAULT_PREFIX)
        import pickle
        assert pickle.loads(pickle.dumps(w.export_handle())) == w.export_handle()
    finally:
        _closing(w, r)
    assert w.closed and r.closed


def test_bad_arguments(broadcast_impl):
    with pytest.raises(ValueError):
        broadcast_impl.MessageQueue(0)
    with pytest.raises(ValueError):
        broadcast_impl.MessageQueue(1, max_chunk_bytes=16)
    with pytest.raises(ValueError):
        broadcast_impl.MessageQueue(1, max_chunks=0)
    w = broadcast_impl.MessageQueue(2, max_chunk_bytes=512, max_chunks=2)
    r0 = broadcast_impl.MessageQueue.attach(w.export_handle(), 0)
    try:
        with pytest.raises(ValueError, match="reader_rank"):
            broadcast_impl.MessageQueue.attach(w.export_handle(), 2)
        with pytest.raises(ValueError, match="already attached"):
            broadcast_impl.MessageQueue.attach(w.export_handle(), 0)
        with pytest.raises(ValueError):
            broadcast_impl.MessageQueue.attach(("something else", w.name), 1)
        with pytest.raises(ValueError):
            r0.enqueue(1)
        with pytest.raises(ValueError):
            w.dequeue(timeout=0)
    finally:
        _closing(w, r0)


def test_last_reader_to_attach_removes_the_name(broadcast_impl):
    w = broadcast_impl.MessageQueue(2, max_chunk_bytes=512, max_chunks=2)
    r0 = broadcast_impl.MessageQueue.attach(w.export_handle(), 0)
    assert w.name in shm.list_segments()
    r1 = broadcast_impl.MessageQueue.attach(w.export_handle(), 1)
    # Nothing left in /dev/shm for a crash to leak; the mapping still works.
    assert w.name not in shm.list_segments()
    w.enqueue("still works")
    assert r0.dequeue(timeout=WAIT) == r1.dequeue(timeout=WAIT) == "still works"
    _closing(w, r0, r1)


def test_interleaved_twins_share_the_layout(broadcast_impl, twin):
    other = twin.other.module("broadcast")
    w = broadcast_impl.MessageQueue(2, max_chunk_bytes=4096, max_chunks=3)
    r_same = broadcast_impl.MessageQueue.attach(w.export_handle(), 0)
    r_other = other.MessageQueue.attach(w.export_handle(), 1)
    try:
        for i in range(10):
            msg = {"i": i, "blob": bytes(range(i % 200)) * 40, "arr": np.arange(i * 500)}
            w.enqueue(msg)  # the bigger ones go out of band
            for r in (r_same, r_other):
                got = r.dequeue(timeout=WAIT)
                assert got["i"] == i and got["blob"] == msg["blob"]
                np.testing.assert_array_equal(got["arr"], msg["arr"])
    finally:
        _closing(w, r_same, r_other)


# --------------------------------------------------------------- big messages

def test_messages_above_the_chunk_size_arrive_intact_and_are_unlinked(broadcast_impl):
    w = broadcast_impl.MessageQueue(2, max_chunk_bytes=1024, max_chunks=2)
    readers = [broadcast_impl.MessageQueue.attach(w.export_handle(), r) for r in range(2)]
    before = set(shm.list_segments())
    try:
        big = {"bytes": os.urandom(300_000), "text": "x" * 5000, "arr": np.random.rand(50, 70)}
        w.enqueue(big)
        oob = set(shm.list_segments()) - before
        assert len(oob) == 1  # the message's own segment
        got0 = readers[0].dequeue(timeout=WAIT)
        assert set(shm.list_segments()) - before == oob  # reader 1 has not read it yet
        got1 = readers[1].dequeue(timeout=WAIT)
        assert set(shm.list_segments()) - before == set()  # every reader has it: unlinked
        for got in (got0, got1):
            assert got["bytes"] == big["bytes"] and got["text"] == big["text"]
            np.testing.assert_array_equal(got["arr"], big["arr"])
        del got0, got1
        # The chunk is reused by small messages afterwards.
        for i in range(5):
            w.enqueue(i)
            assert [r.dequeue(timeout=WAIT) for r in readers] == [i, i]
    finally:
        _closing(w, *readers)


def test_large_buffers_inside_a_chunk_are_private_copies(broadcast_impl):
    # Out-of-band buffers that fit the chunk are copied out before the chunk
    # is handed back, so the writer reusing it cannot change what was read.
    w = broadcast_impl.MessageQueue(1, max_chunk_bytes=1 << 20, max_chunks=1)
    r = broadcast_impl.MessageQueue.attach(w.export_handle(), 0)
    try:
        a = np.arange(100_000, dtype=np.int64)  # 800 KB: out of band, fits the chunk
        w.enqueue(a)
        got = r.dequeue(timeout=WAIT)
        w.enqueue(np.zeros_like(a))  # reuses the single chunk
        np.testing.assert_array_equal(got, a)
        got[0] = 42  # writable
        assert r.dequeue(timeout=WAIT).sum() == 0
        w.enqueue(np.arange(10))  # in band: writable too, as pickle gives it
        small = r.dequeue(timeout=WAIT)
        small[0] = 42
    finally:
        _closing(w, r)


def test_writer_close_discards_unread_out_of_band_segments(broadcast_impl):
    w = broadcast_impl.MessageQueue(1, max_chunk_bytes=512, max_chunks=4)
    r = broadcast_impl.MessageQueue.attach(w.export_handle(), 0)
    before = set(shm.list_segments())
    w.enqueue(b"a" * 10_000)
    w.enqueue("small")
    assert len(set(shm.list_segments()) - before) == 1
    w.close()
    assert set(shm.list_segments()) - before == set()
    with pytest.raises(ChannelClosedError):
        r.dequeue(timeout=WAIT)  # its segment is gone
    assert r.dequeue(timeout=WAIT) == "small"  # inline messages are still delivered
    with pytest.raises(ChannelClosedError):
        r.dequeue(timeout=WAIT)
    r.close()


# --------------------------------------------------------------- timeouts, closing

def test_timeouts(broadcast_impl):
    w = broadcast_impl.MessageQueue(1, max_chunk_bytes=512, max_chunks=2)
    r = broadcast_impl.MessageQueue.attach(w.export_handle(), 0)
    try:
        with pytest.raises(TimeoutError):
            r.dequeue(timeout=0)
        with pytest.raises(TimeoutError):
            r.dequeue(timeout=0.05)
        w.enqueue(1)
        w.enqueue(2)
        with pytest.raises(TimeoutError):
            w.enqueue(3, timeout=0)
        with pytest.raises(TimeoutError):
            w.enqueue(3, timeout=0.05)
        # Still usable after timeouts on both ends.
        assert r.dequeue(timeout=WAIT) == 1
        w.enqueue(3, timeout=WAIT)
        assert [r.dequeue(timeout=WAIT), r.dequeue(timeout=WAIT)] == [2, 3]
        with pytest.raises(ValueError):
            r.dequeue(timeout=-1)
    finally:
        _closing(w, r)


def test_readers_drain_then_see_the_close(broadcast_impl):
    w = broadcast_impl.MessageQueue(2, max_chunk_bytes=512, max_chunks=4)
    readers = [broadcast_impl.MessageQueue.attach(w.export_handle(), r) for r in range(2)]
    w.enqueue("a")
    w.enqueue("b")
    w.close()
    with pytest.raises(ChannelClosedError):
        w.enqueue("c")
    for r in readers:
        assert [r.dequeue(timeout=WAIT), r.dequeue(timeout=WAIT)] == ["a", "b"]
        with pytest.raises(ChannelClosedError):
            r.dequeue(timeout=WAIT)
        r.close()


def _run_blocked(fn, n=1):
    """Start ``n`` threads running ``fn(i)``; return (threads, outcomes, started)."""
    outcomes = [None] * n
    started = threading.Barrier(n + 1)

    def run(i):
        started.wait(WAIT)
        try:
            outcomes[i] = ("ok", fn(i))
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            outcomes[i] = ("err", exc)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    started.wait(WAIT)
    return threads, outcomes


def test_errors_name_the_queue_and_the_cause_in_both_twins(broadcast_impl):
    w = broadcast_impl.MessageQueue(1, max_chunk_bytes=4096, max_chunks=1)
    r = broadcast_impl.MessageQueue.attach(w.export_handle(), 0)
    name = w.name
    try:
        with pytest.raises(TimeoutError, match=f"^MessageQueue {name}: timed out waiting for a message$"):
            r.dequeue(timeout=0)
        w.enqueue(1)
        with pytest.raises(TimeoutError,
                           match=f"^MessageQueue {name}: timed out waiting for readers to make room$"):
            w.enqueue(2, timeout=0)
        r.close()
        with pytest.raises(ChannelClosedError, match=f"^MessageQueue {name} is closed$"):
            r.dequeue(timeout=0)
        with pytest.raises(ChannelClosedError, match=f"^MessageQueue {name}: the reader 0 closed the channel$"):
            w.enqueue(2, timeout=0)
    finally:
        _closing(w, r)


def test_close_by_writer_wakes_blocked_readers(broadcast_impl):
    w = broadcast_impl.MessageQueue(3, max_chunk_bytes=512, max_chunks=2)
    readers = [broadcast_impl.MessageQueue.attach(w.export_handle(), r) for r in range(3)]
    threads, outcomes = _run_blocked(lambda i: readers[i].dequeue(timeout=WAIT), 3)
    w.close()
    for t in threads:
        t.join(WAIT)
        assert not t.is_alive()
    for kind, exc in outcomes:
        assert kind == "err" and type(exc) is ChannelClosedError, outcomes
    _closing(*readers)


def test_close_by_reader_wakes_a_blocked_writer(broadcast_impl):
    w = broadcast_impl.MessageQueue(2, max_chunk_bytes=512, max_chunks=1)
    r0 = broadcast_impl.MessageQueue.attach(w.export_handle(), 0)
    r1 = broadcast_impl.MessageQueue.attach(w.export_handle(), 1)
    w.enqueue("fills the only chunk")
    assert r0.dequeue(timeout=WAIT) == "fills the only chunk"
    threads, outcomes = _run_blocked(lambda i: w.enqueue("next", timeout=WAIT))
    r1.close()  # never read it: the writer can never reuse the chunk
    threads[0].join(WAIT)
    assert outcomes[0][0] == "err" and isinstance(outcomes[0][1], ChannelClosedError)
    assert "reader 1" in str(outcomes[0][1])
    _closing(w, r0)


def test_close_from_another_thread_ends_a_blocked_dequeue(broadcast_impl):
    w = broadcast_impl.MessageQueue(1, max_chunk_bytes=512, max_chunks=2)
    r = broadcast_impl.MessageQueue.attach(w.export_handle(), 0)
    threads, outcomes = _run_blocked(lambda i: r.dequeue(timeout=WAIT))
    r.close()
    threads[0].join(WAIT)
    assert outcomes[0][0] == "err" and isinstance(outcomes[0][1], ChannelClosedError)
    # The writer can still publish (the closed reader does not block it until
    # it would have to make room) and close cleanly.
    w.enqueue(1)
    w.close()


def test_ctrl_c_interrupts_a_blocked_dequeue(broadcast_impl):
    w = broadcast_impl.MessageQueue(1, max_chunk_bytes=512, max_chunks=2)
    r = broadcast_impl.MessageQueue.attach(w.export_handle(), 0)
    timer = threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            r.dequeue(timeout=WAIT)
    finally:
        timer.cancel()
        timer.join(WAIT)
    # Usable afterwards.
    w.enqueue("after")
    assert r.dequeue(timeout=WAIT) == "after"
    _closing(w, r)


# --------------------------------------------------------------- other processes

# Runs in reader processes (started with `python -c`) and in the test, so both
# sides build the same message sequence from the seed.
CHILD_CODE = r'''
import hashlib, json, os, random, sys
import numpy as np

def make_message(seed, i):
    rnd = random.Random(seed * 1_000_003 + i)
    kind = rnd.random()
    if kind < 0.30:
        return ("small", i, rnd.randrange(-2**63, 2**63), "s" * rnd.randrange(0, 50))
    if kind < 0.55:
        return {"i": i, "payload": rnd.randbytes(rnd.randrange(0, 3000)), "f": rnd.random()}
    if kind < 0.85:
        shape = tuple(rnd.randrange(1, 40) for _ in range(rnd.randrange(1, 3)))
        dtype = rnd.choice(["int64", "float32", "uint8", "float64"])
        arr = np.random.default_rng(i + seed).integers(0, 100, size=shape).astype(dtype)
        return ["arr", i, arr]
    if kind < 0.98:
        return ("medium", i, rnd.randbytes(rnd.randrange(3000, 20000)))
    return ("huge", i, np.random.default_rng(i).random(rnd.randrange(10_000, 60_000)))

def same(a, b):
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and (a == b).all()
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return type(b) is dict and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b

def reader_main(twin, handle, rank, seed, n):
    import importlib
    mod = importlib.import_module("ray_lite._fast._broadcast_" + twin)
    q = mod.MessageQueue.attach(tuple(handle), rank)
    bad = []
    count = 0
    try:
        for i in range(n):
            msg = q.dequeue(timeout=60)
            count += 1
            if not same(make_message(seed, i), msg):
                bad.append(i)
        try:
            q.dequeue(timeout=60)
            tail = "more messages than sent"
        except Exception as exc:
            tail = type(exc).__name__
    finally:
        q.close()
    print(json.dumps({"rank": rank, "count": count, "bad": bad[:10], "tail": tail}), flush=True)

def blocked_reader_main(twin, handle, rank):
    import importlib
    mod = importlib.import_module("ray_lite._fast._broadcast_" + twin)
    q = mod.MessageQueue.attach(tuple(handle), rank)
    print("attached", flush=True)
    try:
        q.dequeue(timeout=60)
        print("got a message", flush=True)
    except Exception as exc:
        print(type(exc).__name__, flush=True)
    finally:
        q.close()

def idle_reader_main(twin, handle, rank):
    import importlib
    mod = importlib.import_module("ray_lite._fast._broadcast_" + twin)
    q = mod.MessageQueue.attach(tuple(handle), rank)
    print("attached", flush=True)
    sys.stdin.readline()  # until the test kills us

def async_reader_main(twin, handle, rank, n):
    import asyncio, importlib
    mod = importlib.import_module("ray_lite._fast._broadcast_" + twin)
    q = mod.MessageQueue.attach(tuple(handle), rank)

    async def main():
        return [await q.dequeue_async(timeout=60) for _ in range(n)]

    try:
        print(json.dumps(asyncio.run(main())), flush=True)
    finally:
        q.close()

def writer_main(twin, n_readers):
    import importlib
    mod = importlib.import_module("ray_lite._fast._broadcast_" + twin)
    q = mod.MessageQueue(n_readers, max_chunk_bytes=512, max_chunks=2)
    print(json.dumps(list(q.export_handle())), flush=True)
    sys.stdin.readline()  # until the test kills us
'''

_child_ns = {}
exec(compile(CHILD_CODE, "<broadcast child code>", "exec"), _child_ns)



def _spawn(call, stdin=subprocess.DEVNULL):
    code = f"import sys; sys.path[:] = {sys.path!r}\n{CHILD_CODE}\n{call}"
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stdin=stdin, text=True)


def _reap(*procs):
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(WAIT)
        if p.stdout:
            p.stdout.close()
        if p.stdin:
            p.stdin.close()


def test_10000_random_messages_to_3_reader_processes(broadcast_impl, twin):
    # Random sizes (some above the chunk size: out of band), numpy arrays,
    # a small ring so the writer waits for readers and wraps thousands of times.
    n = 10_000
    seed = 1234
    w = broadcast_impl.MessageQueue(3, max_chunk_bytes=16 * 1024, max_chunks=8)
    procs = [_spawn(f"reader_main({twin.suffix!r}, {list(w.export_handle())!r}, {rank}, {seed}, {n})")
             for rank in range(3)]
    try:
        make = _child_ns["make_message"]
        for i in range(n):
            w.enqueue(make(seed, i), timeout=60)
        w.close()
        results = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    finally:
        w.close()
        _reap(*procs)
    for rank, res in enumerate(results):
        assert res == {"rank": rank, "count": n, "bad": [], "tail": "ChannelClosedError"}
    assert [p.returncode for p in procs] == [0, 0, 0]


def test_writer_close_ends_readers_blocked_in_other_processes(broadcast_impl, twin):
    w = broadcast_impl.MessageQueue(3, max_chunk_bytes=512, max_chunks=2)
    procs = [_spawn(f"blocked_reader_main({twin.suffix!r}, {list(w.export_handle())!r}, {rank})")
             for rank in range(3)]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "attached"
        w.close()
        outs = [p.communicate(timeout=WAIT)[0].strip() for p in procs]
    finally:
        w.close()
        _reap(*procs)
    assert outs == ["ChannelClosedError"] * 3


def test_dead_reader_is_detected_by_a_blocked_writer(broadcast_impl, twin):
    w = broadcast_impl.MessageQueue(1, max_chunk_bytes=512, max_chunks=1)
    proc = _spawn(f"idle_reader_main({twin.suffix!r}, {list(w.export_handle())!r}, 0)",
                  stdin=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == "attached"
        w.enqueue("fills the only chunk")  # never read
        threads, outcomes = _run_blocked(lambda i: w.enqueue("waits for room", timeout=WAIT))
        proc.kill()
        proc.wait(WAIT)
        threads[0].join(WAIT)
        assert outcomes[0][0] == "err" and type(outcomes[0][1]) is PeerDiedError, outcomes
        assert "reader 0" in str(outcomes[0][1])
    finally:
        _reap(proc)
        w.close()


def test_dead_writer_is_detected_by_a_blocked_reader(broadcast_impl, twin):
    proc = _spawn(f"writer_main({twin.suffix!r}, 1)", stdin=subprocess.PIPE)
    try:
        handle = tuple(json.loads(proc.stdout.readline()))
        r = broadcast_impl.MessageQueue.attach(handle, 0)
        threads, outcomes = _run_blocked(lambda i: r.dequeue(timeout=WAIT))
        proc.kill()
        proc.wait(WAIT)
        threads[0].join(WAIT)
        assert outcomes[0][0] == "err" and type(outcomes[0][1]) is PeerDiedError, outcomes
        r.close()
    finally:
        _reap(proc)


# --------------------------------------------------------------- asyncio

def test_asyncio_reader_and_writer(broadcast_impl):
    w = broadcast_impl.MessageQueue(2, max_chunk_bytes=1024, max_chunks=2)
    r0 = broadcast_impl.MessageQueue.attach(w.export_handle(), 0)
    r1 = broadcast_impl.MessageQueue.attach(w.export_handle(), 1)

    async def consume(r, n):
        return [await r.dequeue_async(timeout=WAIT) for _ in range(n)]

    async def produce(n):
        for i in range(n):
            await w.enqueue_async({"i": i, "pad": b"p" * (i * 100)}, timeout=WAIT)

    async def main():
        # The ring holds 2 messages: the writer waits for room on its fd,
        # the readers for messages on theirs, all in one loop.
        got = await asyncio.gather(consume(r0, 30), consume(r1, 30), produce(30))
        with pytest.raises(TimeoutError):
            await r0.dequeue_async(timeout=0.05)
        # A close from the loop wakes an asyncio reader with the clear error.
        waiter = asyncio.ensure_future(r1.dequeue_async(timeout=WAIT))
        await asyncio.sleep(0)
        w.close()
        with pytest.raises(ChannelClosedError):
            await waiter
        return got

    try:
        got0, got1, _ = asyncio.run(main())
        want = [{"i": i, "pad": b"p" * (i * 100)} for i in range(30)]
        assert got0 == want and got1 == want
    finally:
        _closing(w, r0, r1)


def test_asyncio_reader_woken_by_a_writer_thread(broadcast_impl):
    w = broadcast_impl.MessageQueue(1, max_chunk_bytes=1024, max_chunks=4)
    r = broadcast_impl.MessageQueue.attach(w.export_handle(), 0)

    async def main():
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(r.dequeue_async(timeout=WAIT))
        await asyncio.sleep(0)
        await loop.run_in_executor(None, w.enqueue, "from a thread")
        return await task

    try:
        assert asyncio.run(main()) == "from a thread"
    finally:
        _closing(w, r)


def test_a_wake_up_hands_the_cpu_over_only_from_a_thread_without_an_event_loop(broadcast_impl):
    """A plain thread that wakes a sleeping peer waits for it next, so it
    yields its core to it; an event loop's thread has other work to run."""
    hands_over = broadcast_impl.hands_cpu_over

    async def main():
        loop = asyncio.get_running_loop()
        beside = await loop.run_in_executor(None, hands_over)   # a thread beside the loop
        return hands_over(), beside

    assert hands_over() is True
    assert asyncio.run(main()) == (False, True)
    assert hands_over() is True     # the loop is gone


def test_asyncio_ends_in_two_processes(broadcast_impl, twin):
    # The writer waits for room on its descriptor, the reader (another process,
    # either twin) for messages on its own: each is woken by the other end.
    n = 40
    w = broadcast_impl.MessageQueue(1, max_chunk_bytes=1024, max_chunks=2)
    proc = _spawn(f"async_reader_main({twin.suffix!r}, {list(w.export_handle())!r}, 0, {n})")

    async def produce():
        for i in range(n):
            await w.enqueue_async({"i": i}, timeout=WAIT)

    try:
        asyncio.run(produce())
        out = proc.communicate(timeout=WAIT)[0]
    finally:
        w.close()
        _reap(proc)
    assert json.loads(out) == [{"i": i} for i in range(n)]


# --------------------------------------------------------------- other processes' reach

# A plain Python process that is no part of any queue: it finds the queue's
# wake-up sockets in /proc/net/unix (their names are public) and tries to reach
# them: datagrams, connections, and binding their names.
FOREIGN_PROBE = r"""
import json, socket, sys

def errno_of(call, *args):
    try:
        call(*args)
        return 0
    except OSError as exc:
        return exc.errno

prefix = "@" + sys.argv[1] + "."
names = [line.split()[-1] for line in open("/proc/net/unix").read().splitlines()[1:]
         if line.split()[-1].startswith(prefix)]
report = {}
for name in names:
    address = b"\0" + name[1:].encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK) as s:
        sends = sorted({errno_of(s.sendto, b"x", address) for _ in range(1000)})
        connect = errno_of(s.connect, address)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        bind = errno_of(s.bind, address)
    report[name[len(prefix):].split(".")[0]] = {"send": sends, "connect": connect, "bind": bind}
print(json.dumps(report))
"""


def test_another_process_can_neither_wake_nor_reach_the_wake_up_sockets(broadcast_impl):
    import errno

    w = broadcast_impl.MessageQueue(2, max_chunk_bytes=1024, max_chunks=2)
    r0 = broadcast_impl.MessageQueue.attach(w.export_handle(), 0)
    r1 = broadcast_impl.MessageQueue.attach(w.export_handle(), 1)
    try:
        fds = [w.fileno(), r0.fileno(), r1.fileno()]
        out = subprocess.run([sys.executable, "-c", FOREIGN_PROBE, w.name], capture_output=True,
                             text=True, timeout=WAIT, check=True).stdout
        refused = {"send": [errno.EPERM], "connect": errno.EPERM, "bind": errno.EADDRINUSE}
        assert json.loads(out) == {role: refused for role in ("w0", "w1", "r0", "r1")}
        assert select.select(fds, [], [], 0)[0] == []  # nothing woke anybody

        async def main():  # and the queue still works, every end woken by its peer
            async def consume(r):
                return [await r.dequeue_async(timeout=WAIT) for _ in range(6)]

            async def produce():
                for i in range(6):
                    await w.enqueue_async(i, timeout=WAIT)

            return await asyncio.gather(consume(r0), consume(r1), produce())

        got0, got1, _ = asyncio.run(main())
        assert got0 == got1 == list(range(6))
    finally:
        _closing(w, r0, r1)


SQUATTER = r"""
import socket, sys
held = []
for address in sys.argv[1:]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(b"\0" + address.encode())
    held.append(s)
print("bound", flush=True)
sys.stdin.readline()
"""


def test_names_taken_first_by_another_process_do_not_make_the_queue_fail(broadcast_impl, monkeypatch):
    from ray_lite._fast import broadcast_wake

    name = shm.new_name()
    taken = 0x5EED_0000_0000_0001
    # The squatter holds the names the queue draws first (and those of earlier
    # versions); each end then draws another.
    addresses = [broadcast_wake.wake_address(name, role, taken)[1:].decode() for role in ("w0", "r0")]
    addresses += [f"{name}.w", f"{name}.r0"]
    squatter = subprocess.Popen([sys.executable, "-c", SQUATTER, *addresses], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
    try:
        assert squatter.stdout.readline().strip() == "bound"
        draws = iter([taken, 0x1111_0000_0000_0001, taken, 0x2222_0000_0000_0001])
        with monkeypatch.context() as patch:
            patch.setattr(shm, "new_name", lambda prefix=None: name)
            patch.setattr(broadcast_wake, "_new_token", lambda: next(draws))
            w = broadcast_impl.MessageQueue(1, max_chunk_bytes=1024, max_chunks=1)
            r = broadcast_impl.MessageQueue.attach(w.export_handle(), 0)
        try:
            assert next(draws, "all drawn") == "all drawn"

            async def main():
                async def consume():
                    return [await r.dequeue_async(timeout=WAIT) for _ in range(4)]

                async def produce():
                    for i in range(4):
                        await w.enqueue_async(i, timeout=WAIT)

                return (await asyncio.gather(consume(), produce()))[0]

            assert asyncio.run(main()) == list(range(4))
        finally:
            _closing(w, r)
        assert squatter.poll() is None
    finally:
        _reap(squatter)


# --------------------------------------------------------------- properties

@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.tuples(st.sampled_from(["put", "get0", "get1"]),
                              st.integers(0, 3000)), max_size=60))
def test_random_interleavings_match_a_model(broadcast_impl, ops):
    w = broadcast_impl.MessageQueue(2, max_chunk_bytes=1024, max_chunks=3)
    readers = [broadcast_impl.MessageQueue.attach(w.export_handle(), r) for r in range(2)]
    sent = []
    taken = [0, 0]
    try:
        for op, size in ops:
            if op == "put":
                msg = (len(sent), b"z" * size)
                if len(sent) - min(taken) < w.max_chunks:
                    w.enqueue(msg, timeout=0)
                    sent.append(msg)
                else:
                    with pytest.raises(TimeoutError):
                        w.enqueue(msg, timeout=0)
            else:
                r = int(op[-1])
                if taken[r] < len(sent):
                    assert readers[r].dequeue(timeout=0) == sent[taken[r]]
                    taken[r] += 1
                else:
                    with pytest.raises(TimeoutError):
                        readers[r].dequeue(timeout=0)
    finally:
        _closing(w, *readers)
