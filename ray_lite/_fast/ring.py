"""Single-producer/single-consumer ring of messages over shared memory
(compiled twin ``_ring_c``, fallback ``_ring_py``).  See ``_ring_py`` for the
full API, the segment layout and the waiting protocol, which both twins share
byte for byte (a compiled end talks to a pure-Python end).

In short::

    ring = ShmRing.create(capacity=1 << 20, side="consumer")   # this process reads
    other = ShmRing.attach(ring.name, side="producer")        # in the other process
    other.put(obj); other.put_bytes(b"raw")                   # producer
    ring.get(timeout=None); ring.get_nowait(); ring.poll()    # consumer
    ring.close()                                              # wakes the other end

Waiting on one ring blocks the calling thread (spin, yield, futex sleep; the
GIL is released).  Two helpers, here because they work on either twin, wait
on something else than one ring from one thread:

``wait_any(rings, timeout=None) -> list``
    Block until at least one of ``rings`` (consumer ends) is *ready*, i.e. its
    ``get_nowait()`` would not raise ``RingEmpty``: a message is waiting, or
    the ring is closed (at either end) or its peer died, which ``get_nowait``
    then reports.  Returns the ready rings in the order given, or ``[]`` when
    the timeout expires.  It spins briefly over all of them, then arms their
    descriptors and sleeps in ``poll(2)`` (with the peers' pidfds, so a dead
    peer wakes it too): one thread can sleep on many rings at ~0 CPU.
``spin_any(rings, timeout) -> list``
    The same question without ever sleeping: it polls the rings (and yields
    the CPU every few microseconds) for at most ``timeout`` seconds, and
    gives up early when its CPU went to another thread for long.  For an
    event loop that expects its next message within microseconds and has
    nothing else to do: a sleeper is woken in tens of microseconds on a VM,
    and its peers pay a descriptor write for the wake-up.
``hold_wakes(schedule)``, ``release_wakes()``
    Wake-ups held back to the end of an event loop's turn (see ``_ring_py``):
    an HTTP proxy's requests of one turn reach a replica with one wake-up.
``async get_async(ring, timeout=None)``
    ``ring.get()`` for asyncio: a message already there is returned without
    touching the event loop; otherwise the ring's descriptor is armed and
    awaited with ``loop.add_reader`` (never a thread, never a spin).  Raises
    like ``get``: ``TimeoutError``, ``ChannelClosedError``, ``PeerDiedError``.

A ring has one consumer thread (or task) at a time: these helpers follow the
same rule (one waiter per ring).  For a long-lived asyncio consumer that reads
many messages, registering ``ring.fileno()`` once with ``loop.add_reader``
(arm, drain with ``get_nowait`` until ``RingEmpty``, ``clear_fd``) saves the
two ``epoll_ctl`` calls ``get_async`` makes per wait.
"""
import os
import select
import time

from ray_lite._lazy import lazy_module

from ._select import load_twin
from .errors import ChannelClosedError, MessageTooLargeError, PeerDiedError, RingEmpty
from .wait_policy import (MULTI_SPIN_NS, SLICE_NS, SLICE_WEAK_NS, SPIN_POLL_PREEMPTED_NS,
                          SPIN_POLL_YIELD_NS, ns_to_s)

asyncio = lazy_module("asyncio", globals())

_impl, COMPILED = load_twin("ring")

ShmRing = _impl.ShmRing
hold_wakes = _impl.hold_wakes
release_wakes = _impl.release_wakes

# The numbers of ``wait_policy``, in seconds.
#: How long ``wait_any`` polls its rings before it arms their descriptors and sleeps.
WAIT_ANY_SPIN_S = ns_to_s(MULTI_SPIN_NS)
#: Sleeps end at least this often to look for dead peers not yet known by pidfd.
SLICE_S = ns_to_s(SLICE_NS)
# An end that cannot fence (the pure-Python twin) may lose a wake-up: sleeps
# on its descriptors end this often.
_WEAK_SLICE_S = None if COMPILED else ns_to_s(SLICE_WEAK_NS)
#: ``spin_any`` hands the CPU to whatever else is runnable on it this often,
#: and gives up when a round took this long: something else ran meanwhile,
#: for longer than the brief turns of the peers it waits for.
SPIN_ANY_YIELD_S = ns_to_s(SPIN_POLL_YIELD_NS)
SPIN_ANY_PREEMPTED_S = ns_to_s(SPIN_POLL_PREEMPTED_NS)

__all__ = ["COMPILED", "ShmRing", "RingEmpty", "ChannelClosedError", "MessageTooLargeError",
           "PeerDiedError", "wait_any", "wait_rings_or_fds", "spin_any", "get_async",
           "hold_wakes", "release_wakes"]


def _ready(rings):
    return [r for r in rings if r.poll()]


