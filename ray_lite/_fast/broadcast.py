"""Broadcast message queue over shared memory: one writer, N readers
(compiled twin ``_broadcast_c``, fallback ``_broadcast_py``).  See
``_broadcast_py`` for the segment layout and the waiting protocol, which both
twins share byte for byte.

``MessageQueue(n_readers, max_chunk_bytes=DEFAULT_MAX_CHUNK_BYTES, max_chunks=DEFAULT_MAX_CHUNKS, *, oob_threshold=codec.OOB_THRESHOLD)``
    Create the queue; this object is its writer end.
``MessageQueue.attach(handle, reader_rank)``
    Attach as reader ``reader_rank`` (0-based) in any process;
    ``handle`` is ``export_handle()`` (a picklable tuple).
``q.enqueue(obj, timeout=None)``  writer: broadcast ``obj`` to every reader.
``q.dequeue(timeout=None)``       reader: the next message.
``await q.enqueue_async(obj, timeout=None)``, ``await q.dequeue_async(timeout=None)``
    The same for asyncio: they wait on ``q.fileno()`` in the running loop.
``q.close()``                     idempotent; see ``_broadcast_py``.
``q.name``, ``q.n_readers``, ``q.max_chunk_bytes``, ``q.max_chunks``,
``q.is_writer``, ``q.reader_rank``, ``q.closed``

Errors: ``TimeoutError`` when a timeout expires (0: do not wait);
``ChannelClosedError`` when this end, the writer (for readers, after the
last message) or a reader the writer waits for closed; ``PeerDiedError``
when the process at the other end died; the codec's ``SerializationError``
for values nothing can serialise.
"""
from ._select import load_twin
from .errors import ChannelClosedError, PeerDiedError

_impl, COMPILED = load_twin("broadcast")

MessageQueue = _impl.MessageQueue
HANDLE_TAG = _impl.HANDLE_TAG
DEFAULT_MAX_CHUNK_BYTES = _impl.DEFAULT_MAX_CHUNK_BYTES
DEFAULT_MAX_CHUNKS = _impl.DEFAULT_MAX_CHUNKS
MIN_CHUNK_BYTES = _impl.MIN_CHUNK_BYTES
MAX_READERS = _impl.MAX_READERS

__all__ = ["COMPILED", "MessageQueue", "HANDLE_TAG", "DEFAULT_MAX_CHUNK_BYTES",
           "DEFAULT_MAX_CHUNKS", "MIN_CHUNK_BYTES", "MAX_READERS",
           "ChannelClosedError", "PeerDiedError"]
