"""ray_lite.MessageQueue under vLLM's names (shm_broadcast.MessageQueue):
export_handle/create_from_handle, enqueue/dequeue(cancel=), broadcast_object,
wait_until_ready, create_from_process_group, and readers over TCP."""
import os
import pickle
import subprocess
import sys
import textwrap
import threading

import pytest

from ray_lite import MessageQueue
from ray_lite._fast import broadcast
from ray_lite.message_queue import QueueHandle
from ray_lite._fast.errors import ChannelClosedError, PeerDiedError


def _run_child(code, **kw):
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], **kw)


def test_local_only_handle_is_the_shared_memory_handle():
    with MessageQueue(2) as q:
        handle = q.export_handle()
        assert handle[0] == broadcast.HANDLE_TAG
        r0 = MessageQueue.create_from_handle(handle, 0)
        r1 = MessageQueue.attach(handle, 1)
        try:
            for end in (q, r0, r1):
                end.wait_until_ready()
            assert q.broadcast_object({"step": 1}) == {"step": 1}
            assert r0.broadcast_object() == {"step": 1}
            assert r1.broadcast_object() == {"step": 1}
            q.enqueue((1, b"x"), timeout=5)
            assert r0.dequeue(timeout=5) == (1, b"x")
            assert r1.dequeue(5, None) == (1, b"x")
            assert q.is_writer and not r0.is_writer and r1.reader_rank == 1
            assert r0.name == q.name  # the shared-memory queue's other names pass through
        finally:
            r0.close()
            r1.close()


def test_dequeue_cancel_raises_runtime_error_on_both_paths():
    cancel = threading.Event()
    cancel.set()
    with MessageQueue(2, local_reader_ranks=[0], connect_ip="127.0.0.1") as q:
        local = MessageQueue.create_from_handle(q.export_handle(), 0)
        remote = MessageQueue.create_from_handle(q.export_handle(), 1)
        try:
            q.wait_until_ready(timeout=30)
            remote.wait_until_ready(timeout=30)
            for reader in (local, remote):
                with pytest.raises(RuntimeError, match="cancelled"):
                    reader.dequeue(timeout=30, cancel=cancel)
                with pytest.raises(TimeoutError):
                    reader.dequeue(timeout=0.01, cancel=threading.Event())
            q.enqueue("after")
            # A cancel event that is not set does not stop the message.
            assert local.dequeue(timeout=30, cancel=threading.Event()) == "after"
            assert remote.dequeue(timeout=30, cancel=threading.Event()) == "after"
        finally:
            local.close()
            remote.close()


def test_remote_and_local_readers_get_every_message_in_order():
    big = os.urandom(3 << 20)  # larger than a chunk: out of band locally, one frame remotely
    with MessageQueue(3, max_chunk_bytes=1 << 16, max_chunks=4,
                      local_reader_ranks=[0, 2], connect_ip="127.0.0.1") as q:
        handle = q.export_handle()
        assert isinstance(handle, QueueHandle) and handle.remote_address[0] == "127.0.0.1"
        handle = pickle.loads(pickle.dumps(handle))  # it travels between processes
        readers = {rank: MessageQueue.create_from_handle(handle, rank) for rank in (0, 1, 2)}
        try:
            assert readers[1].is_remote_reader and not readers[0].is_remote_reader
            q.wait_until_ready(timeout=30)
            readers[1].wait_until_ready(timeout=30)
            messages = [{"i": i} for i in range(3)] + [("big", big), None]
            for m in messages:
                q.enqueue(m, timeout=30)
                for r in readers.values():
                    assert r.dequeue(timeout=30) == m
            q.close()
            for r in readers.values():
                with pytest.raises(ChannelClosedError):
                    r.dequeue(timeout=30)
        finally:
            for r in readers.values():
                r.close()


def test_a_writer_with_only_remote_readers_and_a_reader_in_another_process():
    with MessageQueue(1, local_reader_ranks=[], connect_ip="127.0.0.1") as q:
        child = _run_child(f"""
            import pickle, sys
            from ray_lite import MessageQueue
            r = MessageQueue.create_from_handle(pickle.loads({pickle.dumps(q.export_handle())!r}), 7)
            r.wait_until_ready(timeout=60)
            got = [r.dequeue(timeout=60) for _ in range(2)]
            sys.exit(0 if got == [[1, 2], "two"] else 3)
        """)
        try:
            q.wait_until_ready(timeout=60)
            assert q.broadcast_object([1, 2]) == [1, 2]
            q.enqueue("two")
            assert child.wait(60) == 0
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()


