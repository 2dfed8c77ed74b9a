"""Stored objects as refs see them: the entries of the shared-memory object store.

The owner's ``_StoredEntry`` (its segment, released to the store's pool once
no ref or view of it is left anywhere), a reader's ``_MappedEntry`` (its
mapping; its share of the owner's count goes back when the mapping dies),
and how values take that path: ``put`` (``frozen_entry``), large
arguments passed by value (``refs.stored_by_value``), a task's large result
(``refs.stored_result``, mapped by the caller with ``loaded``), a large value
first sent elsewhere (``stored_form``).  See ``object_store.py``.
``refs`` re-exports these names (and adds ``stored_result`` and
``stored_by_value``, which make ``ObjectRef``s).
"""
import threading
import weakref

from ray_lite.exceptions import ObjectLostError

from . import object_store

from ..process import state
from .entries import (_Entry, _FrozenEntry, _IMMUTABLE, _PrivateEntry, _give_weight_back, _local, freeze,
                      ready_entry, error_entry, stored_forms, unshared_value)


class _StoredEntry(_FrozenEntry):
    """What ``put`` stores for a large value: its buffers live in a segment of
    the object store (``object_store.py``), which this entry owns; a ref to it
    travels as the descriptor ``desc``.

    The segment goes back to the store (its pool) once the entry is gone and
    so are the views this process decoded from it (``get`` maps the segment
    read-only on first use; that mapping dies with the last view): readers
    elsewhere hold weight until their own views are gone.
    """

    __slots__ = ("desc", "_seg", "_views", "_lease")

    def __init__(self, node, frame, oob):
        seg = object_store.write_segment(node, frame, oob)
        self.ready = True
        self.error = None
        self.callbacks = None
        self.peer = None
        self.frame = frame
        self.refs = None
        self._seg = seg
        self._views = None
        self._lease = _Lease(seg)
        self.desc = (seg.name, seg.size, seg.offsets, [b.nbytes for b in oob], len(frame))

    @property
    def value(self):
        views = self._views
        if views is None:
            views = self._views = self._map_views()
        from ray_lite._fast import codec
        return codec.decode(self.frame, views)     # no refs inside: nothing to thaw

    def _map_views(self):
        name, size, offsets, sizes, _ = self.desc
        window = object_store.map_segment(name, size)
        lease = self._lease
        with _lease_lock:
            lease.holders += 1
        weakref.finalize(window, lease.drop).atexit = False
        return object_store.views_of(window, offsets, sizes)

    def __del__(self):
        lease = getattr(self, "_lease", None)
        if lease is not None:
            lease.drop()


class _Lease:
    """Who still uses a stored segment in its owner: the entry, and the read
    mapping of the owner's own views; the last to go releases the segment."""

    __slots__ = ("seg", "holders")

    def __init__(self, seg):
        self.seg = seg
        self.holders = 1

    def drop(self):
        with _lease_lock:
            self.holders -= 1
            if self.holders:
                return
            seg, self.seg = self.seg, None
        if seg is not None:
            seg.release()


_lease_lock = threading.RLock()


class _MapHold:
    """A reader's share of the owner's count for one stored object: given
    back when the reader's mapping dies, i.e. when its entry and every view
    decoded from it are gone (the owner must not reuse the segment before)."""

    __slots__ = ("oid", "owner", "weight", "node")

    def __init__(self, oid, owner, node):
        self.oid = oid
        self.owner = owner
        self.weight = 0
        self.node = node


class _MappedEntry(_FrozenEntry):
    """A stored object another process owns, mapped read-only here.

    ``weight`` is this process's share of the owner's count: the owner keeps
    the segment while any is out; it goes back when the mapping dies (the
    entry and every view of it are gone).
    """

    __slots__ = ("desc", "oid", "owner", "hold")

    def __init__(self, oid, owner, desc, node):
        name, size, offsets, sizes, frame_len = desc
        window = object_store.map_segment(name, size)
        views = object_store.views_of(window, [*offsets, size - frame_len], [*sizes, frame_len])
        frame = views.pop()
        _FrozenEntry.__init__(self, frame, views, None)
        self.desc = desc
        self.oid = oid
        self.owner = owner
        hold = self.hold = _MapHold(oid, owner, node)
        weakref.finalize(window, _give_weight_back, hold).atexit = False

    @property
    def weight(self):
        return self.hold.weight

    @weight.setter
    def weight(self, w):
        self.hold.weight = w


# A large ready value this process owns (a task's result, an immutable put)
# -> the _StoredEntry it travels as: stored on its first trip out, once.
_promoted = stored_forms
_promote_lock = threading.Lock()


