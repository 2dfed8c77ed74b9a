"""MessageQueue.shutdown(), vLLM's name: idempotent, frees what the queue
holds, wakes a reader or writer blocked in dequeue/enqueue with
ChannelClosedError, and every later use raises it; on both twins."""
import socket
import threading

import pytest

from ray_lite import MessageQueue
from ray_lite import message_queue as mq_module
from ray_lite._fast import shm
from ray_lite._fast.errors import ChannelClosedError

T = 30


@pytest.fixture(autouse=True)
def shm_twin(broadcast_impl, monkeypatch):
    """The wrapper over each twin's shared-memory queue in turn."""
    monkeypatch.setattr(mq_module, "_ShmQueue", broadcast_impl.MessageQueue)


class Blocked:
    """``call()`` on a thread; ``outcome()`` is what it returned or raised."""

    def __init__(self, call):
        self._result = None
        self._started = threading.Event()

        def run():
            self._started.set()
            try:
                self._result = ("returned", call())
            except BaseException as exc:   # noqa: BLE001 - handed to the test
                self._result = ("raised", exc)
        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        assert self._started.wait(T)

    def outcome(self):
        self._thread.join(T)
        assert not self._thread.is_alive(), "still blocked after shutdown()"
        return self._result


def _raised_closed(outcome):
    kind, value = outcome
    assert kind == "raised" and isinstance(value, ChannelClosedError), outcome
    return value


def test_shutdown_is_idempotent_frees_the_segments_and_later_use_raises():
    # Reader 1 never attaches: the queue's name stays until the writer ends.
    q = MessageQueue(2, max_chunk_bytes=4096)
    r = MessageQueue.create_from_handle(q.export_handle(), 0)
    before = set(shm.list_segments())
    q.enqueue(b"x" * 65536)         # larger than a chunk: a segment of its own
    assert r.dequeue(timeout=T) == b"x" * 65536
    oob = set(shm.list_segments()) - before     # reader 1 has not read it
    assert len(oob) == 1 and q.name in shm.list_segments()
    r.shutdown()
    r.shutdown()
    q.shutdown()
    q.shutdown()
    assert q.closed and r.closed
    assert not ({q.name} | oob) & set(shm.list_segments())
    with pytest.raises(ChannelClosedError):
        q.enqueue("after", timeout=T)
    with pytest.raises(ChannelClosedError):
        r.dequeue(timeout=T)
    q.close()       # close after shutdown: nothing more to do
    r.close()


def test_a_reader_blocked_in_dequeue_is_woken_by_its_shutdown():
    with MessageQueue(1) as q:
        r = MessageQueue.create_from_handle(q.export_handle(), 0)
        blocked = Blocked(lambda: r.dequeue(timeout=None))
        r.shutdown()
        assert "shut down" in str(_raised_closed(blocked.outcome()))


def test_a_reader_blocked_with_a_cancel_event_is_woken_too():
    with MessageQueue(1) as q:
        r = MessageQueue.create_from_handle(q.export_handle(), 0)
        blocked = Blocked(lambda: r.dequeue(timeout=None, cancel=threading.Event()))
        r.shutdown()
        _raised_closed(blocked.outcome())


def test_readers_blocked_in_dequeue_are_woken_by_the_writers_shutdown():
    q = MessageQueue(2)
    readers = [MessageQueue.create_from_handle(q.export_handle(), rank) for rank in (0, 1)]
    try:
        q.enqueue("sent before")
        assert [r.dequeue(timeout=T) for r in readers] == ["sent before"] * 2
        blocked = [Blocked(lambda r=r: r.dequeue(timeout=None)) for r in readers]
        q.shutdown()
        for b in blocked:
            _raised_closed(b.outcome())
    finally:
        for r in readers:
            r.shutdown()


def test_a_writer_blocked_on_a_full_queue_is_woken_by_its_shutdown():
    q = MessageQueue(1, max_chunks=2)
    r = MessageQueue.create_from_handle(q.export_handle(), 0)
    try:
        q.enqueue(1)
        q.enqueue(2)        # the ring is full: the reader reads nothing
        blocked = Blocked(lambda: q.enqueue(3, timeout=None))
        q.shutdown()
        _raised_closed(blocked.outcome())
    finally:
        r.shutdown()


def _signal_when_waiting(remote):
    """An event set as the remote reader's dequeue enters its wait on the
    socket (its selector's select): a shutdown after it lands on a waiting
    reader, not on one that has yet to look."""
    waiting = threading.Event()
    selector = remote._net._selector
    select = selector.select

    def select_and_signal(timeout=None):
        waiting.set()
        return select(timeout)
    selector.select = select_and_signal
    return waiting


@pytest.mark.parametrize("cancel", [None, threading.Event], ids=["plain", "cancel"])
def test_a_remote_reader_blocked_in_dequeue_is_woken_by_its_shutdown(cancel):
    with MessageQueue(1, local_reader_ranks=[], connect_ip="127.0.0.1") as q:
        remote = MessageQueue.create_from_handle(q.export_handle(), 0)
        q.wait_until_ready(timeout=T)
        remote.wait_until_ready(timeout=T)
        q.enqueue("first")
        assert remote.dequeue(timeout=T) == "first"
        waiting = _signal_when_waiting(remote)
        blocked = Blocked(lambda: remote.dequeue(timeout=None, cancel=cancel and cancel()))
        assert waiting.wait(T)
        remote.shutdown()
        assert "shut down" in str(_raised_closed(blocked.outcome()))
        remote.shutdown()
        with pytest.raises(ChannelClosedError):
            remote.dequeue(timeout=T)


class _SignalOnSend:
    """A writer's connection to a remote reader whose ``sendall`` sets
    ``sending`` as it starts: a send larger than both ends' buffers blocks in
    it, so a shutdown after the event lands on a blocked writer."""

    def __init__(self, conn, sending):
        self._conn = conn
        self._sending = sending

    def sendall(self, data, *flags):
        self._sending.set()
        return self._conn.sendall(data, *flags)

    def __getattr__(self, name):
        return getattr(self._conn, name)


_BUFFER_BYTES = 1 << 16


def test_a_writer_blocked_on_a_remote_reader_that_does_not_read_is_woken_by_its_shutdown():
    q = MessageQueue(1, local_reader_ranks=[], connect_ip="127.0.0.1")
    remote = MessageQueue.create_from_handle(q.export_handle(), 0)
    try:
        q.wait_until_ready(timeout=T)
        remote.wait_until_ready(timeout=T)
        publisher = q._net
        sending = threading.Event()
        # Both buffers fixed small (no autotuning): a message many times
        # their size cannot leave while the reader reads nothing.
        remote._net._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _BUFFER_BYTES)
        for rank, conn in list(publisher._conns.items()):
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _BUFFER_BYTES)
            publisher._conns[rank] = _SignalOnSend(conn, sending)
        blocked = Blocked(lambda: q.enqueue(b"x" * (128 * _BUFFER_BYTES), timeout=None))
        assert sending.wait(T)
        q.shutdown()
        assert "shut down" in str(_raised_closed(blocked.outcome()))
        q.shutdown()
        assert q.closed
        with pytest.raises(ChannelClosedError):
            q.enqueue("after", timeout=T)
    finally:
        q.shutdown()
        remote.shutdown()
