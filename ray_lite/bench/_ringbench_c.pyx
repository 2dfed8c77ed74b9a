# cython: language_level=3
"""Ring round trips driven entirely from C: the compiled ring's floor, with no
Python in the loop (the B4 row beside the Python-level figure).

``ping(ring_out, ring_in, n, warmup=1000, size=8, timeout=60.0) -> list[int]``
    Send ``warmup + n`` messages of ``size`` bytes on ``ring_out`` (this
    process is its producer) and wait for each echo on ``ring_in`` (its
    consumer); return the ``n`` round-trip times in nanoseconds
    (CLOCK_MONOTONIC), warm-up excluded.
``echo(ring_in, ring_out, n, timeout=60.0) -> None``
    In the other process: copy ``n`` messages from ``ring_in`` (consumer) to
    ``ring_out`` (producer); ``n`` must equal ping's ``warmup + n``.
``c_round_trips(n, warmup=1000, size=8, timeout=60.0) -> list[int]``
    Both at once: creates the two rings, starts ``echo`` in a child process
    (``sys.executable``), runs ``ping`` here, reaps the child.

Rings are ``ShmRing`` objects of the compiled twin, or names to attach (an
attached ring is closed on return).  ``timeout`` bounds the whole run; a
dead or closed peer raises as ``ShmRing.get`` would.  The loops hold no GIL
and call no Python: they use the C-level API of ``_ring_c.pxd``
(``rl_ring_write``, ``rl_ring_peek``, ``rl_ring_reserve``/``publish``,
``rl_ring_release``), so the waiting strategy is the ring's own (spin, yield,
futex), and the figure is what the ring costs without the interpreter.
"""
import subprocess
import sys

from cpython.exc cimport PyErr_CheckSignals
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memset

from ray_lite._fast._ring_c cimport (
    RL_CLOSED,
    RL_PEER_DIED,
    RingEnd,
    ShmRing,
    rl_ring_peek,
    rl_ring_publish,
    rl_ring_release,
    rl_ring_reserve,
    rl_ring_write,
)
from ray_lite._fast._wait cimport RL_AGAIN, RL_INTERRUPTED, RL_OK, RL_TIMEOUT, rl_now_ns

from ray_lite._fast.errors import ChannelClosedError, PeerDiedError

__all__ = ["ping", "echo", "c_round_trips"]

cdef enum:
    KIND_BYTES = 2      # the ring's raw-bytes record kind (see _ring_py)


cdef ShmRing _open(object ring, str side, list opened):
    if isinstance(ring, ShmRing):
        if ring.side != side:
            raise ValueError(f"ring {ring.name} is the {ring.side} end, {side} needed")
        return ring
    r = ShmRing.attach(ring, side=side)
    opened.append(r)
    return r


cdef int _check(int st, str what) except -1:
    if st == RL_OK:
        return 0
    if st == RL_TIMEOUT:
        raise TimeoutError(f"ring benchmark: timed out {what}")
    if st == RL_PEER_DIED:
        raise PeerDiedError(f"ring benchmark: the peer died {what}")
    if st == RL_CLOSED:
        raise ChannelClosedError(f"ring benchmark: the channel closed {what}")
    raise RuntimeError(f"ring benchmark: status {st} {what}")


