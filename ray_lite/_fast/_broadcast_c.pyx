# cython: language_level=3
"""Broadcast message queue, compiled twin.

Same segment layout, protocol, names and errors as ``_broadcast_py`` (the
specification; read its docstring first).  What this twin adds is what
Python cannot express: C11-model atomics (release on publish, acquire on
read, sequentially consistent fences for the sleep handshakes), a spin/yield
phase that runs without the GIL, and futex sleeps without the GIL.
"""
cimport cython
from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytearray cimport PyByteArray_FromStringAndSize
from cpython.exc cimport PyErr_CheckSignals
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.string cimport memcpy

from ray_lite._fast._codec_c cimport decode_from_ptr, encode_to_ptr
from ray_lite._fast._wait cimport (
    WP_BROADCAST_SPIN_NS,
    WP_BROADCAST_YIELD_NS,
    WP_SLICE_NS,
    WP_SLICE_WEAK_NS,
    rl_fence_seq_cst,
    rl_fetch_add_u32,
    rl_futex_wait,
    rl_futex_wake,
    rl_load_acquire_int,
    rl_load_acquire_u32,
    rl_load_acquire_u64,
    rl_now_ns,
    rl_pidfd_open,
    rl_process_exited,
    rl_spin,
    rl_store_release_int,
    rl_store_release_u32,
    rl_store_release_u64,
    rl_wait_policy,
    rl_wait_policy_values,
    sched_yield,
)

import os
import time

from ray_lite._lazy import lazy_module
from ray_lite._fast import _broadcast_py as _spec
from ray_lite._fast import _codec_c as _codec
from ray_lite._fast import shm, wait_policy
from ray_lite._fast.broadcast_wake import ReaderWakeSocket
from ray_lite._fast.errors import (
    RL_CLOSED,
    RL_PEER_DIED,
    RL_TIMEOUT,
    BufferTooSmallError,
    DecodeError,
    channel_error,
)

asyncio = lazy_module("asyncio", globals())

__all__ = ["MessageQueue", "HANDLE_TAG", "DEFAULT_MAX_CHUNK_BYTES", "DEFAULT_MAX_CHUNKS",
           "MIN_CHUNK_BYTES", "MAX_READERS"]

# Constants and the cold-path helpers are the specification's own (one
# implementation of the layout's arithmetic and of the segment handling).
from ray_lite._fast._broadcast_py import (
    DEFAULT_MAX_CHUNK_BYTES,
    DEFAULT_MAX_CHUNKS,
    HANDLE_TAG,
    MAGIC,
    MAX_READERS,
    MIN_CHUNK_BYTES,
    VERSION,
    _WAITING_FOR,
    _buffer_views,
    hands_cpu_over,
    _deadline as _deadline_s,
    _map_readonly,
    _set_done,
    _writer_wake_sockets,
    geometry,
)

# Layout (see _broadcast_py); checked against the specification at import below.
cdef enum:
    LINE = 64
    OFF_MAGIC = 0
    OFF_VERSION = 8
    OFF_N_READERS = 12
    OFF_N_CHUNKS = 16
    OFF_WRITER_PID = 20
    OFF_CHUNK_BYTES = 24
    OFF_CHUNK_STRIDE = 32
    OFF_CHUNKS_OFFSET = 40
    OFF_WRITER_CLOSED = 64
    OFF_DATA_FUTEX = 68
    OFF_WEAK_ORDERING = 72
    OFF_WRITER_WAITING = 128
    OFF_SPACE_FUTEX = 132
    OFF_READERS = 192
    R_PID = 0
    R_CLOSED = 4
    R_WAITING = 8
    R_WRITER_TOKEN = 16
    R_READER_TOKEN = 24
    C_SEQ = 0
    C_KIND = 8
    C_N_OOB = 12
    C_FRAME_LEN = 16
    C_TOTAL_LEN = 24
    C_NAME_LEN = 32
    C_MARKS = 64
    KIND_INLINE = 1
    KIND_OOB_SEGMENT = 2
    WAIT_FUTEX = 1
    WAIT_FD = 2

