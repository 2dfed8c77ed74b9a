"""Broadcast message queue, pure-Python twin (the executable specification).

One writer, ``n_readers`` readers, a ring of ``max_chunks`` fixed-size chunks
in one shared-memory segment.  Every message is read by every reader, in
order.  The compiled twin ``_broadcast_c`` shares this layout byte for byte,
so a compiled writer can feed a pure-Python reader and the other way round.

Segment layout (little-endian, offsets in bytes; every region that one side
writes and another polls sits on its own 64-byte cache line)::

    0    header, written once by the creator
         u64 magic, u32 version, u32 n_readers, u32 n_chunks, u32 writer_pid,
         u64 chunk_bytes (data capacity of a chunk), u64 chunk_stride,
         u64 chunks_offset
    64   u32 writer_closed       the writer closed the queue
         u32 data_futex          futex word readers sleep on; bumped by the
                                 writer after a publish when a reader sleeps
         u32 weak_ordering       set by an end that has no full fence (a pure-
                                 Python end without libatomic): every sleeper
                                 then sleeps in short slices, as a wake-up
                                 may be lost
    128  u32 writer_waiting      the writer waits for space (bit 1: futex
                                 sleeper, bit 2: fd armed)
         u32 space_futex         futex word the writer sleeps on; bumped by a
                                 reader that frees a chunk while it waits
    192  reader slot r (64 bytes each)
         u32 pid (0 until attached), u32 closed, u32 waiting (bits as above),
         u32 unused, u64 token of the writer's wake-up socket for reader r
         (set at creation), u64 token of the reader's (set at attach); see
         ``broadcast_wake``
    chunks_offset + i * chunk_stride: chunk i
         u64 seq                 the *written flag*: number+1 of the message it
                                 holds (0: never written).  Stored last, with
                                 release ordering, so a reader that sees it sees
                                 the whole message.
         u32 kind (1 inline, 2 out of band), u32 n_oob,
         u64 frame_len, u64 total_len, u32 name_len
         64: u64 read mark per reader, the *read flags*: the seq the reader
             last read from this chunk.  Stored with release ordering after
             the reader is done with the chunk.
         then the data area (``chunk_bytes``).

Sequence numbers instead of booleans make the flags immune to ABA: message
``k`` (0-based) lives in chunk ``k % n_chunks`` with ``seq = k + 1``; a reader
waits for ``seq == k + 1``; the writer may put message ``k`` into its chunk
once every reader's mark there is ``k + 1 - n_chunks`` (it read the previous
occupant).  Nobody ever clears a flag.

Payload (in the data area, or in a segment of its own when it does not fit):
the codec frame, then padding to 8, then ``n_oob`` u64 lengths of the
out-of-band buffers, then each buffer aligned to 64.  An out-of-band message
stores the name of that segment in the chunk's data area.  Readers map it
read-only and decode from it without a copy (so its numpy arrays arrive
read-only, as from Ray's object store); the first reader that sees every
read mark set unlinks it, and the writer unlinks it anyway when it reuses the
chunk or closes (a reader that died, or two readers racing to the check).

Waiting: a bounded spin, then ``sched_yield`` for a bounded time, then a
futex sleep in slices.  A sleeper sets its ``waiting`` word, issues a full
fence and checks again before sleeping; a waker makes its change, issues a
full fence and looks at the ``waiting`` words, so one of the two always sees
the other (no lost wake-up), and a side that nobody waits for makes no
system call.  A waker that did wake a sleeper then yields its CPU once: the
kernel often queues the woken process on the waker's core, where it would
otherwise wait until the waker blocks.  Each slice ends with checks for a dead peer (pidfd) and, on
the thread's return to Python, for signals (Ctrl-C).  Ends driven by
asyncio arm the fd bit instead and wait on ``fileno()``, which the other side
pokes through a pair of datagram sockets connected to each other, one pair
per reader, so that no other process can wake them (``broadcast_wake``).
"""
import ctypes
import mmap
import os
import sys
import time

