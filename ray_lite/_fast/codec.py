"""Serialization of values and yields (compiled twin ``_codec_c``, fallback ``_codec_py``).

Frame: one msgpack object.  Common types (None, bool, int up to 64 bits,
float, str, bytes, list, dict) are plain msgpack and need no copy besides the
write into the destination.  Everything else is a msgpack *ext* (see
``EXT_*``): tuples stay tuples, ints beyond 64 bits round-trip, and anything
msgpack cannot represent is pickled (protocol 5: the standard pickler, or
cloudpickle where functions and classes must travel by value, as those of
``__main__``, lambdas and closures do; see ``_pickling``).  Bytes-like values at
least ``oob_threshold`` bytes long, and pickle-5 out-of-band buffers (numpy
arrays), are not copied into the frame: they are returned to the caller as
*out-of-band buffers* for the transport to deliver beside the frame, and
``decode`` takes them back in the same order.

Public names (identical in both twins):

``encode_into(obj, buf, offset=0, oob_threshold=OOB_THRESHOLD, *, readonly_arrays=False) -> (end, buffers)``
    Write the frame of ``obj`` into the writable buffer ``buf`` starting at
    ``offset``; return the offset just past the frame and the frame's
    out-of-band buffers as a tuple of 1-D byte memoryviews -- the empty tuple
    when there are none, so the common frame allocates no container for
    them.  ``oob_threshold=None`` keeps everything in the frame.  Raises ``BufferTooSmallError`` when the
    frame does not fit, ``SerializationError`` for values nothing can serialise.
    ``readonly_arrays=True`` pickles numpy arrays so that they decode
    read-only, as Ray's are (``_arrays``: the core's links and ``put``).
``encode_growing(obj, buf, oob_threshold=OOB_THRESHOLD, *, limit=None, on_retry=None, readonly_arrays=False) -> (buf, end, buffers)``
    ``encode_into`` at offset 0 of the bytearray ``buf``, retried in a
    bigger bytearray (``max(needed, 2 * len(buf))`` bytes) until the frame
    fits; returns the bytearray used, the frame's end and its out-of-band
    buffers as a list.  A frame over ``limit`` bytes raises
    ``BufferTooSmallError``; ``on_retry()`` runs before each retry.
``dumps(obj, *, readonly_arrays=False) -> bytes``
    The frame as bytes, everything in-band.
``decode(data, buffers=()) -> obj``
    Decode exactly one frame that fills ``data`` (any bytes-like object,
    typically a memoryview of a ring slot).  The result never refers to the
    memory of ``data``; it may refer, zero-copy, to the out-of-band buffers.
    Truncated, corrupt or trailing input raises ``DecodeError``.
``loads(data) -> obj``
    ``decode(data)``.
"""
from ._select import load_twin
from .errors import BufferTooSmallError, DecodeError, SerializationError

_impl, COMPILED = load_twin("codec")

EXT_TUPLE = _impl.EXT_TUPLE
EXT_BIGINT = _impl.EXT_BIGINT
EXT_PICKLE = _impl.EXT_PICKLE
EXT_OOB = _impl.EXT_OOB
OOB_THRESHOLD = _impl.OOB_THRESHOLD
MAX_DEPTH = _impl.MAX_DEPTH

encode_into = _impl.encode_into
encode_growing = _impl.encode_growing
dumps = _impl.dumps
decode = _impl.decode
loads = _impl.loads

__all__ = [
    "COMPILED", "EXT_TUPLE", "EXT_BIGINT", "EXT_PICKLE", "EXT_OOB", "OOB_THRESHOLD",
    "MAX_DEPTH", "encode_into", "encode_growing", "dumps", "decode", "loads",
    "BufferTooSmallError", "DecodeError", "SerializationError",
]
