# cython: language_level=3
"""Single-producer/single-consumer message ring over shared memory: the
compiled twin.

Same names, behaviour, errors and segment layout as ``_ring_py`` (whose
docstring is the specification); the two interoperate across processes.
What differs is how: the hot paths here run on raw pointers into the mapping
with C11-model atomics (``_ring_c.pxd``), codec frames are encoded straight
into the ring slot (``encode_to_ptr``) and decoded from it
(``decode_from_ptr``), and waiting releases the GIL.  The creation,
attachment and side-segment code is shared with ``_ring_py`` (cold paths, one
implementation of the header).

The C-level API in ``_ring_c.pxd`` (``rl_ring_reserve``/``publish``/``peek``/
``release`` on a ``RingEnd``) runs without the GIL; ``ray_lite/bench/_ringbench_c.pyx``
drives it.  The waiting strategy (``rl_wait``/``rl_wake``) and the atomics
are ``_wait.pxd``'s, shared with the broadcast queue.
"""
cimport cython
from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.exc cimport PyErr_CheckSignals
from cpython.list cimport PyList_GET_SIZE
from cpython.pythread cimport PyThread_get_thread_ident
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.string cimport memcpy, memset
from posix.unistd cimport close as c_close, getpid, read as c_read, write as c_write

from ._codec_c cimport decode_from_ptr, encode_to_ptr

import os

from . import _ring_py as _spec
from . import errors, shm, wait_policy
from ._codec_c import OOB_THRESHOLD, encode_growing
from ._codec_c import decode as _codec_decode
from .errors import (
    BufferTooSmallError,
    ChannelClosedError,
    DecodeError,
    MessageTooLargeError,
    PeerDiedError,
    RingEmpty,
    channel_error,
)

__all__ = [
    "ShmRing", "DEFAULT_CAPACITY", "DEFAULT_MAX_MESSAGE_SIZE", "MIN_CAPACITY", "MAX_CAPACITY",
    "RingEmpty", "ChannelClosedError", "MessageTooLargeError", "PeerDiedError",
    "hold_wakes", "release_wakes",
]

DEFAULT_CAPACITY = _spec.DEFAULT_CAPACITY
DEFAULT_MAX_MESSAGE_SIZE = _spec.DEFAULT_MAX_MESSAGE_SIZE
MIN_CAPACITY = _spec.MIN_CAPACITY
MAX_CAPACITY = _spec.MAX_CAPACITY

# Layout (see _ring_py); checked against the specification at import below.
cdef enum:
    HEADER_SIZE = 512
    H_MAX_MESSAGE = 24
    H_INLINE_LIMIT = 32
    H_PRODUCER_PID = 40
    H_CONSUMER_PID = 48
    H_FLAGS = 60
    H_PRODUCER_CLOSED = 64
    H_CONSUMER_CLOSED = 68
    H_WRITE_POS = 128
    H_PRODUCER_CPU = 136
    H_READ_POS = 256
    H_CONSUMER_CPU = 264
    H_CONSUMER_SLEEPING = 384
    H_FD_ARMED = 388
    H_PRODUCER_SLEEPING = 392
    FLAG_WEAK_ORDERING = 1
    KIND_WRAP = 1
    KIND_BYTES = 2
    KIND_VALUE = 3
    KIND_SIDE_BYTES = 4
    KIND_SIDE_VALUE = 5
    KIND_SIDE_FRAME = 6
    RL_CORRUPT = 100        # internal: a record that cannot be right

for _const, _value in (("HEADER_SIZE", HEADER_SIZE), ("H_MAX_MESSAGE", H_MAX_MESSAGE),
                       ("H_INLINE_LIMIT", H_INLINE_LIMIT), ("H_PRODUCER_PID", H_PRODUCER_PID),
                       ("H_CONSUMER_PID", H_CONSUMER_PID), ("H_FLAGS", H_FLAGS),
                       ("H_PRODUCER_CLOSED", H_PRODUCER_CLOSED), ("H_CONSUMER_CLOSED", H_CONSUMER_CLOSED),
                       ("H_WRITE_POS", H_WRITE_POS), ("H_READ_POS", H_READ_POS),
                       ("H_PRODUCER_CPU", H_PRODUCER_CPU), ("H_CONSUMER_CPU", H_CONSUMER_CPU),
                       ("H_CONSUMER_SLEEPING", H_CONSUMER_SLEEPING), ("H_FD_ARMED", H_FD_ARMED),
                       ("H_PRODUCER_SLEEPING", H_PRODUCER_SLEEPING),
                       ("FLAG_WEAK_ORDERING", FLAG_WEAK_ORDERING), ("KIND_WRAP", KIND_WRAP),
                       ("KIND_BYTES", KIND_BYTES), ("KIND_VALUE", KIND_VALUE),
                       ("KIND_SIDE_BYTES", KIND_SIDE_BYTES), ("KIND_SIDE_VALUE", KIND_SIDE_VALUE),
                       ("KIND_SIDE_FRAME", KIND_SIDE_FRAME)):
    if getattr(_spec, _const) != _value:
        raise ImportError(f"_ring_c and _ring_py disagree on {_const}")

for _const, _value in (("RL_OK", RL_OK), ("RL_TIMEOUT", RL_TIMEOUT), ("RL_CLOSED", RL_CLOSED),
                       ("RL_PEER_DIED", RL_PEER_DIED), ("RL_CORRUPT", RL_CORRUPT)):
    if getattr(errors, _const) != _value:
        raise ImportError(f"_ring_c and errors disagree on the status code {_const}")

# Waiting: the numbers of wait_policy (C copies in _wait.pxd, checked here).
# A round trip between two active processes takes ~1 µs, so a short spin
# holding the GIL catches most replies without paying for a GIL release; the
# spin continues without the GIL, then sched_yield (lets a peer sharing our
# core run), then futex sleep in slices.  These four can be tuned for the
# rings set up afterwards (_set_wait_policy).
wait_policy.check_twin("ray_lite._fast._ring_c", rl_wait_policy_values())
cdef int64_t SPIN_GIL_NS = WP_RING_SPIN_GIL_NS
cdef int64_t SPIN_NS = WP_RING_SPIN_NS
cdef int YIELDS = WP_RING_YIELDS
cdef int64_t SLICE_NS = WP_SLICE_NS      # peer-death and Ctrl-C checks at least this often

