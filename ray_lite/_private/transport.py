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
A link that is closed, at either end or by its peer's death, raises
``LinkClosed`` (and nothing else) from ``attach``, ``send`` and ``recv_wait``;
``recv_all``, ``has_data``, ``spin_poll``, ``arm`` and ``disarm`` never raise
for it (reading tells).
"""
import threading

from ray_lite._fast import ring as _ring_mod
from ray_lite._fast.errors import ChannelClosedError as _ChannelClosed
from ray_lite._fast.errors import RingEmpty as _RingEmpty
from ray_lite._fast.ring import ShmRing as _ShmRing
from ray_lite._fast.wait_policy import SLICE_WEAK_NS, ns_to_s

from .interrupts import sleep_point


class LinkClosed(ConnectionError):
    """The link is closed: by its peer, by its peer's death, or by this end."""


class Link:
    """A link over two shared-memory SPSC rings (``ray_lite._fast.ring``)."""

    __slots__ = ("names", "_tx", "_rx", "_lock", "_closed", "_fd", "on_full")

    def __init__(self, names, tx, rx):
        self.names = names
        self._tx = tx
        self._rx = rx
        self._lock = threading.Lock()
        self._closed = False
        self._fd = rx.fileno()
        self.on_full = None     # called (no lock held) while the peer's ring is full

    @classmethod
    def create(cls, prefix=None):
        tx = _ShmRing.create(RING_CAPACITY, side="producer", prefix=prefix)
        try:
            rx = _ShmRing.create(RING_CAPACITY, side="consumer", prefix=prefix)
        except BaseException:
            tx.close()
            raise
        return cls((tx.name, rx.name), tx, rx)

    @classmethod
    def loopback(cls, prefix=None):
        """A link from this process to itself (an actor calling its own
        methods): one ring, read by the same process that writes it, so its
        messages wake this process's waits and event loops as any peer's do."""
        tx = _ShmRing.create(RING_CAPACITY, side="producer", prefix=prefix)
        try:
            rx = _ShmRing.attach(tx.name, side="consumer")
        except BaseException:
            tx.close()
            raise
        return cls((tx.name, tx.name), tx, rx)

    @classmethod
    def attach(cls, names):
        """The other end of the link ``Link.create`` made; ``LinkClosed``
        when its creator closed it already (or died and it was cleaned up)."""
        a2b, b2a = names
        try:
            rx = _ShmRing.attach(a2b, side="consumer")
            try:
                tx = _ShmRing.attach(b2a, side="producer")
            except BaseException:
                rx.close()
                raise
        except (FileNotFoundError, _ChannelClosed) as exc:
            raise LinkClosed(str(exc)) from None
        return cls(names, tx, rx)

    def send(self, msg):
        tx = self._tx
        while True:
            # ``with``, not acquire/release (which costs half as much): a
            # worker's send can run inside the user's code, where a cancel
            # raises KeyboardInterrupt at any bytecode; between acquire()
            # and its ``try`` that would keep the lock for good, while
            # ``with`` leaves no such gap.
            with self._lock:
                if self._closed:
                    raise LinkClosed("link is closed")
                try:
                    # A full ring must not block us for good: the peer may be
                    # blocked writing to us.  Drain our side, then retry.
                    tx.put(msg, 0 if self.on_full is not None else None)   # (timeout)
                    return
                except TimeoutError:
                    pass
                except _ChannelClosed as exc:
                    raise LinkClosed(str(exc)) from None
            self.on_full()

    def recv_all(self):
        rx = self._rx
        out = []
        if self._closed:
            return out
        while rx.poll():
            try:
                out.append(rx.get_nowait())
            except (_RingEmpty, _ChannelClosed):
                break
        return out

    @sleep_point
    def recv_wait(self, timeout):
        """The next message, waiting at most ``timeout`` s (None when it expires).

        Waits the ring's own way (a short spin, then a futex sleep), which
        wakes faster than ``poll`` on the descriptor: for a process whose
        only link this is.  ``LinkClosed`` when the peer closed or died.
        """
        if self._closed:
            raise LinkClosed("link is closed")
        try:
            return self._rx.get(timeout)
        except TimeoutError:
            return None
        except _ChannelClosed as exc:       # PeerDiedError too
            raise LinkClosed(str(exc)) from None

    def has_data(self):
        return self._rx.poll()

    def spin_poll(self, timeout):
        """Busy-wait at most ``timeout`` s for a message, never sleeping; True
        when there is one (or the link is closed: reading will tell)."""
        if self._closed:
            return True
        return self._rx.spin_poll(timeout)     # a ring closed under us: True

    def fileno(self):
        return self._fd

    def arm(self):
        """Ask for ``fileno()`` to fire at the next message; False if one is there."""
        if self._closed:
            return True
        try:
            return self._rx.arm_fd()
        except _ChannelClosed:      # closed under us (close() from another thread)
            return True

    def disarm(self):
        if not self._closed:
            self._rx.clear_fd()

    def close(self):
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._tx.close()
        self._rx.close()


RING_COMPILED = _ring_mod.COMPILED
RING_CAPACITY = 1 << 20
# The pure-Python ring has no memory fences: a wake-up can be lost (see
# _ring_py "Ordering"), so sleepers re-check at this interval.
WEAK_SLICE = None if RING_COMPILED else ns_to_s(SLICE_WEAK_NS)


def spin_readable(links, timeout):
    """Busy-wait at most ``timeout`` s, never sleeping, until a link may have
    data (``ring.spin_any``); True if one may."""
    # A ring closed under us counts as ready: reading will tell.
    return bool(_ring_mod.spin_any([link._rx for link in links], timeout))
