"""Large objects in shared memory: written once by their producer, mapped by every reader.

A value whose out-of-band buffers (numpy arrays, large bytes-likes, pickle-5
buffers) add up to at least ``STORE_THRESHOLD`` bytes is *stored*: ``put``
copies its buffers once into a segment of its own (``/dev/shm/<runtime
prefix>o<owner pid>_<random>``), the codec frame at its end.  A ref to it
leaves the process as a *descriptor* (segment name, size, buffer offsets and
sizes, frame length), never as the value: the receiver maps the segment
read-only and decodes over the mapping, so numpy arrays come back as
read-only views of the one copy, in every process, as in Ray.  The same
path carries a large argument passed by value (the caller stores it and the
call carries a ref, ``refs.stored_by_value``) and a task's large return
value (the worker stores it, the reply carries the descriptor,
``refs.stored_result``; the caller passes that same descriptor on).  A
large value that arrived otherwise is stored the first time its owner sends
its ref to another process (``refs.stored_form``), and a fetch of it is
answered with the descriptor.  Buffers under the threshold stay on the
ring, which is cheaper for them; nothing changes for small values.

Lifetime.  The owner (the process that stored it) keeps the segment while a
ref to it *or a view of it* exists anywhere, as Ray pins an object while a
deserialised array uses it: each descriptor sent carries a weight of the
owner's count (the weighted reference counting of ``refs.py``); a reader
gives its weight back when its window on the segment dies, i.e. when its
refs and every array it decoded are gone.  When the owner's own refs and views are gone
too, the segment is released: it joins this process's ``SegmentPool``
(mapped, its pages touched) under a new name, and the next stored object of
a fitting size is written into it at memory-copy speed, without the page
fault and zeroing per page that a new file costs.  The new name makes a
late descriptor of the old object fail (``ObjectLostError``) instead of
mapping the next one's bytes.  Readers likewise keep their mapping of a
segment file once its object is gone (a few idle ones a process,
``map_segment``): the next object in that segment is read through page
tables filled already, so a ``get`` costs no page faults; a discarded
segment's pages are freed by its owner (``StoredSegment.discard``), not
kept by such idle mappings.  So:

- the owner dies while readers hold views: the driver unlinks the dead
  owner's objects, and the views keep working (a mapping of an unlinked
  file stays valid on Linux) until the readers drop them (a reader's idle
  mapping keeps such a segment's pages until it is evicted or the reader
  exits);
  a ref that reaches a process only after the owner's death cannot be mapped
  any more and ``get`` raises ``ObjectLostError``, as in Ray;
- a reader dies: the kernel drops its mappings, and the owner takes back
  the weight the reader held, as for any borrowed ref (``ownership.py``: each
  borrower reports what it receives and what it passes on, at its next
  drain or before a call's code runs).  Weight the dead reader had passed
  on but not yet reported is taken back too, so the third process keeps
  what it mapped but may fail to pass the ref on further
  (``ObjectLostError``); what it mapped keeps its bytes, since such a
  segment is only unlinked when freed, never reused or emptied
  (``StoredSegment.readers_unknown``).  Not covered: a reader killed
  before its report went out: its weight is lost and the segment lives
  until the owner exits or the runtime shuts down;
- the runtime's shutdown unlinks every segment of its prefix (the pools'
  too), and the next start removes those of a killed driver
  (``shm.cleanup_stale_segments``).

Capacity and spilling.  ``init(object_store_memory=...)`` (default: 30 % of
the machine's memory, at most what ``/dev/shm`` can hold) bounds the bytes of
all stored objects of the runtime (the segments of its prefix, counted at
each store).  An object that does not fit any more (or that ``/dev/shm`` has
no room for: checked before writing, a write past a full tmpfs would be a
SIGBUS) is *spilled*: written to a file in the runtime's spill directory
(``<tempdir>/ray_lite_spill-<uid>/<runtime prefix>``, 0700, refused when
another user made it: ``shm.private_dir``) instead of shared memory,
and read back by mapping that file (the kernel's page cache restores it on
access, and may drop it again under pressure; nothing is pinned).  Unlike
Ray, an object is spilled when it is stored, not moved out later.  When the
spill directory's disk has no room either, or spilling is off
(``init(_system_config={"automatic_object_spilling_enabled": False})``,
Ray's switch), ``ObjectStoreFullError`` says how many bytes were asked and
are in use.  The free segments kept for reuse (``SegmentPool``) count
against the capacity too: what the runtime keeps in ``/dev/shm`` for its
objects stays within it.  The spill directory goes at shutdown,
a dead owner's files with it, and a killed driver's at the next start.
"""
import ctypes
import mmap
import os
import sys
import threading
import weakref