from ray_lite._lazy import lazy_module

from . import _codec_py as _codec
from . import shm
from .broadcast_wake import ReaderWakeSocket, WriterWakeSockets
from ._wait_py import HAVE_FENCE, fetch_add_u32, full_fence, futex_wait, futex_wake, open_pidfd, process_alive
from .errors import (RL_CLOSED, RL_PEER_DIED, RL_TIMEOUT, BufferTooSmallError, ChannelClosedError,
                     DecodeError, channel_error)
from .wait_policy import BROADCAST_SPIN_CHECKS, BROADCAST_YIELD_NS, SLICE_NS, SLICE_WEAK_NS, ns_to_s

asyncio = lazy_module("asyncio", globals())


def hands_cpu_over():
    """Whether a wake-up made by this thread hands its CPU to the process it
    woke (``sched_yield``; see ``MessageQueue._bump``): only when no event
    loop runs in this thread.  A plain thread that wakes a reader waits for
    it next, so the reader may as well have its core now; an event loop has
    other work to run meanwhile (an engine that broadcasts a step and then
    hands the last step's tokens on would hold them back until the woken
    worker's turn on its core ended)."""
    aio = sys.modules.get("asyncio")
    return aio is None or aio._get_running_loop() is None

__all__ = ["MessageQueue", "HANDLE_TAG", "DEFAULT_MAX_CHUNK_BYTES", "DEFAULT_MAX_CHUNKS",
           "MIN_CHUNK_BYTES", "MAX_READERS"]

MAGIC = int.from_bytes(b"RLBCAST1", "little")
VERSION = 2
HANDLE_TAG = "ray_lite.MessageQueue/1"

DEFAULT_MAX_CHUNK_BYTES = 1 << 20
DEFAULT_MAX_CHUNKS = 16
#: A chunk must at least hold the name of an out-of-band segment.
MIN_CHUNK_BYTES = 256
MAX_READERS = 256

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

#: Waiting strategy (the numbers are wait_policy's).  The spin and yield
#: phases are bounded in time so an idle waiter costs at most ~YIELD_S of
#: CPU per idle period; the sleep is sliced so a dead peer is noticed and a
#: timeout is honoured, in short slices when some end cannot fence (see
#: OFF_WEAK_ORDERING).
YIELD_S = ns_to_s(BROADCAST_YIELD_NS)
SLEEP_SLICE_S = ns_to_s(SLICE_NS)
SLEEP_SLICE_WEAK_S = ns_to_s(SLICE_WEAK_NS)

#: What a timed-out wait waited for, in its TimeoutError.
_WAITING_FOR = {"dequeue": "a message", "enqueue": "readers to make room"}


def _align(n, a):
    return (n + a - 1) & ~(a - 1)


def _layout_total(frame_len, lengths):
    """Bytes needed for a frame plus its out-of-band buffers (see module doc)."""
    off = _align(frame_len, 8) + 8 * len(lengths)
    for n in lengths:
        off = _align(off, 64) + n
    return off


def geometry(n_readers, max_chunk_bytes, max_chunks):
    """(chunks_offset, chunk_stride, data_offset, total_size) of a queue."""
    chunks_offset = _align(OFF_READERS + LINE * n_readers, 4096)
    data_offset = C_MARKS + _align(8 * n_readers, LINE)
    stride = _align(data_offset + max_chunk_bytes, LINE)
    return chunks_offset, stride, data_offset, chunks_offset + stride * max_chunks


class _PeerWatch:
    """Liveness of another process: a pidfd when the kernel has them."""

    __slots__ = ("pid", "_fd", "_dead")

    def __init__(self, pid):
        self.pid = pid
        self._dead = False
        self._fd = open_pidfd(pid)  # -1: no such process (process_alive says so) or no pidfds

    def alive(self):
        if not self._dead and not process_alive(self.pid, self._fd):
            self._dead = True
        return not self._dead

    def close(self):
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _deadline(timeout):
    if timeout is None:
        return None
    if timeout < 0:
        raise ValueError("timeout must be non-negative")
    return time.monotonic() + timeout