def _set_wait_policy(spin_gil_ns=None, spin_ns=None, yields=None, slice_ns=None):
    """Tune the waiting strategy of rings set up afterwards (experiments, benchmarks)."""
    global SPIN_GIL_NS, SPIN_NS, YIELDS, SLICE_NS
    if spin_gil_ns is not None:
        SPIN_GIL_NS = spin_gil_ns
    if spin_ns is not None:
        SPIN_NS = spin_ns
    if yields is not None:
        YIELDS = yields
    if slice_ns is not None:
        SLICE_NS = slice_ns
    return dict(spin_gil_ns=SPIN_GIL_NS, spin_ns=SPIN_NS, yields=YIELDS, slice_ns=SLICE_NS)


cdef tuple _NO_BUFFERS = ()
cdef Py_ssize_t _OOB_THRESHOLD = OOB_THRESHOLD if OOB_THRESHOLD is not None else -1


cdef inline Py_ssize_t _oob_threshold(RingEnd* e) noexcept nogil:
    # The ring's: see _ring_py.oob_threshold.
    cdef Py_ssize_t half = <Py_ssize_t>(e.inline_limit >> 1)
    if _OOB_THRESHOLD < 0 or half <= _OOB_THRESHOLD:
        return _OOB_THRESHOLD
    return half


cdef inline uint64_t _align8(uint64_t n) noexcept nogil:
    return (n + 7) & ~(<uint64_t>7)


cdef inline uint64_t* _u64(RingEnd* e, Py_ssize_t off) noexcept nogil:
    return <uint64_t*>(e.header + off)


cdef inline uint32_t* _u32(RingEnd* e, Py_ssize_t off) noexcept nogil:
    return <uint32_t*>(e.header + off)


# ------------------------------------------------------- ring helpers ---
cdef bint _data_ready(void* ctx) noexcept nogil:
    cdef RingEnd* e = <RingEnd*>ctx
    return (rl_load_acquire_u64(_u64(e, H_WRITE_POS)) != e.pos
            or rl_load_acquire_u32(_u32(e, H_PRODUCER_CLOSED)) != 0
            or rl_load_relaxed_u32(_u32(e, H_CONSUMER_CLOSED)) != 0
            or e.peer_dead)


cdef bint _space_ready(void* ctx) noexcept nogil:
    cdef RingEnd* e = <RingEnd*>ctx
    e.cache = rl_load_acquire_u64(_u64(e, H_READ_POS))
    return (e.capacity - (e.pos - e.cache) >= e.need
            or rl_load_relaxed_u32(_u32(e, H_CONSUMER_CLOSED)) != 0
            or rl_load_relaxed_u32(_u32(e, H_PRODUCER_CLOSED)) != 0
            or e.peer_dead)


cdef void _learn_peer(RingEnd* e) noexcept nogil:
    cdef int64_t pid
    if e.peer_pid == 0:
        pid = <int64_t>rl_load_acquire_u64(_u64(e, H_CONSUMER_PID if e.is_producer else H_PRODUCER_PID))
        if pid != 0:
            e.peer_pid = pid
            if pid != e.my_pid:
                e.peer_pidfd = rl_pidfd_open(<int>pid)


cdef bint _peer_alive(RingEnd* e) noexcept nogil:
    cdef bint dead
    if e.peer_dead:
        return False
    _learn_peer(e)
    if e.peer_pid == 0 or e.peer_pid == e.my_pid:
        return True
    dead = rl_process_exited(<int>e.peer_pid, e.peer_pidfd)
    if dead:
        e.peer_dead = 1
    return not dead


cdef bint _peer_on_my_cpu(RingEnd* e) noexcept nogil:
    """True when the peer last acted on this ring (publish, release) on the CPU we run on.

    The peer is then not running (we are): spinning would only delay it.
    """
    cdef uint32_t cpu = <uint32_t>(sched_getcpu() + 1)
    return cpu != 0 and rl_load_relaxed_u32(_u32(e, H_CONSUMER_CPU if e.is_producer else H_PRODUCER_CPU)) == cpu


cdef int rl_ring_wait_ready(RingEnd* e, int64_t deadline_ns, bint spin) noexcept nogil:
    cdef rl_wait_policy policy = e.policy
    cdef int st
    if spin and _peer_on_my_cpu(e):
        # Both ends on this CPU: the peer runs only when we stop, so spinning
        # only delays it (a 20 µs spin made such round trips 15x slower).
        # sched_yield hands it the CPU at once.
        policy.spin_ns = 0
    if rl_load_relaxed_u32(_u32(e, H_FLAGS)) & FLAG_WEAK_ORDERING and policy.slice_ns > WP_SLICE_WEAK_NS:
        # A pure-Python end may lose a wake-up (see _ring_py, "Ordering").
        policy.slice_ns = WP_SLICE_WEAK_NS
    if e.is_producer:
        st = rl_wait(_u32(e, H_PRODUCER_SLEEPING), _space_ready, e, deadline_ns, &policy, spin)
    else:
        st = rl_wait(_u32(e, H_CONSUMER_SLEEPING), _data_ready, e, deadline_ns, &policy, spin)
    if st == RL_AGAIN and not _peer_alive(e):
        return RL_OK        # the condition now holds: the caller looks again
    return st


# The producer's early wrap: see HOT_BYTES in _ring_py.
cdef uint64_t HOT_BYTES = _spec.HOT_BYTES


cdef inline bint _empty(RingEnd* e) noexcept nogil:
    """The consumer has read every record (producer side)."""
    if e.cache != e.pos:
        e.cache = rl_load_acquire_u64(_u64(e, H_READ_POS))
    return e.cache == e.pos


