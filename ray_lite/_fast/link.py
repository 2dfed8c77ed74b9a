"""Links: the duplex channel between two processes (compiled twin ``_link_c``,
fallback ``_link_py``).

A link is a pair of single-producer/single-consumer rings, one each way.
The creator makes it and sends ``names`` to the peer, which attaches by
name.  Messages are Python values, encoded by ``codec`` straight into the
rings.

Public names (identical in both twins):

``Link.create(prefix=None)``, ``Link.loopback(prefix=None)``, ``Link.attach(names)``
    A new link; a link from this process to itself (one ring); the other end
    of ``create``'s link (``LinkClosed`` when its creator closed it).
``Link(names, tx, rx)``
    A link over two rings made by hand (tests): the compiled twin takes the
    compiled ring's ends only (TypeError otherwise), the pure twin either.
``link.names``, ``link.on_full``
    The rings' names; called (no lock held) while the peer's ring is full,
    to read our side before retrying (the peer may be blocked writing to us).
``link.send(msg)``
    Thread-safe (one lock per direction: the rings are SPSC).
``link.recv_all()``
    Every message there is now, never blocking (after a close: what the peer
    sent before it, then nothing).
``link.recv_wait(timeout)``
    The next message, waiting at most ``timeout`` s (None when it expires).
``link.has_data()``, ``link.spin_poll(timeout)``, ``link.fileno()``, ``link.arm()``, ``link.disarm()``
    Readiness: at once; spinning without sleeping; the descriptor that fires
    once armed (``arm`` is False when a message is already there).
``link.close()``
    Closes both rings and, on the creator, unlinks them.
``drain(entries, polls, handlers, stash) -> int``
    For each ``(peer, link, poll)`` of ``entries`` whose link has messages,
    read them all and call ``handlers[msg[0]](peer, msg)`` for each; the
    number handled.  When a handler raises, the messages read after its own
    go to ``stash`` as ``(peer, msg)`` before the error propagates.

A link closed at either end or by its peer's death raises ``LinkClosed``
(and nothing else) from ``attach``, ``send`` and ``recv_wait``; ``recv_all``,
``has_data``, ``spin_poll``, ``arm`` and ``disarm`` never raise for it.
"""
from ._select import load_twin
from .errors import LinkClosed

_impl, COMPILED = load_twin("link")

Link = _impl.Link
drain = _impl.drain
RING_CAPACITY = _impl.RING_CAPACITY

__all__ = ["COMPILED", "Link", "LinkClosed", "RING_CAPACITY", "drain"]