def _writer_wake_sockets(name, n_readers, release):
    """The new writer's ``WriterWakeSockets``; when they fail, the end it was
    building is released and its segment removed."""
    try:
        return WriterWakeSockets(name, n_readers)
    except BaseException:
        shm.unlink_segment(name)
        release()
        raise


class MessageQueue:
    """Broadcast queue: one writer, ``n_readers`` readers (see module doc)."""

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
        max_chunk_bytes = _align(max_chunk_bytes, 8)
        chunks_offset, stride, data_offset, size = geometry(n_readers, max_chunk_bytes, max_chunks)
        name, mm = shm.create_segment(size)
        self._setup(name, mm, -1)
        self._u64[OFF_MAGIC // 8] = MAGIC
        u32 = self._u32
        u32[OFF_VERSION // 4] = VERSION
        u32[OFF_N_READERS // 4] = n_readers
        u32[OFF_N_CHUNKS // 4] = max_chunks
        u32[OFF_WRITER_PID // 4] = os.getpid()
        self._u64[OFF_CHUNK_BYTES // 8] = max_chunk_bytes
        self._u64[OFF_CHUNK_STRIDE // 8] = stride
        self._u64[OFF_CHUNKS_OFFSET // 8] = chunks_offset
        self._read_geometry()
        self._oob_threshold = oob_threshold
        self._oob_names = [None] * max_chunks
        self._owns_name = True
        self._declare_ordering()
        self._wake = _writer_wake_sockets(name, n_readers, self._release)
        for r, token in enumerate(self._wake.tokens):
            self._u64[(OFF_READERS + LINE * r + R_WRITER_TOKEN) // 8] = token

    # ------------------------------------------------------------ set-up

    def _setup(self, name, mm, rank):
        self._chunk_data = None
        self._name = name
        self._mm = mm
        self._mv = memoryview(mm)
        self._u64 = self._mv.cast("Q")
        self._u32 = self._mv.cast("I")
        self._anchor = ctypes.c_char.from_buffer(mm)
        self._base = ctypes.addressof(self._anchor)
        self._rank = rank
        self._next = 0  # number of the next message to write or read
        self._closed = False
        self._busy = 0
        self._released = False
        self._wake = None  # our wake-up sockets (broadcast_wake)
        self._peers = {}
        self._oob_names = None
        self._owns_name = False
        self._oob_threshold = _codec.OOB_THRESHOLD

    def _read_geometry(self):
        u32, u64 = self._u32, self._u64
        if u64[OFF_MAGIC // 8] != MAGIC or u32[OFF_VERSION // 4] != VERSION:
            raise ValueError(f"segment {self._name!r} is not a ray_lite MessageQueue (version {VERSION})")
        self._n_readers = u32[OFF_N_READERS // 4]
        self._n_chunks = u32[OFF_N_CHUNKS // 4]
        self._writer_pid = u32[OFF_WRITER_PID // 4]
        self._chunk_bytes = u64[OFF_CHUNK_BYTES // 8]
        self._stride = u64[OFF_CHUNK_STRIDE // 8]
        self._chunks_offset = u64[OFF_CHUNKS_OFFSET // 8]
        self._data_offset = C_MARKS + _align(8 * self._n_readers, LINE)
        self._chunk_data = [
            self._mv[self._chunk_off(i) + self._data_offset:
                     self._chunk_off(i) + self._data_offset + self._chunk_bytes]
            for i in range(self._n_chunks)]

    def _declare_ordering(self):
        if not HAVE_FENCE:
            self._u32[OFF_WEAK_ORDERING // 4] = 1

    def _slice(self):
        return SLEEP_SLICE_WEAK_S if self._u32[OFF_WEAK_ORDERING // 4] else SLEEP_SLICE_S

    def _chunk_off(self, i):
        return self._chunks_offset + i * self._stride

    @classmethod
    def attach(cls, handle, reader_rank):
        """Attach to the queue of ``handle`` (from ``export_handle``) as reader ``reader_rank``."""
        if not (isinstance(handle, tuple) and len(handle) == 2 and handle[0] == HANDLE_TAG):
            raise ValueError(f"not a MessageQueue handle: {handle!r}")
        name = handle[1]
        mm = shm.attach_segment(name)
        self = cls.__new__(cls)
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
        slot = (OFF_READERS + LINE * rank) // 4
        if self._u32[slot + R_PID // 4] != 0:
            pid = self._u32[slot + R_PID // 4]
            self._release()
            raise ValueError(f"reader rank {rank} of {name!r} is already attached (pid {pid})")
        slot_u64 = (OFF_READERS + LINE * rank) // 8
        try:
            self._wake = ReaderWakeSocket(name, rank, self._u64[slot_u64 + R_WRITER_TOKEN // 8])
        except BaseException:
            self._release()
            raise
        # Published before the pid: the writer looks for it once we wait.
        self._u64[slot_u64 + R_READER_TOKEN // 8] = self._wake.token
        self._rank = rank
        self._u32[slot + R_PID // 4] = os.getpid()
        self._declare_ordering()
        full_fence()
        # The last reader to attach removes the name: from then on nothing is
        # left in /dev/shm whoever dies.  (Two readers racing past this check
        # both miss it at worst; the writer's close removes the name then.)
        if all(self._u32[(OFF_READERS + LINE * r + R_PID) // 4] != 0 for r in range(self._n_readers)):
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
        """This end's reader rank, or None on the writer."""
        return None if self._rank < 0 else self._rank

    @property
    def closed(self):
        return self._closed

    def __repr__(self):
        role = "writer" if self._rank < 0 else f"reader {self._rank}"
        return (f"<MessageQueue {self._name} {role} n_readers={self._n_readers} "
                f"chunks={self._n_chunks}x{self._chunk_bytes}{' closed' if self._closed else ''}>")

    # ------------------------------------------------------------ helpers

    def _enter(self):
        if self._closed:
            raise self._error(RL_CLOSED, this_end=True)
        self._busy += 1

    def _leave(self):
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
        # Release every view explicitly: a stale local elsewhere holding one
        # would otherwise keep the mapping exported and mmap.close() would fail.
        for view in (self._chunk_data or ()):
            view.release()
        for view in (self._u32, self._u64):
            if view is not None:
                view.release()
        self._chunk_data = None
        self._u32 = self._u64 = None
        self._anchor = None
        self._mv.release()
        self._mm.close()

    def _reader_slot(self, r):
        return (OFF_READERS + LINE * r) // 4

    def _peer_alive(self, pid):
        w = self._peers.get(pid)
        if w is None:
            w = self._peers[pid] = _PeerWatch(pid)
        return w.alive()

    def _reader_token(self, r):
        """The token reader ``r`` published at attach (0: not attached)."""
        return self._u64[(OFF_READERS + LINE * r + R_READER_TOKEN) // 8]

    def fileno(self):
        """A file descriptor that becomes readable when this end may proceed
        (a reader: a message may be there; the writer: a chunk may be free).
        Only poked while ``dequeue_async``/``enqueue_async`` is waiting, and
        only by the queue's own ends (see ``broadcast_wake``)."""
        if self._closed:
            raise self._error(RL_CLOSED, this_end=True)
        return self._wake.fileno(self._reader_token) if self._rank < 0 else self._wake.fileno()

    def _drain_wake_sock(self):
        self._wake.drain(self._reader_token)

    # ------------------------------------------------------------ writer

    def _chunk_free(self, c, k):
        """Whether message ``k`` may go into chunk ``c``; raises if a reader
        that still has to read it closed its end."""
        if k < self._n_chunks:
            return True
        want = k + 1 - self._n_chunks
        base = (self._chunk_off(c) + C_MARKS) // 8
        u64 = self._u64
        for r in range(self._n_readers):
            if u64[base + r] < want:
                if self._u32[self._reader_slot(r) + R_CLOSED // 4]:
                    raise self._error(RL_CLOSED, peer=f"reader {r}")
                return False
        return True

    def _check_readers_alive(self, c, k):
        want = k + 1 - self._n_chunks
        base = (self._chunk_off(c) + C_MARKS) // 8
        for r in range(self._n_readers):
            if self._u64[base + r] < want:
                pid = self._u32[self._reader_slot(r) + R_PID // 4]
                if pid and not self._peer_alive(pid):
                    raise self._error(RL_PEER_DIED, peer=f"reader {r}", pid=pid)

    def enqueue(self, obj, timeout=None):
        """Broadcast ``obj`` to every reader.  Waits while the chunk it needs
        has not been read by every reader yet; ``TimeoutError`` after
        ``timeout`` seconds, ``ChannelClosedError`` if this end or a reader
        closed, ``PeerDiedError`` if a reader that has to make room died."""
        if self._rank >= 0:
            raise ValueError("enqueue on a reader end of the MessageQueue")
        self._enter()
        try:
            k = self._next
            c = k % self._n_chunks
            if not self._chunk_free(c, k):
                self._wait_space(c, k, _deadline(timeout))
            self._write(c, k, obj)
            self._next = k + 1
        finally:
            self._leave()

    def _busy_wait(self, ready, deadline):
        """The spin and yield phases of a wait: True as soon as ``ready()``."""
        for _ in range(BROADCAST_SPIN_CHECKS):
            if ready():
                return True
        end_yield = time.monotonic() + YIELD_S
        if deadline is not None:
            end_yield = min(end_yield, deadline)
        while time.monotonic() < end_yield:
            os.sched_yield()
            if ready():
                return True
        return False

    def _sleep_slice(self, futex_addr, seen, deadline, waiting_for):
        """One futex sleep of at most a slice, ending at ``deadline``."""
        slice_s = self._slice()
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._error(RL_TIMEOUT, waiting_for=waiting_for)
            slice_s = min(slice_s, left)
        futex_wait(futex_addr, seen, int(slice_s * 1e9))

    def _wait_space(self, c, k, deadline):
        if self._busy_wait(lambda: self._chunk_free(c, k), deadline):
            return
        u32 = self._u32
        futex_addr = self._base + OFF_SPACE_FUTEX
        try:
            while True:
                seen = u32[OFF_SPACE_FUTEX // 4]
                u32[OFF_WRITER_WAITING // 4] = WAIT_FUTEX
                full_fence()
                if self._chunk_free(c, k):
                    return
                if self._closed:
                    raise self._error(RL_CLOSED, this_end=True)
                self._check_readers_alive(c, k)
                self._sleep_slice(futex_addr, seen, deadline,
                                  _WAITING_FOR["enqueue"])
        finally:
            if self._u32 is not None:
                u32[OFF_WRITER_WAITING // 4] = 0

    def _write(self, c, k, obj):
        stale = self._oob_names[c]
        if stale is not None:
            # Every reader read the previous occupant: its segment is unlinked
            # already, unless a reader died or two raced past the check.
            self._oob_names[c] = None
            shm.unlink_segment(stale)
        coff = self._chunk_off(c)
        data = self._chunk_data[c]
        kind = KIND_INLINE
        try:
            end, bufs = _codec.encode_into(obj, data, 0, self._oob_threshold)
            lengths = [b.nbytes for b in bufs]
            total = _layout_total(end, lengths)
            if total > self._chunk_bytes:
                raise BufferTooSmallError("out-of-band buffers do not fit", total)
            _place_buffers(data, end, bufs)
            frame_len, n_oob = end, len(bufs)
            name_len = 0
        except BufferTooSmallError as exc:
            kind = KIND_OOB_SEGMENT
            frame_len, n_oob, total, seg_name = self._write_oob_segment(obj, exc.needed)
            raw = seg_name.encode()
            data[:len(raw)] = raw
            name_len = len(raw)
            self._oob_names[c] = seg_name
        u32, u64 = self._u32, self._u64
        u32[(coff + C_KIND) // 4] = kind
        u32[(coff + C_N_OOB) // 4] = n_oob
        u64[(coff + C_FRAME_LEN) // 8] = frame_len
        u64[(coff + C_TOTAL_LEN) // 8] = total
        u32[(coff + C_NAME_LEN) // 4] = name_len
        # Publish: the written flag last (an aligned 8-byte store, release on x86).
        u64[(coff + C_SEQ) // 8] = k + 1
        full_fence()
        self._wake_readers()

    def _write_oob_segment(self, obj, needed):
        frame, end, bufs = _codec.encode_growing(
            obj, bytearray(max(needed, 2 * self._chunk_bytes, 4096)), self._oob_threshold)
        lengths = [b.nbytes for b in bufs]
        total = _layout_total(end, lengths)
        seg_name, mm = shm.create_segment(total)
        try:
            with memoryview(mm) as mv:
                mv[:end] = memoryview(frame)[:end]
                _place_buffers(mv, end, bufs)
        except BaseException:
            mm.close()
            shm.unlink_segment(seg_name)
            raise
        mm.close()
        return end, len(bufs), total, seg_name

    def _wake_readers(self):
        u32 = self._u32
        futex = poke = False
        for r in range(self._n_readers):
            w = u32[self._reader_slot(r) + R_WAITING // 4]
            if w:
                futex = futex or bool(w & WAIT_FUTEX)
                if w & WAIT_FD:
                    poke = True
                    self._wake.poke(r, self._reader_token)
        if futex:
            self._bump(OFF_DATA_FUTEX)
        return futex or poke

    def _bump(self, off):
        addr = self._base + off
        if not fetch_add_u32(addr, 1):
            self._u32[off // 4] = (self._u32[off // 4] + 1) & 0xFFFFFFFF
        futex_wake(addr)
        # Hand the CPU to the woken process if the kernel queued it on our
        # core (see the compiled twin); only paid when somebody slept.
        if hands_cpu_over():
            os.sched_yield()

    # ------------------------------------------------------------ reader

    def _poll(self, c, k):
        """True when message ``k`` is in chunk ``c``; raises when it never will be."""
        if self._u64[(self._chunk_off(c) + C_SEQ) // 8] == k + 1:
            return True
        if self._closed:
            raise self._error(RL_CLOSED, this_end=True)
        if self._u32[OFF_WRITER_CLOSED // 4]:
            # Closed flag then seq: a message published before the close is
            # still delivered.
            if self._u64[(self._chunk_off(c) + C_SEQ) // 8] == k + 1:
                return True
            raise self._error(RL_CLOSED, peer="writer")
        return False

    def dequeue(self, timeout=None):
        """The next message.  ``TimeoutError`` after ``timeout`` seconds,
        ``ChannelClosedError`` once the writer closed and every message it sent
        was read (or this end was closed), ``PeerDiedError`` if the writer died."""
        if self._rank < 0:
            raise ValueError("dequeue on the writer end of the MessageQueue")
        self._enter()
        try:
            k = self._next
            c = k % self._n_chunks
            if not self._poll(c, k):
                self._wait_message(c, k, _deadline(timeout))
            return self._read(c, k)
        finally:
            self._leave()

    def _wait_message(self, c, k, deadline):
        if deadline is not None and deadline <= time.monotonic():
            raise self._error(RL_TIMEOUT, waiting_for=_WAITING_FOR["dequeue"])
        if self._busy_wait(lambda: self._poll(c, k), deadline):
            return
        u32 = self._u32
        waiting = self._reader_slot(self._rank) + R_WAITING // 4
        futex_addr = self._base + OFF_DATA_FUTEX
        try:
            while True:
                seen = u32[OFF_DATA_FUTEX // 4]
                u32[waiting] = WAIT_FUTEX
                full_fence()
                if self._poll(c, k):
                    return
                if not self._peer_alive(self._writer_pid):
                    if self._poll(c, k):
                        return
                    raise self._error(RL_PEER_DIED, peer="writer", pid=self._writer_pid)
                self._sleep_slice(futex_addr, seen, deadline, _WAITING_FOR["dequeue"])
        finally:
            if self._u32 is not None:
                u32[waiting] = 0

    def _read(self, c, k):
        coff = self._chunk_off(c)
        u32, u64 = self._u32, self._u64
        kind = u32[(coff + C_KIND) // 4]
        n_oob = u32[(coff + C_N_OOB) // 4]
        frame_len = u64[(coff + C_FRAME_LEN) // 8]
        data = self._chunk_data[c]
        seg_name = None
        try:
            if kind == KIND_INLINE:
                # The chunk is reused once every reader is done: the
                # out-of-band buffers are copied out before the read mark.
                bufs = [bytearray(b) for b in _buffer_views(data, frame_len, n_oob)]
                return _codec.decode(data[:frame_len], bufs)
            if kind == KIND_OOB_SEGMENT:
                name_len = u32[(coff + C_NAME_LEN) // 4]
                seg_name = bytes(data[:name_len]).decode()
                total = u64[(coff + C_TOTAL_LEN) // 8]
                mv = _map_readonly(seg_name, total)
                return _codec.decode(mv[:frame_len], _buffer_views(mv, frame_len, n_oob))
            raise DecodeError(f"corrupt MessageQueue chunk (kind {kind})")
        finally:
            self._next = k + 1
            u64[(coff + C_MARKS) // 8 + self._rank] = k + 1
            full_fence()
            if seg_name is not None:
                base = (coff + C_MARKS) // 8
                if all(u64[base + r] >= k + 1 for r in range(self._n_readers)):
                    shm.unlink_segment(seg_name)
            w = u32[OFF_WRITER_WAITING // 4]
            if w:
                if w & WAIT_FD:
                    self._wake.poke_writer()
                if w & WAIT_FUTEX:
                    self._bump(OFF_SPACE_FUTEX)

    # ------------------------------------------------------------ asyncio

    async def dequeue_async(self, timeout=None):
        """``dequeue`` for asyncio: waits on ``fileno()`` in the running loop."""
        if self._rank < 0:
            raise ValueError("dequeue on the writer end of the MessageQueue")

        def attempt():
            k = self._next
            c = k % self._n_chunks
            if not self._poll(c, k):
                return _NOTHING
            return self._read(c, k)

        def check_peer():
            if not self._peer_alive(self._writer_pid):
                raise self._error(RL_PEER_DIED, peer="writer", pid=self._writer_pid)

        waiting = self._reader_slot(self._rank) + R_WAITING // 4
        return await self._async_wait(attempt, waiting, _deadline(timeout), check_peer, "dequeue")

    async def enqueue_async(self, obj, timeout=None):
        """``enqueue`` for asyncio: waits for room on ``fileno()`` in the running loop."""
        if self._rank >= 0:
            raise ValueError("enqueue on a reader end of the MessageQueue")

        def attempt():
            if self._closed:
                raise self._error(RL_CLOSED, this_end=True)
            k = self._next
            c = k % self._n_chunks
            if not self._chunk_free(c, k):
                return _NOTHING
            self._write(c, k, obj)
            self._next = k + 1
            return None

        def check_peer():
            k = self._next
            self._check_readers_alive(k % self._n_chunks, k)

        return await self._async_wait(attempt, OFF_WRITER_WAITING // 4, _deadline(timeout),
                                      check_peer, "enqueue")

    async def _async_wait(self, attempt, waiting_index, deadline, check_peer, what):
        # The whole wait counts as an operation in progress, so a close()
        # from elsewhere defers unmapping and closing our socket until we left.
        self._enter()
        try:
            result = attempt()
            if result is not _NOTHING:
                return result
            loop = asyncio.get_running_loop()
            fd = self.fileno()
            try:
                while True:
                    self._u32[waiting_index] = WAIT_FD
                    full_fence()
                    result = attempt()
                    if result is not _NOTHING:
                        return result
                    check_peer()
                    slice_s = self._slice()
                    if deadline is not None:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            raise self._error(RL_TIMEOUT, waiting_for=_WAITING_FOR[what])
                        slice_s = min(slice_s, left)
                    fut = loop.create_future()
                    loop.add_reader(fd, _set_done, fut)
                    try:
                        await asyncio.wait_for(fut, slice_s)
                    except asyncio.TimeoutError:
                        pass
                    finally:
                        loop.remove_reader(fd)
                    self._drain_wake_sock()
            finally:
                self._u32[waiting_index] = 0
        finally:
            self._leave()

    # ------------------------------------------------------------ closing

    def close(self):
        """Close this end.  The writer's close wakes every blocked reader (they
        get the messages already sent, then ``ChannelClosedError``), removes the
        segment's name and the out-of-band segments; a reader's close wakes
        a blocked writer.  A call blocked on this same object in another
        thread ends with ``ChannelClosedError``.  Idempotent."""
        if self._closed or self._released:
            return
        # Held while closing: a call blocked in another thread, woken below,
        # must not release the mapping under this code (see _leave).
        self._busy += 1
        self._closed = True
        try:
            self._close_end()
        finally:
            self._busy -= 1
        if self._busy == 0:
            self._release()

    def _close_end(self):
        u32 = self._u32
        if self._rank < 0:
            u32[OFF_WRITER_CLOSED // 4] = 1
            full_fence()
            self._bump(OFF_DATA_FUTEX)  # wakes our own blocked enqueue too
            self._bump(OFF_SPACE_FUTEX)
            for r in range(self._n_readers):
                if u32[self._reader_slot(r) + R_WAITING // 4] & WAIT_FD:
                    self._wake.poke(r, self._reader_token)
            shm.unlink_segment(self._name)
            for i, seg in enumerate(self._oob_names):
                if seg is not None:
                    shm.unlink_segment(seg)
                    self._oob_names[i] = None
        else:
            u32[self._reader_slot(self._rank) + R_CLOSED // 4] = 1
            full_fence()
            self._bump(OFF_SPACE_FUTEX)
            self._bump(OFF_DATA_FUTEX)  # our own blocked dequeue, if any
            if u32[OFF_WRITER_WAITING // 4] & WAIT_FD:
                self._wake.poke_writer()
            if not self._peer_alive(self._writer_pid):
                # The writer cannot clean up any more: do it for it.
                shm.unlink_segment(self._name)
        # Wake our own asyncio waiter (it then sees the closed flag).
        self._wake.wake_self()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    __del__ = shm.close_if_dropped


class _Nothing:
    __slots__ = ()


_NOTHING = _Nothing()


def _set_done(fut):
    if not fut.done():
        fut.set_result(None)


def _place_buffers(dst, frame_end, bufs):
    """Write the length table and the out-of-band buffers after the frame."""
    off = _align(frame_end, 8)
    table = dst[off:off + 8 * len(bufs)].cast("Q")
    for i, b in enumerate(bufs):
        table[i] = b.nbytes
    off += 8 * len(bufs)
    for b in bufs:
        off = _align(off, 64)
        n = b.nbytes
        dst[off:off + n] = b
        off += n


def _buffer_views(src, frame_len, n_oob):
    if not n_oob:
        return []
    off = _align(frame_len, 8)
    lengths = src[off:off + 8 * n_oob].cast("Q").tolist()
    off += 8 * n_oob
    views = []
    for n in lengths:
        off = _align(off, 64)
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