def stored_form(ref):
    """The stored entry a ready ``ref`` travels as, or None when it travels with its value.

    A large value that this process owns but did not store yet (the result
    of a task, which arrived through the ring) is stored on its first trip to
    another process: the one copy the ring would make, made once for every
    later reader.  Values of other owners are never stored here (their owner
    decides when they are freed).
    """
    e = ref._e
    t = type(e)
    if t is _StoredEntry or t is _MappedEntry:
        return e
    if (t is not _Entry and t is not _PrivateEntry) or e.error is not None:
        return None
    stored = _promoted.get(e)
    if stored is not None:
        return stored
    value = e.value if t is _Entry else unshared_value(e)
    if not _is_large(value):
        return None
    node = state.node
    if node is None or ref._owner != node.id:
        return None
    with _promote_lock:
        stored = _promoted.get(e)
        if stored is None:
            stored = _store_value(node, value)
            if stored is not None:
                _promoted[e] = stored
    return stored


def _is_large(value):
    """A cheap look: is ``value`` one large buffer (numpy array, tensor, bytes-like)?"""
    vt = type(value)
    if vt in _IMMUTABLE and vt is not bytes:
        return False
    if hasattr(vt, "nbytes"):          # numpy arrays, memoryviews, tensors
        n = value.nbytes
    elif vt is bytes or vt is bytearray:
        n = len(value)
    else:
        return False
    return type(n) is int and n >= object_store.STORE_THRESHOLD


def loaded(ok, payload):
    """``(ok, value, mapped entry)`` of a reply whose payload is a stored
    value (``LoadedValue``): mapped, decoded; the entry is None when it failed."""
    mapped = payload.entry()
    if not ok:
        return ok, payload, None
    if mapped.error is not None:
        return False, mapped.error, None
    return True, mapped.value, mapped


def adopt_stored(entry, mapped):
    """``entry`` (this process's, a result) holds a value decoded from the
    stored object ``mapped``: a ref to it travels as that object's
    descriptor, so readers map the producer's one copy (no second store)."""
    if (type(entry) is _Entry or type(entry) is _PrivateEntry) and type(mapped) is _MappedEntry:
        with _promote_lock:
            _promoted[entry] = mapped


def _store_value(node, value):
    """A _StoredEntry holding ``value``, or None when it cannot be stored (it then travels as it did)."""
    from ray_lite._fast import codec
    outer = getattr(_local, "freezing", None)
    refs = _local.freezing = []
    try:
        buf, end, oob = codec.encode_growing(value, bytearray(4096), codec.OOB_THRESHOLD,
                                             readonly_arrays=True)
        if refs or sum(b.nbytes for b in oob) < object_store.STORE_THRESHOLD:
            return None
        return _StoredEntry(node, bytes(memoryview(buf)[:end]), oob)
    except Exception:       # noqa: BLE001 - full store, unserialisable: the old path says why
        return None
    finally:
        _local.freezing = outer


class StoredValue:
    """The value of a stored object in a message (a fetch's answer): it
    travels as the object's descriptor and arrives as ``LoadedValue``."""

    __slots__ = ("ref",)

    def __init__(self, ref):
        self.ref = ref

    def __reduce__(self):
        return (LoadedValue, (self.ref,))


class LoadedValue:
    """A fetched stored object, mapped on arrival: ``entry()`` is its mapped
    entry (an error entry with ``ObjectLostError`` when it could not be mapped)."""

    __slots__ = ("ref",)

    def __init__(self, ref):
        self.ref = ref

    def entry(self):
        return self.ref._e


def travels_as_value(ref):
    """True when a call may inline the value of the ready ``ref`` (stored objects travel as descriptors)."""
    return stored_form(ref) is None


def map_stored(oid, owner, desc, node):
    """The entry of a stored object received from another process (an error entry when it is gone)."""
    try:
        return _MappedEntry(oid, owner, desc, node)
    except (OSError, ValueError, ObjectLostError) as exc:
        if not isinstance(exc, ObjectLostError):
            exc = ObjectLostError(f"cannot map stored object {oid:x}: {exc}", oid)
        return error_entry(exc)




def frozen_entry(value):
    """The entry ``put`` stores for ``value``: the value itself if immutable, else a snapshot."""
    if type(value) in _IMMUTABLE:
        return ready_entry(value)
    frame, oob, refs = freeze(value)
    if oob and not refs and sum(b.nbytes for b in oob) >= object_store.STORE_THRESHOLD:
        node = state.node
        if node is not None:
            return _StoredEntry(node, frame, oob)
    # One copy of large buffers (numpy data...), as Ray's put copies into its
    # store; ``get`` then decodes zero-copy views of these read-only bytes.
    return _FrozenEntry(frame, [bytes(b) for b in oob], refs)