cdef inline Py_ssize_t _contiguous_room(RingEnd* e, char** slot) noexcept nogil:
    """Payload room at the write position without waiting or wrapping; -1 if the ring is full.

    The consumer's line is re-read only when the cached read_pos offers less
    than the end of the area (capped at the inline limit) could.
    """
    cdef uint64_t off = e.pos & e.mask
    cdef uint64_t to_end = e.capacity - off
    cdef uint64_t free
    cdef uint64_t room
    if off >= HOT_BYTES and _empty(e):
        (<uint64_t*>(e.data + off))[0] = (<uint64_t>KIND_WRAP) << 32
        e.pending_hdr = 0
        e.pending_skip = to_end
        slot[0] = e.data + 8
        room = off - 8
        return <Py_ssize_t>(room if room < e.inline_limit else e.inline_limit)
    free = e.capacity - (e.pos - e.cache)
    if free < to_end and free < e.inline_limit + 8:
        e.cache = rl_load_acquire_u64(_u64(e, H_READ_POS))
        free = e.capacity - (e.pos - e.cache)
    if free < 16:
        return -1
    e.pending_hdr = off
    e.pending_skip = 0
    slot[0] = e.data + off + 8
    room = (to_end if to_end < free else free) - 8
    return <Py_ssize_t>(room if room < e.inline_limit else e.inline_limit)


cdef inline Py_ssize_t _room_after_reserve(RingEnd* e) noexcept nogil:
    cdef uint64_t to_end = e.capacity - e.pending_hdr
    cdef uint64_t free = e.capacity - (e.pos + e.pending_skip - e.cache)
    cdef uint64_t room = (to_end if to_end < free else free) - 8
    return <Py_ssize_t>(room if room < e.inline_limit else e.inline_limit)


cdef inline int64_t _next_record(RingEnd* e) noexcept nogil:
    cdef uint64_t off
    while True:
        if e.pos == e.cache:
            e.cache = rl_load_acquire_u64(_u64(e, H_WRITE_POS))
            if e.pos == e.cache:
                return -1
        off = e.pos & e.mask
        if ((<uint64_t*>(e.data + off))[0] >> 32) == KIND_WRAP:
            e.pos += e.capacity - off
            continue
        return <int64_t>off


# ------------------------------------------------------ raw-record API ---
cdef inline int _wait_turn(RingEnd* e, int64_t deadline_ns, bint* spin, int64_t* started) noexcept nogil:
    """One wait of rl_ring_reserve / rl_ring_peek for their condition.

    RL_OK: look again.  Otherwise the status to return, RL_AGAIN included
    once AGAIN_NS passed since the first wait (``*started``, -1 until then):
    the caller then checks for signals.  Only the first wait spins.
    """
    cdef int st
    if started[0] < 0:
        started[0] = rl_now_ns()
    st = rl_ring_wait_ready(e, deadline_ns, spin[0])
    spin[0] = False
    if st == RL_AGAIN and rl_now_ns() - started[0] < WP_AGAIN_NS:
        return RL_OK
    return st


cdef int rl_ring_reserve(RingEnd* e, uint64_t n, int64_t deadline_ns, char** payload) noexcept nogil:
    cdef uint64_t rec, off, to_end, need
    cdef int st
    cdef bint spin = not e.resume
    cdef int64_t started = -1
    e.resume = 0
    if n > e.inline_limit:
        return RL_TOO_BIG
    rec = 8 + _align8(n)
    while True:
        if (rl_load_relaxed_u32(_u32(e, H_CONSUMER_CLOSED))
                or rl_load_relaxed_u32(_u32(e, H_PRODUCER_CLOSED))):
            return RL_CLOSED
        if e.peer_dead:
            return RL_PEER_DIED
        off = e.pos & e.mask
        to_end = e.capacity - off
        need = rec if rec <= to_end else to_end + rec
        if e.capacity - (e.pos - e.cache) < need:
            e.cache = rl_load_acquire_u64(_u64(e, H_READ_POS))
        if e.capacity - (e.pos - e.cache) >= need:
            if rec <= to_end and not (off >= HOT_BYTES and rec <= off and _empty(e)):
                e.pending_hdr = off
                e.pending_skip = 0
                payload[0] = e.data + off + 8
            else:
                # Published together with the record, by one store of write_pos.
                (<uint64_t*>(e.data + off))[0] = (<uint64_t>KIND_WRAP) << 32
                e.pending_hdr = 0
                e.pending_skip = to_end
                payload[0] = e.data + 8
            return RL_OK
        e.need = need
        st = _wait_turn(e, deadline_ns, &spin, &started)
        if st != RL_OK:
            return st


cdef void rl_ring_publish(RingEnd* e, uint32_t kind, uint64_t n) noexcept nogil:
    _publish_record(e, kind, n)
    _wake_consumer(e)


cdef inline void _publish_record(RingEnd* e, uint32_t kind, uint64_t n) noexcept nogil:
    (<uint64_t*>(e.data + e.pending_hdr))[0] = ((<uint64_t>kind) << 32) | n
    e.pos += e.pending_skip + 8 + _align8(n)
    rl_store_release_u64(_u64(e, H_WRITE_POS), e.pos)
    # On write_pos's line, which this store owns anyway: no extra coherence traffic.
    rl_store_relaxed_u32(_u32(e, H_PRODUCER_CPU), <uint32_t>(sched_getcpu() + 1))


cdef void _wake_consumer(RingEnd* e) noexcept nogil:
    """After a publish: wake the consumer if it sleeps (futex or descriptor)."""
    cdef uint32_t* armed
    rl_wake(_u32(e, H_CONSUMER_SLEEPING))       # includes the full fence
    armed = _u32(e, H_FD_ARMED)
    if rl_load_relaxed_u32(armed) and rl_exchange_u32(armed, 0):
        c_write(e.fifo_fd, b"\1", 1)            # EAGAIN (full FIFO) is fine: it is readable


