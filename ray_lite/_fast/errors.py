"""Exceptions raised by the hot paths; both twins raise these same classes,
and ``channel_error``, which turns a channel's status code into one of them."""
import queue


class SerializationError(TypeError):
    """A value that neither msgpack nor pickle can serialise.

    The message names the offending type and where it sat in the value
    (for example ``value[2]['key']``).
    """


class SharedPathError(PermissionError):
    """A path ray_lite makes in a shared place (the temporary directory,
    ``/dev/shm``) exists and is not this user's private file or directory:
    another user may have planted it (``shm.private_dir``)."""


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


class LinkClosed(ConnectionError):
    """The link is closed: by its peer, by its peer's death, or by this end."""


class RingEmpty(queue.Empty):
    """A non-blocking read found no message."""


# -- status codes --------------------------------------------------------------
# What the compiled channels' C-level waits return (``RL_*`` in _wait.pxd and
# _ring_c.pxd, which the compiled ring checks against these at import).
RL_OK = 0
RL_TIMEOUT = 1
RL_CLOSED = 2
RL_PEER_DIED = 3
RL_CORRUPT = 100

_STATUS_ERRORS = {RL_TIMEOUT: TimeoutError, RL_CLOSED: ChannelClosedError,
                  RL_PEER_DIED: PeerDiedError, RL_CORRUPT: DecodeError}


def channel_error(status, channel, *, peer="peer", pid=0, this_end=False, waiting_for=None):
    """The exception a channel raises for ``status``, both twins alike.

    ``channel`` names it (``"ring <name>"``, ``"MessageQueue <name>"``).
    ``RL_TIMEOUT``: ``TimeoutError`` (``waiting_for`` says for what);
    ``RL_CLOSED``: ``ChannelClosedError``, closed by ``peer``, or by this end
    (``this_end``); ``RL_PEER_DIED``: ``PeerDiedError``, ``peer`` (process
    ``pid``) died; ``RL_CORRUPT``: ``DecodeError``.
    """
    if status == RL_TIMEOUT:
        detail = "timed out" if waiting_for is None else f"timed out waiting for {waiting_for}"
    elif status == RL_CLOSED:
        if this_end:
            return ChannelClosedError(f"{channel} is closed")
        detail = f"the {peer} closed the channel"
    elif status == RL_PEER_DIED:
        detail = f"the {peer} process {pid} died"
    elif status == RL_CORRUPT:
        detail = "corrupt record"
    else:
        return AssertionError(f"{channel}: unexpected status {status}")
    return _STATUS_ERRORS[status](f"{channel}: {detail}")
