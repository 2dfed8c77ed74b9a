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
import threading

from ..process import state
from ..process.backend import AlsoRay
from ..process.ids import JOB_ID_HEX, JobID, TaskID, task_id_hex
from ray_lite._fast.stream_table import NOT_READY, StreamTable
from .entries import (_BorrowedEntry, _Entry, _FrozenEntry, _IMMUTABLE,  # noqa: F401
                      _give_weight_back, _local, error_entry, raisable, ready_entry,
                      result_entry)
from .stored import (LoadedValue, StoredValue, _MappedEntry, _StoredEntry,  # noqa: F401
                     _is_large, _store_value, adopt_stored, frozen_entry, loaded, map_stored,
                     stored_form, travels_as_value)


def probe_serialisable(value):
    """Raise what serialising ``value`` for another process would raise.

    Refs inside are not lent (the frame is thrown away) and large buffers
    are not copied (they would travel out of band): returns their bytes.
    """
    from ray_lite._fast import codec
    from ray_lite._fast.errors import BufferTooSmallError
    with not_lending():
        buf = getattr(_local, "scratch", None)
        if buf is None:
            buf = _local.scratch = bytearray(4096)
        while True:
            try:
                _, oob = codec.encode_into(value, buf, 0)
                return sum(b.nbytes for b in oob) if oob else 0
            except BufferTooSmallError as exc:
                buf = bytearray(max(exc.needed, 2 * len(buf)))
                if len(buf) <= 1 << 20:
                    _local.scratch = buf


class pinning_refs:
    """``with pinning_refs(): blob = cloudpickle.dumps(fn)`` for a blob that
    may be loaded any number of times (a function shipped to every worker,
    a pool's function): a share of a ref's count can be given once, so the
    refs inside (an actor handle a function captured, say) are pinned in
    this process until it ends instead, as Ray pins what a remote function
    captures."""

    def __enter__(self):
        self.outer = getattr(_local, "pinning", False)
        _local.pinning = True
        return self

    def __exit__(self, *exc):
        _local.pinning = self.outer


class not_lending:
    """``with not_lending(): cloudpickle.dumps(x)`` for bytes that are thrown
    away (a probe of serialisability): the refs inside lend nothing."""

    def __enter__(self):
        self.outer = getattr(_local, "freezing", None)
        _local.freezing = []
        return self

    def __exit__(self, *exc):
        _local.freezing = self.outer


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

    def task_id(self):
        """The ``TaskID`` of the call that made this object (as that call's
        ``get_runtime_context().task_id``)."""
        return TaskID.from_hex(task_id_hex(self._id))

    def job_id(self):
        return JobID.from_hex(JOB_ID_HEX)

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
                return (_rebuild_stored_ref, (self._id, self._owner, stored.desc, self._lend()))
            # A ready value travels with the ref: the receiver needs no fetch.
            st = (True, e.value) if e.error is None else (False, e.error)
            return (_rebuild_ref, (self._id, self._owner, st))
        return (_rebuild_ref, (self._id, self._owner, None, self._lend()))

    def _lend(self):
        """The share of the count that goes with this ref to another process."""
        node = state.node
        if node is None:
            return None
        if getattr(_local, "pinning", False):
            # In a blob that may be loaded any number of times (see
            # pinning_refs): no share to split, the object is kept here.
            node.objects.pinned_refs[self._id] = self     # once, however many blobs
            return None
        return node.objects.lend(self)

    def __await__(self):
        return _await_ref(self).__await__()

    def as_future(self):
        """An ``asyncio.Future`` of the running loop, done when the object is
        ready (Ray's; ``await ref`` is the same without the Future)."""
        import asyncio
        return asyncio.ensure_future(_await_ref(self))

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
        node.objects.ensure_fetch(self)
        self._e.add_callback(done)
        return fut


def _rebuild_ref(object_id, owner, st, weight=None):
    if st is not None:
        e = result_entry(st[1]) if st[0] else error_entry(st[1])
        return ObjectRef(object_id, owner, e)
    node = state.node
    if node is None:
        return ObjectRef(object_id, owner, _Entry())
    return ObjectRef(object_id, owner, node.objects.receive_ref(object_id, owner, weight))


def _rebuild_stored_ref(object_id, owner, desc, weight):
    node = state.node
    if node is None:
        return ObjectRef(object_id, owner, map_stored(object_id, owner, desc, None))
    return ObjectRef(object_id, owner, node.objects.receive_stored(object_id, owner, desc, weight))