def test_remote_reader_sees_a_dead_writer_as_peer_died():
    child = _run_child("""
        import pickle, sys
        from ray_lite import MessageQueue
        q = MessageQueue(1, local_reader_ranks=[], connect_ip="127.0.0.1")
        sys.stdout.buffer.write(pickle.dumps(q.export_handle()).hex().encode() + b"\\n")
        sys.stdout.flush()
        q.wait_until_ready(timeout=60)
        q.enqueue("last words")
        sys.stdin.read()  # until the test kills us
    """, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        handle = pickle.loads(bytes.fromhex(child.stdout.readline().decode().strip()))
        r = MessageQueue.create_from_handle(handle, 0)
        try:
            r.wait_until_ready(timeout=60)
            assert r.dequeue(timeout=60) == "last words"
            child.kill()
            child.wait(30)
            with pytest.raises(PeerDiedError):
                r.dequeue(timeout=60)
        finally:
            r.close()
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
        child.stdin.close()
        child.stdout.close()


def test_a_rank_that_is_no_reader_is_refused():
    with MessageQueue(1, local_reader_ranks=[3]) as q:
        with pytest.raises(ValueError, match="not a reader"):
            MessageQueue.create_from_handle(q.export_handle(), 4)
        reader = MessageQueue.create_from_handle(q.export_handle(), 3)
        try:
            with pytest.raises(ValueError, match="writer's"):
                reader.export_handle()
        finally:
            reader.close()


class _OneProcessGroup:
    """vLLM's StatelessProcessGroup's collective names, for a group of the
    writer alone and one remote reader played by this process too."""

    def __init__(self, rank, box, published):
        self.rank, self.world_size, self._box, self._published = rank, 2, box, published

    def all_gather_obj(self, obj):
        return ["writer-host", "reader-host"]    # two machines: the reader is remote

    def broadcast_obj(self, obj, src):
        if self.rank == src:
            self._box.append(obj)
            self._published.set()
            return obj
        assert self._published.wait(60)
        return self._box[0]


def test_create_from_process_group_with_vllms_stateless_group(monkeypatch):
    box, published = [], threading.Event()
    monkeypatch.setattr("ray_lite.message_queue._node_ip", lambda: "127.0.0.1")
    # The writer's wait_until_ready needs the reader connected: run it on a thread.
    made = {}
    writer = threading.Thread(target=lambda: made.setdefault("q", MessageQueue.create_from_process_group(
        _OneProcessGroup(0, box, published), 1 << 16, 4, writer_rank=0)))
    writer.start()
    try:
        reader = MessageQueue.create_from_process_group(_OneProcessGroup(1, box, published),
                                                        1 << 16, 4)
        writer.join(60)
        q = made["q"]
        try:
            assert reader.is_remote_reader
            assert q.broadcast_object(("hello", 1)) == ("hello", 1)
            assert reader.broadcast_object() == ("hello", 1)
        finally:
            reader.close()
            q.close()
    finally:
        writer.join(60)


_PG_PROGRAM = """
import sys
import torch.distributed as dist
from ray_lite import MessageQueue
rank, port = int(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
try:
    q = MessageQueue.create_from_process_group(dist.group.WORLD, 1 << 16, 4, writer_rank=1)
    assert q.is_writer == (rank == 1)
    got = [q.broadcast_object({"n": i} if rank == 1 else None) for i in range(3)]
    assert got == [{"n": i} for i in range(3)], got
    dist.barrier()
    q.close()
finally:
    dist.destroy_process_group()
"""


def test_create_from_process_group_over_gloo():
    pytest.importorskip("torch.distributed")
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, "-c", _PG_PROGRAM, str(rank), str(port)])
             for rank in (0, 1)]
    try:
        assert [p.wait(120) for p in procs] == [0, 0]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def test_vllms_positional_n_local_reader_is_refused_saying_why():
    # vLLM's MessageQueue(n_reader, n_local_reader, ...): here the second
    # argument is max_chunk_bytes, so a port of that call gets told so.
    with pytest.raises(ValueError, match="n_local_reader.*local_reader_ranks"):
        MessageQueue(3, 2)
