# cython: language_level=3
# C-level interface of the compiled ring, for other compiled modules: the
# benchmark's nogil ping-pong (ray_lite/bench/_ringbench_c.pyx) and any
# shared-memory channel that wants the same waiting strategy.  Layout and
# protocol: see _ring_py.py (the specification).
#
# The primitives are verbatim C rather than a header so that a module that
# cimports this file from another directory compiles without an include path.
from libc.stdint cimport int64_t, uint32_t, uint64_t

cdef extern from *:
    """
    #ifndef RL_RING_PRIMITIVES_H
    #define RL_RING_PRIMITIVES_H
    #include <errno.h>
    #include <fcntl.h>
    #include <limits.h>
    #include <poll.h>
    #include <sched.h>
    #include <signal.h>
    #include <stdint.h>
    #include <stdio.h>
    #include <string.h>
    #include <time.h>
    #include <unistd.h>
    #include <sys/syscall.h>
    #if defined(__linux__)
    #include <linux/futex.h>
    #endif
    #if defined(__linux__) && !defined(SYS_pidfd_open)
    #define SYS_pidfd_open 434  /* the same number on every architecture */
    #endif

    /* Atomics: GCC/Clang builtins with C11 memory-model semantics. */
    static inline uint64_t rl_load_acquire_u64(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
    static inline uint64_t rl_load_relaxed_u64(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
    static inline void rl_store_release_u64(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
    static inline void rl_store_relaxed_u64(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
    static inline uint32_t rl_load_acquire_u32(const uint32_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
    static inline uint32_t rl_load_relaxed_u32(const uint32_t *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
    static inline void rl_store_release_u32(uint32_t *p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
    static inline void rl_store_relaxed_u32(uint32_t *p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
    static inline uint32_t rl_exchange_u32(uint32_t *p, uint32_t v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
    static inline void rl_fence_seq_cst(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

    static inline void rl_cpu_relax(void) {
    #if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
    #elif defined(__aarch64__)
        __asm__ __volatile__("yield" ::: "memory");
    #else
        __asm__ __volatile__("" ::: "memory");
    #endif
    }

    static inline int64_t rl_now_ns(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
    }

    /* Sleep while *word == expected, at most timeout_ns.  Returns 0 (woken),
       ETIMEDOUT, EAGAIN (the word had changed) or EINTR.  Not a private futex:
       the word lives in memory shared by two processes. */
    static inline int rl_futex_wait(uint32_t *word, uint32_t expected, int64_t timeout_ns) {
        struct timespec ts;
        if (timeout_ns < 0) timeout_ns = 0;
        ts.tv_sec = (time_t)(timeout_ns / 1000000000LL);
        ts.tv_nsec = (long)(timeout_ns % 1000000000LL);
    #if defined(__linux__) && defined(SYS_futex)
        if (syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, NULL, 0) == 0) return 0;
        return errno;
    #else
        (void)word; (void)expected;
        if (nanosleep(&ts, NULL) == 0) return ETIMEDOUT;
        return errno;
    #endif
    }

    static inline void rl_futex_wake(uint32_t *word) {
    #if defined(__linux__) && defined(SYS_futex)
        syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    #else
        (void)word;
    #endif
    }

    static inline int rl_pidfd_open(int pid) {
    #if defined(__linux__)
        return (int)syscall(SYS_pidfd_open, pid, 0);
    #else
        (void)pid; errno = ENOSYS; return -1;
    #endif
    }

    /* 1 when fd is readable now (a pidfd: the process exited). */
    static inline int rl_fd_readable(int fd) {
        struct pollfd p;
        p.fd = fd; p.events = POLLIN; p.revents = 0;
        return poll(&p, 1, 0) > 0;
    }

    /* Without a pidfd: kill(pid, 0) says nothing about zombies, /proc does. */
    static inline int rl_pid_exited(int pid) {
        char path[64], buf[512];
        ssize_t n;
        int fd;
        char *paren;
        if (pid <= 0) return 1;
        if (kill(pid, 0) != 0 && errno == ESRCH) return 1;
        snprintf(path, sizeof path, "/proc/%d/stat", pid);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) return errno == ENOENT;
        n = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (n <= 0) return 0;
        buf[n] = 0;
        paren = strrchr(buf, ')');
        return paren != NULL && (paren[2] == 'Z' || paren[2] == 'X');
    }
    #endif /* RL_RING_PRIMITIVES_H */
    """
    uint64_t rl_load_acquire_u64(const uint64_t* p) nogil
    uint64_t rl_load_relaxed_u64(const uint64_t* p) nogil
    void rl_store_release_u64(uint64_t* p, uint64_t v) nogil
    void rl_store_relaxed_u64(uint64_t* p, uint64_t v) nogil
    uint32_t rl_load_acquire_u32(const uint32_t* p) nogil
    uint32_t rl_load_relaxed_u32(const uint32_t* p) nogil
    void rl_store_release_u32(uint32_t* p, uint32_t v) nogil
    void rl_store_relaxed_u32(uint32_t* p, uint32_t v) nogil
    uint32_t rl_exchange_u32(uint32_t* p, uint32_t v) nogil
    void rl_fence_seq_cst() nogil
    void rl_cpu_relax() nogil
    int64_t rl_now_ns() nogil
    int rl_futex_wait(uint32_t* word, uint32_t expected, int64_t timeout_ns) nogil
    void rl_futex_wake(uint32_t* word) nogil
    int rl_pidfd_open(int pid) nogil
    int rl_fd_readable(int fd) nogil
    int rl_pid_exited(int pid) nogil


