"""``ObjectRef`` and ``ObjectRefGenerator``.

An ``ObjectRef`` points to a shared ``_Entry``: the slot that the owner fills
when the value (or error) arrives.  ``get`` on a ready ref is therefore an
attribute read, with no look-up and no message.

Lifetime: in the process that holds it, an entry lives as long as a ref to it
(plain reference counting).  A ref that leaves its process while its object is
not ready yet carries a *weight* (weighted reference counting): the owner
counts the weight it hands out, a borrower splits its weight when it passes
the ref on (no message to the owner, so no race between a release and a
hand-over), and gives it back when its last ref is gone or when the value
arrived.  The owner forgets the export once every weight came back.  A ready
object travels with its value instead, so it needs no bookkeeping at all.

``put`` stores a serialised snapshot (``_FrozenEntry``): mutating the value
afterwards does not change what ``get`` returns, and each ``get`` returns a
fresh copy (numpy arrays and large buffers: read-only views of the snapshot,
zero-copy), as in Ray.  A large snapshot lives in the shared-memory object
store (``_StoredEntry``; see ``object_store.py``): a ref to it travels as a
descriptor, and every other process maps it (``_MappedEntry``).

An ``ObjectRefGenerator`` holds the owner's ``StreamTable`` for one stream:
the owner records a report when it reads it off a link, so ``next()`` on a
reported item is a table look-up that returns an already-ready ref.
"""
import copy
import threading
import weakref

from ray_lite.exceptions import ObjectLostError

from . import object_store, state
from .backend import AlsoRay
from ray_lite._fast.stream_table import NOT_READY, StreamTable


class _Entry:
    """The value slot of one object, shared by every ref to it in this process."""

    # ``peer``: the process expected to fill it (a hint for the waiting thread).
    __slots__ = ("ready", "value", "error", "callbacks", "peer", "__weakref__")

    def __init__(self, peer=None):
        self.ready = False
        self.value = None
        self.error = None
        self.callbacks = None
        self.peer = peer

    def set_value(self, value):
        if self.ready:
            return
        self.value = value
        self.ready = True
        self._fire()

    def set_error(self, error):
        if self.ready:
            return
        self.error = error
        self.ready = True
        self._fire()

    def _fire(self):
        if self.callbacks:       # a peek without the lock: most entries have none
            with _callbacks_lock:
                cbs, self.callbacks = self.callbacks, None
            if cbs:
                if len(cbs) == 1:
                    cbs[0](self)
                    return
                # One failing callback must not cost the others their call
                # (they may be waiters that would then wait for ever).
                first_error = None
                for cb in cbs:
                    try:
                        cb(self)
                    except BaseException as exc:   # re-raised below
                        if first_error is None:
                            first_error = exc
                if first_error is not None:
                    raise first_error

    def add_callback(self, cb):
        """Call ``cb(entry)`` once the entry is ready (at once if it is).

        Safe against another thread filling the entry meanwhile (the driver's
        service thread, a thread in ``get``): each callback runs exactly once.
        """
        if self.ready:
            cb(self)
            return
        with _callbacks_lock:
            if self.callbacks is None:
                self.callbacks = [cb]
            else:
                self.callbacks.append(cb)
        if self.ready:
            # Filled between our look and the append: its _fire may have
            # missed the callback.  Whichever _fire takes the list runs it.
            self._fire()


_callbacks_lock = threading.Lock()


def raisable(error):
    """A copy of the stored ``error`` to raise, as Ray's ``get`` raises a fresh
    exception each time: raising the stored one would grow its traceback on
    every ``get`` and tie it to the raising frame, whose locals hold the
    entry that holds the error (a reference cycle per failed call)."""
    try:
        return copy.copy(error)
    except Exception:   # noqa: BLE001 - an exception class copy cannot rebuild
        return error.with_traceback(None)


def ready_entry(value):
    e = _Entry()
    e.value = value
    e.ready = True
    return e


def error_entry(error):
    e = _Entry()
    e.error = error
    e.ready = True
    return e