from ray_lite._fast import shm
from ray_lite.exceptions import ObjectLostError, ObjectStoreFullError

from .spill import make_spill_dir, spill_dir


#: Values with at least this many out-of-band bytes are stored in shared memory.
STORE_THRESHOLD = 256 * 1024
#: Buffers start at offsets aligned for SIMD loads (and numpy's alignment).
_ALIGN = 64
#: The file beside a runtime's segments that tells its workers the capacity.
_CAPACITY_SUFFIX = "store_capacity"
_DEFAULT_SHARE = 0.3


def default_capacity():
    """30 % of the machine's memory, capped by what ``/dev/shm`` can hold."""
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError):
        ram = 8 << 30
    cap = int(ram * _DEFAULT_SHARE)
    try:
        st = os.statvfs(shm.SHM_DIR)
        cap = min(cap, st.f_blocks * st.f_frsize)
    except OSError:
        pass
    return cap


def check_capacity(capacity):
    """``init(object_store_memory=...)`` checked, or the default when None."""
    if capacity is None:
        return default_capacity()
    if isinstance(capacity, float) and capacity.is_integer():
        capacity = int(capacity)        # 200e6, as Ray takes it
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0:
        raise ValueError(f"object_store_memory must be a positive int (bytes), got {capacity!r}")
    return capacity


def spilling_enabled(system_config):
    """Whether objects past the capacity spill to disk: Ray's
    ``_system_config={"automatic_object_spilling_enabled": ...}`` (default True)."""
    if system_config is None:
        return True
    if not isinstance(system_config, dict):
        raise TypeError(f"_system_config must be a dict, got {type(system_config).__name__}")
    enabled = system_config.get("automatic_object_spilling_enabled", True)
    if not isinstance(enabled, bool):
        raise TypeError("_system_config['automatic_object_spilling_enabled'] must be a bool, "
                        f"got {enabled!r}")
    return enabled


def configure(node, capacity, spilling=True):
    """Set the runtime's capacity and whether it spills (the driver, at
    ``init``) and tell its workers.

    A driver that uses numpy has its zygote import it too: workers decode the
    driver's arrays (a stored object maps as numpy arrays), and numpy imported
    once before the fork keeps its ~10 MB of private pages shared by every
    worker forked afterwards, where each worker would import a copy of its
    own at its first array.  (Workers forked already, the initial pool, are
    not helped; the zygote's import delays the next spawn by that import.)
    """
    node.store_capacity = capacity
    node.store_spilling = spilling
    path = shm.segment_path(node.shm_prefix + _CAPACITY_SUFFIX)
    try:
        fd = shm.create_private_file(path)
    except shm.SharedPathError:
        # This runtime's own from an earlier configure is replaced; a file
        # another user planted under its name is refused.
        shm.check_private(path, False)
        os.unlink(path)
        fd = shm.create_private_file(path)
    with os.fdopen(fd, "w") as f:
        f.write(f"{capacity} {int(spilling)}")
    zygote = getattr(node, "zygote", None)
    if zygote is not None and "numpy" in sys.modules:
        zygote.preload(["numpy"])