cdef int rl_ring_write(RingEnd* e, const char* src, uint64_t n, int64_t deadline_ns) noexcept nogil:
    cdef char* slot
    cdef int st = rl_ring_reserve(e, n, deadline_ns, &slot)
    if st == RL_OK:
        memcpy(slot, src, n)
        rl_ring_publish(e, KIND_BYTES, n)
    return st


cdef int rl_ring_peek(RingEnd* e, int64_t deadline_ns, const char** payload, uint64_t* n,
                      uint32_t* kind) noexcept nogil:
    cdef int64_t off
    cdef uint64_t word
    cdef int st
    cdef bint spin = not e.resume
    cdef int64_t started = -1
    e.resume = 0
    while True:
        if rl_load_relaxed_u32(_u32(e, H_CONSUMER_CLOSED)):
            return RL_CLOSED
        off = _next_record(e)
        if off < 0:
            # "closed" (and death) are looked at before write_pos is read again,
            # so everything published before the close is drained first.
            if rl_load_acquire_u32(_u32(e, H_PRODUCER_CLOSED)):
                off = _next_record(e)
                if off < 0:
                    return RL_CLOSED
            elif e.peer_dead:
                off = _next_record(e)
                if off < 0:
                    return RL_PEER_DIED
        if off >= 0:
            word = (<uint64_t*>(e.data + off))[0]
            n[0] = word & 0xFFFFFFFFu
            kind[0] = <uint32_t>(word >> 32)
            if n[0] > e.capacity - <uint64_t>off - 8:
                return RL_CORRUPT
            payload[0] = e.data + off + 8
            e.cur_rec = 8 + _align8(n[0])
            return RL_OK
        st = _wait_turn(e, deadline_ns, &spin, &started)
        if st != RL_OK:
            return st


cdef void rl_ring_release(RingEnd* e) noexcept nogil:
    e.pos += e.cur_rec
    e.cur_rec = 0
    rl_store_release_u64(_u64(e, H_READ_POS), e.pos)
    rl_store_relaxed_u32(_u32(e, H_CONSUMER_CPU), <uint32_t>(sched_getcpu() + 1))
    rl_wake(_u32(e, H_PRODUCER_SLEEPING))


cdef bint rl_ring_poll(RingEnd* e) noexcept nogil:
    return e.pos != e.cache or _data_ready(e)


cdef bint _spin_poll(RingEnd* e, int64_t deadline_ns) noexcept nogil:
    # It hands the CPU to whatever else is runnable on it every
    # SPIN_POLL_YIELD_NS (the peer it waits for may have been woken onto
    # this very CPU), and gives up when it lost the CPU for
    # SPIN_POLL_PREEMPTED_NS at once: the CPU is wanted elsewhere.
    cdef int64_t now = rl_now_ns()
    cdef int64_t before
    cdef int64_t next_yield = now + WP_SPIN_POLL_YIELD_NS
    cdef int i
    while True:
        for i in range(16):
            if _data_ready(e):
                return True
            rl_cpu_relax()
        before = now
        now = rl_now_ns()
        if now >= deadline_ns or now - before > WP_SPIN_POLL_PREEMPTED_NS:
            return _data_ready(e)
        if now >= next_yield:
            sched_yield()
            next_yield = now + WP_SPIN_POLL_YIELD_NS


cdef bint _ready(RingEnd* e) noexcept nogil:
    return _space_ready(e) if e.is_producer else _data_ready(e)


cdef inline void _spin_with_gil(RingEnd* e) noexcept:
    """The first microseconds of a wait, GIL held: a reply usually lands here."""
    cdef int64_t until
    cdef int i
    if _peer_on_my_cpu(e):
        return
    until = rl_now_ns() + SPIN_GIL_NS
    while True:
        for i in range(16):
            if _ready(e):
                return
            rl_cpu_relax()
        if rl_now_ns() >= until:
            return


cdef inline int _check_size(RingEnd* e, Py_ssize_t n) except -1:
    """MessageTooLargeError, before anything is sent, for a message over the maximum."""
    if <uint64_t>n > e.max_message:
        raise MessageTooLargeError(f"message of {n} bytes exceeds max_message_size={e.max_message}")
    return 0


cdef int64_t _deadline_ns(object timeout) except? -2:
    cdef double t
    if timeout is None:
        return -1
    t = timeout
    if t <= 0:
        return 0
    return rl_now_ns() + <int64_t>(t * 1e9)


# ------------------------------------------------------- held wake-ups ---
# (see hold_wakes in _ring_py)
cdef bint _holding = False
cdef unsigned long _held_by = 0     # the thread whose puts owe their wake-ups
cdef object _schedule = None        # its schedule(): arranges a release_wakes() soon
cdef list _owed = []                # the rings that owe their consumer a wake-up
cdef bint _release_scheduled = False    # and has not run yet


def hold_wakes(schedule):
    """See _ring_py; ``None`` stops holding (and releases)."""
    global _holding, _held_by, _schedule
    cdef unsigned long me
    if schedule is None:
        _holding = False
        _held_by = 0
        _schedule = None
        release_wakes()
        return
    me = PyThread_get_thread_ident()
    if _holding and _held_by != me:
        raise RuntimeError("wake-ups are already held by another thread")
    _schedule = schedule
    _held_by = me
    _holding = True


def release_wakes():
    """Give every wake-up owed since the last release (see ``hold_wakes``)."""
    global _release_scheduled
    cdef ShmRing ring
    _release_scheduled = False
    while _owed:
        ring = _owed.pop()
        ring._give_owed_wake()


cdef int _schedule_release() except -1:
    global _release_scheduled
    _release_scheduled = True
    try:
        _schedule()
    except Exception:
        release_wakes()     # (a closed loop, say): nothing else would give them
    return 0


