# cython: language_level=3
"""The machine's floor for a cross-process round trip: two processes
ping-pong a counter on one shared cache line, spinning, with no system call
and no Python in the loop (what shared/anchors/spin_pingpong.c measures).

``spin_round_trips(round_trips, block=1000, timeout_s=10.0) -> list[float]``
    Forks a child (plain C after the fork: it never returns to Python) and
    runs ``round_trips`` round trips; returns the mean nanoseconds per round
    trip of each block of ``block`` consecutive round trips (timing each
    round trip alone would add the clock's own cost to a ~0.3 µs figure).
    Raises ``TimeoutError`` when the peer stops answering (it is then
    killed); the child is always reaped.

Both processes spin: on a machine with one free core this measures the
scheduler, not the cache line.  A spinner that has not seen its peer's
answer within ``SPINS_PER_CHECK`` spins (tens of microseconds; a round trip
takes well under one on a free pair of cores) yields its CPU: beside other
load the peer, waiting for a core, then gets this one, and the run ends
instead of timing out a round trip per scheduler tick.
"""
from libc.stdint cimport int64_t, uint64_t
from posix.signal cimport kill
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec
from posix.types cimport pid_t
from posix.unistd cimport _exit, fork, getpid, getppid

cdef extern from "<sys/mman.h>" nogil:
    void* mmap(void* addr, size_t length, int prot, int flags, int fd, long offset)
    int munmap(void* addr, size_t length)
    int PROT_READ
    int PROT_WRITE
    int MAP_SHARED
    int MAP_ANONYMOUS
    void* MAP_FAILED

cdef extern from "<sys/wait.h>" nogil:
    pid_t waitpid(pid_t pid, int* status, int options)

cdef extern from "<signal.h>" nogil:
    int SIGKILL

cdef extern from "<sched.h>" nogil:
    int sched_yield()

cdef extern from "<sys/prctl.h>" nogil:
    int prctl(int option, unsigned long arg2, unsigned long arg3, unsigned long arg4,
              unsigned long arg5)
    int PR_SET_PDEATHSIG


# C11-model atomics through GCC builtins: the counters are published with a
# release store and read with an acquire load, as the ring does.
cdef extern from *:
    """
    static inline int64_t rl_floor_load(int64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
    static inline void rl_floor_store(int64_t *p, int64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
    """
    int64_t rl_floor_load(int64_t* p) nogil
    void rl_floor_store(int64_t* p, int64_t v) nogil


cdef enum:
    # The two counters sit 128 bytes apart: each on its own line, and not in
    # the pair the adjacent-line prefetcher pulls together.
    PEER_OFFSET = 16            # in int64 units
    MAP_BYTES = 4096
    # Check the clock (parent) or the parent (child) once per this many spins.
    SPINS_PER_CHECK = 1 << 16


cdef inline int64_t now_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <int64_t>ts.tv_sec * 1000000000 + ts.tv_nsec


cdef void child_loop(int64_t* ping, int64_t* pong, int64_t n, pid_t parent) noexcept nogil:
    # Runs in the forked child: no Python from here on, and _exit, never return.
    cdef int64_t i
    cdef uint64_t spins = 0
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)
    for i in range(1, n + 1):
        while rl_floor_load(ping) != i:
            spins += 1
            if (spins & (SPINS_PER_CHECK - 1)) == 0:
                if getppid() != parent:
                    _exit(3)
                sched_yield()
            if rl_floor_load(ping) < 0:      # the parent gave up
                _exit(2)
        rl_floor_store(pong, i)
    _exit(0)


def spin_round_trips(long round_trips, long block=1000, double timeout_s=10.0):
    if round_trips <= 0 or block <= 0:
        raise ValueError("round_trips and block must be positive")
    cdef int64_t* mem = <int64_t*>mmap(NULL, MAP_BYTES, PROT_READ | PROT_WRITE,
                                       MAP_SHARED | MAP_ANONYMOUS, -1, 0)
    if <void*>mem == MAP_FAILED:
        raise OSError("mmap failed")
    cdef int64_t* ping = mem
    cdef int64_t* pong = mem + PEER_OFFSET
    cdef int64_t n = (round_trips + block - 1) // block * block
    cdef int64_t i, t0, t_block, deadline
    cdef uint64_t spins = 0
    cdef bint timed_out = False
    cdef int status = 0
    cdef pid_t parent
    cdef pid_t pid
    cdef list means = []
    cdef list block_ns = []
    ping[0] = 0
    pong[0] = 0
    parent = getpid()
    pid = fork()
    if pid < 0:
        munmap(mem, MAP_BYTES)
        raise OSError("fork failed")
    if pid == 0:
        child_loop(ping, pong, n, parent)
    try:
        with nogil:
            deadline = now_ns() + <int64_t>(timeout_s * 1e9)
            t_block = now_ns()
            i = 1
            while i <= n:
                rl_floor_store(ping, i)
                while rl_floor_load(pong) != i:
                    spins += 1
                    if (spins & (SPINS_PER_CHECK - 1)) == 0:
                        if now_ns() > deadline:
                            timed_out = True
                            break
                        sched_yield()
                if timed_out:
                    break
                if i % block == 0:
                    t0 = now_ns()
                    with gil:
                        block_ns.append(t0 - t_block)
                    t_block = now_ns()
                i += 1
        if timed_out:
            rl_floor_store(ping, -1)
            kill(pid, SIGKILL)
            raise TimeoutError(f"spin ping-pong peer stopped answering after {i - 1} round trips")
    finally:
        if timed_out:
            kill(pid, SIGKILL)
        with nogil:
            waitpid(pid, &status, 0)
        munmap(mem, MAP_BYTES)
    for t in block_ns:
        means.append(t / block)
    return means