def capacity_of(node):
    cap = getattr(node, "store_capacity", None)
    if cap is None:
        spilling = True
        try:
            fd = os.open(shm.segment_path(node.shm_prefix + _CAPACITY_SUFFIX),
                         os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            with os.fdopen(fd) as f:
                cap, spilling = f.read().split()
            cap, spilling = int(cap), spilling == "1"
        except (OSError, ValueError):
            cap = default_capacity()
        node.store_capacity = cap
        node.store_spilling = spilling
    return cap


def spilling_of(node):
    """Whether the runtime of ``node`` spills objects past its capacity."""
    capacity_of(node)
    return getattr(node, "store_spilling", True)


def _store_prefix(node):
    return node.shm_prefix + "o"


def bytes_in_use(node):
    """Bytes of the runtime's stored objects (segments not yet unlinked) and
    of its processes' free segments kept for reuse (``SegmentPool``)."""
    total = 0
    for name in shm.list_segments(node.shm_prefix):
        if name[len(node.shm_prefix):][:1] not in ("o", "p"):
            continue
        try:
            total += os.stat(shm.segment_path(name)).st_size
        except OSError:
            pass
    return total


def layout(frame_len, sizes):
    """``(segment size, offset of the frame, offsets of the buffers)``."""
    offsets = []
    off = 0
    for n in sizes:
        offsets.append(off)
        off = (off + n + _ALIGN - 1) & ~(_ALIGN - 1)
    return max(off + frame_len, 1), off, offsets


def write_segment(node, frame, buffers):
    """Store ``buffers`` then ``frame`` in a segment; return its ``StoredSegment``.

    A free segment of the process's pool (``SegmentPool``) is reused when one
    fits: its pages are mapped and touched already, so the write runs at
    memcpy speed instead of paying a page fault (and the kernel's zeroing)
    per page of a new file.  Raises ``ObjectStoreFullError`` past the
    capacity or when ``/dev/shm`` is full.
    """
    sizes = [b.nbytes for b in buffers]
    size, frame_off, offsets = layout(len(frame), sizes)
    token = f"{os.getpid()}_{os.urandom(8).hex()}"
    name = _store_prefix(node) + token
    seg = _pool.take(node, size, name)
    if seg is None:
        seg = _new_segment(node, size, name, token)
    try:
        mm = seg.mm
        for off, b, n in zip(offsets, buffers, sizes):
            copy_into(mm, off, b, n)
        mm[frame_off:frame_off + len(frame)] = frame
    except BaseException:
        seg.discard()
        raise
    seg.size = size
    seg.offsets = offsets
    return seg


def _new_segment(node, size, name, token):
    capacity = capacity_of(node)
    used = bytes_in_use(node)
    # Checked rather than reserved (posix_fallocate costs a pass over the
    # pages): writing past a full tmpfs would be a SIGBUS.  The pool's free
    # segments give way first.
    if (used + size > capacity or size > _room(shm.SHM_DIR)) and _pool.bytes_kept():
        _pool.clear()
        used = bytes_in_use(node)
    if used + size <= capacity and size <= _room(shm.SHM_DIR):
        path = shm.segment_path(name)
        spilled = False
    elif not spilling_of(node):
        raise ObjectStoreFullError(
            f"cannot store an object of {size} bytes: the object store holds {used} bytes of "
            f"its capacity of {capacity} bytes (init(object_store_memory=...)) and spilling is "
            f"off (_system_config={{'automatic_object_spilling_enabled': False}}); free some "
            f"objects (drop their refs) or raise object_store_memory")
    else:
        spill = make_spill_dir(node)
        room = _room(spill)
        if size > room:
            raise ObjectStoreFullError(
                f"cannot store an object of {size} bytes: the object store holds {used} bytes "
                f"of its capacity of {capacity} bytes (init(object_store_memory=...)) and the "
                f"spill directory {spill} has {room} bytes free")
        name = path = os.path.join(spill, "o" + token)
        spilled = True
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, size)
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except BaseException:
        free(name)
        raise
    finally:
        os.close(fd)
    return StoredSegment(name, size, mm, node.shm_prefix, spilled, capacity // 4)


#: Below this many bytes a buffer is copied by the calling thread alone.
_PARALLEL_COPY_MIN = 8 << 20


def copy_into(mm, off, buf, n):
    """Copy the ``n`` bytes of ``buf`` to ``mm[off:]``.

    Large writable buffers (numpy arrays...) are copied in two halves at
    once, by the caller and one helper thread (``ctypes.memmove`` releases
    the GIL): one core rarely saturates the memory bus, which Ray's parallel
    memcopy of large objects relies on too.
    """
    if n < _PARALLEL_COPY_MIN or _CPUS < 2:
        mm[off:off + n] = buf
        return
    try:
        src = (ctypes.c_char * n).from_buffer(buf)
    except (TypeError, ValueError, BufferError):    # read-only or not contiguous
        mm[off:off + n] = buf
        return
    dst = (ctypes.c_char * n).from_buffer(mm, off)
    try:
        d, s_ = ctypes.addressof(dst), ctypes.addressof(src)
        half = (n // 2) & ~4095
        done = _copier().submit(ctypes.memmove, d + half, s_ + half, n - half)
        ctypes.memmove(d, s_, half)
        done.result()
    finally:
        del dst, src       # the exports of both buffers end here


_CPUS = os.cpu_count() or 1
_copier_pool = None


def _copier():
    global _copier_pool
    if _copier_pool is None:
        from concurrent.futures import ThreadPoolExecutor
        # A thread that sleeps on its queue between copies (never spins).
        _copier_pool = ThreadPoolExecutor(1, thread_name_prefix="ray_lite-store-copy")
    return _copier_pool


class StoredSegment:
    """A segment holding one stored object, mapped writable by its owner.

    ``release()`` (the object is freed everywhere: no ref, no reader's view)
    gives it to the pool under a new name, so that a late descriptor of the
    old object can never map the next one's bytes; ``discard()`` unlinks it.

    ``readers_unknown``: the owner took back the share of a reader that died
    (``ObjectsMixin.release_dead_holder``), the part it may have passed on
    to a third process included, so the count can end while that process
    still reads the object.  Such a segment is only unlinked when freed:
    never reused for the next object nor emptied, so what that process
    mapped keeps its bytes (the kernel frees them with its last mapping).
    """

    __slots__ = ("name", "size", "mm", "prefix", "spilled", "offsets", "file_size", "pool_cap",
                 "readers_unknown")

    def __init__(self, name, size, mm, prefix, spilled, pool_cap):
        self.name = name
        self.pool_cap = pool_cap
        self.size = size
        self.file_size = size
        self.mm = mm
        self.prefix = prefix
        self.spilled = spilled
        self.offsets = ()
        self.readers_unknown = False

    def release(self):
        if self.spilled or self.readers_unknown or not _pool.give(self):
            self.discard()

    def discard(self):
        mm, self.mm = self.mm, None
        if mm is not None and not self.readers_unknown:
            # Readers keep an idle mapping of a segment for its next object
            # (``map_segment``): its pages are freed here, not when the last
            # of them unmaps it.  Nothing reads them any more: no ref or view
            # of the object is left (the dead-owner path only unlinks).
            try:
                mm.madvise(mmap.MADV_REMOVE)
            except (OSError, ValueError, AttributeError):
                pass
        free(self.name)
        if mm is not None:
            try:
                mm.close()
            except BufferError:     # a view of it is still out: the GC unmaps it
                pass


class SegmentPool:
    """The free segments of this process, mapped and touched, ready for reuse.

    Named ``<runtime prefix>p<pid>_<random>`` while free: not an object (the
    store's listing and capacity ignore them), removed by the runtime's
    shutdown and, for a dead process, by ``release_dead_owner``.  At most
    ``MAX_SEGMENTS`` segments, together at most a quarter of the capacity,
    are kept (the oldest goes first: kept memory is resident memory); a
    segment is reused for an object of at least half its size.  Nothing
    trims an idle pool: its segments go at shutdown or when a new object
    needs their room.
    """

    MAX_SEGMENTS = 2

    def __init__(self):
        self._free = []             # StoredSegment, most recently freed last
        self._lock = threading.Lock()

    def take(self, node, size, name):
        """A free segment for ``size`` bytes, renamed ``name``; None when none fits."""
        with self._lock:
            best = None
            for seg in self._free:
                if seg.prefix == node.shm_prefix and size <= seg.file_size < 2 * size + 4096 \
                        and (best is None or seg.file_size < best.file_size):
                    best = seg
            if best is None:
                return None
            self._free.remove(best)
        try:
            os.rename(shm.segment_path(best.name), shm.segment_path(name))
        except OSError:             # removed under us (the runtime shut down)
            best.discard()
            return None
        best.name = name
        return best

    def give(self, seg):
        """Keep ``seg`` for reuse; False when the pool has no room for it."""
        if seg.mm is None:
            return False
        cap = seg.pool_cap
        with self._lock:
            kept = sum(s.file_size for s in self._free)
            if seg.file_size > cap:
                return False
            evicted = []
            while self._free and (len(self._free) >= self.MAX_SEGMENTS
                                  or kept + seg.file_size > cap):
                old = self._free.pop(0)
                kept -= old.file_size
                evicted.append(old)
            name = f"{seg.prefix}p{os.getpid()}_{os.urandom(8).hex()}"
            try:
                os.rename(shm.segment_path(seg.name), shm.segment_path(name))
            except OSError:
                self._free.extend(evicted)
                return False
            seg.name = name
            self._free.append(seg)
        for old in evicted:
            old.discard()
        return True

    def clear(self, unlink=True):
        """Drop every free segment (the runtime's shutdown; room for a new object)."""
        with self._lock:
            segs, self._free = self._free, []
        for seg in segs:
            if unlink:
                seg.discard()

    def bytes_kept(self):
        with self._lock:
            return sum(s.file_size for s in self._free)


_pool = SegmentPool()
# A forked child owns none of its parent's free segments.
os.register_at_fork(after_in_child=lambda: _pool.clear(unlink=False))


def clear_pool():
    """Unlink and unmap this process's free segments, and unmap its idle read
    mappings (the runtime's shutdown: what it unlinked is not pinned here)."""
    _pool.clear()
    _drop_idle_mappings()


def _room(directory):
    """Bytes free for us in the file system of ``directory``."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize


def _path_of(name):
    # A spilled object's name is the path of its file; others are /dev/shm names.
    return name if "/" in name else shm.segment_path(name)


def views_of(buf, offsets, sizes):
    """Read-only byte views of the buffers of a mapped segment (arrays decoded over them are read-only)."""
    whole = memoryview(buf)
    if whole.format != "B":
        whole = whole.cast("B")
    if not whole.readonly:
        whole = whole.toreadonly()
    return [whole[off:off + n] for off, n in zip(offsets, sizes)]


def map_segment(name, size):
    """A read-only *window* on a stored object's segment; ``ObjectLostError`` when it is gone.

    The window is a buffer over this process's one mapping of the segment
    file (``_Mapping``): views of it keep it alive, and a
    ``weakref.finalize`` on it tells when the last of them is gone.  The
    mapping itself outlives the window: the next object its owner writes
    into the same (pooled) segment is read through the page tables this
    process filled already, instead of faulting in every page of a new
    mapping again (a fresh map of 100 MB costs more than reading it).
    """
    path = _path_of(name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ObjectLostError(
            f"stored object {name!r} is gone (its owner freed it or died)") from None
    try:
        st = os.fstat(fd)
        if st.st_size < size:
            raise ObjectLostError(f"stored object {name!r} is truncated")
        # The file's identity, not its name: a pooled segment changes its
        # name with each object.  Sound while mapped: a mapped inode lives on.
        key = (st.st_dev, st.st_ino)
        with _mappings_lock:
            m = _mappings.get(key)
            if m is not None and m.length >= size:
                _idle.pop(key, None)        # first: what is idle has no window
                m.windows += 1
                m.path = path
            else:
                m = None
        if m is None:
            m = _Mapping(fd, st.st_size, key, path)
            with _mappings_lock:
                if key not in _mappings:        # else one in use stays; this one is private
                    _mappings[key] = m
    finally:
        os.close(fd)
    window = m.window_type.from_address(m.addr)
    weakref.finalize(window, m.window_closed).atexit = False
    return window


def _size_class(n):
    """``n`` rounded up to one of 8 steps per power of two (a mapping's length:
    ctypes keeps a type per array length for good, so lengths must be few)."""
    if n <= 4096:
        return 4096
    step = 1 << max(n.bit_length() - 4, 12)
    return (n + step - 1) // step * step


class _Mapping:
    """This process's read-only mapping of one segment file, shared by the
    windows ``map_segment`` gives out over it.  Unmapped only when no window
    is left and more than ``MAX_IDLE_MAPPINGS`` idle ones are kept (the
    least recently used goes first).  An idle mapping keeps a file's pages
    only until its owner discards it: ``StoredSegment.discard`` frees them
    first; the driver drops those of a dead owner's segments when it unlinks
    them (``release_dead_owner``)."""

    __slots__ = ("key", "addr", "length", "window_type", "windows", "path")

    def __init__(self, fd, file_size, key, path):
        length = _size_class(file_size)     # past the file's end: never read, costs nothing
        addr = _libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr is None or addr == _MAP_FAILED:
            err = ctypes.get_errno()
            raise OSError(err, f"mmap: {os.strerror(err)}")
        self.key = key
        self.addr = addr
        self.length = file_size
        self.window_type = ctypes.c_ubyte * length
        self.windows = 1
        self.path = path        # the last name it was mapped by (a pooled segment's changes)

    def window_closed(self):
        with _mappings_lock:
            self.windows -= 1
            if self.windows:
                return
            if _mappings.get(self.key) is not self:
                self._unmap()
                return
            _idle[self.key] = self
            while len(_idle) > MAX_IDLE_MAPPINGS:
                _idle[next(iter(_idle))].evict()

    def evict(self):
        """Forget and unmap this idle mapping (under the lock).  Written to
        bear a finalizer running inside it (a collection may start at any
        allocation): every step checks what it undoes."""
        _idle.pop(self.key, None)
        if _mappings.get(self.key) is self:
            del _mappings[self.key]
        self._unmap()

    def _unmap(self):
        addr, self.addr = self.addr, None
        if addr is not None:
            _libc.munmap(addr, ctypes.sizeof(self.window_type))


#: Mappings with no window kept by a process for the next object in their segment.
MAX_IDLE_MAPPINGS = 2
_mappings = {}          # (st_dev, st_ino) -> _Mapping
_idle = {}              # the idle ones, least recently used first
# Reentrant: a window's finalizer may run in a collection inside a locked block.
_mappings_lock = threading.RLock()
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long)
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_MAP_FAILED = ctypes.c_void_p(-1).value


def _drop_idle_mappings():
    with _mappings_lock:
        while _idle:
            _idle[next(iter(_idle))].evict()


def drop_unlinked_idle_mappings():
    """Unmap the idle mappings whose file is no longer where it was last
    mapped from (unlinked: its owner died), so that its pages go now rather
    than whenever the mapping would be evicted."""
    with _mappings_lock:
        for key, m in list(_idle.items()):
            try:
                st = os.stat(m.path)
                gone = (st.st_dev, st.st_ino) != key
            except OSError:
                gone = True
            if gone and _idle.get(key) is m:
                m.evict()


def _lock_after_fork():
    # The child's copy of the lock may be held by a thread that is not there.
    global _mappings_lock
    _mappings_lock = threading.RLock()


os.register_at_fork(after_in_child=_lock_after_fork)


def cached_mappings():
    """``(mapped, idle)``: how many segment files this process maps (tests)."""
    with _mappings_lock:
        return len(_mappings), len(_idle)


def free(name):
    """Unlink a stored object's segment (readers' mappings stay valid)."""
    try:
        os.unlink(_path_of(name))
    except (OSError, ValueError):
        pass


def release_dead_owner(node, pid):
    """Unlink the stored objects owned by the dead process ``pid``.

    Readers that mapped them keep their views; later readers get
    ``ObjectLostError`` (the owner is gone, as in Ray).
    """
    for tag in ("o", "p", "q"):  # its objects, the free segments of its pool, its queue rings
        for name in shm.list_segments(f"{node.shm_prefix}{tag}{pid}_"):
            free(name)
    drop_unlinked_idle_mappings()   # pages of what was just unlinked: not kept here
    spill = spill_dir(node)
    try:
        spilled = os.listdir(spill)
    except OSError:
        return
    for entry in spilled:
        if entry.startswith(f"o{pid}_"):
            free(os.path.join(spill, entry))

