"""Single-producer/single-consumer message ring over shared memory: the
pure-Python twin, and the specification both twins implement byte for byte.

Public names (identical in ``_ring_c``)
=======================================

``ShmRing.create(capacity=1 << 20, *, side, prefix=None, max_message_size=DEFAULT_MAX_MESSAGE_SIZE)``
    Create a ring and claim ``side`` (``"producer"`` or ``"consumer"``: which
    end *this* process is).  ``capacity`` is the data area in bytes, a power
    of two between ``MIN_CAPACITY`` and ``MAX_CAPACITY``.  ``prefix`` is the
    segment-name prefix (``shm.DEFAULT_PREFIX`` when None).
``ShmRing.attach(name, *, side)``
    Map the ring ``name`` and claim the other ``side``.  Raises
    ``FileNotFoundError`` (no such segment), ``ValueError`` (not a ring, wrong
    version, side already claimed), ``ChannelClosedError`` (the creator has
    already closed).  The peer must attach before the creator closes: closing
    unlinks the names.
``ring.name``, ``ring.side``, ``ring.capacity``, ``ring.max_message_size``,
``ring.closed``, ``ring.peer_pid`` (0 until the other end attached)
``ring.put(obj, timeout=None)``
    Producer: encode ``obj`` with the codec straight into the ring.
``ring.readonly_arrays``
    Producer, settable, False at first: numpy arrays put decode read-only
    (``_arrays``; the core's links set it, as Ray's arrays are).
``ring.put_bytes(data, timeout=None)``
    Producer: send a raw bytes-like message.
``ring.get(timeout=None)``
    Consumer: the next message: the decoded value, or ``bytes`` for a
    ``put_bytes`` message.
``ring.get_nowait()``
    Consumer: the same without waiting; ``RingEmpty`` when there is nothing.
``ring.poll() -> bool``
    Consumer: ``get_nowait()`` would not raise ``RingEmpty`` (a message is
    waiting, or the channel is closed or its peer dead, which ``get`` reports).
    No system call.
``ring.fileno()``, ``ring.arm_fd() -> bool``, ``ring.clear_fd()``
    Consumer: a file descriptor for event loops and ``select``.  ``arm_fd()``
    asks the producer to make ``fileno()`` readable at its next message (or
    close); it returns False, without arming, when ``poll()`` is already true
    (do not sleep then).  After the descriptor fired (or the wait ended for
    another reason) call ``clear_fd()``, which disarms and drains it.  A
    readable descriptor means "a message *may* be waiting": always re-check.
``ring.peer_fd() -> int``
    A pidfd of the peer process (readable once the peer exits), -1 while the
    peer is unknown or pidfds are unsupported.  For event loops that want to
    notice a dead peer at once instead of at the next time slice.
``ring.peer_alive() -> bool``
    Check (one system call) whether the peer still runs; a peer found dead is
    remembered, and ``get`` then raises ``PeerDiedError`` once the ring is
    drained (``put`` at once).
``ring.close()``
    Idempotent.  Wakes the other end (and threads of this process blocked on
    this end) with ``ChannelClosedError``; unlinks the names.
``hold_wakes(schedule)``, ``release_wakes()`` (module functions)
    Wake-ups held back to the end of an event loop's turn.  After
    ``hold_wakes(schedule)``, a message that the calling thread puts into any
    ring does not wake a sleeping consumer at once: the ring owes it a
    wake-up, and ``release_wakes()`` gives every owed one (from any thread).
    ``schedule()`` is called once per release to come, at the first owed
    wake-up after the last release; an event loop passes
    ``lambda: loop.call_soon(release_wakes)``, so that the messages of one
    turn reach a consumer with one wake-up, after the turn, instead of one
    each, amid it.  Nothing waits on a held wake-up: a wait in this process
    (a ``get`` that must wait, a full ring's ``put``, ``spin_poll`` and the
    helpers of ``ring.py``) releases them first, a ``schedule`` that raises
    releases at once, and ``hold_wakes(None)`` stops holding and releases.
    One thread holds at a time (another's ``hold_wakes`` raises
    ``RuntimeError``); puts from other threads wake as usual.

Timeouts are in seconds; None waits forever, 0 does not wait.  An expired
timeout raises the builtin ``TimeoutError``.  A full ring makes ``put`` wait;
a peer that closed raises ``ChannelClosedError`` (the consumer first drains
what was sent); a peer process that died raises ``PeerDiedError`` (noticed
while waiting, within one sleep slice; the consumer drains first).  Values
nothing can serialise raise the codec's ``SerializationError`` and leave the
ring untouched; a message over ``max_message_size`` raises
``MessageTooLargeError`` before anything is sent.  Messages above the inline
limit (capacity/4) and codec out-of-band buffers travel in side segments (see
below); the consumer gets numpy arrays and large buffers without a copy.

Threads: one operation (``put*``/``get*``) at a time per end; a second thread
entering one while another runs gets ``RuntimeError``.  ``close()`` may come
from any thread: it wakes the blocked one (``ChannelClosedError``), and the
end's resources go when the last running operation leaves (descriptors; the
compiled twin also unmaps then, this twin leaves the mapping to the garbage
collector).  An end dropped without ``close()`` is closed by its finaliser.
A ``ShmRing`` object is not shared across ``fork()``: the other process
attaches by name.  A message with a side segment whose producer was killed
may be lost once ``shm.cleanup_stale_segments`` removed that segment (its
``get`` raises ``DecodeError``).

Segment layout (version 1)
==========================

All integers little-endian.  Positions are byte counts since creation, never
reduced: ``pos & (capacity - 1)`` is the offset in the data area, and
``write_pos - read_pos`` the bytes in use.  The header is four 128-byte lines
so that what the producer writes, what the consumer writes and what sleepers
write never share a cache line (128 bytes: the adjacent-line prefetcher pulls
lines in pairs)::

    line 0: identity and life cycle (written at create, claim and close only)
      0  u64 magic  b"rlring\\0\\0"
      8  u32 version (1)
     12  u32 header size (512) = offset of the data area
     16  u64 capacity (data bytes, power of two)
     24  u64 max_message_size
     32  u64 inline_limit (largest payload stored in the ring itself)
     40  i64 producer pid (0: not claimed yet)
     48  i64 consumer pid
     56  u32 length of the name prefix (a side segment gets the same prefix)
     60  u32 flags: bit 0 = a pure-Python end is attached (see "Ordering")
     64  u32 producer closed
     68  u32 consumer closed
    line 1 (producer's):   128 u64 write_pos
                           136 u32 CPU of the producer's last publish, plus 1 (0: unknown)
    line 2 (consumer's):   256 u64 read_pos
                           264 u32 CPU of the consumer's last release, plus 1
    line 3 (sleepers'):    384 u32 consumer sleeping  (futex word)
                           388 u32 fd armed
                           392 u32 producer sleeping  (futex word)
    512: data area, ``capacity`` bytes

A record starts at an 8-byte aligned offset with an 8-byte header, ``u32
length`` (payload bytes) then ``u32 kind``, and occupies ``8 + align8(length)``
bytes.  Records never straddle the end of the data area: a message that does
not fit before the end is preceded by a ``WRAP`` record (length 0) whose meaning
is "continue at offset 0"; the WRAP and the message after it are published by
one store of ``write_pos``.  Kinds:

``1 WRAP``; ``2 BYTES`` (payload = the message); ``3 VALUE`` (payload = one
codec frame, no out-of-band buffers); ``4 SIDE_BYTES`` (message is side entry
0); ``5 SIDE_VALUE`` (frame inline, its out-of-band buffers are the side
entries); ``6 SIDE_FRAME`` (frame is side entry 0, out-of-band buffers follow).

Payloads above ``inline_limit`` (capacity/4), and every message with codec
out-of-band buffers, use a *side segment*: a separate segment, created by the
producer with the ring's prefix.  Its record's payload is
``[inline frame][zero pad to 8][ref][u64 inline frame length]`` where ``ref``
is ``u64 segment size, u32 name length, u32 0, name (ASCII, zero-padded to
8)``.  The side segment holds ``u32 entry count, u32 0``, then ``(u64 offset,
u64 length)`` per entry, then the entries at 64-byte aligned offsets.  The
consumer maps the side segment, unlinks its name at once and decodes over
memoryviews of the mapping: zero-copy, the mapping lives as long as the
decoded objects refer to it.  Side segments of messages never read are
unlinked by whichever end closes last (or finds its peer dead); those of a
killed producer by ``shm.cleanup_stale_segments`` (its pid is in their names).

Protocol
========

Producer: waits until ``capacity - (write_pos - read_pos)`` can hold the
record (plus the WRAP's tail when wrapping), writes payload and header(s), then
publishes with a *release* store of ``write_pos``.  Consumer: an *acquire* load
of ``write_pos``; reads the record; then a *release* store of ``read_pos``.
Each end keeps its own position locally and caches the peer's, reloading it
only when the cache says "empty"/"full", so an active pair touches the other
end's line once per batch.

Waiting (either end): spin a few microseconds (``RING_SPIN_NS``), ``sched_yield``
a few times (``RING_YIELDS``), then sleep on the futex word of its side.  The spin
is skipped when the peer's last action on this ring (publish, release) was on
the CPU this end runs on now: the peer is then not running (we are), and
every microsecond spent spinning is one it cannot use (with both ends on one
core, a fixed 20 µs spin made round trips 15 times slower; ``sched_yield``
hands the CPU over at once).  To sleep: set the futex word to 1, *full
fence*, re-check the condition, ``FUTEX_WAIT(word, 1, slice)``.  The
other end, after each publish (or release of space), issues a *full fence*,
loads the word and only when it is 1 swaps it to 0 and calls ``FUTEX_WAKE``:
the store/fence/load on both sides is a Dekker handshake, so one of them
always sees the other.  An active pair makes no system call; an idle waiter
sleeps.  Sleeps last at most one slice, after which the waiter checks that
its peer still lives (pidfd, else ``kill(pid, 0)`` plus a zombie check),
signals (Ctrl-C) and its deadline.

The descriptor: a FIFO ``<name>.fifo`` (mode 0600) beside the segment, which
both ends open ``O_RDWR | O_NONBLOCK`` (so opening never blocks and writes
never fail with EPIPE).  ``arm_fd`` is the consumer's sleeping flag for event
loops: it sets "fd armed", full fence, re-checks; the producer, after the same
fence as above, swaps "fd armed" to 0 and when it was 1 writes one byte.

Close: set this end's "closed" word, full fence, wake both futex words and the
FIFO.  Each waiter's condition includes both "closed" words.  The consumer
reads "producer closed" *before* ``write_pos`` so that it drains everything
published before the close.

Ordering
========

The compiled twin uses C11-model atomics (GCC ``__atomic`` builtins): release
on publish, acquire on read, sequentially consistent fences for the
handshakes.  Python has no fences: this twin relies on aligned 8-byte loads
and stores being single instructions (true of memoryview item access on
x86-64 and aarch64) and on x86 TSO for release/acquire.  The store-then-load
of the sleeping handshake can still be reordered by a store buffer, so a
wake-up can be lost, but only when the other end publishes while the
sleeper's flag store may still be in flight: this twin's first sleep after
setting its flag lasts at most ``SLICE_WEAK_NS`` (2 ms), later ones (the flag
stayed set, so it is visible) up to ``SLICE_NS``.  It sets header flag
bit 0 so that a compiled peer sleeps in 2 ms slices too (its own stores are
fenced, but a pure-Python waker's load may pass its store).  A lost wake-up
costs latency, never a hang.
"""
import ctypes
import fcntl
import mmap
import operator
import os
import threading
import time

