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

import asyncio
import mmap
import os
import select
import socket
import time

from ray_lite._fast import _codec_c as _codec
from ray_lite._fast import shm
from ray_lite._fast.errors import BufferTooSmallError, ChannelClosedError, DecodeError, PeerDiedError

__all__ = ["MessageQueue", "HANDLE_TAG", "DEFAULT_MAX_CHUNK_BYTES", "DEFAULT_MAX_CHUNKS",
           "MIN_CHUNK_BYTES", "MAX_READERS"]

# TODO-dedupe: the ring's _ring_c.pxd is to expose the same nogil wait/wake
# primitives; switch to them once it does.
cdef extern from *:
    """
    #include <stdint.h>
    #include <time.h>
    #include <sched.h>
    #include <unistd.h>
    #include <sys/syscall.h>
    #include <linux/futex.h>

    static inline uint64_t rlb_load_u64_acquire(const char *p) {
        return __atomic_load_n((const uint64_t *)p, __ATOMIC_ACQUIRE);
    }
    static inline void rlb_store_u64_release(char *p, uint64_t v) {
        __atomic_store_n((uint64_t *)p, v, __ATOMIC_RELEASE);
    }
    static inline uint32_t rlb_load_u32(const char *p) {
        return __atomic_load_n((const uint32_t *)p, __ATOMIC_ACQUIRE);
    }
    static inline void rlb_store_u32(char *p, uint32_t v) {
        __atomic_store_n((uint32_t *)p, v, __ATOMIC_RELEASE);
    }
    static inline void rlb_bump_u32(char *p) {
        __atomic_fetch_add((uint32_t *)p, 1, __ATOMIC_SEQ_CST);
    }
    static inline int rlb_load_int(const int *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
    static inline void rlb_store_int(int *p, int v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
    static inline void rlb_fence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
    static inline void rlb_relax(void) {
    #if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
    #elif defined(__aarch64__)
        __asm__ __volatile__("yield" ::: "memory");
    #else
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
    #endif
    }
    static inline int64_t rlb_now_ns(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
    }
    /* Shared (not private) futex: the word lives in a mapping of another process. */
    static inline void rlb_futex_wait(char *p, uint32_t expected, int64_t timeout_ns) {
        struct timespec ts;
        ts.tv_sec = timeout_ns / 1000000000LL;
        ts.tv_nsec = timeout_ns % 1000000000LL;
        syscall(SYS_futex, (uint32_t *)p, FUTEX_WAIT, expected, &ts, NULL, 0);
    }
    static inline void rlb_futex_wake(char *p) {
        syscall(SYS_futex, (uint32_t *)p, FUTEX_WAKE, 0x7fffffff, NULL, NULL, 0);
    }
    """
    uint64_t rlb_load_u64_acquire(const char* p) noexcept nogil
    void rlb_store_u64_release(char* p, uint64_t v) noexcept nogil
    uint32_t rlb_load_u32(const char* p) noexcept nogil
    void rlb_store_u32(char* p, uint32_t v) noexcept nogil
    void rlb_bump_u32(char* p) noexcept nogil
    int rlb_load_int(const int* p) noexcept nogil
    void rlb_store_int(int* p, int v) noexcept nogil
    void rlb_fence() noexcept nogil
    void rlb_relax() noexcept nogil
    int64_t rlb_now_ns() noexcept nogil
    void rlb_futex_wait(char* p, uint32_t expected, int64_t timeout_ns) noexcept nogil
    void rlb_futex_wake(char* p) noexcept nogil
    int sched_yield() noexcept nogil


MAGIC = int.from_bytes(b"RLBCAST1", "little")
VERSION = 1
HANDLE_TAG = "ray_lite.MessageQueue/1"
DEFAULT_MAX_CHUNK_BYTES = 1 << 20
DEFAULT_MAX_CHUNKS = 16
MIN_CHUNK_BYTES = 256
MAX_READERS = 256

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

# Waiting strategy (see the pure twin).  Spinning is cheap in C, so it is
# short and precise; yielding lets the other processes of a 2-core machine
# run while we still answer within microseconds; both are bounded in time so
# an idle waiter costs at most ~YIELD_NS of CPU per idle period.
cdef enum:
    SPIN_NS = 5000
    YIELD_NS = 200000
    SLEEP_SLICE_NS = 100000000
    SLEEP_SLICE_WEAK_NS = 2000000   # when an end cannot fence (see the pure twin)

cdef inline int64_t _sleep_slice(const char* base) noexcept nogil:
    return SLEEP_SLICE_WEAK_NS if rlb_load_u32(base + OFF_WEAK_ORDERING) else SLEEP_SLICE_NS