# ------------------------------------------------------------- the ring ---
@cython.final
cdef class ShmRing:
    """One end of a shared-memory SPSC message ring (see ``_ring_py``)."""

    def __cinit__(self):
        self._has_view = False
        self._closed = True         # until set up
        self._released = True
        self._in_op = False
        self._pins = 0
        self._oob = []
        self.readonly_arrays = False
        self.end.fifo_fd = -1
        self.end.peer_pidfd = -1
        self.end.peer_dead = 0
        self.end.peer_pid = 0

    def __init__(self, *args, **kwargs):
        raise TypeError("use ShmRing.create() or ShmRing.attach()")

    @classmethod
    def create(cls, capacity=DEFAULT_CAPACITY, *, side, prefix=None,
               max_message_size=DEFAULT_MAX_MESSAGE_SIZE):
        name, mm = _spec._create_segment(capacity, side, prefix, max_message_size, weak=False)
        try:
            return _setup(name, side, mm)
        except BaseException:
            mm.close()
            shm.unlink_segment(name)
            _spec._unlink_fifo(name)
            raise

    @classmethod
    def attach(cls, name, *, side):
        mm = _spec._attach_segment(name, side, weak=False)
        try:
            return _setup(name, side, mm)
        except BaseException:
            mm.close()
            raise

    # -- properties --------------------------------------------------------
    @property
    def name(self):
        return self._name

    @property
    def side(self):
        return self._side

    @property
    def capacity(self):
        return self.end.capacity

    @property
    def max_message_size(self):
        return self.end.max_message

    @property
    def offset(self):
        """This end's offset in the data area: where its next record goes
        (producer) or the next one to read (consumer)."""
        return self.end.pos & self.end.mask

    @property
    def closed(self):
        return self._closed

    @property
    def peer_pid(self):
        if not self._closed:
            _learn_peer(&self.end)
        return self.end.peer_pid

    def __repr__(self):
        return (f"<ShmRing {self._name} {self._side} capacity={self.end.capacity} "
                f"{'closed' if self._closed else 'open'}>")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __reduce__(self):
        raise TypeError("a ShmRing cannot be pickled: send its name and attach() in the other process")

    # -- peer ----------------------------------------------------------------
    def peer_fd(self):
        if self._closed:
            self._raise_status(RL_CLOSED)
        _learn_peer(&self.end)
        return self.end.peer_pidfd

    def peer_alive(self):
        if self.end.peer_dead:
            return False
        if self._closed:
            self._raise_status(RL_CLOSED)
        return _peer_alive(&self.end)

    # -- operation guard -------------------------------------------------------
    cdef int _enter(self, bint producer) except -1:
        # The mapping must outlive an operation that released the GIL (or
        # ran Python code: decode, pickle): close() from another thread
        # defers the unmapping to _leave.
        if self._closed:
            self._raise_status(RL_CLOSED)
        if producer != self.end.is_producer:
            raise ValueError(f"ring {self._name}: {'put' if producer else 'get'}() is for the "
                             f"{'producer' if producer else 'consumer'} end; this is the {self._side}")
        if self._in_op:
            raise RuntimeError(f"ring {self._name}: one end used by two threads at once")
        if producer:
            if rl_load_relaxed_u32(_u32(&self.end, H_CONSUMER_CLOSED)):
                self._raise_status(RL_CLOSED)
            if self.end.peer_dead:
                self._raise_status(RL_PEER_DIED)
        self._in_op = True
        self._pins += 1
        return 0

    cdef void _leave(self):
        self._in_op = False
        self._pins -= 1
        if self._closed and self._pins == 0:
            self._release()

    cdef int _raise_status(self, int st) except -1:
        raise channel_error(st, f"ring {self._name}", peer="consumer" if self.end.is_producer else "producer",
                            pid=self.end.peer_pid, this_end=self._closed)

    # -- producer ----------------------------------------------------------
    cdef int _reserve(self, uint64_t n, object timeout, char** slot) except -1:
        cdef RingEnd* e = &self.end
        cdef int st = rl_ring_reserve(e, n, 0, slot)
        cdef int64_t deadline
        if st == RL_TIMEOUT:
            if _owed:
                release_wakes()     # the consumer may sleep on a held wake-up
            deadline = _deadline_ns(timeout)
            _spin_with_gil(e)
            while True:
                with nogil:
                    st = rl_ring_reserve(e, n, deadline, slot)
                if st != RL_AGAIN and st != RL_INTERRUPTED:
                    break
                PyErr_CheckSignals()
                e.resume = 1
        if st != RL_OK:
            self._raise_status(st)
        return 0

    def put_bytes(self, data, timeout=None):
        cdef RingEnd* e = &self.end
        cdef Py_buffer buf
        cdef bint has_buf = False
        cdef const char* src
        cdef Py_ssize_t n
        cdef char* slot
        self._enter(True)
        try:
            if PyBytes_CheckExact(data):
                src = PyBytes_AS_STRING(data)
                n = PyBytes_GET_SIZE(data)
            else:
                try:
                    PyObject_GetBuffer(data, &buf, PyBUF_SIMPLE)
                except BufferError:
                    raise ValueError("put_bytes needs a C-contiguous bytes-like object") from None
                has_buf = True
                src = <const char*>buf.buf
                n = buf.len
            _check_size(e, n)
            if <uint64_t>n <= e.inline_limit:
                self._reserve(n, timeout, &slot)
                memcpy(slot, src, n)
                self._publish(KIND_BYTES, n)
            else:
                self._put_side(KIND_SIDE_BYTES, [memoryview(data).cast("B")], timeout)
        finally:
            if has_buf:
                PyBuffer_Release(&buf)
            self._leave()

    def put(self, obj, timeout=None):
        self._put(obj, timeout)

    cdef int _put(self, object obj, object timeout) except -1:
        # (C-level put, for the compiled link: ``put`` without a Python call)
        cdef RingEnd* e = &self.end
        cdef char* slot
        cdef Py_ssize_t room, n, need
        self._enter(True)
        try:
            if PyList_GET_SIZE(self._oob):
                del self._oob[:]
            room = _contiguous_room(e, &slot)
            if room < 0:
                return self._put_slow(obj, 1, timeout)
            need = 0
            n = 0
            try:
                n = encode_to_ptr(obj, slot, room, self._oob, _oob_threshold(e),
                                  self.readonly_arrays)
            except BufferTooSmallError as exc:
                need = max(exc.needed, room + 1)
            if not need:
                need = self._publish_frame(slot, n, room, timeout)
            if need:
                # Outside the except block: errors while waiting must not chain to it.
                self._put_slow(obj, need, timeout)
            return 0
        finally:
            self._leave()

    cdef int _put_slow(self, object obj, Py_ssize_t need, object timeout) except -1:
        """Encode after waiting for ``need`` payload bytes (wrapping if need be)."""
        cdef RingEnd* e = &self.end
        cdef char* slot
        cdef Py_ssize_t room, n
        while True:
            if <uint64_t>need > e.inline_limit:
                return self._put_big(obj, timeout)
            self._reserve(need, timeout, &slot)
            room = _room_after_reserve(e)
            if PyList_GET_SIZE(self._oob):
                del self._oob[:]
            try:
                n = encode_to_ptr(obj, slot, room, self._oob, _oob_threshold(e),
                                  self.readonly_arrays)
            except BufferTooSmallError as exc:
                need = max(exc.needed, room + 1, need + 1)
                continue
            need = self._publish_frame(slot, n, room, timeout)
            if not need:
                return 0

    cdef Py_ssize_t _publish_frame(self, char* slot, Py_ssize_t n, Py_ssize_t room,
                                   object timeout) except -1:
        """Publish the frame of ``n`` bytes just encoded at ``slot`` (its
        out-of-band buffers in ``_oob``); 0 when sent, else the payload room
        the record needs (more than ``room``): wait for it and encode again."""
        if PyList_GET_SIZE(self._oob) == 0:
            _check_size(&self.end, n)
            self._publish(KIND_VALUE, n)
            return 0
        return self._put_oob(slot, n, room, timeout)

    cdef int _publish(self, uint32_t kind, uint64_t n) except -1:
        """Publish the reserved record; wake the consumer, or owe it the
        wake-up while this thread holds them (``hold_wakes``)."""
        _publish_record(&self.end, kind, n)
        if _holding and PyThread_get_thread_ident() == _held_by:
            if not self._wake_owed:
                self._wake_owed = True
                _owed.append(self)
            if not _release_scheduled:
                _schedule_release()
        else:
            _wake_consumer(&self.end)
        return 0

    cdef void _give_owed_wake(self) noexcept:
        if self._wake_owed:
            self._wake_owed = False
            if not (self._closed or self._released):    # (a close woke the consumer)
                _wake_consumer(&self.end)

    cdef Py_ssize_t _put_oob(self, char* slot, Py_ssize_t n, Py_ssize_t room,
                             object timeout) except -1:
        """The frame at ``slot`` has out-of-band buffers: ship them in a side segment.

        Returns 0 when sent, else the payload room the record needs (more than ``room``).
        """
        cdef RingEnd* e = &self.end
        cdef list buffers = self._oob
        cdef Py_ssize_t payload
        self._oob = []
        _check_size(e, n + sum([b.nbytes for b in buffers]))
        side_name = shm.new_name(self._prefix)
        payload = <Py_ssize_t>_align8(n) + 16 + <Py_ssize_t>_align8(len(side_name)) + 8
        if <uint64_t>payload > e.inline_limit:
            # The frame itself is large: it joins its buffers in the side segment.
            self._put_side(KIND_SIDE_FRAME, [PyBytes_FromStringAndSize(slot, n)] + buffers, timeout)
            return 0
        if payload > room:
            return payload
        size = _spec._write_side_segment(side_name, buffers)
        self._write_side_ref(slot, n, side_name.encode("ascii"), size, KIND_SIDE_VALUE)
        return 0

    cdef int _put_big(self, object obj, object timeout) except -1:
        """A frame over the inline limit: encode it aside, then ship it in a side segment."""
        cdef RingEnd* e = &self.end
        try:
            scratch, n, buffers = encode_growing(
                obj, bytearray(max(<Py_ssize_t>e.inline_limit * 2, 4096)), OOB_THRESHOLD,
                limit=e.max_message, readonly_arrays=self.readonly_arrays)
        except BufferTooSmallError as exc:
            raise MessageTooLargeError(
                f"message of {exc.needed} bytes exceeds max_message_size={e.max_message}") from None
        _check_size(e, n + sum([b.nbytes for b in buffers]))
        return self._put_side(KIND_SIDE_FRAME, [memoryview(scratch)[:n]] + buffers, timeout)

    cdef int _put_side(self, uint32_t kind, list pieces, object timeout) except -1:
        cdef char* slot
        name = shm.new_name(self._prefix)
        size = _spec._write_side_segment(name, pieces)
        try:
            self._reserve(16 + _align8(len(name)) + 8, timeout, &slot)
            self._write_side_ref(slot, 0, name.encode("ascii"), size, kind)
        except BaseException:
            shm.unlink_segment(name)
            raise
        return 0

    cdef int _write_side_ref(self, char* payload, uint64_t inline_len, bytes name, uint64_t size,
                             uint32_t kind) except -1:
        cdef uint64_t ref = _align8(inline_len)
        cdef uint64_t name_len = len(name)
        cdef uint64_t trailer = ref + 16 + _align8(name_len)
        memset(payload + inline_len, 0, trailer + 8 - inline_len)
        (<uint64_t*>(payload + ref))[0] = size
        (<uint32_t*>(payload + ref + 8))[0] = <uint32_t>name_len
        memcpy(payload + ref + 16, PyBytes_AS_STRING(name), name_len)
        (<uint64_t*>(payload + trailer))[0] = inline_len
        self._publish(kind, trailer + 8)
        return 0

    # -- consumer ----------------------------------------------------------
    cdef int _peek(self, object timeout, const char** payload, uint64_t* n, uint32_t* kind) except -1:
        cdef RingEnd* e = &self.end
        cdef int st
        cdef int64_t deadline = _deadline_ns(timeout)
        if _owed:
            release_wakes()     # what we wait for may need one (hold_wakes)
        _spin_with_gil(e)
        while True:
            with nogil:
                st = rl_ring_peek(e, deadline, payload, n, kind)
            if st != RL_AGAIN and st != RL_INTERRUPTED:
                break
            PyErr_CheckSignals()
            e.resume = 1
        if st != RL_OK:
            self._raise_status(st)
        return 0

    def get(self, timeout=None):
        return self._get(timeout)

    cdef object _get(self, object timeout):
        cdef const char* payload
        cdef uint64_t n
        cdef uint32_t kind
        cdef int st
        self._enter(False)
        try:
            st = rl_ring_peek(&self.end, 0, &payload, &n, &kind)
            if st == RL_TIMEOUT:
                self._peek(timeout, &payload, &n, &kind)
            elif st != RL_OK:
                self._raise_status(st)
            return self._consume(payload, n, kind)
        finally:
            self._leave()

    def get_nowait(self):
        return self._get_nowait()

    cdef object _get_nowait(self):
        cdef const char* payload
        cdef uint64_t n
        cdef uint32_t kind
        cdef int st
        self._enter(False)
        try:
            st = rl_ring_peek(&self.end, 0, &payload, &n, &kind)
            if st == RL_TIMEOUT:
                raise RingEmpty()
            if st != RL_OK:
                self._raise_status(st)
            return self._consume(payload, n, kind)
        finally:
            self._leave()

    cdef object _consume(self, const char* payload, uint64_t n, uint32_t kind):
        try:
            if kind == KIND_BYTES:
                return PyBytes_FromStringAndSize(payload, n)
            if kind == KIND_VALUE:
                return decode_from_ptr(payload, n, _NO_BUFFERS)
            if kind == KIND_SIDE_BYTES or kind == KIND_SIDE_VALUE or kind == KIND_SIDE_FRAME:
                return self._consume_side(payload, n, kind)
            raise DecodeError(f"ring {self._name}: unknown record kind {kind}")
        finally:
            rl_ring_release(&self.end)

    cdef object _consume_side(self, const char* payload, uint64_t n, uint32_t kind):
        cdef uint64_t inline_len, ref, name_len
        if n < 24:
            raise DecodeError(f"ring {self._name}: corrupt side reference")
        inline_len = (<const uint64_t*>(payload + n - 8))[0]
        ref = _align8(inline_len)
        if inline_len > n or ref + 16 > n - 8:
            raise DecodeError(f"ring {self._name}: corrupt side reference")
        size = (<const uint64_t*>(payload + ref))[0]
        name_len = (<const uint32_t*>(payload + ref + 8))[0]
        if name_len > n - 8 - ref - 16:
            raise DecodeError(f"ring {self._name}: corrupt side reference")
        name = PyBytes_FromStringAndSize(payload + ref + 16, name_len).decode("ascii", "replace")
        entries = _spec._map_side_segment(name, size)
        if kind == KIND_SIDE_BYTES:
            if len(entries) != 1:
                raise DecodeError(f"side segment {name!r}: expected 1 entry")
            return entries[0].tobytes()
        if kind == KIND_SIDE_VALUE:
            return decode_from_ptr(payload, inline_len, entries)
        if not entries:
            raise DecodeError(f"side segment {name!r}: no frame")
        return _codec_decode(entries[0], entries[1:])

    def poll(self):
        if self._closed:
            return True
        if self.end.is_producer:
            raise ValueError(f"ring {self._name}: this is the producer end; the call is for the consumer")
        return rl_ring_poll(&self.end)

    def spin_poll(self, double timeout):
        """Busy-wait at most ``timeout`` seconds for data; never sleeps.

        True once ``poll()`` would be (a message, or the ring closed or its
        peer dead), False when the time ran out.  For a consumer that expects
        an answer within microseconds and has nothing else to do meanwhile:
        a process that sleeps is woken in tens of microseconds on a VM, and
        its peer pays a descriptor write for the wake-up.  It yields the CPU
        every few microseconds, in case the peer is runnable on this CPU, and
        gives up early (False) when the CPU went to another thread for 100 µs
        at once: the CPU is wanted there more than here.
        """
        cdef RingEnd* e = &self.end
        cdef int64_t deadline
        cdef bint ready
        if self._closed:
            return True
        if e.is_producer:
            raise ValueError(f"ring {self._name}: this is the producer end; the call is for the consumer")
        if rl_ring_poll(e):
            return True
        if not timeout > 0:     # also NaN
            return False
        if _owed:
            release_wakes()
        deadline = rl_now_ns() + <int64_t>(min(timeout, 1.0) * 1e9)
        # Pinned: a close() from another thread meanwhile ends the spin (the
        # closed flag makes the ring ready) but must not unmap under it.
        self._pins += 1
        with nogil:
            ready = _spin_poll(e, deadline)
        self._pins -= 1
        if self._closed and self._pins == 0:
            self._release()
        return ready

    cdef int _check_consumer(self) except -1:
        if self._closed:
            self._raise_status(RL_CLOSED)
        if self.end.is_producer:
            raise ValueError(f"ring {self._name}: this is the producer end; the call is for the consumer")
        return 0

    def fileno(self):
        self._check_consumer()
        return self.end.fifo_fd

    def arm_fd(self):
        cdef RingEnd* e = &self.end
        self._check_consumer()
        if rl_ring_poll(e):
            return False
        rl_store_relaxed_u32(_u32(e, H_FD_ARMED), 1)
        rl_fence_seq_cst()
        if rl_ring_poll(e):
            rl_store_relaxed_u32(_u32(e, H_FD_ARMED), 0)
            return False
        return True

    def clear_fd(self):
        cdef char buf[256]
        if self._closed or self.end.is_producer:
            return
        rl_store_relaxed_u32(_u32(&self.end, H_FD_ARMED), 0)
        while c_read(self.end.fifo_fd, buf, sizeof(buf)) == sizeof(buf):
            pass

    # -- closing -------------------------------------------------------------
    def close(self):
        if self._closed:
            return
        self._closed = True
        # Pinned like an operation: unlinking runs Python code (the GIL may
        # pass to a thread whose operation ends now) and then reads the data area.
        self._pins += 1
        try:
            self._close()
        finally:
            self._pins -= 1
            if self._pins == 0:
                self._release()

    cdef int _close(self) except -1:
        cdef RingEnd* e = &self.end
        cdef uint32_t theirs
        rl_store_release_u32(_u32(e, H_PRODUCER_CLOSED if e.is_producer else H_CONSUMER_CLOSED), 1)
        # Wake everyone: the peer, and threads of this process blocked on this end.
        rl_fence_seq_cst()
        rl_store_relaxed_u32(_u32(e, H_CONSUMER_SLEEPING), 0)
        rl_futex_wake(_u32(e, H_CONSUMER_SLEEPING))
        rl_store_relaxed_u32(_u32(e, H_PRODUCER_SLEEPING), 0)
        rl_futex_wake(_u32(e, H_PRODUCER_SLEEPING))
        rl_store_relaxed_u32(_u32(e, H_FD_ARMED), 0)
        c_write(e.fifo_fd, b"\1", 1)
        theirs = rl_load_acquire_u32(_u32(e, H_CONSUMER_CLOSED if e.is_producer else H_PRODUCER_CLOSED))
        _learn_peer(e)
        if (theirs or e.peer_pid == 0
                or (e.peer_pid != e.my_pid and not _peer_alive(e))):
            self._unlink_unread_side_segments()
        shm.unlink_segment(self._name)
        _spec._unlink_fifo(self._name)
        return 0

    cdef _unlink_unread_side_segments(self):
        cdef RingEnd* e = &self.end
        cdef uint64_t pos = rl_load_acquire_u64(_u64(e, H_READ_POS))
        cdef uint64_t end = rl_load_acquire_u64(_u64(e, H_WRITE_POS))
        cdef uint64_t off, word, n
        cdef uint32_t kind
        if end - pos > e.capacity:
            return
        while pos < end:
            off = pos & e.mask
            word = (<uint64_t*>(e.data + off))[0]
            kind = <uint32_t>(word >> 32)
            n = word & 0xFFFFFFFFu
            if kind == KIND_WRAP:
                pos += e.capacity - off
                continue
            if n > e.capacity - off - 8:
                return
            if kind == KIND_SIDE_BYTES or kind == KIND_SIDE_VALUE or kind == KIND_SIDE_FRAME:
                try:
                    shm.unlink_segment(self._side_name(e.data + off + 8, n))
                except (DecodeError, ValueError):
                    pass
            pos += 8 + _align8(n)

    cdef str _side_name(self, const char* payload, uint64_t n):
        cdef uint64_t inline_len, ref, name_len
        if n < 24:
            raise DecodeError("corrupt side reference")
        inline_len = (<const uint64_t*>(payload + n - 8))[0]
        ref = _align8(inline_len)
        if inline_len > n or ref + 16 > n - 8:
            raise DecodeError("corrupt side reference")
        name_len = (<const uint32_t*>(payload + ref + 8))[0]
        if name_len > n - 8 - ref - 16:
            raise DecodeError("corrupt side reference")
        return PyBytes_FromStringAndSize(payload + ref + 16, name_len).decode("ascii", "replace")

    cdef int _release(self) except -1:
        if self._released:
            return 0
        self._released = True
        if self.end.fifo_fd >= 0:
            c_close(self.end.fifo_fd)
            self.end.fifo_fd = -1
        if self.end.peer_pidfd >= 0:
            c_close(self.end.peer_pidfd)
            self.end.peer_pidfd = -1
        self.end.header = NULL
        self.end.data = NULL
        if self._has_view:
            self._has_view = False
            PyBuffer_Release(&self._view)
        if self._mm is not None:
            self._mm.close()
        return 0

    def __del__(self):
        # An end dropped without close() still wakes its peer and unlinks.
        if not self._closed:
            try:
                self.close()
            except Exception:
                pass

    def __dealloc__(self):
        if self.end.fifo_fd >= 0:
            c_close(self.end.fifo_fd)
        if self.end.peer_pidfd >= 0:
            c_close(self.end.peer_pidfd)
        if self._has_view:
            PyBuffer_Release(&self._view)


