"""MessageQueue's remote readers are admitted only with the queue's secret,
and a reader decodes nothing from a peer that is not the queue's writer."""
import hashlib
import hmac
import os
import socket
import struct

import pytest

from ray_lite import MessageQueue
from ray_lite.message_queue import QueueHandle
from ray_lite._private.links import mq_network
from ray_lite.exceptions import AuthenticationError, PeerDiedError

_UNPICKLED = []


def _mark():
    _UNPICKLED.append(True)


class _Bomb:
    """Unpickling it leaves a mark: what a malicious pickle would run."""

    def __reduce__(self):
        return (_mark, ())


@pytest.fixture
def codec_twin(codec_impl, monkeypatch):
    """mq_network's frames encoded and decoded by ``codec_impl``."""
    monkeypatch.setattr(mq_network, "codec", codec_impl)
    return codec_impl


def _hello(authkey, rank, nonce=None):
    signed = b"rlmq\x00\x01\x00\x00" + struct.pack("<q", rank) + (nonce or os.urandom(32))
    return signed + hmac.new(authkey, b"reader" + signed, hashlib.sha256).digest()


def _connect(address):
    sock = socket.create_connection(tuple(address), timeout=30)
    sock.settimeout(30)
    return sock


def _recv_all(sock):
    """What ``sock`` receives until the writer drops it (a reset too: the
    writer closes with the peer's extra bytes unread)."""
    out = b""
    while True:
        try:
            part = sock.recv(65536)
        except ConnectionResetError:
            return out
        if not part:
            return out
        out += part


def test_the_handle_carries_a_fresh_secret_per_queue():
    with MessageQueue(1, local_reader_ranks=[], connect_ip="127.0.0.1") as a, \
            MessageQueue(1, local_reader_ranks=[], connect_ip="127.0.0.1") as b:
        ka, kb = a.export_handle().authkey, b.export_handle().authkey
        assert isinstance(ka, bytes) and len(ka) == 32 and ka != kb


def test_a_peer_without_the_secret_is_refused_and_does_not_take_the_rank(codec_twin):
    with MessageQueue(2, local_reader_ranks=[0], connect_ip="127.0.0.1") as q:
        handle = q.export_handle()
        impostor = _connect(handle.remote_address)          # first at the door, rank 1
        impostor.sendall(_hello(os.urandom(32), 1))
        wrong = MessageQueue.create_from_handle(handle._replace(authkey=os.urandom(32)), 1)
        local = MessageQueue.create_from_handle(handle, 0)
        remote = MessageQueue.create_from_handle(handle, 1)
        try:
            q.wait_until_ready(timeout=30)
            remote.wait_until_ready(timeout=30)
            q.enqueue({"step": 1})
            assert remote.dequeue(timeout=30) == {"step": 1}
            assert local.dequeue(timeout=30) == {"step": 1}
            # Dropped before a byte was sent to them: no proof, no message.
            assert _recv_all(impostor) == b""
            with pytest.raises(PeerDiedError):
                wrong.wait_until_ready(timeout=30)
        finally:
            impostor.close()
            for r in (wrong, local, remote):
                r.close()


def test_a_peer_that_hangs_up_mid_hello_or_speaks_garbage_is_dropped(codec_twin):
    with MessageQueue(1, local_reader_ranks=[], connect_ip="127.0.0.1") as q:
        handle = q.export_handle()
        half = _connect(handle.remote_address)
        half.sendall(_hello(handle.authkey, 0)[:20])
        half.close()
        garbage = _connect(handle.remote_address)
        garbage.sendall(b"\x00" * 200)
        reader = MessageQueue.create_from_handle(handle, 0)
        try:
            q.wait_until_ready(timeout=30)
            q.enqueue("x")
            assert reader.dequeue(timeout=30) == "x"
            assert _recv_all(garbage) == b""
        finally:
            garbage.close()
            reader.close()


def test_a_silent_peer_holds_no_reader_up(codec_twin, monkeypatch):
    """A peer that connects first and never says a word: the real reader is
    admitted while it waits (it would be dropped only after the handshake
    timeout, set here beyond the test's own bound)."""
    monkeypatch.setattr(mq_network, "HANDSHAKE_TIMEOUT_S", 3600.0)
    with MessageQueue(1, local_reader_ranks=[], connect_ip="127.0.0.1") as q:
        handle = q.export_handle()
        silent = _connect(handle.remote_address)
        reader = MessageQueue.create_from_handle(handle, 0)
        try:
            q.wait_until_ready(timeout=30)
            q.enqueue("z")
            assert reader.dequeue(timeout=30) == "z"
            # Left out, and dropped when the writer stopped waiting for readers.
            assert _recv_all(silent) == b""
        finally:
            silent.close()
            reader.close()


def test_a_replayed_hello_is_refused(codec_twin):
    with MessageQueue(2, local_reader_ranks=[], connect_ip="127.0.0.1") as q:
        handle = q.export_handle()
        recorded = _hello(handle.authkey, 0)
        first = _connect(handle.remote_address)
        first.sendall(recorded)
        replay = _connect(handle.remote_address)
        replay.sendall(recorded)
        reader = MessageQueue.create_from_handle(handle, 1)
        try:
            q.wait_until_ready(timeout=30)
            proof = first.recv(32)
            assert len(proof) == 32
            assert _recv_all(replay) == b""
            q.enqueue("y")
            assert reader.dequeue(timeout=30) == "y"
        finally:
            first.close()
            replay.close()
            reader.close()


@pytest.mark.parametrize("proof", [b"", os.urandom(32)], ids=["no-proof", "wrong-proof"])
def test_a_reader_decodes_nothing_from_a_peer_posing_as_the_writer(codec_twin, proof):
    """A peer at the handle's address that lacks the secret: its frames,
    pickles included, are never decoded."""
    del _UNPICKLED[:]
    frame = codec_twin.dumps(_Bomb())
    codec_twin.loads(codec_twin.dumps(_Bomb()))
    assert _UNPICKLED == [True]          # the frame does run code when decoded
    del _UNPICKLED[:]
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        fake = QueueHandle(None, [], listener.getsockname(), os.urandom(32))
        reader = MessageQueue.create_from_handle(fake, 0)
        conn, _ = listener.accept()
        try:
            conn.settimeout(30)
            assert len(conn.recv(80, socket.MSG_WAITALL)) == 80     # the reader's hello
            ready = struct.pack("<BQ", 1, 0)
            data = struct.pack("<BQ", 0, len(frame)) + frame
            conn.sendall(proof + ready + data)
            with pytest.raises(AuthenticationError, match="authkey"):
                reader.wait_until_ready(timeout=30)
                reader.dequeue(timeout=30)
            assert _UNPICKLED == []
        finally:
            conn.close()
            reader.close()
    finally:
        listener.close()