cdef inline uint64_t _align(uint64_t n, uint64_t a) noexcept nogil:
    return (n + a - 1) & ~(a - 1)


def geometry(n_readers, max_chunk_bytes, max_chunks):
    """(chunks_offset, chunk_stride, data_offset, total_size) of a queue."""
    chunks_offset = _align(OFF_READERS + LINE * n_readers, 4096)
    data_offset = C_MARKS + _align(8 * n_readers, LINE)
    stride = _align(data_offset + max_chunk_bytes, LINE)
    return chunks_offset, stride, data_offset, chunks_offset + stride * max_chunks


cdef int64_t _deadline_ns(object timeout) except -2:
    """-1 for "no deadline"."""
    if timeout is None:
        return -1
    if timeout < 0:
        raise ValueError("timeout must be non-negative")
    return rlb_now_ns() + <int64_t>(timeout * 1e9)


cdef class _PeerWatch:
    """Liveness of another process: a pidfd when the kernel has them."""
    cdef public int pid
    cdef int _fd
    cdef bint _dead

    def __cinit__(self, int pid):
        self.pid = pid
        self._fd = -1
        self._dead = False
        try:
            self._fd = os.pidfd_open(pid)
        except ProcessLookupError:
            self._dead = True
        except (OSError, AttributeError):
            self._fd = -1

    def alive(self):
        if self._dead:
            return False
        if self._fd >= 0:
            p = select.poll()
            p.register(self._fd, select.POLLIN)
            if p.poll(0):
                self._dead = True
        elif not shm.pid_alive(self.pid):
            self._dead = True
        return not self._dead

    def close(self):
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _wake_address(name, role):
    return "\0" + name + "." + role


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


def _buffer_views(src, frame_len, n_oob):
    if not n_oob:
        return []
    off = int(_align(frame_len, 8))
    lengths = src[off:off + 8 * n_oob].cast("Q").tolist()
    off += 8 * n_oob
    views = []
    for n in lengths:
        off = int(_align(off, 64))
        views.append(src[off:off + n])
        off += n
    return views


