"""The shared-memory ring of a ``util.queue.Queue``: where its items wait.

A ``Queue``'s owner actor creates one segment; every process that uses the
queue maps it, and a ``put`` that finds room (or a ``get`` that finds an
item) copies the item in (out) itself, without calling the owner.  Any number
of processes put and get at once, so every operation holds the segment's
lock: ``flock`` on the segment's file (the kernel drops it when a holder
dies, so a process killed inside an operation blocks nobody) plus a thread
lock (``flock`` does not exclude threads sharing one descriptor).  Both are
system calls or full barriers, so the plain loads and stores of the header
are ordered without atomics, in pure Python.

The owner keeps what the ring cannot hold and every blocked call (see
``queue._QueueOwner``); the header tells the other processes when the ring
alone does not decide an operation, and they call the owner then:

    0   u64 magic
    8   u64 read_pos      (bytes since creation; ``& (capacity - 1)`` = offset)
    16  u64 write_pos
    24  u64 count         items in the ring
    32  u64 overflow      items the owner holds after the ring's (too large,
                          or put while the ring was full)
    40  u32 getters       calls blocked in the owner on an empty queue
    44  u32 putters       calls blocked in the owner on a full queue
    48  u32 closed        set by ``Queue.shutdown``
    56  u64 capacity
    64  data area: records ``u32 length, u32 0, payload`` 8-byte aligned; a
        length of ``WRAP`` means "continue at offset 0".

The queue's order is the ring's items, then the owner's overflow.
"""
import fcntl
import mmap
import os
import secrets
import select
import struct
import threading
from time import perf_counter

from ray_lite._fast import shm
from ray_lite._fast.wait_policy import SPIN_POLL_YIELD_NS, RING_SPIN_NS, RING_YIELDS

MAGIC = int.from_bytes(b"rlqueue1", "little")
HEADER_SIZE = 64
DEFAULT_CAPACITY = 1 << 20
WRAP = 0xFFFFFFFF
#: The name tag after the runtime's prefix: the driver unlinks ``q<pid>_``
#: segments when process ``pid`` dies (``object_store.release_dead_owner``).
TAG = "q"

_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
# read_pos, write_pos, count, overflow, getters, putters, closed
_STATE = struct.Struct("<QQQQIII")
_READ, _COUNT, _OVERFLOW, _GETTERS, _PUTTERS, _CLOSED, _CAPACITY = (
    8, 24, 32, 40, 44, 48, 56)
# read_pos, write_pos, count: stored by one pack_into, so that a process
# killed inside an operation leaves them consistent with one another.
_POSITIONS = struct.Struct("<QQQ")
# What a client's spin before calling the owner looks at: count, overflow.
_HINT = struct.Struct("<QQ")
_SPIN_S = RING_SPIN_NS * 1e-9
_YIELD_EVERY_S = SPIN_POLL_YIELD_NS * 1e-9


def _record_size(n):
    return 8 + ((n + 7) & ~7)


def _has_items(count, overflow, _maxsize):
    """What a blocked get spins on: True, False (ask the owner), None (wait)."""
    if count:
        return True
    return False if overflow else None


def _has_room(count, overflow, maxsize):
    """What a blocked put spins on: True, False (ask the owner), None (wait)."""
    if overflow:
        return False
    return True if count < maxsize else None