def ping(ring_out, ring_in, Py_ssize_t n, Py_ssize_t warmup=1000, Py_ssize_t size=8,
         double timeout=60.0):
    cdef list opened = []
    cdef ShmRing out_ring, in_ring
    cdef RingEnd* out
    cdef RingEnd* inn
    cdef int64_t* samples = NULL
    cdef char* msg = NULL
    cdef const char* payload
    cdef uint64_t got
    cdef uint32_t kind
    cdef int64_t deadline, t0
    cdef Py_ssize_t i = 0, total = warmup + n
    cdef int st = RL_OK
    cdef bint writing = True
    if n < 0 or warmup < 0 or size < 0:
        raise ValueError("n, warmup and size must not be negative")
    try:
        out_ring = _open(ring_out, "producer", opened)
        in_ring = _open(ring_in, "consumer", opened)
        out = &out_ring.end
        inn = &in_ring.end
        if <uint64_t>size > out.inline_limit:
            raise ValueError(f"size {size} is over the ring's inline limit {out.inline_limit}")
        samples = <int64_t*>malloc(max(n, 1) * sizeof(int64_t))
        msg = <char*>malloc(max(size, 1))
        if samples == NULL or msg == NULL:
            raise MemoryError()
        memset(msg, 0x5A, size)
        deadline = rl_now_ns() + <int64_t>(timeout * 1e9)
        t0 = 0
        while i < total:
            with nogil:
                while i < total:
                    if writing:
                        t0 = rl_now_ns()
                        st = rl_ring_write(out, msg, size, deadline)
                        if st != RL_OK:
                            break
                        writing = False
                    st = rl_ring_peek(inn, deadline, &payload, &got, &kind)
                    if st != RL_OK:
                        break
                    rl_ring_release(inn)
                    if i >= warmup:
                        samples[i - warmup] = rl_now_ns() - t0
                    writing = True
                    i += 1
            if st == RL_AGAIN or st == RL_INTERRUPTED:
                PyErr_CheckSignals()        # Ctrl-C ends a stuck benchmark
                (out if writing else inn).resume = 1
                continue
            _check(st, "in ping")
        return [samples[j] for j in range(n)]
    finally:
        free(samples)
        free(msg)
        for r in opened:
            r.close()


def echo(ring_in, ring_out, Py_ssize_t n, double timeout=60.0):
    cdef list opened = []
    cdef ShmRing out_ring, in_ring
    cdef RingEnd* out
    cdef RingEnd* inn
    cdef const char* payload
    cdef char* slot
    cdef uint64_t got = 0
    cdef uint32_t kind
    cdef int64_t deadline
    cdef Py_ssize_t i = 0
    cdef int st = RL_OK
    cdef bint have = False
    try:
        in_ring = _open(ring_in, "consumer", opened)
        out_ring = _open(ring_out, "producer", opened)
        inn = &in_ring.end
        out = &out_ring.end
        deadline = rl_now_ns() + <int64_t>(timeout * 1e9)
        while i < n:
            with nogil:
                while i < n:
                    if not have:
                        st = rl_ring_peek(inn, deadline, &payload, &got, &kind)
                        if st != RL_OK:
                            break
                        have = True
                    st = rl_ring_reserve(out, got, deadline, &slot)
                    if st != RL_OK:
                        break
                    memcpy(slot, payload, got)
                    rl_ring_publish(out, KIND_BYTES, got)
                    rl_ring_release(inn)
                    have = False
                    i += 1
            if st == RL_AGAIN or st == RL_INTERRUPTED:
                PyErr_CheckSignals()
                (out if have else inn).resume = 1
                continue
            _check(st, "in echo")
    finally:
        for r in opened:
            r.close()


def c_round_trips(Py_ssize_t n, Py_ssize_t warmup=1000, Py_ssize_t size=8, double timeout=60.0):
    # The child imports this very ray_lite (python_argv), not one in the
    # current directory.
    from ray_lite._private.process.boot import python_argv
    with ShmRing.create(side="producer") as out_ring, ShmRing.create(side="consumer") as in_ring:
        child = subprocess.Popen(
            python_argv("from ray_lite.bench._ringbench_c import echo; "
                        "echo(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))",
                        "ring benchmark's echo process")
            + [out_ring.name, in_ring.name, str(warmup + n), str(timeout)])
        try:
            samples = ping(out_ring, in_ring, n, warmup, size, timeout)
            child.wait(timeout)
            if child.returncode != 0:
                raise RuntimeError(f"the echo process failed (exit status {child.returncode})")
            return samples
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