cdef ShmRing _setup(str name, str side, object mm):
    cdef ShmRing self = ShmRing.__new__(ShmRing)
    cdef RingEnd* e = &self.end
    self._name = name
    self._side = side
    self._mm = mm
    PyObject_GetBuffer(mm, &self._view, PyBUF_WRITABLE)
    self._has_view = True
    self._released = False
    e.header = <char*>self._view.buf
    e.data = e.header + HEADER_SIZE
    e.capacity = (<uint64_t*>(e.header + 16))[0]
    e.mask = e.capacity - 1
    e.inline_limit = rl_load_relaxed_u64(_u64(e, H_INLINE_LIMIT))
    e.max_message = rl_load_relaxed_u64(_u64(e, H_MAX_MESSAGE))
    e.is_producer = side == "producer"
    e.my_pid = getpid()
    e.resume = 0
    e.policy.spin_ns = SPIN_NS
    e.policy.yields = YIELDS
    e.policy.yield_ns = 0   # the yields are counted, not timed
    e.policy.slice_ns = SLICE_NS
    if e.is_producer:
        e.pos = rl_load_acquire_u64(_u64(e, H_WRITE_POS))
        e.cache = rl_load_acquire_u64(_u64(e, H_READ_POS))
    else:
        e.pos = rl_load_acquire_u64(_u64(e, H_READ_POS))
        e.cache = rl_load_acquire_u64(_u64(e, H_WRITE_POS))
    self._prefix = name[:(<uint32_t*>(e.header + 56))[0]]
    try:
        e.fifo_fd = _spec._open_fifo(name)
    except BaseException:
        self._release()
        raise
    self._closed = False
    _learn_peer(e)
    return self