class QueueRing:
    """One process's mapping of a queue's segment (see the module docstring)."""

    def __init__(self, name, fd, mm, owner_pid):
        self.name = name
        self._fd = fd
        self._mm = mm
        self.capacity = _U64.unpack_from(mm, _CAPACITY)[0]
        self._mask = self.capacity - 1
        #: The largest encoded item the ring takes; larger ones go to the owner.
        self.item_limit = self.capacity // 4
        self._tlock = threading.Lock()
        self._creator = False       # the owner's end unlinks the segment
        self._pidfd = -1
        self._poller = None
        self.owner_pid = owner_pid
        if owner_pid != os.getpid():
            try:
                self._pidfd = os.pidfd_open(owner_pid)
                self._poller = select.poll()
                self._poller.register(self._pidfd, select.POLLIN)
            except (AttributeError, OSError):
                self._pidfd = -1

    @classmethod
    def create(cls, prefix, capacity=DEFAULT_CAPACITY):
        """The owner's end: a new segment under the runtime's ``prefix``."""
        name = f"{prefix}{TAG}{os.getpid()}_{secrets.token_hex(8)}"
        _, mm = shm.create_segment(HEADER_SIZE + capacity, name=name)
        try:
            fd = os.open(shm.segment_path(name), os.O_RDWR | os.O_CLOEXEC)
        except BaseException:
            mm.close()
            shm.unlink_segment(name)
            raise
        _U64.pack_into(mm, _CAPACITY, capacity)
        _U64.pack_into(mm, 0, MAGIC)
        ring = cls(name, fd, mm, os.getpid())
        ring._creator = True
        return ring

    @classmethod
    def attach(cls, name, owner_pid):
        """Map the segment ``name``; ``FileNotFoundError`` once its owner is gone."""
        fd = os.open(shm.segment_path(name), os.O_RDWR | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            if size <= HEADER_SIZE:
                raise ValueError(f"{name!r} is not a queue segment")
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            if _U64.unpack_from(mm, 0)[0] != MAGIC:
                mm.close()
                raise ValueError(f"{name!r} is not a queue segment")
        except BaseException:
            os.close(fd)
            raise
        return cls(name, fd, mm, owner_pid)

    def close(self):
        """Unmap and close (the owner also unlinks); idempotent."""
        fd, self._fd = self._fd, -1
        if fd < 0:
            return
        if self._creator:
            shm.unlink_segment(self.name)
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1
        os.close(fd)
        self._mm.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # ---------------------------------------------------------------- lock
    def lock(self):
        self._tlock.acquire()
        self._flock()

    def _flock(self):
        """The segment's lock, once the thread lock is held (released if
        this raises, e.g. a KeyboardInterrupt while waiting)."""
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except BaseException:
            self._tlock.release()
            raise

    def _lock_if_owner_alive(self):
        """``lock()`` unless the owner process exited (then False, unlocked).
        The poll happens under the thread lock: a poll object serves one
        thread at a time."""
        self._tlock.acquire()
        if self._poller is not None and self._poller.poll(0):
            self._tlock.release()
            return False
        self._flock()
        return True

    def unlock(self):
        try:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._tlock.release()

    def __enter__(self):
        self.lock()
        return self

    def __exit__(self, *exc):
        self.unlock()

    def owner_alive(self):
        """False once the owner process exited (a pidfd; always True without one)."""
        if self._poller is None:
            return True
        with self._tlock:
            return not self._poller.poll(0)

    # ------------------------------------------- fast paths (take the lock)
    # A dead owner makes each of these answer "ask the owner", which raises.
    def try_put(self, data, maxsize):
        """Put ``data`` when the ring alone decides it; False: ask the owner."""
        if len(data) > self.item_limit:
            return False
        mm = self._mm
        if not self._lock_if_owner_alive():
            return False
        try:
            _, _, count, overflow, getters, putters, closed = _STATE.unpack_from(mm, _READ)
            if (getters or putters or overflow or closed
                    or (maxsize > 0 and count >= maxsize)):
                return False
            return self.push(data)
        finally:
            self.unlock()

    def try_get(self):
        """The oldest item's bytes when the ring alone decides it, else None."""
        mm = self._mm
        if not self._lock_if_owner_alive():
            return None
        try:
            _, _, count, _, _, putters, closed = _STATE.unpack_from(mm, _READ)
            if not count or putters or closed:
                return None
            return self.pop()
        finally:
            self.unlock()

    def size(self):
        """Items in the queue (ring and owner), or None when closed (or the
        owner exited)."""
        if not self._lock_if_owner_alive():
            return None
        try:
            _, _, count, overflow, _, _, closed = _STATE.unpack_from(self._mm, _READ)
        finally:
            self.unlock()
        return None if closed else count + overflow

    def spin_until_items(self):
        """Wait (no lock) for the ring to hold an item; False when none came
        (or the owner holds items: the ring alone cannot decide then)."""
        return self._spin(_has_items, 0)

    def spin_until_room(self, maxsize):
        """Wait (no lock) for the ring to have room under ``maxsize``; False
        when none came (or the owner holds items)."""
        return self._spin(_has_room, maxsize)

    def _spin(self, ready, maxsize):
        # A bounded spin, handing the CPU on now and then (the peer may be
        # runnable on this CPU), then a few yields: the caller waits in the
        # owner after that.
        mm, unpack = self._mm, _HINT.unpack_from
        start = last_yield = perf_counter()
        while True:
            answer = ready(*unpack(mm, _COUNT), maxsize)
            if answer is not None:
                return answer
            now = perf_counter()
            if now - start > _SPIN_S:
                break
            if now - last_yield > _YIELD_EVERY_S:
                os.sched_yield()
                last_yield = now
        for _ in range(RING_YIELDS):
            os.sched_yield()
            answer = ready(*unpack(mm, _COUNT), maxsize)
            if answer is not None:
                return answer
        return False

    # --------------------------------- with the lock held (owner and above)
    def state(self):
        """``(count, overflow, getters, putters, closed)``."""
        return _STATE.unpack_from(self._mm, _READ)[2:]

    def set_overflow(self, n):
        _U64.pack_into(self._mm, _OVERFLOW, n)

    def add_getters(self, delta):
        mm = self._mm
        _U32.pack_into(mm, _GETTERS, _U32.unpack_from(mm, _GETTERS)[0] + delta)

    def add_putters(self, delta):
        mm = self._mm
        _U32.pack_into(mm, _PUTTERS, _U32.unpack_from(mm, _PUTTERS)[0] + delta)

    def set_closed(self):
        _U32.pack_into(self._mm, _CLOSED, 1)

    def push(self, data):
        """Append ``data``; False when the ring has no room for it."""
        n = len(data)
        if n > self.item_limit:
            return False
        mm, cap = self._mm, self.capacity
        read, write, count = _POSITIONS.unpack_from(mm, _READ)
        need = _record_size(n)
        off = write & self._mask
        tail = cap - off
        wrap = need > tail
        if cap - (write - read) < need + (tail if wrap else 0):
            return False
        if wrap:
            _U32.pack_into(mm, HEADER_SIZE + off, WRAP)
            write += tail
            off = 0
        at = HEADER_SIZE + off
        _U32.pack_into(mm, at, n)
        mm[at + 8:at + 8 + n] = data
        _POSITIONS.pack_into(mm, _READ, read, write + need, count + 1)
        return True

    def pop(self):
        """Remove and return the oldest item's bytes (the ring holds one)."""
        mm = self._mm
        read, write, count = _POSITIONS.unpack_from(mm, _READ)
        off = read & self._mask
        n = _U32.unpack_from(mm, HEADER_SIZE + off)[0]
        if n == WRAP:
            read += self.capacity - off
            off = 0
            n = _U32.unpack_from(mm, HEADER_SIZE)[0]
        at = HEADER_SIZE + off
        data = mm[at + 8:at + 8 + n]
        _POSITIONS.pack_into(mm, _READ, read + _record_size(n), write, count - 1)
        return data
