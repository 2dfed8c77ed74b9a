# cython: language_level=3
# Waiting primitives shared by the compiled shared-memory channels (the SPSC
# ring, the broadcast queue, the ring benchmark): C11-model atomics on words
# of a shared mapping, the monotonic clock, futex sleep and wake, process
# liveness (pidfd, else kill(0) plus a zombie check), and the bounded
# spin -> yield -> futex waiting strategy, with C copies of the numbers of
# wait_policy.py.
#
# Class-free and without non-inline cdef functions on purpose: cimporting
# this file compiles everything into the cimporting module and adds no
# run-time import (cimporting _ring_c.pxd would import _ring_c, because it
# declares the ShmRing class).  The primitives are verbatim C rather than a
# header so that a module that cimports this file from another directory
# compiles without an include path.
from libc.errno cimport EINTR
from libc.stdint cimport int64_t, uint32_t, uint64_t

cdef extern from *:
    """
    #ifndef RL_WAIT_PRIMITIVES_H
    #define RL_WAIT_PRIMITIVES_H
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
    static inline uint32_t rl_fetch_add_u32(uint32_t *p, uint32_t v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
    /* A flag in process memory that a nogil wait loop polls (another thread may set it). */
    static inline int rl_load_acquire_int(const int *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
    static inline void rl_store_release_int(int *p, int v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
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

    /* A pidfd of pid (readable once it exits), or -1 (no such process, or no pidfds). */
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

    /* Whether pid has exited: its pidfd when there is one (pidfd >= 0). */
    static inline int rl_process_exited(int pid, int pidfd) {
        return pidfd >= 0 ? rl_fd_readable(pidfd) : rl_pid_exited(pid);
    }
    #endif /* RL_WAIT_PRIMITIVES_H */
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
    uint32_t rl_fetch_add_u32(uint32_t* p, uint32_t v) nogil
    int rl_load_acquire_int(const int* p) nogil
    void rl_store_release_int(int* p, int v) nogil
    void rl_fence_seq_cst() nogil
    void rl_cpu_relax() nogil
    int64_t rl_now_ns() nogil
    int rl_futex_wait(uint32_t* word, uint32_t expected, int64_t timeout_ns) nogil
    void rl_futex_wake(uint32_t* word) nogil
    int rl_pidfd_open(int pid) nogil
    int rl_fd_readable(int fd) nogil
    int rl_pid_exited(int pid) nogil
    int rl_process_exited(int pid, int pidfd) nogil

cdef extern from "<sched.h>" nogil:
    int sched_yield()
    int sched_getcpu()


# Status codes of the waiting functions (the ring's C-level API adds its own
# codes in the gaps: see _ring_c.pxd).
cdef enum:
    RL_OK = 0
    RL_TIMEOUT = 1      # the deadline passed
    RL_AGAIN = 4        # a sleep slice (or the spin and yield phases) ended: check, call again
    RL_INTERRUPTED = 6  # a signal arrived (EINTR): check signals at once, call again


# -- the wait policy's numbers ------------------------------------------------
# C copies of ray_lite/_fast/wait_policy.py (compile-time constants, so the
# hot paths pay nothing for reading them).  Every compiled module that waits
# passes ``rl_wait_policy_values()`` to ``wait_policy.check_twin`` at import:
# a module built from another policy then refuses to load.
cdef enum:
    WP_RING_SPIN_GIL_NS = 3000
    WP_RING_SPIN_NS = 20000
    WP_RING_YIELDS = 4
    WP_SLICE_NS = 100000000
    WP_SLICE_WEAK_NS = 2000000
    WP_AGAIN_NS = 100000000
    WP_SPIN_POLL_YIELD_NS = 5000
    WP_SPIN_POLL_PREEMPTED_NS = 100000
    WP_BROADCAST_SPIN_NS = 5000
    WP_BROADCAST_YIELD_NS = 200000


cdef inline dict rl_wait_policy_values():
    """The constants above under their names in ``wait_policy``."""
    return {
        "RING_SPIN_GIL_NS": WP_RING_SPIN_GIL_NS, "RING_SPIN_NS": WP_RING_SPIN_NS,
        "RING_YIELDS": WP_RING_YIELDS, "SLICE_NS": WP_SLICE_NS, "SLICE_WEAK_NS": WP_SLICE_WEAK_NS,
        "AGAIN_NS": WP_AGAIN_NS, "SPIN_POLL_YIELD_NS": WP_SPIN_POLL_YIELD_NS,
        "SPIN_POLL_PREEMPTED_NS": WP_SPIN_POLL_PREEMPTED_NS,
        "BROADCAST_SPIN_NS": WP_BROADCAST_SPIN_NS, "BROADCAST_YIELD_NS": WP_BROADCAST_YIELD_NS,
    }


# -- the waiting strategy ----------------------------------------------------
# ``ready(ctx)`` is the condition; it must load what it checks with acquire
# (or stronger) ordering.
ctypedef bint (*rl_ready_fn)(void* ctx) noexcept nogil

cdef struct rl_wait_policy:
    int64_t spin_ns     # busy-wait this long first (pause instruction between checks)
    int yields          # then sched_yield() at most this many times...
    int64_t yield_ns    # ...and (when > 0) only until this long after the wait began
    int64_t slice_ns    # then sleep on the futex at most this long per call


cdef inline int rl_spin(rl_ready_fn ready, void* ctx, int64_t deadline_ns,
                        const rl_wait_policy* policy) noexcept nogil:
    """The busy phases of a wait: spin, then yield.

    RL_OK once ready(ctx); RL_TIMEOUT once ``deadline_ns`` (absolute
    CLOCK_MONOTONIC, -1 for none) passed; RL_AGAIN when both phases ran out
    and the caller should sleep.
    """
    cdef int64_t start = rl_now_ns()
    cdef int64_t until
    cdef int i
    if deadline_ns >= 0 and start >= deadline_ns:
        return RL_TIMEOUT
    if policy.spin_ns > 0:
        until = start + policy.spin_ns
        if deadline_ns >= 0 and until > deadline_ns:
            until = deadline_ns
        while True:
            # The clock is read once per 16 pauses: a pause takes 10-140
            # cycles, a clock read about as much as a few of them.
            for i in range(16):
                rl_cpu_relax()
                if ready(ctx):
                    return RL_OK
            if rl_now_ns() >= until:
                break
    until = start + policy.yield_ns if policy.yield_ns > 0 else -1
    if deadline_ns >= 0 and (until < 0 or until > deadline_ns):
        until = deadline_ns
    for i in range(policy.yields):
        sched_yield()
        if ready(ctx):
            return RL_OK
        if until >= 0 and rl_now_ns() >= until:
            break
    if deadline_ns >= 0 and rl_now_ns() >= deadline_ns:
        return RL_TIMEOUT
    return RL_AGAIN


cdef inline int rl_wait(uint32_t* sleep_word, rl_ready_fn ready, void* ctx, int64_t deadline_ns,
                        const rl_wait_policy* policy, bint spin) noexcept nogil:
    """Wait until ready(ctx): RL_OK.

    ``deadline_ns`` as for rl_spin; once passed: RL_TIMEOUT.  With ``spin``
    it runs rl_spin first; then it sleeps at most one slice and returns
    RL_AGAIN if still not ready (the caller checks its peer and signals, and
    calls again with spin=0), or RL_INTERRUPTED if a signal ended the sleep.
    Sleeping is a Dekker handshake with rl_wake: sleep_word = 1, full fence,
    re-check, FUTEX_WAIT(sleep_word, 1).  The sleeper's word is 0 while
    nobody sleeps.
    """
    cdef int64_t now, slice_ns
    cdef int r
    if ready(ctx):
        return RL_OK
    if spin:
        r = rl_spin(ready, ctx, deadline_ns, policy)
        if r != RL_AGAIN:
            return r
    now = rl_now_ns()
    if deadline_ns >= 0 and now >= deadline_ns:
        return RL_TIMEOUT
    rl_store_relaxed_u32(sleep_word, 1)
    rl_fence_seq_cst()
    if ready(ctx):
        rl_store_relaxed_u32(sleep_word, 0)
        return RL_OK
    slice_ns = policy.slice_ns
    if deadline_ns >= 0 and deadline_ns - now < slice_ns:
        slice_ns = deadline_ns - now
    r = rl_futex_wait(sleep_word, 1, slice_ns)
    rl_store_relaxed_u32(sleep_word, 0)
    if ready(ctx):
        return RL_OK
    if deadline_ns >= 0 and rl_now_ns() >= deadline_ns:
        return RL_TIMEOUT
    return RL_INTERRUPTED if r == EINTR else RL_AGAIN


cdef inline void rl_wake(uint32_t* sleep_word) noexcept nogil:
    """The waker's half of rl_wait, after publishing the change the sleeper waits for.

    Full fence, and only if *sleep_word is set: swap it to 0 and FUTEX_WAKE.
    Costs a fence and a load when nobody sleeps.
    """
    rl_fence_seq_cst()
    if rl_load_relaxed_u32(sleep_word) and rl_exchange_u32(sleep_word, 0):
        rl_futex_wake(sleep_word)
