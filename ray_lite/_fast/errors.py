"""Exceptions raised by the hot paths; both twins raise these same classes."""
import queue


class SerializationError(TypeError):
    """A value that neither msgpack nor pickle can serialise.

    The message names the offending type and where it sat in the value
    (for example ``value[2]['key']``).
    """


class DecodeError(ValueError):
    """A frame that is truncated, corrupt, or not produced by this codec."""


class BufferTooSmallError(ValueError):
    """``encode_into`` ran out of room in the destination buffer.

    ``needed`` is a lower bound on the bytes required (exact when known),
    so the caller can retry with a bigger buffer or fall back to a side segment.
    """

    def __init__(self, message, needed=-1):
        super().__init__(message)
        self.needed = needed


class MessageTooLargeError(ValueError):
    """A message over the channel's configured maximum size."""


class ChannelClosedError(ConnectionError):
    """The other end closed the channel (or this end already did)."""


class PeerDiedError(ChannelClosedError):
    """The process at the other end died without closing the channel."""


class RingEmpty(queue.Empty):
    """A non-blocking read found no message."""
