"""Links: the duplex channel between two processes of one runtime.

A link is a pair of single-producer/single-consumer channels, one each way.
The creator makes it and sends ``names`` to the peer (through the driver or
at spawn), which attaches by name.  Messages are Python tuples.

The runtime only uses this interface:

``Link.create(prefix) -> link``, ``link.names``, ``Link.attach(names) -> link``
``link.send(msg)``       thread-safe (one lock per direction: the rings are SPSC)
``link.recv_all()``      every message available now, never blocks (after a
                         close: what the peer sent before it, then nothing)
``link.fileno()``        readable when messages may be available (for poll/asyncio)
``link.close()``         closes and, on the creator, unlinks
``spin_readable(links, timeout)`` spins (never sleeps) until a link may have data;
                         a process sleeps on its links with ``ring.wait_rings_or_fds``.

Messages are encoded by ``ray_lite._fast.codec`` straight into the rings.
The link itself is a hot path (``ray_lite._fast.link``, compiled twin and
pure-Python twin); this module adds what the runtime needs around it.
A link that is closed, at either end or by its peer's death, raises
``LinkClosed`` (and nothing else) from ``attach``, ``send`` and ``recv_wait``;
``recv_all``, ``has_data``, ``spin_poll``, ``arm`` and ``disarm`` never raise
for it (reading tells).
"""
from ray_lite._fast import link as _link_mod
from ray_lite._fast import ring as _ring_mod
from ray_lite._fast.errors import LinkClosed
from ray_lite._fast.wait_policy import SLICE_WEAK_NS, ns_to_s

from ..process.interrupts import sleep_point

_recv_wait = _link_mod.Link.recv_wait


class Link(_link_mod.Link):
    """A link over two shared-memory SPSC rings (``ray_lite._fast.link``,
    compiled or pure Python), whose ``recv_wait`` is a sleep point: a Ctrl-C
    ends its wait at once (``interrupts``)."""

    __slots__ = ()

    @sleep_point
    def recv_wait(self, timeout):
        """The next message, waiting at most ``timeout`` s (None when it expires).

        Waits the ring's own way (a short spin, then a futex sleep), which
        wakes faster than ``poll`` on the descriptor: for a process whose
        only link this is.  ``LinkClosed`` when the peer closed or died.
        """
        return _recv_wait(self, timeout)


drain_links = _link_mod.drain


RING_COMPILED = _ring_mod.COMPILED
# The pure-Python ring has no memory fences: a wake-up can be lost (see
# _ring_py "Ordering"), so sleepers re-check at this interval.
WEAK_SLICE = None if RING_COMPILED else ns_to_s(SLICE_WEAK_NS)


def spin_readable(links, timeout):
    """Busy-wait at most ``timeout`` s, never sleeping, until a link may have
    data (``ring.spin_any``); True if one may."""
    # A ring closed under us counts as ready: reading will tell.
    return bool(_ring_mod.spin_any([link._rx for link in links], timeout))
