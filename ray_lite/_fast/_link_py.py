"""Pure-Python twin of ``_link_c``: the link and the drain of many links.

See ``link.py`` for the interface; this module is its specification.
"""
import itertools
import operator
import threading

from . import ring as _ring_mod
from .errors import ChannelClosedError as _ChannelClosed
from .errors import LinkClosed
from .errors import RingEmpty as _RingEmpty

__all__ = ["Link", "drain", "RING_CAPACITY"]

RING_CAPACITY = 1 << 20

_compress = itertools.compress
_MANY_LINKS = 8     # beyond this, drain polls from C (fewer: a loop costs less)
_call = getattr(operator, "call", None) or (lambda fn: fn())   # operator.call: 3.11+


class Link:
    """A link over two shared-memory SPSC rings (``ray_lite._fast.ring``)."""

    __slots__ = ("names", "_tx", "_rx", "_lock", "_closed", "_fd", "on_full")

    def __init__(self, names, tx, rx):
        self.names = names
        self._tx = tx
        tx.readonly_arrays = True   # as Ray's arrays are: see _arrays
        self._rx = rx
        self._lock = threading.Lock()
        self._closed = False
        self._fd = rx.fileno()
        self.on_full = None     # called (no lock held) while the peer's ring is full

    @classmethod
    def create(cls, prefix=None):
        tx = _ring_mod.ShmRing.create(RING_CAPACITY, side="producer", prefix=prefix)
        try:
            rx = _ring_mod.ShmRing.create(RING_CAPACITY, side="consumer", prefix=prefix)
        except BaseException:
            tx.close()
            raise
        return cls((tx.name, rx.name), tx, rx)

    @classmethod
    def loopback(cls, prefix=None):
        tx = _ring_mod.ShmRing.create(RING_CAPACITY, side="producer", prefix=prefix)
        try:
            rx = _ring_mod.ShmRing.attach(tx.name, side="consumer")
        except BaseException:
            tx.close()
            raise
        return cls((tx.name, tx.name), tx, rx)

    @classmethod
    def attach(cls, names):
        a2b, b2a = names
        try:
            rx = _ring_mod.ShmRing.attach(a2b, side="consumer")
            try:
                tx = _ring_mod.ShmRing.attach(b2a, side="producer")
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

    def recv_wait(self, timeout):
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
        if self._closed:
            return True
        return self._rx.spin_poll(timeout)     # a ring closed under us: True

    def fileno(self):
        return self._fd

    def arm(self):
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


def drain(entries, polls, handlers, stash):
    """Dispatch every message the links of ``entries`` hold now; their count."""
    n = 0
    if len(polls) > _MANY_LINKS:
        # A proxy has a link per replica, most of them empty at any drain:
        # poll them all from C (map) and visit the ready ones.
        try:
            entries = list(_compress(entries, map(_call, polls)))
        except (OSError, ValueError):
            pass            # a ring closed under us: look at each below
    for peer, link, poll in entries:
        try:
            if not poll():
                continue
            msgs = link.recv_all()
        except (LinkClosed, OSError, ValueError):
            continue
        i = 0
        try:
            for msg in msgs:
                i += 1
                handlers[msg[0]](peer, msg)
        except BaseException:
            # A KeyboardInterrupt (or a bug) must not lose what was read.
            stash.extend((peer, m) for m in msgs[i:])
            raise
        n += i
    return n