class _BorrowedEntry(_Entry):
    """The entry of an object another process owns, shared by this process's refs.

    ``weight`` is this process's share of the owner's count (see the module
    docstring); it goes back to the owner when the entry dies or is filled.
    """

    __slots__ = ("oid", "owner", "weight", "node")

    def __init__(self, oid, owner, node):
        _Entry.__init__(self, owner)
        self.oid = oid
        self.owner = owner
        self.weight = 0
        self.node = node        # ids are per runtime: never give back to another one

    def __del__(self):
        _give_weight_back(self, None)


def _give_weight_back(entry, as_holder):
    """``__del__`` of an entry holding weight of another owner's object: give it back.

    ``as_holder``: the weight goes as an ``object_store.HolderWeight`` (a
    reader of a stored object also tells the owner it holds nothing any more).
    """
    w = entry.weight
    if w:
        entry.weight = 0
        node = entry.node
        if node is not None and not node.closed:
            # Only queued: __del__ may run inside a send or a drain.
            node.release_later(entry.owner, entry.oid,
                               w if as_holder is None else object_store.HolderWeight(w, False))


# Immutable values that ``put`` can keep by reference (no copy needed).
_IMMUTABLE = frozenset((int, float, complex, str, bytes, bool, type(None), range))
_local = threading.local()


class _FrozenEntry(_Entry):
    """What ``put`` stores: a serialised snapshot, decoded afresh by each ``get``.

    Refs inside the value are kept as refs (they stay alive with the entry)
    instead of being exported: the snapshot never leaves this process.
    """

    __slots__ = ("frame", "buffers", "refs")

    def __init__(self, frame, buffers, refs):
        self.ready = True
        self.error = None
        self.callbacks = None
        self.peer = None
        self.frame = frame
        self.buffers = buffers
        self.refs = refs

    @property
    def value(self):
        from ray_lite._fast import codec
        outer = getattr(_local, "thawing", None)
        _local.thawing = self.refs
        try:
            return codec.decode(self.frame, self.buffers)
        finally:
            _local.thawing = outer


def frozen_entry(value):
    """The entry ``put`` stores for ``value``: the value itself if immutable, else a snapshot."""
    if type(value) in _IMMUTABLE:
        return ready_entry(value)
    from ray_lite._fast import codec
    from ray_lite._fast.errors import BufferTooSmallError
    refs = []
    outer = getattr(_local, "freezing", None)
    _local.freezing = refs
    try:
        buf = bytearray(512)
        while True:
            try:
                end, oob = codec.encode_into(value, buf, 0)
                break
            except BufferTooSmallError as exc:
                buf = bytearray(max(exc.needed, 2 * len(buf)))
                refs.clear()      # the next attempt numbers them again
    finally:
        _local.freezing = outer
    frame = bytes(memoryview(buf)[:end])
    if oob and not refs and sum(b.nbytes for b in oob) >= object_store.STORE_THRESHOLD:
        node = state.node
        if node is not None:
            return _StoredEntry(node, frame, oob)
    # One copy of large buffers (numpy data...), as Ray's put copies into its
    # store; ``get`` then decodes zero-copy views of these read-only bytes.
    return _FrozenEntry(frame, [bytes(b) for b in oob], refs or None)


class _StoredEntry(_FrozenEntry):
    """What ``put`` stores for a large value: its buffers live in a segment of
    the object store (``object_store.py``), which this entry owns and unlinks
    when it dies; a ref to it travels as the descriptor ``desc``."""

    __slots__ = ("desc",)

    def __init__(self, node, frame, oob):
        name, size, mm, offsets = object_store.write_segment(node, frame, oob)
        sizes = [b.nbytes for b in oob]
        _FrozenEntry.__init__(self, frame, object_store.views_of(mm, offsets, sizes), None)
        self.desc = (name, size, offsets, sizes, len(frame))

    def __del__(self):
        try:
            name = self.desc[0]
        except AttributeError:      # __init__ failed: nothing was stored
            return
        object_store.free(name)


class _MappedEntry(_FrozenEntry):
    """A stored object another process owns, mapped read-only here.

    ``weight`` is this process's share of the owner's count: the owner keeps
    the segment's name while any is out; it goes back when the entry dies.
    """

    __slots__ = ("desc", "oid", "owner", "weight", "node")

    def __init__(self, oid, owner, desc, node):
        name, size, offsets, sizes, frame_len = desc
        mm = object_store.map_segment(name, size)
        frame = memoryview(mm)[size - frame_len:size]
        _FrozenEntry.__init__(self, frame, object_store.views_of(mm, offsets, sizes), None)
        self.desc = desc
        self.oid = oid
        self.owner = owner
        self.weight = 0
        self.node = node

    def __del__(self):
        _give_weight_back(self, True)