from . import _codec_py as _codec
from . import shm
from ._wait_py import futex_wait, futex_wake, open_pidfd, process_alive, sched_getcpu
from .errors import (
    RL_CLOSED,
    RL_PEER_DIED,
    RL_TIMEOUT,
    BufferTooSmallError,
    ChannelClosedError,
    DecodeError,
    MessageTooLargeError,
    PeerDiedError,
    RingEmpty,
    channel_error,
)
from .wait_policy import (
    RING_SPIN_NS,
    RING_YIELDS,
    SLICE_NS,
    SLICE_WEAK_NS,
    SPIN_POLL_PREEMPTED_NS,
    SPIN_POLL_YIELD_NS,
)

__all__ = [
    "ShmRing", "DEFAULT_CAPACITY", "DEFAULT_MAX_MESSAGE_SIZE", "MIN_CAPACITY", "MAX_CAPACITY",
    "RingEmpty", "ChannelClosedError", "MessageTooLargeError", "PeerDiedError",
    "hold_wakes", "release_wakes",
]

# ---------------------------------------------------------------- layout ---
MAGIC = int.from_bytes(b"rlring\0\0", "little")
VERSION = 1
HEADER_SIZE = 512

H_MAGIC = 0
H_VERSION = 8
H_HEADER_SIZE = 12
H_CAPACITY = 16
H_MAX_MESSAGE = 24
H_INLINE_LIMIT = 32
H_PRODUCER_PID = 40
H_CONSUMER_PID = 48
H_PREFIX_LEN = 56
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

