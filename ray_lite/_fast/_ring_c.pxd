# cython: language_level=3
# C-level interface of the compiled ring, for other compiled modules: the
# compiled link (_link_c.pyx: ``_put``, ``_get``, ``_get_nowait`` and ``end`` without a
# Python call) and the benchmark's nogil ping-pong (ray_lite/bench/_ringbench_c.pyx).  Layout and
# protocol: see _ring_py.py (the specification).
#
# The waiting primitives (atomics, clock, futex, liveness, rl_wait/rl_wake)
# live in _wait.pxd, shared with the broadcast queue; they are cimported
# here, so that cimporting them from this file keeps working.
from libc.stdint cimport int64_t, uint32_t, uint64_t

from ray_lite._fast._wait cimport (
    RL_AGAIN,
    RL_INTERRUPTED,
    RL_OK,
    RL_TIMEOUT,
    WP_AGAIN_NS,
    WP_RING_SPIN_GIL_NS,
    WP_RING_SPIN_NS,
    WP_RING_YIELDS,
    WP_SLICE_NS,
    WP_SLICE_WEAK_NS,
    WP_SPIN_POLL_PREEMPTED_NS,
    WP_SPIN_POLL_YIELD_NS,
    rl_cpu_relax,
    rl_exchange_u32,
    rl_fence_seq_cst,
    rl_futex_wait,
    rl_futex_wake,
    rl_load_acquire_u32,
    rl_load_acquire_u64,
    rl_load_relaxed_u32,
    rl_load_relaxed_u64,
    rl_now_ns,
    rl_pidfd_open,
    rl_process_exited,
    rl_ready_fn,
    rl_store_relaxed_u32,
    rl_store_relaxed_u64,
    rl_store_release_u32,
    rl_store_release_u64,
    rl_wait,
    rl_wait_policy,
    rl_wait_policy_values,
    rl_wake,
    sched_getcpu,
    sched_yield,
)


# Status codes of the ring's C-level API: those of _wait.pxd (RL_OK 0,
# RL_TIMEOUT 1, RL_AGAIN 4, RL_INTERRUPTED 6) and these.
cdef enum:
    RL_CLOSED = 2       # this end or the peer closed (a consumer: after draining)
    RL_PEER_DIED = 3    # the peer process exited without closing (a consumer: after draining)
    RL_TOO_BIG = 5      # more than inline_limit bytes for a raw record


# -- one end of a ring -----------------------------------------------------
cdef struct RingEnd:
    char* header            # start of the mapping
    char* data              # the data area (header + 512)
    uint64_t capacity       # power of two
    uint64_t mask
    uint64_t inline_limit   # largest payload stored in the ring itself
    uint64_t max_message
    uint64_t pos            # this end's position (write_pos or read_pos), authoritative here
    uint64_t cache          # last seen position of the other end
    uint64_t pending_hdr    # producer: offset of the reserved record's header
    uint64_t pending_skip   # producer: bytes a pending WRAP skips
    uint64_t cur_rec        # consumer: size of the record handed out by rl_ring_peek
    uint64_t need           # producer: free bytes a waiter needs
    int is_producer
    int peer_dead           # the peer was found dead (sticky)
    int fifo_fd
    int peer_pidfd
    int64_t peer_pid
    int64_t my_pid
    int resume              # set to 1 before calling a waiting function again after RL_AGAIN /
                            # RL_INTERRUPTED: the wait resumes without spinning again
    rl_wait_policy policy


# Raw-record API: no Python, no GIL.  Deadlines as for rl_wait (-1: none,
# 0: do not wait).  Waiting calls return RL_AGAIN every ~100 ms and
# RL_INTERRUPTED when a signal arrives: call PyErr_CheckSignals() with the GIL
# (so that Ctrl-C works), then call again.