# A large ready value this process owns (a task's result, an immutable put)
# -> the _StoredEntry it travels as: stored on its first trip out, once.
_promoted = weakref.WeakKeyDictionary()
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
    if t is not _Entry or e.error is not None:
        return None
    value = e.value
    vt = type(value)
    if hasattr(vt, "nbytes"):          # numpy arrays, memoryviews, tensors
        n = value.nbytes
    elif vt is bytes or vt is bytearray:
        n = len(value)
    else:
        return None
    if type(n) is not int or n < object_store.STORE_THRESHOLD:
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


def _store_value(node, value):
    """A _StoredEntry holding ``value``, or None when it cannot be stored (it then travels as it did)."""
    from ray_lite._fast import codec
    outer = getattr(_local, "freezing", None)
    refs = _local.freezing = []
    try:
        buf, end, oob = codec.encode_growing(value, bytearray(4096), codec.OOB_THRESHOLD)
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


def probe_serialisable(value):
    """Raise what serialising ``value`` for another process would raise.

    Refs inside are not lent (the frame is thrown away) and large buffers
    are not copied (they would travel out of band).
    """
    from ray_lite._fast import codec
    from ray_lite._fast.errors import BufferTooSmallError
    outer = getattr(_local, "freezing", None)
    _local.freezing = []
    try:
        buf = getattr(_local, "scratch", None)
        if buf is None:
            buf = _local.scratch = bytearray(4096)
        while True:
            try:
                codec.encode_into(value, buf, 0)
                return
            except BufferTooSmallError as exc:
                buf = bytearray(max(exc.needed, 2 * len(buf)))
                if len(buf) <= 1 << 20:
                    _local.scratch = buf
    finally:
        _local.freezing = outer


def _thawed_ref(index):
    return _local.thawing[index]


class ObjectRef(metaclass=AlsoRay):
    """A reference to an object that a task, an actor call or ``put`` produces.

    Hashable, comparable by id, awaitable in asyncio, and picklable: a ref
    sent to another process (inside arguments, results, ...) still refers to
    the same object, which that process fetches from the owner on ``get``.
    """

    __slots__ = ("_id", "_owner", "_e", "__weakref__")

    def __init__(self, object_id, owner, entry):
        self._id = object_id
        self._owner = owner
        self._e = entry

    @classmethod
    def nil(cls):
        return cls(0, -1, _Entry())

    def is_nil(self):
        return self._id == 0

    def hex(self):
        return f"{self._owner & 0xffffffff:08x}{self._id:016x}"

    def binary(self):
        return bytes.fromhex(self.hex())

    def __hash__(self):
        return hash(self._id)

    def __eq__(self, other):
        return type(other) is ObjectRef and other._id == self._id

    def __ne__(self, other):
        return not self.__eq__(other)

    def __repr__(self):
        return f"ObjectRef({self.hex()})"

    def __reduce__(self):
        frozen = getattr(_local, "freezing", None)
        if frozen is not None:
            # Inside a put: the ref stays a ref, kept alive by the snapshot.
            frozen.append(self)
            return (_thawed_ref, (len(frozen) - 1,))
        e = self._e
        if e.ready:
            stored = stored_form(self)
            if stored is not None:
                node = state.node
                weight = node.lend(self) if node is not None else None
                return (_rebuild_stored_ref, (self._id, self._owner, stored.desc, weight))
            # A ready value travels with the ref: the receiver needs no fetch.
            st = (True, e.value) if e.error is None else (False, e.error)
            return (_rebuild_ref, (self._id, self._owner, st))
        node = state.node
        weight = node.lend(self) if node is not None else None
        return (_rebuild_ref, (self._id, self._owner, None, weight))

    def __await__(self):
        return _await_ref(self).__await__()

    def future(self):
        """A ``concurrent.futures.Future`` completed when the object is ready."""
        import concurrent.futures
        fut = concurrent.futures.Future()

        def done(e):
            if e.error is None:
                fut.set_result(e.value)
            else:
                fut.set_exception(raisable(e.error))
        node = state.get_node()
        node.ensure_fetch(self)
        self._e.add_callback(done)
        return fut