def wait_any(rings, timeout=None):
    """Wait until at least one consumer ring in ``rings`` is ready; return the ready ones.

    See the module docstring.  ``timeout`` in seconds (None: no limit);
    returns ``[]`` when it expires.
    """
    rings = list(rings)
    if not rings:
        raise ValueError("wait_any needs at least one ring")
    ready = _ready(rings)
    if ready or timeout is not None and timeout <= 0:
        return ready
    deadline = None if timeout is None else time.monotonic() + timeout
    spin_s = WAIT_ANY_SPIN_S
    peers = {}              # the peers' pidfds -> their ring
    watched = set()
    while True:
        for r in rings:
            if id(r) not in watched:
                pfd = r.peer_fd()
                if pfd >= 0:
                    peers[pfd] = r
                    watched.add(id(r))
        wait_s = SLICE_S
        if deadline is not None:
            wait_s = max(0.0, min(SLICE_S, deadline - time.monotonic()))
        fired = wait_rings_or_fds(rings, list(peers), wait_s, spin_s)
        spin_s = 0.0        # spun once; from now on a wake-up is worth a sleep
        for pfd in fired:
            peers[pfd].peer_alive()     # marks the peer dead: poll() is now true
        ready = _ready(rings)
        if ready:
            return ready
        if not fired:
            for r in rings:             # peers still unknown by pidfd, and pidfd-less systems
                if not r.closed:
                    r.peer_alive()
            ready = _ready(rings)
            if ready:
                return ready
        if deadline is not None and time.monotonic() >= deadline:
            return []


def wait_rings_or_fds(rings, fds=(), timeout=None, spin_s=WAIT_ANY_SPIN_S, yield_s=0.0):
    """One wait on consumer ``rings`` and other descriptors ``fds`` (process
    sentinels, say); the waiting policy shared by every waiter on several rings.

    Polls the rings for ``spin_s`` seconds, then yields the CPU until
    ``yield_s`` (a peer on this CPU gets to answer), then arms the rings'
    descriptors and sleeps once in ``poll(2)`` on them and on ``fds``, for at
    most ``timeout`` seconds (None: no limit; an end that cannot fence, at
    most ``SLICE_WEAK_NS``: it may lose a wake-up).  Returns those of ``fds``
    that fired (``[]`` when a ring became ready or the time ran out): the
    caller reads its rings either way.  A ring closed under the wait ends it.
    """
    release_wakes()     # what we wait for may need one (hold_wakes)
    polls = [r.poll for r in rings]
    if timeout is not None:
        spin_s = min(spin_s, timeout)
        yield_s = min(yield_s, timeout)
    try:
        now = time.monotonic()
        spin_end = now + spin_s
        yield_end = now + yield_s
        while True:
            for poll in polls:
                if poll():
                    return []
            if now >= spin_end:
                if now >= yield_end:
                    break
                os.sched_yield()
            now = time.monotonic()
        if _WEAK_SLICE_S is not None and (timeout is None or timeout > _WEAK_SLICE_S):
            timeout = _WEAK_SLICE_S
        poller = select.poll()
        armed = []
        try:
            for r in rings:
                if not r.arm_fd():
                    return []           # a message came: no sleep
                armed.append(r)
                poller.register(r.fileno(), select.POLLIN)
            for fd in fds:
                poller.register(fd, select.POLLIN)
            ms = None if timeout is None else max(0, int(timeout * 1000 + 0.999))
            if fds:
                wanted = set(fds)
                return [fd for fd, _ in poller.poll(ms) if fd in wanted]
            poller.poll(ms)
            return []
        finally:
            for r in armed:
                r.clear_fd()
    except (ValueError, OSError):
        return []                       # a ring closed under us: reading it will tell


def spin_any(rings, timeout):
    """Poll ``rings`` (consumer ends) for at most ``timeout`` seconds, never
    sleeping; return the ready ones, or ``[]`` when the time ran out."""
    rings = list(rings)
    if not rings:
        raise ValueError("spin_any needs at least one ring")
    if len(rings) == 1:
        return rings if rings[0].spin_poll(timeout) else []
    release_wakes()
    polls = [r.poll for r in rings]
    now = time.monotonic()
    deadline = now + min(timeout, 1.0) if timeout > 0 else now
    next_yield = now + SPIN_ANY_YIELD_S
    while True:
        for poll in polls:
            if poll():
                return _ready(rings)
        before, now = now, time.monotonic()
        if now >= deadline or now - before > SPIN_ANY_PREEMPTED_S:
            # Out of time, or this CPU went to another thread for long: it
            # is wanted, so stop spinning (the caller sleeps instead).
            return []
        if now >= next_yield:
            os.sched_yield()
            next_yield = now + SPIN_ANY_YIELD_S


async def get_async(ring, timeout=None):
    """``ring.get(timeout)`` for asyncio, waiting through ``loop.add_reader``."""
    if ring.poll():
        return ring.get_nowait()
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    fd = ring.fileno()
    while True:
        if ring.arm_fd():
            waiter = loop.create_future()

            def wake():
                if not waiter.done():
                    waiter.set_result(None)

            pfd = ring.peer_fd()
            delay = SLICE_S if deadline is None else min(SLICE_S, deadline - loop.time())
            loop.add_reader(fd, wake)
            if pfd >= 0:
                loop.add_reader(pfd, wake)
            timer = loop.call_later(max(delay, 0.0), wake)
            try:
                await waiter
            finally:
                timer.cancel()
                loop.remove_reader(fd)
                if pfd >= 0:
                    loop.remove_reader(pfd)
                ring.clear_fd()
        if ring.poll():
            return ring.get_nowait()
        ring.peer_alive()               # a dead peer makes poll() true on the next turn
        if ring.poll():
            return ring.get_nowait()
        if deadline is not None and loop.time() >= deadline:
            raise TimeoutError(f"ring {ring.name}: timed out")