for _const, _value in (
        ("LINE", LINE), ("OFF_MAGIC", OFF_MAGIC), ("OFF_VERSION", OFF_VERSION),
        ("OFF_N_READERS", OFF_N_READERS), ("OFF_N_CHUNKS", OFF_N_CHUNKS),
        ("OFF_WRITER_PID", OFF_WRITER_PID), ("OFF_CHUNK_BYTES", OFF_CHUNK_BYTES),
        ("OFF_CHUNK_STRIDE", OFF_CHUNK_STRIDE), ("OFF_CHUNKS_OFFSET", OFF_CHUNKS_OFFSET),
        ("OFF_WRITER_CLOSED", OFF_WRITER_CLOSED), ("OFF_DATA_FUTEX", OFF_DATA_FUTEX),
        ("OFF_WEAK_ORDERING", OFF_WEAK_ORDERING), ("OFF_WRITER_WAITING", OFF_WRITER_WAITING),
        ("OFF_SPACE_FUTEX", OFF_SPACE_FUTEX), ("OFF_READERS", OFF_READERS), ("R_PID", R_PID),
        ("R_CLOSED", R_CLOSED), ("R_WAITING", R_WAITING), ("R_WRITER_TOKEN", R_WRITER_TOKEN),
        ("R_READER_TOKEN", R_READER_TOKEN), ("C_SEQ", C_SEQ), ("C_KIND", C_KIND),
        ("C_N_OOB", C_N_OOB), ("C_FRAME_LEN", C_FRAME_LEN), ("C_TOTAL_LEN", C_TOTAL_LEN),
        ("C_NAME_LEN", C_NAME_LEN), ("C_MARKS", C_MARKS), ("KIND_INLINE", KIND_INLINE),
        ("KIND_OOB_SEGMENT", KIND_OOB_SEGMENT), ("WAIT_FUTEX", WAIT_FUTEX), ("WAIT_FD", WAIT_FD)):
    if getattr(_spec, _const) != _value:
        raise ImportError(f"_broadcast_c and _broadcast_py disagree on {_const}")

# Waiting strategy (see the pure twin), with the numbers of wait_policy (C
# copies in _wait.pxd, checked here).  Spinning is cheap in C, so it is short
# and precise; yielding lets the other processes of a 2-core machine run
# while we still answer within microseconds; both are bounded in time so an
# idle waiter costs at most ~BROADCAST_YIELD_NS of CPU per idle period.
wait_policy.check_twin("ray_lite._fast._broadcast_c", rl_wait_policy_values())

# rl_spin's phases (the futex sleep that follows is this queue's own: a
# counter word bumped by the waker, with per-end "waiting" flags).
cdef rl_wait_policy _BUSY_PHASES
_BUSY_PHASES.spin_ns = WP_BROADCAST_SPIN_NS
_BUSY_PHASES.yields = 1 << 30       # bounded by time (yield_ns), not by count
_BUSY_PHASES.yield_ns = WP_BROADCAST_YIELD_NS
_BUSY_PHASES.slice_ns = WP_SLICE_NS


cdef struct _SpaceWait:
    const char* marks       # the chunk's read marks
    uint32_t n_readers
    uint64_t want           # every mark must reach this
    const int* closed       # this end closed (from another thread)


cdef bint _space_ready(void* ctx) noexcept nogil:
    cdef _SpaceWait* w = <_SpaceWait*>ctx
    cdef uint32_t r
    if rl_load_acquire_int(w.closed):
        return True
    for r in range(w.n_readers):
        if rl_load_acquire_u64(_u64(w.marks + 8 * r)) < w.want:
            return False
    return True


cdef struct _MessageWait:
    const uint64_t* seq     # the chunk's written flag
    uint64_t want
    const uint32_t* writer_closed
    const int* closed       # this end closed (from another thread)


cdef bint _message_ready(void* ctx) noexcept nogil:
    cdef _MessageWait* w = <_MessageWait*>ctx
    return (rl_load_acquire_u64(w.seq) == w.want or rl_load_acquire_u32(w.writer_closed) != 0
            or rl_load_acquire_int(w.closed) != 0)


cdef inline int64_t _sleep_slice(const char* base) noexcept nogil:
    # An end that cannot fence may lose a wake-up: shorter slices then.
    return WP_SLICE_WEAK_NS if rl_load_acquire_u32(_u32(base + OFF_WEAK_ORDERING)) else WP_SLICE_NS


# Words of the shared mapping, addressed by byte offset (the layout is in bytes).
cdef inline uint32_t* _u32(const char* p) noexcept nogil:
    return <uint32_t*>p


cdef inline uint64_t* _u64(const char* p) noexcept nogil:
    return <uint64_t*>p


cdef inline uint64_t _align(uint64_t n, uint64_t a) noexcept nogil:
    return (n + a - 1) & ~(a - 1)


cdef int64_t _deadline_ns(object timeout) except -2:
    """-1 for "no deadline"."""
    if timeout is None:
        return -1
    if timeout < 0:
        raise ValueError("timeout must be non-negative")
    return rl_now_ns() + <int64_t>(timeout * 1e9)


cdef class _PeerWatch:
    """Liveness of another process: a pidfd when the kernel has them."""
    cdef public int pid
    cdef int _fd
    cdef bint _dead

    def __cinit__(self, int pid):
        self.pid = pid
        self._dead = False
        self._fd = rl_pidfd_open(pid)   # -1: no such process (rl_process_exited says so) or no pidfds

    def alive(self):
        if not self._dead and rl_process_exited(self.pid, self._fd):
            self._dead = True
        return not self._dead

    def close(self):
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