def _rebuild_ref(object_id, owner, st, weight=None):
    if st is not None:
        e = ready_entry(st[1]) if st[0] else error_entry(st[1])
        return ObjectRef(object_id, owner, e)
    node = state.node
    if node is None:
        return ObjectRef(object_id, owner, _Entry())
    return ObjectRef(object_id, owner, node.receive_ref(object_id, owner, weight))


def _rebuild_stored_ref(object_id, owner, desc, weight):
    node = state.node
    if node is None:
        return ObjectRef(object_id, owner, map_stored(object_id, owner, desc, None))
    return ObjectRef(object_id, owner, node.receive_stored(object_id, owner, desc, weight))


async def _await_ref(ref):
    e = ref._e
    if not e.ready:
        node = state.get_node()
        await node.wait_entry_async(ref)
    if e.error is not None:
        raise raisable(e.error)
    return e.value


class _StreamState:
    """Owner-side state of one stream: its table and who produces it."""

    __slots__ = ("sid", "table", "peer", "done", "completed", "bp", "acked", "waiter",
                 "cancelled", "name", "released", "__weakref__")

    def __init__(self, sid, peer, bp, name):
        self.sid = sid
        self.table = StreamTable()
        self.peer = peer
        self.done = False
        self.completed = _Entry()
        self.bp = bp
        self.acked = 0
        self.waiter = None      # a callable woken when a report or the end arrives
        self.cancelled = False
        self.name = name
        self.released = False   # the generator object is gone: items are dropped


class ObjectRefGenerator(metaclass=AlsoRay):
    """What a generator task or method returns: an iterator of ``ObjectRef``.

    ``next()`` returns the ref of the next item as soon as its report has been
    read by this process (a look-up when it already was); iteration ends with
    ``StopIteration``.  An error at item k is raised by ``get`` on the k-th
    ref, after which the iteration stops.
    """

    __slots__ = ("_s", "__weakref__")

    def __init__(self, stream_state):
        self._s = stream_state

    def __iter__(self):
        return self

    def __next__(self):
        s = self._s
        item = s.table.try_next()  # raises StopIteration at the end
        if item is NOT_READY:
            item = state.get_node().next_item(s, None)
        if s.bp > 0:
            state.node.ack_stream(s)
        return item

    def _next_sync(self, timeout_s=None):
        """The next ref, waiting at most ``timeout_s``; a nil ref on timeout."""
        s = self._s
        item = s.table.try_next()
        if item is NOT_READY:
            item = state.get_node().next_item(s, timeout_s)
            if item is NOT_READY:
                return ObjectRef.nil()
        if s.bp > 0:
            state.node.ack_stream(s)
        return item

    def __aiter__(self):
        return self

    async def __anext__(self):
        s = self._s
        try:
            item = s.table.try_next()
        except StopIteration:
            raise StopAsyncIteration from None
        if item is NOT_READY:
            item = await state.get_node().next_item_async(s)
        if s.bp > 0:
            state.node.ack_stream(s)
        return item

    def completed(self):
        """A ref that becomes ready when the stream has ended."""
        s = self._s
        return ObjectRef(s.sid, state.node.id if state.node else -1, s.completed)

    def next_ready(self):
        """True when the next item is reported (``next()`` returns it at once);
        False while it is not, and once the stream is exhausted (as in Ray:
        ``is_finished()`` says that)."""
        table = self._s.table
        return table.is_next_ready() and not table.is_finished()

    def is_finished(self):
        """True when the end is known and every item was taken."""
        return self._s.table.is_finished()

    def __repr__(self):
        return f"ObjectRefGenerator({self._s.sid:016x})"

    def __del__(self):
        s = getattr(self, "_s", None)
        node = state.node
        if s is not None and not s.done and node is not None:
            # Not sent from here: __del__ may run inside a send on this thread.
            node.defer_stream_release(s)


_main_thread_id = threading.main_thread().ident
