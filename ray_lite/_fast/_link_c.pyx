# cython: language_level=3
"""The link, compiled.  Same names, behaviour and errors as ``_link_py`` (the
executable specification); its C layout is in ``_link_c.pxd``.

Each message of a round trip passes ``send`` once and ``recv_all`` (or
``drain``) once: written in Python, the lock, the look at the closed flag
and the calls into the ring were about as much again as the ring's own work
(encoding into the slot, decoding from it).
"""
from cpython.exc cimport PyErr_CheckSignals
from cpython.pythread cimport (
    NOWAIT_LOCK,
    PY_LOCK_ACQUIRED,
    PyLockStatus,
    PyThread_acquire_lock,
    PyThread_allocate_lock,
    PyThread_free_lock,
    PyThread_release_lock,
    PyThread_type_lock,
)

from ray_lite._fast._ring_c cimport ShmRing, rl_ring_poll

from ._ring_c import ShmRing as _ShmRing
from .errors import ChannelClosedError, LinkClosed, RingEmpty

__all__ = ["Link", "drain", "RING_CAPACITY"]

RING_CAPACITY = 1 << 20


cdef extern from "pythread.h":
    PyLockStatus PyThread_acquire_lock_timed(PyThread_type_lock, long long microseconds,
                                             int intr_flag) nogil


cdef enum:
    # A sender that finds the lock taken sleeps on it in slices this long
    # (µs), looking for a Ctrl-C between them: the holder may wait long on a
    # full ring.
    LOCK_SLICE_US = 50000


cdef inline bint _ready(ShmRing rx):
    # ``rx.poll()``: a ring closed under us counts as ready (reading tells).
    return rx._closed or rl_ring_poll(&rx.end)


cdef class Link:
    """A link over two shared-memory SPSC rings (``ray_lite._fast.ring``)."""

    def __cinit__(self, *args, **kwargs):
        self._lock = PyThread_allocate_lock()
        if self._lock is NULL:
            raise MemoryError("could not allocate the link's lock")

    def __dealloc__(self):
        if self._lock is not NULL:
            PyThread_free_lock(self._lock)

    def __init__(self, names, ShmRing tx not None, ShmRing rx not None):
        self.names = names
        self._tx = tx
        tx.readonly_arrays = True   # as Ray's arrays are: see _arrays
        self._rx = rx
        self._closed = False
        self._fd = rx.fileno()
        self.on_full = None

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
        tx = _ShmRing.create(RING_CAPACITY, side="producer", prefix=prefix)
        try:
            rx = _ShmRing.attach(tx.name, side="consumer")
        except BaseException:
            tx.close()
            raise
        return cls((tx.name, tx.name), tx, rx)

    @classmethod
    def attach(cls, names):
        a2b, b2a = names
        try:
            rx = _ShmRing.attach(a2b, side="consumer")
            try:
                tx = _ShmRing.attach(b2a, side="producer")
            except BaseException:
                rx.close()
                raise
        except (FileNotFoundError, ChannelClosedError) as exc:
            raise LinkClosed(str(exc)) from None
        return cls(names, tx, rx)

    cdef int _acquire(self) except -1:
        # Compiled code takes no interrupt between taking the lock and the
        # ``try`` that gives it back (the gap ``with`` closes in the twin).
        cdef PyLockStatus got
        if PyThread_acquire_lock(self._lock, NOWAIT_LOCK):
            return 0
        while True:
            with nogil:
                got = PyThread_acquire_lock_timed(self._lock, LOCK_SLICE_US, 0)
            if got == PY_LOCK_ACQUIRED:
                return 0
            PyErr_CheckSignals()

    def send(self, msg):
        cdef ShmRing tx = self._tx
        while True:
            self._acquire()
            try:
                if self._closed:
                    raise LinkClosed("link is closed")
                try:
                    # A full ring must not block us for good: the peer may be
                    # blocked writing to us.  Drain our side, then retry.
                    tx._put(msg, 0 if self.on_full is not None else None)
                    return
                except TimeoutError:
                    pass
                except ChannelClosedError as exc:
                    raise LinkClosed(str(exc)) from None
            finally:
                PyThread_release_lock(self._lock)
            self.on_full()

    cdef list _recv_all(self):
        cdef ShmRing rx = self._rx
        cdef list out = []
        if self._closed:
            return out
        while _ready(rx):
            try:
                out.append(rx._get_nowait())
            except (RingEmpty, ChannelClosedError):
                break
        return out

    def recv_all(self):
        return self._recv_all()

    def recv_wait(self, timeout):
        if self._closed:
            raise LinkClosed("link is closed")
        try:
            return self._rx._get(timeout)
        except TimeoutError:
            return None
        except ChannelClosedError as exc:       # PeerDiedError too
            raise LinkClosed(str(exc)) from None

    def has_data(self):
        return _ready(self._rx)

    def spin_poll(self, timeout):
        if self._closed:
            return True
        return self._rx.spin_poll(timeout)

    def fileno(self):
        return self._fd

    def arm(self):
        if self._closed:
            return True
        try:
            return self._rx.arm_fd()
        except ChannelClosedError:
            return True

    def disarm(self):
        if not self._closed:
            self._rx.clear_fd()

    def close(self):
        self._acquire()
        try:
            if self._closed:
                return
            self._closed = True
        finally:
            PyThread_release_lock(self._lock)
        self._tx.close()
        self._rx.close()


def drain(entries, polls, handlers, list stash):
    """Dispatch every message the links of ``entries`` hold now; their count.

    ``polls`` (each link's bound ``poll``) is for the twin: a compiled poll
    is an inline look at the ring's header here.
    """
    cdef Py_ssize_t n = 0, i, k
    cdef Link link
    cdef list msgs
    for entry in entries:
        peer, link, _ = entry
        if not _ready(link._rx):
            continue
        try:
            msgs = link._recv_all()
        except (LinkClosed, OSError, ValueError):
            continue
        k = len(msgs)
        i = 0
        try:
            while i < k:
                msg = msgs[i]
                i += 1
                handlers[msg[0]](peer, msg)
        except BaseException:
            # A KeyboardInterrupt (or a bug) must not lose what was read.
            stash.extend([(peer, m) for m in msgs[i:]])
            raise
        n += k
    return n