def _map_readonly(name, size):
    try:
        fd = os.open(shm.segment_path(name), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ChannelClosedError(
            f"the out-of-band segment {name!r} of a message is gone (the writer closed the queue)") from None
    try:
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
    finally:
        os.close(fd)
    return memoryview(mm)


cdef class _Nothing:
    pass


cdef object _NOTHING = _Nothing()


def _set_done(fut):
    if not fut.done():
        fut.set_result(None)


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
        self._wake_sock = None
        self._poke_sock = None
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
        cdef uint32_t pid = rlb_load_u32(slot + R_PID)
        if pid != 0:
            self._release()
            raise ValueError(f"reader rank {rank} of {name!r} is already attached (pid {pid})")
        self._rank = irank
        rlb_store_u32(slot + R_PID, os.getpid())
        rlb_fence()
        # The last reader to attach removes the name (see the pure twin).
        cdef uint32_t r
        for r in range(self._n_readers):
            if rlb_load_u32(self._base + OFF_READERS + LINE * r + R_PID) == 0:
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
            raise ChannelClosedError("this end of the MessageQueue is closed")
        self._busy += 1
        return 0

    cdef void _leave(self):
        self._busy -= 1
        if self._closed and self._busy == 0:
            self._release()

    def _release(self):
        if self._released:
            return
        self._released = True
        for sock in (self._wake_sock, self._poke_sock):
            if sock is not None:
                sock.close()
        self._wake_sock = self._poke_sock = None
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

    def _poke(self, role):
        if self._poke_sock is None:
            self._poke_sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK)
        try:
            self._poke_sock.sendto(b"\1", _wake_address(self._name, role))
        except OSError:
            pass

    def fileno(self):
        """A file descriptor that becomes readable when this end may proceed
        (a reader: a message may be there; the writer: a chunk may be free).
        Only poked while ``dequeue_async``/``enqueue_async`` is waiting."""
        if self._wake_sock is None:
            if self._closed:
                raise ChannelClosedError("this end of the MessageQueue is closed")
            s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK)
            try:
                s.bind(_wake_address(self._name, "w" if self._rank < 0 else f"r{self._rank}"))
            except BaseException:
                s.close()
                raise
            self._wake_sock = s
        return self._wake_sock.fileno()

    def _drain_wake_sock(self):
        try:
            while True:
                self._wake_sock.recv(64)
        except OSError:
            pass

    cdef void _bump(self, uint32_t off) noexcept:
        rlb_bump_u32(self._base + off)
        rlb_futex_wake(self._base + off)
        # Hand the CPU over: on a machine with few cores the kernel often
        # queues the woken process on *our* core (wake-affine), where it
        # would wait until we block.  Only paid when somebody was asleep,
        # i.e. at the first message after an idle period; measured here it
        # took the wake-up from ~75 to ~40 µs when both shared a core.
        sched_yield()

    # ------------------------------------------------------------ writer

    cdef bint _chunk_free(self, uint32_t c, uint64_t k) except -1:
        if k < self._n_chunks:
            return True
        cdef uint64_t want = k + 1 - self._n_chunks
        cdef char* marks = self._chunk(c) + C_MARKS
        cdef uint32_t r
        for r in range(self._n_readers):
            if rlb_load_u64_acquire(marks + 8 * r) < want:
                if rlb_load_u32(self._base + OFF_READERS + LINE * r + R_CLOSED):
                    raise ChannelClosedError(f"reader {r} closed the MessageQueue")
                return False
        return True

    def _check_readers_alive(self, uint32_t c, uint64_t k):
        cdef uint64_t want = k + 1 - self._n_chunks
        cdef char* marks = self._chunk(c) + C_MARKS
        cdef uint32_t r, pid
        for r in range(self._n_readers):
            if rlb_load_u64_acquire(marks + 8 * r) < want:
                pid = rlb_load_u32(self._base + OFF_READERS + LINE * r + R_PID)
                if pid and not self._peer_alive(pid):
                    raise PeerDiedError(f"reader {r} (pid {pid}) of the MessageQueue died")

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

    cdef int _wait_space(self, uint32_t c, uint64_t k, int64_t deadline) except -1:
        cdef char* marks = self._chunk(c) + C_MARKS
        cdef uint64_t want = k + 1 - self._n_chunks
        cdef uint32_t n = self._n_readers, r, seen
        cdef int64_t start, now, slice_ns
        cdef long spins = 0
        cdef bint ready = False
        with nogil:
            start = rlb_now_ns()
            while not ready:
                ready = True
                for r in range(n):
                    if rlb_load_u64_acquire(marks + 8 * r) < want:
                        ready = False
                        break
                if ready or rlb_load_int(&self._closed):
                    break
                spins += 1
                now = rlb_now_ns() if (spins & 31) == 0 or spins > 256 else start
                if now - start > YIELD_NS or (deadline >= 0 and now >= deadline):
                    break
                if now - start > SPIN_NS:
                    sched_yield()
                else:
                    rlb_relax()
        cdef char* waiting = self._base + OFF_WRITER_WAITING
        cdef char* futex = self._base + OFF_SPACE_FUTEX
        try:
            while True:
                if self._chunk_free(c, k):
                    return 0
                if self._closed:
                    raise ChannelClosedError("the MessageQueue was closed while enqueue waited")
                seen = rlb_load_u32(futex)
                rlb_store_u32(waiting, WAIT_FUTEX)
                rlb_fence()
                if self._chunk_free(c, k):
                    return 0
                self._check_readers_alive(c, k)
                slice_ns = _sleep_slice(self._base)
                if deadline >= 0:
                    now = rlb_now_ns()
                    if now >= deadline:
                        raise TimeoutError("MessageQueue.enqueue timed out waiting for readers to make room")
                    if deadline - now < slice_ns:
                        slice_ns = deadline - now
                with nogil:
                    rlb_futex_wait(futex, seen, slice_ns)
                PyErr_CheckSignals()
        finally:
            if self._base != NULL:
                rlb_store_u32(waiting, 0)

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
            end = encode_to_ptr(obj, data, <Py_ssize_t>self._chunk_bytes, bufs, threshold)
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
        rlb_store_u64_release(chunk + C_SEQ, k + 1)
        self._wake_readers()
        return 0

    def _write_oob_segment(self, obj, needed):
        size = max(needed, 2 * self._chunk_bytes, 4096)
        while True:
            frame = bytearray(size)
            try:
                end, bufs = _codec.encode_into(obj, frame, 0, self._oob_threshold)
                break
            except BufferTooSmallError as exc:
                size = max(exc.needed, 2 * size)
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
        rlb_fence()
        cdef uint32_t r, w, any_futex = 0
        cdef char* slots = self._base + OFF_READERS
        for r in range(self._n_readers):
            w = rlb_load_u32(slots + LINE * r + R_WAITING)
            if w:
                any_futex |= w & WAIT_FUTEX
                if w & WAIT_FD:
                    self._poke(f"r{r}")
        if any_futex:
            self._bump(OFF_DATA_FUTEX)
        return 0

    # ------------------------------------------------------------ reader

    cdef int _poll(self, uint32_t c, uint64_t k) except -1:
        cdef char* seq = self._chunk(c) + C_SEQ
        if rlb_load_u64_acquire(seq) == k + 1:
            return 1
        if self._closed:
            raise ChannelClosedError("this end of the MessageQueue is closed")
        if rlb_load_u32(self._base + OFF_WRITER_CLOSED):
            if rlb_load_u64_acquire(seq) == k + 1:
                return 1
            raise ChannelClosedError("the writer closed the MessageQueue")
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
        cdef uint64_t want = k + 1
        cdef int64_t start, now, slice_ns
        cdef long spins = 0
        cdef uint32_t seen
        if deadline >= 0 and rlb_now_ns() >= deadline:
            raise TimeoutError("MessageQueue.dequeue timed out")
        with nogil:
            start = rlb_now_ns()
            while True:
                if rlb_load_u64_acquire(seq) == want or rlb_load_u32(closed) or rlb_load_int(&self._closed):
                    break
                spins += 1
                now = rlb_now_ns() if (spins & 31) == 0 or spins > 256 else start
                if now - start > YIELD_NS or (deadline >= 0 and now >= deadline):
                    break
                if now - start > SPIN_NS:
                    sched_yield()
                else:
                    rlb_relax()
        cdef char* waiting = self._base + OFF_READERS + LINE * self._rank + R_WAITING
        cdef char* futex = self._base + OFF_DATA_FUTEX
        try:
            while True:
                if self._poll(c, k):
                    return 0
                seen = rlb_load_u32(futex)
                rlb_store_u32(waiting, WAIT_FUTEX)
                rlb_fence()
                if self._poll(c, k):
                    return 0
                if not self._peer_alive(self._writer_pid):
                    if self._poll(c, k):
                        return 0
                    raise PeerDiedError(f"the writer of the MessageQueue (pid {self._writer_pid}) died")
                slice_ns = _sleep_slice(self._base)
                if deadline >= 0:
                    now = rlb_now_ns()
                    if now >= deadline:
                        raise TimeoutError("MessageQueue.dequeue timed out")
                    if deadline - now < slice_ns:
                        slice_ns = deadline - now
                with nogil:
                    rlb_futex_wait(futex, seen, slice_ns)
                PyErr_CheckSignals()
        finally:
            if self._base != NULL:
                rlb_store_u32(waiting, 0)

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
        rlb_store_u64_release(marks + 8 * self._rank, k + 1)
        rlb_fence()
        if seg_name is not None:
            for r in range(self._n_readers):
                if rlb_load_u64_acquire(marks + 8 * r) < k + 1:
                    break
            else:
                shm.unlink_segment(seg_name)
        w = rlb_load_u32(self._base + OFF_WRITER_WAITING)
        if w:
            if w & WAIT_FD:
                self._poke("w")
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
            raise ChannelClosedError("this end of the MessageQueue is closed")
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
            raise PeerDiedError(f"the writer of the MessageQueue (pid {self._writer_pid}) died")

    def _check_space_peers(self):
        self._check_readers_alive(self._cursor, self._next)

    def _set_waiting(self, uint32_t bits):
        cdef char* w
        if self._rank < 0:
            w = self._base + OFF_WRITER_WAITING
        else:
            w = self._base + OFF_READERS + LINE * self._rank + R_WAITING
        rlb_store_u32(w, bits)
        rlb_fence()

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
        rlb_store_int(&self._closed, 1)
        cdef char* b = self._base
        cdef uint32_t r
        if self._rank < 0:
            rlb_store_u32(b + OFF_WRITER_CLOSED, 1)
            rlb_fence()
            self._bump(OFF_DATA_FUTEX)
            self._bump(OFF_SPACE_FUTEX)
            for r in range(self._n_readers):
                if rlb_load_u32(b + OFF_READERS + LINE * r + R_WAITING) & WAIT_FD:
                    self._poke(f"r{r}")
            shm.unlink_segment(self._name)
            for i, seg in enumerate(self._oob_names):
                if seg is not None:
                    shm.unlink_segment(seg)
                    self._oob_names[i] = None
        else:
            rlb_store_u32(b + OFF_READERS + LINE * self._rank + R_CLOSED, 1)
            rlb_fence()
            self._bump(OFF_SPACE_FUTEX)
            self._bump(OFF_DATA_FUTEX)
            if rlb_load_u32(b + OFF_WRITER_WAITING) & WAIT_FD:
                self._poke("w")
            if not self._peer_alive(self._writer_pid):
                shm.unlink_segment(self._name)
        if self._wake_sock is not None:
            try:
                self._wake_sock.sendto(b"\1", self._wake_sock.getsockname())
            except OSError:
                pass
        if self._busy == 0:
            self._release()

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


def _deadline_s(timeout):
    if timeout is None:
        return None
    if timeout < 0:
        raise ValueError("timeout must be non-negative")
    return time.monotonic() + timeout


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
                        raise TimeoutError(f"MessageQueue.{what} timed out")
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