# Status codes of the C-level API.
cdef enum:
    RL_OK = 0
    RL_TIMEOUT = 1      # the deadline passed
    RL_CLOSED = 2       # this end or the peer closed (a consumer: after draining)
    RL_PEER_DIED = 3    # the peer process exited without closing (a consumer: after draining)
    RL_AGAIN = 4        # a sleep slice ended or a signal arrived: check signals, call again
    RL_TOO_BIG = 5      # more than inline_limit bytes for a raw record
    RL_INTERRUPTED = 6  # a signal arrived (EINTR): check signals at once, call again


# -- the waiting strategy, reusable by any shared-memory channel -----------
# ``ready(ctx)`` is the condition; it must load what it checks with acquire
# (or stronger) ordering.  The sleeper's futex word is 0 while nobody sleeps.
ctypedef bint (*rl_ready_fn)(void* ctx) noexcept nogil

cdef struct rl_wait_policy:
    int64_t spin_ns     # busy-wait this long first (pause instruction between checks)
    int yields          # then sched_yield() this many times
    int64_t slice_ns    # then sleep on the futex at most this long per call

cdef int rl_wait(uint32_t* sleep_word, rl_ready_fn ready, void* ctx, int64_t deadline_ns,
                 const rl_wait_policy* policy, bint spin) noexcept nogil
# Wait until ready(ctx): RL_OK.  ``deadline_ns`` is absolute CLOCK_MONOTONIC
# (rl_now_ns()), -1 for none; once passed: RL_TIMEOUT.  With ``spin`` it
# spins and yields first; then it sleeps at most one slice and returns
# RL_AGAIN if still not ready (the caller checks its peer and signals, and
# calls again with spin=0), or RL_INTERRUPTED if a signal ended the sleep.  Sleeping: sleep_word = 1, full fence, re-check,
# FUTEX_WAIT(sleep_word, 1).

cdef void rl_wake(uint32_t* sleep_word) noexcept nogil
# The waker's half, after publishing the change the sleeper waits for:
# full fence, and only if *sleep_word is set: swap it to 0 and FUTEX_WAKE.
# Costs a fence and a load when nobody sleeps.


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
    cdef Py_ssize_t _put_oob_need
    cdef object __weakref__

    cdef int _enter(self, bint producer) except -1
    cdef void _leave(self)
    cdef int _raise_status(self, int st) except -1
    cdef int _reserve(self, uint64_t n, object timeout, char** slot) except -1
    cdef int _put_slow(self, object obj, Py_ssize_t need, object timeout) except -1
    cdef int _put_oob(self, char* slot, Py_ssize_t n, Py_ssize_t room, object timeout) except -1
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
