"""``ObjectRef`` and ``ObjectRefGenerator``.

An ``ObjectRef`` points to a shared ``_Entry``: the slot that the owner fills
when the value (or error) arrives.  ``get`` on a ready ref is therefore an
attribute read, with no look-up and no message; the object is freed when the
last ref to its entry is gone (plain Python reference counting), except for
entries exported to other processes (see ``Node.export``).

An ``ObjectRefGenerator`` holds the owner's ``StreamTable`` for one stream:
the owner records a report when it reads it off a link, so ``next()`` on a
reported item is a table look-up that returns an already-ready ref.
"""
import threading

from . import state
from ray_lite._fast.stream_table import NOT_READY, StreamTable


class _Entry:
    """The value slot of one object, shared by every ref to it in this process."""

    __slots__ = ("ready", "value", "error", "callbacks", "__weakref__")

    def __init__(self):
        self.ready = False
        self.value = None
        self.error = None
        self.callbacks = None

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
        cbs = self.callbacks
        if cbs:
            self.callbacks = None
            for cb in cbs:
                cb(self)

    def add_callback(self, cb):
        """Call ``cb(entry)`` once the entry is ready (at once if it is)."""
        if self.ready:
            cb(self)
        elif self.callbacks is None:
            self.callbacks = [cb]
        else:
            self.callbacks.append(cb)


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


class ObjectRef:
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
        e = self._e
        if e.ready:
            # A ready value travels with the ref: the receiver needs no fetch.
            st = (True, e.value) if e.error is None else (False, e.error)
        else:
            st = None
            node = state.node
            if node is not None and self._owner == node.id:
                node.export(self._id, e)
        return (_rebuild_ref, (self._id, self._owner, st))

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
                fut.set_exception(e.error)
        node = state.get_node()
        node.ensure_fetch(self)
        self._e.add_callback(done)
        return fut


def _rebuild_ref(object_id, owner, st):
    node = state.node
    if st is not None:
        e = ready_entry(st[1]) if st[0] else error_entry(st[1])
        return ObjectRef(object_id, owner, e)
    if node is not None:
        if owner == node.id:
            e = node.lookup_owned(object_id)
            if e is not None:
                return ObjectRef(object_id, owner, e)
        return ObjectRef(object_id, owner, node.borrowed_entry(object_id, owner))
    return ObjectRef(object_id, owner, _Entry())


async def _await_ref(ref):
    e = ref._e
    if not e.ready:
        node = state.get_node()
        await node.wait_entry_async(ref)
    if e.error is not None:
        raise e.error
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


class ObjectRefGenerator:
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
        """True when ``next()`` would not wait (an item or the end is reported)."""
        return self._s.table.is_next_ready()

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