cdef int rl_ring_reserve(RingEnd* e, uint64_t n, int64_t deadline_ns, char** payload) noexcept nogil
# Producer: room for a payload of n <= inline_limit bytes; *payload points at it.
# RL_OK / RL_TIMEOUT / RL_CLOSED / RL_PEER_DIED / RL_AGAIN / RL_INTERRUPTED / RL_TOO_BIG.
cdef void rl_ring_publish(RingEnd* e, uint32_t kind, uint64_t n) noexcept nogil
# Producer: publish the reserved record with its n payload bytes; wakes the consumer if it sleeps.
cdef int rl_ring_write(RingEnd* e, const char* src, uint64_t n, int64_t deadline_ns) noexcept nogil
# Producer: reserve + copy + publish a raw bytes message (kind BYTES).

cdef int rl_ring_peek(RingEnd* e, int64_t deadline_ns, const char** payload, uint64_t* n,
                      uint32_t* kind) noexcept nogil
# Consumer: the next record, left in the ring until rl_ring_release.
# RL_OK / RL_TIMEOUT / RL_CLOSED / RL_PEER_DIED / RL_AGAIN / RL_INTERRUPTED.
cdef void rl_ring_release(RingEnd* e) noexcept nogil
# Consumer: hand the peeked record's space back; wakes the producer if it sleeps.
cdef bint rl_ring_poll(RingEnd* e) noexcept nogil
# Consumer: rl_ring_peek would not wait (a record, or a closed/dead peer).
cdef int rl_ring_wait_ready(RingEnd* e, int64_t deadline_ns, bint spin) noexcept nogil
# Either end: one rl_wait on this end's condition (data; or e.need free bytes),
# including the peer check after a slice.  RL_OK means "look again".


cdef class ShmRing:
    cdef RingEnd end
    cdef object _name
    cdef object _side
    cdef object _prefix
    cdef object _mm             # the mmap object; _view pins it while raw pointers are in use
    cdef Py_buffer _view
    cdef bint _has_view
    cdef bint _closed
    cdef bint _released
    cdef bint _in_op            # an operation is running (one at a time per end)
    cdef int _pins              # running operation and close(): the mapping stays while > 0
    cdef list _oob              # reused out-of-band buffer list for encode_to_ptr
    cdef public bint readonly_arrays    # numpy arrays sent decode read-only (the core's links)
    cdef object __weakref__
    cdef bint _wake_owed        # its consumer's wake-up is held (hold_wakes)

    cdef int _enter(self, bint producer) except -1
    cdef void _leave(self)
    cdef int _raise_status(self, int st) except -1
    cdef int _put(self, object obj, object timeout) except -1
    cdef int _publish(self, uint32_t kind, uint64_t n) except -1
    cdef void _give_owed_wake(self) noexcept
    cdef object _get(self, object timeout)
    cdef object _get_nowait(self)
    cdef int _reserve(self, uint64_t n, object timeout, char** slot) except -1
    cdef int _put_slow(self, object obj, Py_ssize_t need, object timeout) except -1
    cdef Py_ssize_t _publish_frame(self, char* slot, Py_ssize_t n, Py_ssize_t room, object timeout) except -1
    cdef Py_ssize_t _put_oob(self, char* slot, Py_ssize_t n, Py_ssize_t room, object timeout) except -1
    cdef int _put_big(self, object obj, object timeout) except -1
    cdef int _put_side(self, uint32_t kind, list pieces, object timeout) except -1
    cdef int _write_side_ref(self, char* payload, uint64_t inline_len, bytes name, uint64_t size,
                             uint32_t kind) except -1
    cdef int _peek(self, object timeout, const char** payload, uint64_t* n, uint32_t* kind) except -1
    cdef object _consume(self, const char* payload, uint64_t n, uint32_t kind)
    cdef object _consume_side(self, const char* payload, uint64_t n, uint32_t kind)
    cdef int _check_consumer(self) except -1
    cdef _unlink_unread_side_segments(self)
    cdef str _side_name(self, const char* payload, uint64_t n)
    cdef int _close(self) except -1
    cdef int _release(self) except -1