async def _await_ref(ref):
    e = ref._e
    if not e.ready:
        node = state.get_node()
        await node.bridges.wait_entry_async(ref)
    if e.error is not None:
        raise raisable(e.error)
    return e.value


class _StreamState:
    """Owner-side state of one stream: its table and who produces it."""

    __slots__ = ("sid", "table", "peer", "done", "completed", "bp", "acked", "ack_every",
                 "waiter", "cancelled", "name", "released", "__weakref__")

    def __init__(self, sid, peer, bp, name):
        self.sid = sid
        self.table = StreamTable()
        self.peer = peer
        self.done = False
        self.completed = _Entry()
        self.bp = bp
        self.acked = 0
        # Consumption is acknowledged every half window (and before a wait:
        # see Streams.next_item), not per item: an ack per item was a ring
        # message, and often a wake-up of the producer, per item.
        self.ack_every = max(1, bp // 2)
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
            item = state.get_node().streams.next_item(s, None)
        if s.bp > 0:
            state.node.streams.ack_stream(s)
        return item

    def _next_sync(self, timeout_s=None):
        """The next ref, waiting at most ``timeout_s``; a nil ref on timeout."""
        s = self._s
        item = s.table.try_next()
        if item is NOT_READY:
            item = state.get_node().streams.next_item(s, timeout_s)
            if item is NOT_READY:
                return ObjectRef.nil()
        if s.bp > 0:
            state.node.streams.ack_stream(s)
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
            item = await state.get_node().streams.next_item_async(s)
        if s.bp > 0:
            state.node.streams.ack_stream(s)
        return item

    def completed(self):
        """A ref that becomes ready when the stream has ended."""
        s = self._s
        return ObjectRef(s.sid, state.node.id if state.node else -1, s.completed)

    def next_ready(self):
        """True when the next item is reported (``next()`` returns it at once);
        False while it is not, and once the stream is exhausted (as in Ray:
        ``is_finished()`` says that)."""
        s = self._s
        table = s.table
        if table.is_next_ready():
            return not table.is_finished()
        if s.bp > 0 and state.node is not None:
            state.node.streams.flush_stream_acks(s)     # a poll may precede a wait
        return False

    def is_finished(self):
        """True when the end is known and every item was taken."""
        return self._s.table.is_finished()

    def __repr__(self):
        return f"ObjectRefGenerator({self._s.sid:016x})"

    def __reduce__(self):
        # The stream lives in the process that made the call, as in Ray.
        raise TypeError("an ObjectRefGenerator cannot be passed to another task or actor, "
                        "nor pickled (as in Ray): pass the refs it gives, or a list of them")

    def __del__(self):
        s = getattr(self, "_s", None)
        node = state.node
        if s is not None and not s.done and node is not None:
            # Not sent from here: __del__ may run inside a send on this thread.
            node.streams.defer_stream_release(s)


_main_thread_id = threading.main_thread().ident
_NEVER_STORED = _IMMUTABLE - {bytes}    # a look before _is_large's: most results are these


def stored_result(value):
    """What a worker replies for a task's return ``value``: a large one is
    stored here, by its producer, once (a segment of this process's pool,
    warm after the first), and the reply carries its descriptor; the caller
    maps it (``loaded``).  Anything else is returned as is."""
    if type(value) in _NEVER_STORED or not _is_large(value):
        return value
    node = state.node
    if node is None:
        return value
    stored = _store_value(node, value)
    if stored is None:
        return value
    return StoredValue(ObjectRef(node.new_oid(), node.id, stored))


def stored_by_value(node, values):
    """``values`` (arguments passed by value) with each large one stored.

    A value whose out-of-band buffers reach ``STORE_THRESHOLD`` goes into the
    object store, once, and the call carries a ref to it, which the worker
    resolves as any ref argument: it maps the one copy (read-only arrays, as
    Ray's large arguments are), and the segment returns to its owner's pool
    when the worker has dropped it.  Others (small, or holding refs) stay.
    """
    out = []
    for a in values:
        if type(a) is not ObjectRef and type(a) not in _IMMUTABLE:
            e = frozen_entry(a)
            if type(e) is _StoredEntry:
                a = ObjectRef(node.new_oid(), node.id, e)
        out.append(a)
    return out