cdef uint64_t _layout_total(uint64_t frame_len, list bufs) except? 0:
    cdef uint64_t off = _align(frame_len, 8) + 8 * len(bufs)
    for b in bufs:
        off = _align(off, 64) + (<memoryview?>b).nbytes
    return off


cdef int _place_buffers(char* dst, uint64_t frame_end, list bufs) except -1:
    """The length table and the out-of-band buffers after the frame."""
    cdef uint64_t off = _align(frame_end, 8)
    cdef Py_ssize_t i, n = len(bufs)
    cdef Py_buffer view
    cdef uint64_t length
    for i in range(n):
        length = (<memoryview?>bufs[i]).nbytes
        memcpy(dst + off + 8 * i, &length, 8)
    off += 8 * n
    for i in range(n):
        off = _align(off, 64)
        PyObject_GetBuffer(bufs[i], &view, PyBUF_SIMPLE)
        try:
            memcpy(dst + off, view.buf, view.len)
            off += view.len
        finally:
            PyBuffer_Release(&view)
    return 0


cdef class _Nothing:
    pass


cdef object _NOTHING = _Nothing()


cdef class MessageQueue:
    """Broadcast queue: one writer, ``n_readers`` readers (see ``_broadcast_py``)."""

    def __cinit__(self, *args, **kwargs):
        self._has_view = False
        self._released = True
        self._rank = -1
        self._closed = 0
        self._busy = 0
        self._peers = {}
        self._oob_threshold = None

    def __init__(self, n_readers, max_chunk_bytes=DEFAULT_MAX_CHUNK_BYTES,
                 max_chunks=DEFAULT_MAX_CHUNKS, *, oob_threshold=_codec.OOB_THRESHOLD):
        n_readers = int(n_readers)
        max_chunk_bytes = int(max_chunk_bytes)
        max_chunks = int(max_chunks)
        if not 1 <= n_readers <= MAX_READERS:
            raise ValueError(f"n_readers must be in 1..{MAX_READERS}, got {n_readers}")
        if max_chunk_bytes < MIN_CHUNK_BYTES:
            raise ValueError(f"max_chunk_bytes must be at least {MIN_CHUNK_BYTES}, got {max_chunk_bytes}")
        if max_chunks < 1:
            raise ValueError(f"max_chunks must be at least 1, got {max_chunks}")
        max_chunk_bytes = int(_align(max_chunk_bytes, 8))
        chunks_offset, stride, data_offset, size = geometry(n_readers, max_chunk_bytes, max_chunks)
        name, mm = shm.create_segment(size)
        self._setup(name, mm, -1)
        cdef char* b = self._base
        cdef uint64_t magic = MAGIC
        cdef uint32_t u
        cdef uint64_t q
        memcpy(b + OFF_MAGIC, &magic, 8)
        u = VERSION; memcpy(b + OFF_VERSION, &u, 4)
        u = n_readers; memcpy(b + OFF_N_READERS, &u, 4)
        u = max_chunks; memcpy(b + OFF_N_CHUNKS, &u, 4)
        u = os.getpid(); memcpy(b + OFF_WRITER_PID, &u, 4)
        q = max_chunk_bytes; memcpy(b + OFF_CHUNK_BYTES, &q, 8)
        q = stride; memcpy(b + OFF_CHUNK_STRIDE, &q, 8)
        q = chunks_offset; memcpy(b + OFF_CHUNKS_OFFSET, &q, 8)
        self._read_geometry()
        self._oob_threshold = oob_threshold
        self._oob_names = [None] * max_chunks
        self._wake = _writer_wake_sockets(name, n_readers, self._release)
        cdef uint32_t r
        for r in range(self._n_readers):
            rl_store_release_u64(_u64(b + OFF_READERS + LINE * r + R_WRITER_TOKEN), self._wake.tokens[r])

    # ------------------------------------------------------------ set-up

    cdef _setup(self, name, mm, int rank):
        self._name = name
        self._mm = mm
        PyObject_GetBuffer(mm, &self._view, PyBUF_WRITABLE)
        self._has_view = True
        self._released = False
        self._base = <char*>self._view.buf
        self._rank = rank
        self._next = 0
        self._cursor = 0
        self._closed = 0
        self._busy = 0
        self._wake = None
        self._peers = {}
        self._oob_names = None
        self._oob_threshold = _codec.OOB_THRESHOLD

    cdef _read_geometry(self):
        cdef char* b = self._base
        cdef uint64_t magic
        cdef uint32_t version
        memcpy(&magic, b + OFF_MAGIC, 8)
        memcpy(&version, b + OFF_VERSION, 4)
        if magic != MAGIC or version != VERSION:
            raise ValueError(f"segment {self._name!r} is not a ray_lite MessageQueue (version {VERSION})")
        memcpy(&self._n_readers, b + OFF_N_READERS, 4)
        memcpy(&self._n_chunks, b + OFF_N_CHUNKS, 4)
        memcpy(&self._writer_pid, b + OFF_WRITER_PID, 4)
        memcpy(&self._chunk_bytes, b + OFF_CHUNK_BYTES, 8)
        memcpy(&self._stride, b + OFF_CHUNK_STRIDE, 8)
        memcpy(&self._chunks_offset, b + OFF_CHUNKS_OFFSET, 8)
        self._data_offset = C_MARKS + _align(8 * self._n_readers, LINE)
        if (self._n_readers == 0 or self._n_chunks == 0
                or self._chunks_offset + <uint64_t>self._stride * self._n_chunks > <uint64_t>self._view.len
                or self._data_offset + self._chunk_bytes > self._stride):
            raise ValueError(f"MessageQueue segment {self._name!r} has a corrupt header")

    cdef char* _chunk(self, uint32_t c) noexcept nogil:
        return self._base + self._chunks_offset + <uint64_t>c * self._stride

    @classmethod
    def attach(cls, handle, reader_rank):
        """Attach to the queue of ``handle`` (from ``export_handle``) as reader ``reader_rank``."""
        if not (isinstance(handle, tuple) and len(handle) == 2 and handle[0] == HANDLE_TAG):
            raise ValueError(f"not a MessageQueue handle: {handle!r}")
        name = handle[1]
        mm = shm.attach_segment(name)
        cdef MessageQueue self = cls.__new__(cls)
        try:
            self._setup(name, mm, -1)
            self._read_geometry()
        except BaseException:
            self._release()
            raise
        rank = int(reader_rank)
        if not 0 <= rank < self._n_readers:
            self._release()
            raise ValueError(f"reader_rank must be in 0..{self._n_readers - 1}, got {reader_rank}")
        cdef int irank = rank
        cdef char* slot = self._base + OFF_READERS + LINE * irank
        cdef uint32_t pid = rl_load_acquire_u32(_u32(slot + R_PID))
        if pid != 0:
            self._release()
            raise ValueError(f"reader rank {rank} of {name!r} is already attached (pid {pid})")
        try:
            self._wake = ReaderWakeSocket(name, irank, rl_load_acquire_u64(_u64(slot + R_WRITER_TOKEN)))
        except BaseException:
            self._release()
            raise
        # Published before the pid: the writer looks for it once we wait.
        rl_store_release_u64(_u64(slot + R_READER_TOKEN), self._wake.token)
        self._rank = irank
        rl_store_release_u32(_u32(slot + R_PID), os.getpid())
        rl_fence_seq_cst()
        # The last reader to attach removes the name (see the pure twin).
        cdef uint32_t r
        for r in range(self._n_readers):
            if rl_load_acquire_u32(_u32(self._base + OFF_READERS + LINE * r + R_PID)) == 0:
                break
        else:
            shm.unlink_segment(name)
        return self

    def export_handle(self):
        """A picklable handle for ``MessageQueue.attach`` in another process."""
        return (HANDLE_TAG, self._name)

    # ------------------------------------------------------------ properties

    @property
    def name(self):
        return self._name

    @property
    def n_readers(self):
        return self._n_readers

    @property
    def max_chunk_bytes(self):
        return self._chunk_bytes

    @property
    def max_chunks(self):
        return self._n_chunks

    @property
    def is_writer(self):
        return self._rank < 0

    @property
    def reader_rank(self):
        return None if self._rank < 0 else self._rank

    @property
    def closed(self):
        return bool(self._closed)

    def __repr__(self):
        role = "writer" if self._rank < 0 else f"reader {self._rank}"
        return (f"<MessageQueue {self._name} {role} n_readers={self._n_readers} "
                f"chunks={self._n_chunks}x{self._chunk_bytes}{' closed' if self._closed else ''}>")

    # ------------------------------------------------------------ helpers

    cdef int _enter(self) except -1:
        if self._closed:
            raise self._error(RL_CLOSED, this_end=True)
        self._busy += 1
        return 0

    cdef void _leave(self):
        self._busy -= 1
        if self._closed and self._busy == 0:
            self._release()

    def _error(self, status, **details):
        """The exception for ``status`` (see ``errors.channel_error``)."""
        return channel_error(status, f"MessageQueue {self._name}", **details)

    def _release(self):
        if self._released:
            return
        self._released = True
        if self._wake is not None:
            self._wake.close()
            self._wake = None
        for w in self._peers.values():
            w.close()
        self._peers = {}
        if self._has_view:
            self._has_view = False
            self._base = NULL
            PyBuffer_Release(&self._view)
        if self._mm is not None:
            self._mm.close()
            self._mm = None

    def _peer_alive(self, pid):
        w = self._peers.get(pid)
        if w is None:
            w = self._peers[pid] = _PeerWatch(pid)
        return w.alive()

    def _reader_token(self, uint32_t r):
        """The token reader ``r`` published at attach (0: not attached)."""
        return rl_load_acquire_u64(_u64(self._base + OFF_READERS + LINE * r + R_READER_TOKEN))

    def fileno(self):
        """A file descriptor that becomes readable when this end may proceed
        (see the pure twin)."""
        if self._closed:
            raise self._error(RL_CLOSED, this_end=True)
        return self._wake.fileno(self._reader_token) if self._rank < 0 else self._wake.fileno()

    def _drain_wake_sock(self):
        self._wake.drain(self._reader_token)

    cdef void _bump(self, uint32_t off) noexcept:
        rl_fetch_add_u32(_u32(self._base + off), 1)
        rl_futex_wake(_u32(self._base + off))
        # Hand the CPU over: on a machine with few cores the kernel often
        # queues the woken process on *our* core (wake-affine), where it
        # would wait until we block.  Only paid when somebody was asleep,
        # i.e. at the first message after an idle period; measured here it
        # took the wake-up from ~75 to ~40 µs when both shared a core.  Not
        # from an event loop's thread, which has other work (hands_cpu_over).
        if hands_cpu_over():
            sched_yield()

    # ------------------------------------------------------------ writer

    cdef bint _chunk_free(self, uint32_t c, uint64_t k) except -1:
        if k < self._n_chunks:
            return True
        cdef uint64_t want = k + 1 - self._n_chunks
        cdef char* marks = self._chunk(c) + C_MARKS
        cdef uint32_t r
        for r in range(self._n_readers):
            if rl_load_acquire_u64(_u64(marks + 8 * r)) < want:
                if rl_load_acquire_u32(_u32(self._base + OFF_READERS + LINE * r + R_CLOSED)):
                    raise self._error(RL_CLOSED, peer=f"reader {r}")
                return False
        return True

    def _check_readers_alive(self, uint32_t c, uint64_t k):
        cdef uint64_t want = k + 1 - self._n_chunks
        cdef char* marks = self._chunk(c) + C_MARKS
        cdef uint32_t r, pid
        for r in range(self._n_readers):
            if rl_load_acquire_u64(_u64(marks + 8 * r)) < want:
                pid = rl_load_acquire_u32(_u32(self._base + OFF_READERS + LINE * r + R_PID))
                if pid and not self._peer_alive(pid):
                    raise self._error(RL_PEER_DIED, peer=f"reader {r}", pid=pid)

    def enqueue(self, obj, timeout=None):
        """Broadcast ``obj`` to every reader (see the pure twin)."""
        if self._rank >= 0:
            raise ValueError("enqueue on a reader end of the MessageQueue")
        self._enter()
        cdef uint64_t k = self._next
        cdef uint32_t c = self._cursor
        try:
            if not self._chunk_free(c, k):
                self._wait_space(c, k, _deadline_ns(timeout))
            self._write(c, k, obj)
            self._next = k + 1
            self._cursor = c + 1 if c + 1 < self._n_chunks else 0
        finally:
            self._leave()

    cdef int _sleep(self, char* futex, uint32_t seen, int64_t deadline, str waiting_for) except -1:
        """One futex sleep of at most a slice, ending at ``deadline``; then signals are checked."""
        cdef int64_t now, slice_ns = _sleep_slice(self._base)
        if deadline >= 0:
            now = rl_now_ns()
            if now >= deadline:
                raise self._error(RL_TIMEOUT, waiting_for=waiting_for)
            if deadline - now < slice_ns:
                slice_ns = deadline - now
        with nogil:
            rl_futex_wait(_u32(futex), seen, slice_ns)
        PyErr_CheckSignals()
        return 0

    cdef int _wait_space(self, uint32_t c, uint64_t k, int64_t deadline) except -1:
        cdef _SpaceWait sw
        cdef uint32_t seen
        sw.marks = self._chunk(c) + C_MARKS
        sw.n_readers = self._n_readers
        sw.want = k + 1 - self._n_chunks
        sw.closed = &self._closed
        with nogil:
            rl_spin(_space_ready, &sw, deadline, &_BUSY_PHASES)
        cdef char* waiting = self._base + OFF_WRITER_WAITING
        cdef char* futex = self._base + OFF_SPACE_FUTEX
        try:
            while True:
                if self._chunk_free(c, k):
                    return 0
                if self._closed:
                    raise self._error(RL_CLOSED, this_end=True)
                seen = rl_load_acquire_u32(_u32(futex))
                rl_store_release_u32(_u32(waiting), WAIT_FUTEX)
                rl_fence_seq_cst()
                if self._chunk_free(c, k):
                    return 0
                self._check_readers_alive(c, k)
                self._sleep(futex, seen, deadline,
                            _WAITING_FOR["enqueue"])
        finally:
            if self._base != NULL:
                rl_store_release_u32(_u32(waiting), 0)

    cdef int _write(self, uint32_t c, uint64_t k, object obj) except -1:
        stale = self._oob_names[c]
        if stale is not None:
            self._oob_names[c] = None
            shm.unlink_segment(stale)
        cdef char* chunk = self._chunk(c)
        cdef char* data = chunk + self._data_offset
        cdef list bufs = []
        cdef Py_ssize_t end
        cdef uint64_t total, frame_len
        cdef uint32_t kind = KIND_INLINE, n_oob = 0, name_len = 0
        cdef Py_ssize_t threshold = -1 if self._oob_threshold is None else self._oob_threshold
        try:
            end = encode_to_ptr(obj, data, <Py_ssize_t>self._chunk_bytes, bufs, threshold, False)
            frame_len = end
            total = end
            if bufs:
                total = _layout_total(end, bufs)
                if total > self._chunk_bytes:
                    raise BufferTooSmallError("out-of-band buffers do not fit", total)
                _place_buffers(data, end, bufs)
                n_oob = len(bufs)
        except BufferTooSmallError as exc:
            kind = KIND_OOB_SEGMENT
            frame_len, n_oob, total, seg_name = self._write_oob_segment(obj, exc.needed)
            raw = seg_name.encode()
            name_len = len(raw)
            memcpy(data, <char*>raw, name_len)
            self._oob_names[c] = seg_name
        memcpy(chunk + C_KIND, &kind, 4)
        memcpy(chunk + C_N_OOB, &n_oob, 4)
        memcpy(chunk + C_FRAME_LEN, &frame_len, 8)
        memcpy(chunk + C_TOTAL_LEN, &total, 8)
        memcpy(chunk + C_NAME_LEN, &name_len, 4)
        # Publish: the written flag last, with release ordering.
        rl_store_release_u64(_u64(chunk + C_SEQ), k + 1)
        self._wake_readers()
        return 0

    def _write_oob_segment(self, obj, needed):
        cdef Py_ssize_t end
        cdef list bufs
        cdef bytearray frame
        frame, end, bufs = _codec.encode_growing(
            obj, bytearray(max(needed, 2 * self._chunk_bytes, 4096)), self._oob_threshold)
        total = _layout_total(end, bufs)
        seg_name, mm = shm.create_segment(total)
        cdef Py_buffer view
        try:
            PyObject_GetBuffer(mm, &view, PyBUF_WRITABLE)
            try:
                memcpy(view.buf, <char*>frame, end)
                _place_buffers(<char*>view.buf, end, bufs)
            finally:
                PyBuffer_Release(&view)
        except BaseException:
            mm.close()
            shm.unlink_segment(seg_name)
            raise
        mm.close()
        return end, len(bufs), total, seg_name

    cdef int _wake_readers(self) except -1:
        # Full fence between our publish and our look at the sleepers: the
        # other half of the handshake in _wait_message.
        rl_fence_seq_cst()
        cdef uint32_t r, w, any_futex = 0
        cdef char* slots = self._base + OFF_READERS
        for r in range(self._n_readers):
            w = rl_load_acquire_u32(_u32(slots + LINE * r + R_WAITING))
            if w:
                any_futex |= w & WAIT_FUTEX
                if w & WAIT_FD:
                    self._wake.poke(r, self._reader_token)
        if any_futex:
            self._bump(OFF_DATA_FUTEX)
        return 0

    # ------------------------------------------------------------ reader

    cdef int _poll(self, uint32_t c, uint64_t k) except -1:
        cdef char* seq = self._chunk(c) + C_SEQ
        if rl_load_acquire_u64(_u64(seq)) == k + 1:
            return 1
        if self._closed:
            raise self._error(RL_CLOSED, this_end=True)
        if rl_load_acquire_u32(_u32(self._base + OFF_WRITER_CLOSED)):
            if rl_load_acquire_u64(_u64(seq)) == k + 1:
                return 1
            raise self._error(RL_CLOSED, peer="writer")
        return 0

    def dequeue(self, timeout=None):
        """The next message (see the pure twin)."""
        if self._rank < 0:
            raise ValueError("dequeue on the writer end of the MessageQueue")
        self._enter()
        cdef uint64_t k = self._next
        cdef uint32_t c = self._cursor
        try:
            if not self._poll(c, k):
                self._wait_message(c, k, _deadline_ns(timeout))
            return self._read(c, k)
        finally:
            self._leave()

    cdef int _wait_message(self, uint32_t c, uint64_t k, int64_t deadline) except -1:
        cdef char* seq = self._chunk(c) + C_SEQ
        cdef char* closed = self._base + OFF_WRITER_CLOSED
        cdef _MessageWait mw
        cdef uint32_t seen
        if deadline >= 0 and rl_now_ns() >= deadline:
            raise self._error(RL_TIMEOUT, waiting_for=_WAITING_FOR["dequeue"])
        mw.seq = _u64(seq)
        mw.want = k + 1
        mw.writer_closed = _u32(closed)
        mw.closed = &self._closed
        with nogil:
            rl_spin(_message_ready, &mw, deadline, &_BUSY_PHASES)
        cdef char* waiting = self._base + OFF_READERS + LINE * self._rank + R_WAITING
        cdef char* futex = self._base + OFF_DATA_FUTEX
        try:
            while True:
                if self._poll(c, k):
                    return 0
                seen = rl_load_acquire_u32(_u32(futex))
                rl_store_release_u32(_u32(waiting), WAIT_FUTEX)
                rl_fence_seq_cst()
                if self._poll(c, k):
                    return 0
                if not self._peer_alive(self._writer_pid):
                    if self._poll(c, k):
                        return 0
                    raise self._error(RL_PEER_DIED, peer="writer", pid=self._writer_pid)
                self._sleep(futex, seen, deadline, _WAITING_FOR["dequeue"])
        finally:
            if self._base != NULL:
                rl_store_release_u32(_u32(waiting), 0)

    cdef object _read(self, uint32_t c, uint64_t k):
        cdef char* chunk = self._chunk(c)
        cdef char* data = chunk + self._data_offset
        cdef uint32_t kind, n_oob, name_len, i
        cdef uint64_t frame_len, total, off, length
        cdef list bufs
        memcpy(&kind, chunk + C_KIND, 4)
        memcpy(&n_oob, chunk + C_N_OOB, 4)
        memcpy(&frame_len, chunk + C_FRAME_LEN, 8)
        seg_name = None
        try:
            if kind == KIND_INLINE:
                if frame_len > self._chunk_bytes:
                    raise DecodeError("corrupt MessageQueue chunk (frame length)")
                if n_oob == 0:
                    return decode_from_ptr(data, <Py_ssize_t>frame_len, ())
                # The chunk is reused once every reader is done: copy the
                # out-of-band buffers out before the read mark.
                bufs = []
                off = _align(frame_len, 8) + 8 * n_oob
                for i in range(n_oob):
                    memcpy(&length, data + _align(frame_len, 8) + 8 * i, 8)
                    off = _align(off, 64)
                    if off + length > self._chunk_bytes:
                        raise DecodeError("corrupt MessageQueue chunk (buffer table)")
                    bufs.append(PyByteArray_FromStringAndSize(data + off, <Py_ssize_t>length))
                    off += length
                return decode_from_ptr(data, <Py_ssize_t>frame_len, bufs)
            if kind == KIND_OOB_SEGMENT:
                memcpy(&name_len, chunk + C_NAME_LEN, 4)
                memcpy(&total, chunk + C_TOTAL_LEN, 8)
                if name_len > self._chunk_bytes:
                    raise DecodeError("corrupt MessageQueue chunk (segment name)")
                seg_name = data[:name_len].decode()
                mv = _map_readonly(seg_name, total)
                return _codec.decode(mv[:frame_len], _buffer_views(mv, frame_len, n_oob))
            raise DecodeError(f"corrupt MessageQueue chunk (kind {kind})")
        finally:
            self._next = k + 1
            self._cursor = c + 1 if c + 1 < self._n_chunks else 0
            self._mark_read(chunk, k, seg_name)

    cdef int _mark_read(self, char* chunk, uint64_t k, object seg_name) except -1:
        cdef char* marks = chunk + C_MARKS
        cdef uint32_t r, w
        rl_store_release_u64(_u64(marks + 8 * self._rank), k + 1)
        rl_fence_seq_cst()
        if seg_name is not None:
            for r in range(self._n_readers):
                if rl_load_acquire_u64(_u64(marks + 8 * r)) < k + 1:
                    break
            else:
                shm.unlink_segment(seg_name)
        w = rl_load_acquire_u32(_u32(self._base + OFF_WRITER_WAITING))
        if w:
            if w & WAIT_FD:
                self._wake.poke_writer()
            if w & WAIT_FUTEX:
                self._bump(OFF_SPACE_FUTEX)
        return 0

    # ------------------------------------------------------------ asyncio

    def _try_dequeue(self):
        cdef uint64_t k = self._next
        cdef uint32_t c = self._cursor
        if not self._poll(c, k):
            return _NOTHING
        return self._read(c, k)

    def _try_enqueue(self, obj):
        if self._closed:
            raise self._error(RL_CLOSED, this_end=True)
        cdef uint64_t k = self._next
        cdef uint32_t c = self._cursor
        if not self._chunk_free(c, k):
            return _NOTHING
        self._write(c, k, obj)
        self._next = k + 1
        self._cursor = c + 1 if c + 1 < self._n_chunks else 0
        return None

    def _check_writer_alive(self):
        if not self._peer_alive(self._writer_pid):
            raise self._error(RL_PEER_DIED, peer="writer", pid=self._writer_pid)

    def _check_space_peers(self):
        self._check_readers_alive(self._cursor, self._next)

    def _set_waiting(self, uint32_t bits):
        cdef char* w
        if self._rank < 0:
            w = self._base + OFF_WRITER_WAITING
        else:
            w = self._base + OFF_READERS + LINE * self._rank + R_WAITING
        rl_store_release_u32(_u32(w), bits)
        rl_fence_seq_cst()

    def _slice_ns(self):
        return _sleep_slice(self._base)

    def _begin(self):
        self._enter()

    def _end(self):
        self._leave()

    async def dequeue_async(self, timeout=None):
        """``dequeue`` for asyncio: waits on ``fileno()`` in the running loop."""
        if self._rank < 0:
            raise ValueError("dequeue on the writer end of the MessageQueue")
        return await _async_wait(self, self._try_dequeue, self._check_writer_alive,
                                 _deadline_s(timeout), "dequeue")

    async def enqueue_async(self, obj, timeout=None):
        """``enqueue`` for asyncio: waits for room on ``fileno()`` in the running loop."""
        if self._rank >= 0:
            raise ValueError("enqueue on a reader end of the MessageQueue")
        return await _async_wait(self, lambda: self._try_enqueue(obj), self._check_space_peers,
                                 _deadline_s(timeout), "enqueue")

    # ------------------------------------------------------------ closing

    def close(self):
        """Close this end (see the pure twin).  Idempotent."""
        if self._closed or self._released:
            return
        cdef char* b = self._base
        # Held while closing: a call blocked in another thread, woken below,
        # must not unmap the segment under this code (see _leave).
        self._busy += 1
        rl_store_release_int(&self._closed, 1)
        try:
            self._close_end(b)
        finally:
            self._busy -= 1
        if self._busy == 0:
            self._release()

    cdef int _close_end(self, char* b) except -1:
        cdef uint32_t r
        if self._rank < 0:
            rl_store_release_u32(_u32(b + OFF_WRITER_CLOSED), 1)
            rl_fence_seq_cst()
            self._bump(OFF_DATA_FUTEX)
            self._bump(OFF_SPACE_FUTEX)
            for r in range(self._n_readers):
                if rl_load_acquire_u32(_u32(b + OFF_READERS + LINE * r + R_WAITING)) & WAIT_FD:
                    self._wake.poke(r, self._reader_token)
            shm.unlink_segment(self._name)
            for i, seg in enumerate(self._oob_names):
                if seg is not None:
                    shm.unlink_segment(seg)
                    self._oob_names[i] = None
        else:
            rl_store_release_u32(_u32(b + OFF_READERS + LINE * self._rank + R_CLOSED), 1)
            rl_fence_seq_cst()
            self._bump(OFF_SPACE_FUTEX)
            self._bump(OFF_DATA_FUTEX)
            if rl_load_acquire_u32(_u32(b + OFF_WRITER_WAITING)) & WAIT_FD:
                self._wake.poke_writer()
            if not self._peer_alive(self._writer_pid):
                shm.unlink_segment(self._name)
        self._wake.wake_self()
        return 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __dealloc__(self):
        # Last resort for a queue dropped without close(): at least the
        # writer's segments must not outlive it.
        if not self._released:
            try:
                self.close()
            except BaseException:
                pass
            if not self._released:
                self._release()


async def _async_wait(MessageQueue q, attempt, check_peer, deadline, what):
    # The whole wait counts as an operation in progress, so a close() from
    # elsewhere defers unmapping and closing our socket until we have left.
    q._begin()
    try:
        result = attempt()
        if result is not _NOTHING:
            return result
        loop = asyncio.get_running_loop()
        fd = q.fileno()
        try:
            while True:
                q._set_waiting(WAIT_FD)
                result = attempt()
                if result is not _NOTHING:
                    return result
                check_peer()
                slice_s = q._slice_ns() / 1e9
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise q._error(RL_TIMEOUT, waiting_for=_WAITING_FOR[what])
                    slice_s = min(slice_s, left)
                fut = loop.create_future()
                loop.add_reader(fd, _set_done, fut)
                try:
                    await asyncio.wait_for(fut, slice_s)
                except asyncio.TimeoutError:
                    pass
                finally:
                    loop.remove_reader(fd)
                q._drain_wake_sock()
        finally:
            q._set_waiting(0)
    finally:
        q._end()