DEFAULT_CAPACITY = 1 << 20
MIN_CAPACITY = 1 << 10      # an inline side reference (<= 232 bytes) must fit in capacity/4
MAX_CAPACITY = 1 << 32
DEFAULT_MAX_MESSAGE_SIZE = 1 << 31
SIDE_ALIGN = 64             # entries of a side segment: cache-line (and SIMD) aligned
FIFO_SUFFIX = ".fifo"
# A producer that finds the ring empty with its write offset at or past this
# many bytes starts its record at the beginning of the area (after a WRAP):
# a ring whose consumer keeps up then touches only its first pages, instead
# of every page of the area lap after lap.  With a proxy linked to 48
# replicas by 2 x 1 MB rings each, the laps grew its resident memory by up
# to ~100 MB of shared pages, and each lap walked the caches and the TLB
# through a megabyte per ring.
HOT_BYTES = 1 << 16


_U64 = (1 << 64) - 1


def _align8(n):
    return (n + 7) & ~7


def _align(n, a):
    return (n + a - 1) & ~(a - 1)


def oob_threshold(inline_limit):
    """From how many bytes a buffer in a message (a numpy array's data)
    leaves the ring for a side segment: half the ring's inline limit, and
    never below the codec's ``OOB_THRESHOLD``.  A side segment costs its
    creation, mapping, page faults and unlink on both ends, whatever its
    size: a 64 KiB array took 89 us through one against 13 us copied in and
    out of the ring (2-core Xeon VM, 2026-12-05), and copies stay cheaper up
    to the sizes a ring holds inline.  (A 64-sequence step's logits of a
    256-token vocabulary are 64 KiB.)"""
    return max(_codec.OOB_THRESHOLD, inline_limit // 2)


# --------------------------------------------------------- side segments ---
def _side_ref_size(name_len):
    return 16 + _align8(name_len)


def _write_side_segment(name, pieces):
    """Create the side segment ``name`` holding ``pieces`` (1-D byte memoryviews); return its size."""
    n = len(pieces)
    offset = _align(8 + 16 * n, SIDE_ALIGN)
    table = []
    for p in pieces:
        table.append((offset, p.nbytes))
        offset = _align(offset + p.nbytes, SIDE_ALIGN)
    size = max(offset, 8)
    name, mm = shm.create_segment(size, name=name)
    try:
        mm[0:8] = n.to_bytes(4, "little") + b"\0\0\0\0"
        for i, ((off, length), p) in enumerate(zip(table, pieces)):
            mm[8 + 16 * i:24 + 16 * i] = off.to_bytes(8, "little") + length.to_bytes(8, "little")
            mm[off:off + length] = p
    except BaseException:
        shm.unlink_segment(name)
        raise
    finally:
        mm.close()
    return size


def _map_side_segment(name, size):
    """Map a side segment, unlink its name, return memoryviews of its entries."""
    try:
        fd = os.open(shm.segment_path(name), os.O_RDWR | os.O_CLOEXEC)
    except ValueError:
        raise DecodeError(f"ring record names an invalid side segment {name!r}") from None
    except FileNotFoundError:
        raise DecodeError(f"side segment {name!r} of a ring message is gone") from None
    try:
        shm.unlink_segment(name)
        if os.fstat(fd).st_size < size or size < 8:
            raise DecodeError(f"side segment {name!r} is truncated")
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    mv = memoryview(mm)
    n = int.from_bytes(mv[0:4], "little")
    if 8 + 16 * n > size:
        raise DecodeError(f"side segment {name!r} has a corrupt entry table")
    entries = []
    for i in range(n):
        off = int.from_bytes(mv[8 + 16 * i:16 + 16 * i], "little")
        length = int.from_bytes(mv[16 + 16 * i:24 + 16 * i], "little")
        if off + length > size:
            raise DecodeError(f"side segment {name!r} has a corrupt entry table")
        # Views keep the mapping alive for as long as decoded objects use them.
        entries.append(mv[off:off + length])
    return entries


def _unlink_fifo(name):
    try:
        os.unlink(shm.segment_path(name + FIFO_SUFFIX))
    except FileNotFoundError:
        pass


def _check_side(side):
    if side not in ("producer", "consumer"):
        raise ValueError(f"side must be 'producer' or 'consumer', got {side!r}")
    return side == "producer"


def _deadline(timeout):
    if timeout is None:
        return None
    return time.monotonic_ns() + max(0, int(timeout * 1e9))


# ------------------------------------------- creation and attachment ---
# Cold paths, shared by both twins (the compiled one imports them) so that the
# header is written and validated by one piece of code.

def _create_segment(capacity, side, prefix, max_message_size, weak):
    """Create and initialise a ring segment and its FIFO, claim ``side``; return ``(name, mmap)``."""
    is_producer = _check_side(side)
    capacity = operator.index(capacity)
    if capacity < MIN_CAPACITY or capacity > MAX_CAPACITY or capacity & (capacity - 1):
        raise ValueError(f"capacity must be a power of two in [{MIN_CAPACITY}, {MAX_CAPACITY}], "
                         f"got {capacity}")
    max_message_size = operator.index(max_message_size)
    if max_message_size < 0 or max_message_size > _U64:
        raise ValueError(f"invalid max_message_size {max_message_size}")
    prefix = shm.DEFAULT_PREFIX if prefix is None else prefix
    name, mm = shm.create_segment(HEADER_SIZE + capacity, prefix)
    try:
        os.mkfifo(shm.segment_path(name + FIFO_SUFFIX), 0o600)
        with memoryview(mm) as h, h[:HEADER_SIZE].cast("Q") as h64, \
                h[:HEADER_SIZE].cast("I") as h32:
            h32[H_VERSION // 4] = VERSION
            h32[H_HEADER_SIZE // 4] = HEADER_SIZE
            h64[H_CAPACITY // 8] = capacity
            h64[H_MAX_MESSAGE // 8] = max_message_size
            h64[H_INLINE_LIMIT // 8] = min(capacity // 4, 0xFFFFFFF8)
            h32[H_PREFIX_LEN // 4] = len(prefix)
            h32[H_FLAGS // 4] = FLAG_WEAK_ORDERING if weak else 0
            h64[(H_PRODUCER_PID if is_producer else H_CONSUMER_PID) // 8] = os.getpid()
            # The magic last: an attacher that sees it sees an initialised header.
            h64[H_MAGIC // 8] = MAGIC
    except BaseException:
        mm.close()
        shm.unlink_segment(name)
        _unlink_fifo(name)
        raise
    return name, mm


def _attach_segment(name, side, weak):
    """Map the ring ``name``, check its header and claim ``side``; return the mmap."""
    is_producer = _check_side(side)
    path = shm.segment_path(name)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        raise FileNotFoundError(f"ring {name!r} does not exist (or was closed)") from None
    mm = None
    try:
        size = os.fstat(fd).st_size
        if size < HEADER_SIZE + MIN_CAPACITY:
            raise ValueError(f"segment {name!r} is not a ray_lite ring (too small)")
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        with memoryview(mm) as h, h[:HEADER_SIZE].cast("Q") as h64, \
                h[:HEADER_SIZE].cast("I") as h32:
            if h64[H_MAGIC // 8] != MAGIC:
                raise ValueError(f"segment {name!r} is not a ray_lite ring (bad magic)")
            if h32[H_VERSION // 4] != VERSION:
                raise ValueError(f"ring {name!r} has layout version {h32[H_VERSION // 4]}, "
                                 f"this ray_lite speaks {VERSION}")
            capacity = h64[H_CAPACITY // 8]
            if (h32[H_HEADER_SIZE // 4] != HEADER_SIZE or capacity < MIN_CAPACITY
                    or capacity > MAX_CAPACITY or capacity & (capacity - 1)
                    or size < HEADER_SIZE + capacity
                    or h64[H_INLINE_LIMIT // 8] != min(capacity // 4, 0xFFFFFFF8)
                    or h32[H_PREFIX_LEN // 4] > len(name)):
                raise ValueError(f"ring {name!r} has a corrupt header")
            # Claims are rare; a lock on the file makes two simultaneous
            # claims of one side fail cleanly, in both twins.
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                pid_word = (H_PRODUCER_PID if is_producer else H_CONSUMER_PID) // 8
                holder = h64[pid_word]
                if holder:
                    raise ValueError(f"the {side} end of ring {name!r} is already claimed "
                                     f"by pid {holder}")
                if h32[H_PRODUCER_CLOSED // 4] or h32[H_CONSUMER_CLOSED // 4]:
                    raise ChannelClosedError(f"ring {name!r} is already closed")
                if weak:
                    h32[H_FLAGS // 4] = h32[H_FLAGS // 4] | FLAG_WEAK_ORDERING
                h64[pid_word] = os.getpid()
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
    except BaseException:
        if mm is not None:
            mm.close()
        raise
    finally:
        os.close(fd)
    return mm


def _open_fifo(name):
    try:
        return os.open(shm.segment_path(name + FIFO_SUFFIX), os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise FileNotFoundError(f"the descriptor FIFO of ring {name!r} is gone "
                                f"(the ring was closed)") from None


# ------------------------------------------------------- held wake-ups ---
_get_ident = threading.get_ident
_held_by = None             # the thread whose puts owe their wake-ups (hold_wakes)
_schedule = None            # its schedule(): arranges a release_wakes() soon
_owed = []                  # the rings that owe their consumer a wake-up
_release_scheduled = False  # and has not run yet


def hold_wakes(schedule):
    """See the module docstring; ``None`` stops holding (and releases)."""
    global _held_by, _schedule
    if schedule is None:
        _held_by = _schedule = None
        release_wakes()
        return
    me = _get_ident()
    if _held_by is not None and _held_by != me:
        raise RuntimeError("wake-ups are already held by another thread")
    _schedule = schedule
    _held_by = me


def release_wakes():
    """Give every wake-up owed since the last release (see ``hold_wakes``)."""
    global _release_scheduled
    _release_scheduled = False
    while _owed:
        _owed.pop()._give_owed_wake()


def _schedule_release():
    global _release_scheduled
    _release_scheduled = True
    try:
        _schedule()
    except Exception:
        release_wakes()     # (a closed loop, say): nothing else would give them


# ----------------------------------------------------------------- ring ---
class ShmRing:
    """One end of a shared-memory SPSC message ring (see the module docstring)."""

    __slots__ = (
        "_name", "_side", "_is_producer", "_capacity", "_mask", "_inline_limit", "_oob_threshold",
        "_max_message",
        "_prefix", "_mm", "_mv", "_h64", "_h32", "_data", "_d64", "_addr_anchor", "_base_addr",
        "_fifo_fd", "_pos", "_cache", "_pending_hdr", "_pending_skip", "_closed", "_in_op",
        "_closing", "_released", "_lock", "_peer_pid", "_peer_pidfd", "_peer_dead", "_my_pid",
        "readonly_arrays", "_wake_owed", "__weakref__",
    )

    def __init__(self, *args, **kwargs):
        raise TypeError("use ShmRing.create() or ShmRing.attach()")

    # -- construction ---------------------------------------------------
    @classmethod
    def create(cls, capacity=DEFAULT_CAPACITY, *, side, prefix=None,
               max_message_size=DEFAULT_MAX_MESSAGE_SIZE):
        name, mm = _create_segment(capacity, side, prefix, max_message_size, weak=True)
        try:
            return cls._from_mapping(name, side, mm)
        except BaseException:
            mm.close()
            shm.unlink_segment(name)
            _unlink_fifo(name)
            raise

    @classmethod
    def attach(cls, name, *, side):
        mm = _attach_segment(name, side, weak=True)
        try:
            return cls._from_mapping(name, side, mm)
        except BaseException:
            mm.close()
            raise

    @classmethod
    def _from_mapping(cls, name, side, mm):
        self = cls.__new__(cls)
        self._name = name
        self._side = side
        self._is_producer = side == "producer"
        self._mm = mm
        self._mv = mv = memoryview(mm)
        self._h64 = h64 = mv[:HEADER_SIZE].cast("Q")
        self._h32 = h32 = mv[:HEADER_SIZE].cast("I")
        self._capacity = cap = h64[H_CAPACITY // 8]
        self._mask = cap - 1
        self._inline_limit = h64[H_INLINE_LIMIT // 8]
        self._oob_threshold = oob_threshold(self._inline_limit)
        self._max_message = h64[H_MAX_MESSAGE // 8]
        self._prefix = name[:h32[H_PREFIX_LEN // 4]]
        self._data = mv[HEADER_SIZE:HEADER_SIZE + cap]
        self._d64 = self._data.cast("Q")
        self._addr_anchor = ctypes.c_char.from_buffer(mm)
        self._base_addr = ctypes.addressof(self._addr_anchor)
        self._fifo_fd = -1
        self._closed = False
        self._in_op = False
        self._closing = False
        self._released = False
        self.readonly_arrays = False
        self._wake_owed = False
        self._lock = threading.Lock()
        self._pending_hdr = 0
        self._pending_skip = 0
        self._my_pid = os.getpid()
        self._peer_pid = 0
        self._peer_pidfd = -1
        self._peer_dead = False
        if self._is_producer:
            self._pos = h64[H_WRITE_POS // 8]
            self._cache = h64[H_READ_POS // 8]
        else:
            self._pos = h64[H_READ_POS // 8]
            self._cache = h64[H_WRITE_POS // 8]
        try:
            self._fifo_fd = _open_fifo(name)
        except BaseException:
            self._unmap()
            raise
        self._learn_peer()
        return self

    # -- properties --------------------------------------------------------
    @property
    def name(self):
        return self._name

    @property
    def side(self):
        return self._side

    @property
    def capacity(self):
        return self._capacity

    @property
    def max_message_size(self):
        return self._max_message

    @property
    def offset(self):
        """This end's offset in the data area: where its next record goes
        (producer) or the next one to read (consumer)."""
        return self._pos & self._mask

    @property
    def closed(self):
        return self._closed

    @property
    def peer_pid(self):
        if self._closed:
            return self._peer_pid
        return self._learn_peer()

    def __repr__(self):
        state = "closed" if self._closed else "open"
        return f"<ShmRing {self._name} {self._side} capacity={self._capacity} {state}>"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __reduce__(self):
        raise TypeError("a ShmRing cannot be pickled: send its name and attach() in the other process")

    # -- peer ------------------------------------------------------------
    def _learn_peer(self):
        if self._peer_pid == 0 and not self._released:
            pid = self._h64[(H_CONSUMER_PID if self._is_producer else H_PRODUCER_PID) // 8]
            if pid:
                self._peer_pid = pid
                if pid != self._my_pid:
                    self._peer_pidfd = open_pidfd(pid)
        return self._peer_pid

    def peer_fd(self):
        self._check_open()
        self._learn_peer()
        return self._peer_pidfd

    def peer_alive(self):
        if self._peer_dead:
            return False
        if self._closed:
            self._raise_status(RL_CLOSED)
        pid = self._learn_peer()
        if pid == 0 or pid == self._my_pid:
            return True
        if not process_alive(pid, self._peer_pidfd):
            self._peer_dead = True
            return False
        return True

    # -- checks ----------------------------------------------------------
    def _check_open(self):
        if self._closed:
            self._raise_status(RL_CLOSED)

    def _raise_status(self, status):
        raise channel_error(status, f"ring {self._name}", peer="consumer" if self._is_producer else "producer",
                            pid=self._peer_pid, this_end=self._closed)

    def _enter(self, producer):
        """Start an operation: this end must be open and of the right side, and idle.

        One operation at a time per end (it is single-producer,
        single-consumer); ``close()`` from another thread is allowed and takes
        effect when the running operation leaves.
        """
        if self._closed:
            self._raise_status(RL_CLOSED)
        if producer != self._is_producer:
            raise ValueError(f"ring {self._name}: {'put' if producer else 'get'}() is for the "
                             f"{'producer' if producer else 'consumer'} end; this is the {self._side}")
        if self._in_op:
            raise RuntimeError(f"ring {self._name}: one end used by two threads at once")
        if producer:
            self._check_producer()
        self._in_op = True

    def _leave(self):
        self._in_op = False
        if self._closed:
            self._release()

    def _check_producer(self):
        if self._closed:
            self._raise_status(RL_CLOSED)
        if self._h32[H_CONSUMER_CLOSED // 4]:
            self._raise_status(RL_CLOSED)
        if self._peer_dead:
            self._raise_status(RL_PEER_DIED)

    def _check_consumer(self):
        if self._closed:
            self._raise_status(RL_CLOSED)
        if self._is_producer:
            raise ValueError(f"ring {self._name}: this is the producer end; the call is for the consumer")

    # -- waiting ---------------------------------------------------------
    def _wait(self, flag_off, ready, deadline):
        """Wait until ``ready()``; TimeoutError at ``deadline``; sets ``_peer_dead``."""
        if _owed:
            release_wakes()     # what we wait for may need one (hold_wakes)
        t = time.monotonic_ns()
        if deadline is not None and t >= deadline:
            self._raise_status(RL_TIMEOUT)
        h32 = self._h32
        word = flag_off // 4
        addr = self._base_addr + flag_off
        next_peer_check = 0
        spin_end = t + (0 if self._peer_on_my_cpu() else RING_SPIN_NS)
        if deadline is not None and spin_end > deadline:
            spin_end = deadline
        while time.monotonic_ns() < spin_end:
            if ready():
                return
        for _ in range(RING_YIELDS):
            os.sched_yield()
            if ready():
                return
        try:
            while True:
                now = time.monotonic_ns()
                if deadline is not None and now >= deadline:
                    self._raise_status(RL_TIMEOUT)
                if now >= next_peer_check:
                    next_peer_check = now + SLICE_NS
                    if not self.peer_alive():
                        return
                # A wake-up can only be missed while our flag store may still
                # sit in a store buffer: the first slice after (re)setting it
                # is short; a flag nobody cleared through a whole slice is
                # seen by every later publish, so the next slices are long.
                fresh = h32[word] != 1
                h32[word] = 1
                if ready():
                    return
                slice_ns = SLICE_WEAK_NS if fresh else SLICE_NS
                if deadline is not None and deadline - now < slice_ns:
                    slice_ns = max(deadline - now, 1)
                futex_wait(addr, 1, slice_ns)
                if ready():
                    return
        finally:
            h32[word] = 0

    def _peer_on_my_cpu(self):
        """True when the peer last acted on this ring on the CPU we run on."""
        cpu = sched_getcpu() + 1
        return cpu > 0 and self._h32[(H_CONSUMER_CPU if self._is_producer else H_PRODUCER_CPU) // 4] == cpu

    def _wake_consumer(self):
        h32 = self._h32
        if h32[H_CONSUMER_SLEEPING // 4]:
            h32[H_CONSUMER_SLEEPING // 4] = 0
            futex_wake(self._base_addr + H_CONSUMER_SLEEPING)
        if h32[H_FD_ARMED // 4]:
            h32[H_FD_ARMED // 4] = 0
            self._write_fifo()

    def _wake_producer(self):
        if self._h32[H_PRODUCER_SLEEPING // 4]:
            self._h32[H_PRODUCER_SLEEPING // 4] = 0
            futex_wake(self._base_addr + H_PRODUCER_SLEEPING)

    def _write_fifo(self):
        try:
            os.write(self._fifo_fd, b"\1")
        except (BlockingIOError, OSError):
            pass  # full: it is readable already

    # -- producer --------------------------------------------------------
    def _space_ready(self, need):
        h32 = self._h32
        return lambda: (self._capacity - (self._pos - self._h64[H_READ_POS // 8]) >= need
                        or h32[H_CONSUMER_CLOSED // 4] != 0 or h32[H_PRODUCER_CLOSED // 4] != 0
                        or self._peer_dead)

    def _reserve(self, n, deadline):
        """Room for a payload of ``n`` (<= inline_limit) bytes; return its offset in the data area.

        When the record must wrap, the WRAP header is written now but is only
        published with the record (see ``_publish``).
        """
        rec = 8 + _align8(n)
        cap = self._capacity
        while True:
            off = self._pos & self._mask
            to_end = cap - off
            need = rec if rec <= to_end else to_end + rec
            if cap - (self._pos - self._cache) < need:
                self._cache = self._h64[H_READ_POS // 8]
                if cap - (self._pos - self._cache) < need:
                    self._wait(H_PRODUCER_SLEEPING, self._space_ready(need), deadline)
                    self._check_producer()
                    continue
            if rec <= to_end and not (off >= HOT_BYTES and rec <= off and self._empty()):
                self._pending_hdr = off
                self._pending_skip = 0
                return off + 8
            self._d64[off >> 3] = KIND_WRAP << 32
            self._pending_hdr = 0
            self._pending_skip = to_end
            return 8

    def _contiguous(self, deadline):
        """Payload offset and room at the write position, waiting only while the ring is full.

        The consumer's line is re-read only when the cached ``read_pos`` offers
        less than the end of the area (capped at the inline limit) could: an
        active producer touches it once per few hundred kilobytes, not per put.
        """
        cap = self._capacity
        while True:
            off = self._pos & self._mask
            if off >= HOT_BYTES and self._empty():
                self._d64[off >> 3] = KIND_WRAP << 32
                self._pending_hdr = 0
                self._pending_skip = cap - off
                return 8, min(off, self._inline_limit + 8) - 8
            free = cap - (self._pos - self._cache)
            if free < min(cap - off, self._inline_limit + 8):
                self._cache = self._h64[H_READ_POS // 8]
                free = cap - (self._pos - self._cache)
            if free >= 16:
                self._pending_hdr = off
                self._pending_skip = 0
                return off + 8, min(cap - off, free) - 8
            self._wait(H_PRODUCER_SLEEPING, self._space_ready(16), deadline)
            self._check_producer()

    def _empty(self):
        """The consumer has read every record (``HOT_BYTES``)."""
        if self._cache != self._pos:
            self._cache = self._h64[H_READ_POS // 8]
        return self._cache == self._pos

    def _room_after_reserve(self, payload_off):
        cap = self._capacity
        free = cap - (self._pos + self._pending_skip - self._cache)
        return min(cap - (payload_off - 8), free) - 8

    def _publish(self, kind, n):
        self._d64[self._pending_hdr >> 3] = (kind << 32) | n
        self._pos += self._pending_skip + 8 + _align8(n)
        self._h64[H_WRITE_POS // 8] = self._pos
        h32 = self._h32
        h32[H_PRODUCER_CPU // 4] = sched_getcpu() + 1
        if _held_by is not None and _held_by == _get_ident():
            self._owe_wake()
        elif h32[H_CONSUMER_SLEEPING // 4] or h32[H_FD_ARMED // 4]:
            self._wake_consumer()

    def _owe_wake(self):
        """A held wake-up (``hold_wakes``): given by ``release_wakes``."""
        if not self._wake_owed:
            self._wake_owed = True
            _owed.append(self)
        if not _release_scheduled:
            _schedule_release()

    def _give_owed_wake(self):
        if self._wake_owed:
            self._wake_owed = False
            if not (self._closed or self._released):    # (a close woke the consumer)
                self._wake_consumer()       # (it wakes only a sleeping one)

    def put_bytes(self, data, timeout=None):
        self._enter(True)
        try:
            self._put_bytes(data, timeout)
        finally:
            self._leave()

    def _put_bytes(self, data, timeout):
        mv = memoryview(data)
        if not mv.c_contiguous:
            raise ValueError("put_bytes needs a C-contiguous bytes-like object")
        if mv.format != "B" or mv.ndim != 1:
            mv = mv.cast("B")
        n = mv.nbytes
        if n > self._max_message:
            raise self._too_large(n)
        deadline = _deadline(timeout)
        if n <= self._inline_limit:
            off = self._reserve(n, deadline)
            self._data[off:off + n] = mv
            self._publish(KIND_BYTES, n)
        else:
            self._put_side(KIND_SIDE_BYTES, [mv], deadline)

    def put(self, obj, timeout=None):
        self._enter(True)
        try:
            self._put(obj, timeout)
        finally:
            self._leave()

    def _put(self, obj, timeout):
        deadline = _deadline(timeout)
        data = self._data
        limit = self._inline_limit
        need = 0
        while True:
            if need == 0:
                off, room = self._contiguous(deadline)
            else:
                off = self._reserve(need, deadline)
                room = self._room_after_reserve(off)
            room = min(room, limit)
            try:
                end, buffers = _codec.encode_into(obj, data[:off + room], off, self._oob_threshold,
                                                  readonly_arrays=self.readonly_arrays)
            except BufferTooSmallError as exc:
                need = max(exc.needed, room + 1, need + 1)
                if need > limit:
                    return self._put_big(obj, deadline)
                continue
            n = end - off
            if not buffers:
                if n > self._max_message:
                    raise self._too_large(n)
                self._publish(KIND_VALUE, n)
                return
            total = n + sum(b.nbytes for b in buffers)
            if total > self._max_message:
                raise self._too_large(total)
            side_name = shm.new_name(self._prefix)
            payload = _align8(n) + _side_ref_size(len(side_name)) + 8
            if payload > limit:
                # The frame itself is large: it joins its buffers in the side segment.
                self._put_side(KIND_SIDE_FRAME, [data[off:end].tobytes(), *buffers], deadline)
                return
            if payload > room:
                need = payload
                continue
            size = _write_side_segment(side_name, buffers)
            self._write_side_ref(off, n, side_name, size, KIND_SIDE_VALUE)
            return

    def _put_big(self, obj, deadline):
        """A frame over the inline limit: encode it aside, then ship it in a side segment."""
        try:
            scratch, end, buffers = _codec.encode_growing(
                obj, bytearray(max(self._inline_limit * 2, 4096)), _codec.OOB_THRESHOLD,
                limit=self._max_message, readonly_arrays=self.readonly_arrays)
        except BufferTooSmallError as exc:
            raise self._too_large(exc.needed) from None
        total = end + sum(b.nbytes for b in buffers)
        if total > self._max_message:
            raise self._too_large(total)
        self._put_side(KIND_SIDE_FRAME, [memoryview(scratch)[:end], *buffers], deadline)

    def _too_large(self, n):
        """The error for a message of ``n`` bytes over the maximum (raised before anything is sent)."""
        return MessageTooLargeError(f"message of {n} bytes exceeds max_message_size={self._max_message}")

    def _put_side(self, kind, pieces, deadline):
        name = shm.new_name(self._prefix)
        size = _write_side_segment(name, pieces)
        try:
            off = self._reserve(_side_ref_size(len(name)) + 8, deadline)
            self._write_side_ref(off, 0, name, size, kind)
        except BaseException:
            shm.unlink_segment(name)
            raise

    def _write_side_ref(self, payload_off, inline_len, name, size, kind):
        data = self._data
        ref = payload_off + _align8(inline_len)
        raw = name.encode("ascii")
        data[ref:ref + 16] = size.to_bytes(8, "little") + len(raw).to_bytes(4, "little") + b"\0\0\0\0"
        padded = _align8(len(raw))
        data[ref + 16:ref + 16 + padded] = raw + b"\0" * (padded - len(raw))
        if inline_len & 7:
            data[payload_off + inline_len:ref] = b"\0" * (ref - payload_off - inline_len)
        trailer = ref + 16 + padded
        data[trailer:trailer + 8] = inline_len.to_bytes(8, "little")
        self._publish(kind, trailer + 8 - payload_off)

    # -- consumer --------------------------------------------------------
    def _next_record(self):
        """Offset of the next record's header, or -1 when the ring is empty."""
        while True:
            if self._pos == self._cache:
                self._cache = self._h64[H_WRITE_POS // 8]
                if self._pos == self._cache:
                    return -1
            off = self._pos & self._mask
            word = self._d64[off >> 3]
            if word >> 32 == KIND_WRAP:
                self._pos += self._capacity - off
                continue
            return off

    def _release_record(self, off, n):
        self._pos += 8 + _align8(n)
        self._h64[H_READ_POS // 8] = self._pos
        self._h32[H_CONSUMER_CPU // 4] = sched_getcpu() + 1
        if self._h32[H_PRODUCER_SLEEPING // 4]:
            self._wake_producer()

    def _consume(self, off):
        word = self._d64[off >> 3]
        kind = word >> 32
        n = word & 0xFFFFFFFF
        start = off + 8
        if n > self._capacity - start:
            raise DecodeError(f"ring {self._name}: corrupt record (length {n} at offset {off})")
        try:
            if kind == KIND_BYTES:
                return self._data[start:start + n].tobytes()
            if kind == KIND_VALUE:
                return _codec.decode(self._data[start:start + n])
            if kind in (KIND_SIDE_BYTES, KIND_SIDE_VALUE, KIND_SIDE_FRAME):
                inline_len, name, size = self._parse_side_ref(start, n)
                entries = _map_side_segment(name, size)
                if kind == KIND_SIDE_BYTES:
                    if len(entries) != 1:
                        raise DecodeError(f"side segment {name!r}: expected 1 entry")
                    return entries[0].tobytes()
                if kind == KIND_SIDE_VALUE:
                    return _codec.decode(self._data[start:start + inline_len], entries)
                if not entries:
                    raise DecodeError(f"side segment {name!r}: no frame")
                return _codec.decode(entries[0], entries[1:])
            raise DecodeError(f"ring {self._name}: unknown record kind {kind} at offset {off}")
        finally:
            self._release_record(off, n)

    def _parse_side_ref(self, start, n):
        data = self._data
        if n < 24:
            raise DecodeError(f"ring {self._name}: corrupt side reference")
        inline_len = int.from_bytes(data[start + n - 8:start + n], "little")
        ref = start + _align8(inline_len)
        if ref + 16 > start + n:
            raise DecodeError(f"ring {self._name}: corrupt side reference")
        size = int.from_bytes(data[ref:ref + 8], "little")
        name_len = int.from_bytes(data[ref + 8:ref + 12], "little")
        if ref + 16 + name_len > start + n - 8:
            raise DecodeError(f"ring {self._name}: corrupt side reference")
        name = data[ref + 16:ref + 16 + name_len].tobytes().decode("ascii", "replace")
        return inline_len, name, size

    def _data_ready(self):
        h32 = self._h32
        return (self._h64[H_WRITE_POS // 8] != self._pos or h32[H_PRODUCER_CLOSED // 4] != 0
                or h32[H_CONSUMER_CLOSED // 4] != 0 or self._peer_dead)

    def _raise_empty(self, blocking):
        # "closed" is read before write_pos (in the caller's _next_record)
        # had its last look: re-read write_pos after it to drain everything.
        if self._closed:
            self._raise_status(RL_CLOSED)
        if self._h32[H_PRODUCER_CLOSED // 4]:
            if self._next_record() < 0:
                self._raise_status(RL_CLOSED)
            return False
        if self._peer_dead:
            if self._next_record() < 0:
                self._raise_status(RL_PEER_DIED)
            return False
        if not blocking:
            raise RingEmpty()
        return True

    def get_nowait(self):
        self._enter(False)
        try:
            off = self._next_record()
            if off < 0:
                self._raise_empty(False)
                off = self._next_record()
            return self._consume(off)
        finally:
            self._leave()

    def get(self, timeout=None):
        self._enter(False)
        try:
            off = self._next_record()
            if off >= 0:
                return self._consume(off)
            deadline = _deadline(timeout)
            while True:
                if self._raise_empty(True):
                    self._wait(H_CONSUMER_SLEEPING, self._data_ready, deadline)
                    self._check_open()
                off = self._next_record()
                if off >= 0:
                    return self._consume(off)
        finally:
            self._leave()

    def poll(self):
        if self._closed:
            return True
        if self._is_producer:
            raise ValueError(f"ring {self._name}: poll() is for the consumer end; this is the producer")
        return self._pos != self._cache or self._data_ready()

    def spin_poll(self, timeout):
        """Busy-wait at most ``timeout`` seconds for data; never sleeps (see _ring_c)."""
        if self.poll():
            return True
        if not timeout > 0:
            return False
        if _owed:
            release_wakes()
        now = time.monotonic_ns()
        deadline = now + int(min(timeout, 1.0) * 1e9)
        next_yield = now + SPIN_POLL_YIELD_NS
        while True:
            if self.poll():
                return True
            before, now = now, time.monotonic_ns()
            if now >= deadline or now - before > SPIN_POLL_PREEMPTED_NS:
                return self.poll()
            if now >= next_yield:
                os.sched_yield()
                next_yield = now + SPIN_POLL_YIELD_NS

    def fileno(self):
        self._check_consumer()
        return self._fifo_fd

    def arm_fd(self):
        self._check_consumer()
        if self.poll():
            return False
        self._h32[H_FD_ARMED // 4] = 1
        if self.poll():
            self._h32[H_FD_ARMED // 4] = 0
            return False
        return True

    def clear_fd(self):
        if self._closed or self._is_producer:
            return
        self._h32[H_FD_ARMED // 4] = 0
        try:
            while len(os.read(self._fifo_fd, 256)) == 256:
                pass
        except OSError:     # empty (EAGAIN), or closed from another thread meanwhile
            pass

    # -- closing ---------------------------------------------------------
    def close(self):
        if self._closed:
            return
        self._closed = True
        self._closing = True
        try:
            self._close()
        finally:
            self._closing = False
            self._release()

    def _close(self):
        h32 = self._h32
        mine, theirs = ((H_PRODUCER_CLOSED, H_CONSUMER_CLOSED) if self._is_producer
                        else (H_CONSUMER_CLOSED, H_PRODUCER_CLOSED))
        h32[mine // 4] = 1
        # Wake everyone: the peer, and threads of this process blocked on this end.
        h32[H_CONSUMER_SLEEPING // 4] = 0
        futex_wake(self._base_addr + H_CONSUMER_SLEEPING)
        h32[H_PRODUCER_SLEEPING // 4] = 0
        futex_wake(self._base_addr + H_PRODUCER_SLEEPING)
        h32[H_FD_ARMED // 4] = 0
        self._write_fifo()
        peer_pid = self._learn_peer()
        last = (h32[theirs // 4] != 0 or peer_pid == 0
                or (peer_pid != self._my_pid and not process_alive(peer_pid, self._peer_pidfd)))
        if last:
            self._unlink_unread_side_segments()
        shm.unlink_segment(self._name)
        _unlink_fifo(self._name)

    def _unlink_unread_side_segments(self):
        """Unlink the side segments of messages nobody will read (bounded walk, checked offsets)."""
        h64 = self._h64
        pos, end = h64[H_READ_POS // 8], h64[H_WRITE_POS // 8]
        if end - pos > self._capacity:
            return
        while pos < end:
            off = pos & self._mask
            word = self._d64[off >> 3]
            kind, n = word >> 32, word & 0xFFFFFFFF
            if kind == KIND_WRAP:
                pos += self._capacity - off
                continue
            if n > self._capacity - off - 8:
                return
            if kind in (KIND_SIDE_BYTES, KIND_SIDE_VALUE, KIND_SIDE_FRAME):
                try:
                    _, name, _ = self._parse_side_ref(off + 8, n)
                    shm.unlink_segment(name)
                except (DecodeError, ValueError):
                    pass
            pos += 8 + _align8(n)

    def _release(self):
        """Close the descriptors once the end is closed and no operation or close() runs.

        The mapping itself is left to the garbage collector: in Python another
        thread may be anywhere between its "closed?" check and a header access.
        """
        with self._lock:
            if self._released or self._in_op or self._closing:
                return
            self._released = True
        if self._fifo_fd >= 0:
            os.close(self._fifo_fd)
            self._fifo_fd = -1
        if self._peer_pidfd >= 0:
            os.close(self._peer_pidfd)
            self._peer_pidfd = -1

    def _unmap(self):
        """Undo ``_from_mapping`` when it fails half-way (no other thread knows the object)."""
        self._released = True
        self._addr_anchor = None
        for view in (self._d64, self._data, self._h64, self._h32, self._mv):
            view.release()
        self._mm.close()

    __del__ = shm.close_if_dropped
