"""The value slots behind ``ObjectRef``s (see ``refs.py``).

One ``_Entry`` per object in a process, shared by every ref to it there;
``_BorrowedEntry`` for an object another process owns (with its share of
the owner's count); ``_FrozenEntry`` for what ``put`` keeps (a snapshot
decoded afresh by each ``get``).  The store's entries (``stored.py``)
subclass these.

Objects are immutable, as Ray's are: a ``get`` never returns an object that
an earlier ``get`` (or a task given the ref) returned.  A result whose value
is of an immutable type keeps it as it is.  Any other result is filled into
an entry of the "private copies" form (``keep_private``): the first read
takes the decoded value itself (nobody else has it yet) and leaves an
encoded snapshot behind; every later read decodes its own copy of that.
The first ``get`` of a result, the common case, so costs no copy at all.
"""
import copy
import threading
import weakref


# How many entries were failed in this process so far: a get of many refs
# looks among them for a failed one only when this has moved (it raises the
# first error it finds without waiting for the others, as Ray's does).  A
# lost increment between two threads still moves it.
failures = [0]


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
        failures[0] += 1
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
        _give_weight_back(self)


class HolderWeight:
    """A change of the weight a borrower holds, reported to the owner
    (``Objects._on_holder_report``), so that the owner can take back
    itself what a borrower held when it died: ``HELD`` "I received it",
    ``PASSED_ON`` "I passed it on to another process" (the receiver reports
    it as ``HELD``), ``GIVEN_BACK`` "I give it back" (the owner's count goes
    down).  Every share a borrower's entry holds was reported ``HELD``."""

    __slots__ = ("weight", "kind")

    HELD, PASSED_ON, GIVEN_BACK = 0, 1, 2

    def __init__(self, weight, kind):
        self.weight = weight
        self.kind = kind


def _give_weight_back(entry):
    """``__del__`` of an entry holding weight of another owner's object: give it back."""
    w = entry.weight
    if w:
        entry.weight = 0
        node = entry.node
        if node is not None and not node.closed:
            # Only queued: __del__ may run inside a send or a drain.
            node.objects.release_later(entry.owner, entry.oid,
                               HolderWeight(w, HolderWeight.GIVEN_BACK))


# Immutable values that ``put`` and results keep by reference (no copy needed).
_IMMUTABLE = frozenset((int, float, complex, str, bytes, bool, type(None), range))
_local = threading.local()


def freeze(value):
    """``(frame, buffers, refs)``: ``value`` encoded, decodable any number of
    times by ``thaw``.  Refs inside stay refs (kept in ``refs``, alive with the
    snapshot) instead of being exported: a snapshot never leaves this process.
    ``buffers`` are views of the value's large buffers (numpy data...): the
    caller copies what could still change."""
    from ray_lite._fast import codec
    from ray_lite._fast.errors import BufferTooSmallError
    refs = []
    outer = getattr(_local, "freezing", None)
    _local.freezing = refs
    try:
        buf = bytearray(512)
        while True:
            try:
                end, oob = codec.encode_into(value, buf, 0, readonly_arrays=True)
                break
            except BufferTooSmallError as exc:
                buf = bytearray(max(exc.needed, 2 * len(buf)))
                refs.clear()      # the next attempt numbers them again
    finally:
        _local.freezing = outer
    return bytes(memoryview(buf)[:end]), oob, refs or None


def thaw(frame, buffers, refs):
    """A new copy of the value ``freeze`` encoded."""
    from ray_lite._fast import codec
    outer = getattr(_local, "thawing", None)
    _local.thawing = refs
    try:
        return codec.decode(frame, buffers)
    finally:
        _local.thawing = outer


class _Snapshot:
    """The value of a private-copies entry once its first read took the value
    itself: an encoded snapshot, or the stored object the value was decoded
    from (``source``, decoded again zero-copy)."""

    __slots__ = ("frame", "buffers", "refs", "source")

    def __init__(self, frame, buffers, refs, source=None):
        self.frame = frame
        self.buffers = buffers
        self.refs = refs
        self.source = source

    def copy(self):
        if self.source is not None:
            return self.source.value
        return thaw(self.frame, self.buffers, self.refs)


# The slot ``_Entry.value`` itself (private-copies entries hide it behind a property).
_value_slot = _Entry.__dict__["value"]
_hand_out_lock = threading.Lock()
# A ready entry -> the stored object (``stored.py``) its value was decoded
# from or was stored as on its first trip out.
stored_forms = weakref.WeakKeyDictionary()


def _private_value(entry):
    held = _value_slot.__get__(entry)
    if type(held) is _Snapshot:
        return held.copy()
    with _hand_out_lock:
        held = _value_slot.__get__(entry)
        if type(held) is _Snapshot:         # another thread's read came first
            return held.copy()
        if not entry.ready:
            return held
        try:
            source = stored_forms.get(entry)
            if source is not None:
                snapshot = _Snapshot(None, None, None, source)
            else:
                frame, views, refs = freeze(held)
                # A read-only view is of a stored object's mapping, which
                # nobody can change; anything else the caller may change.
                snapshot = _Snapshot(frame, [v if v.readonly else bytes(v) for v in views],
                                     refs)
        except Exception:   # noqa: BLE001 - it was decoded here, so this is unlikely;
            # a value that cannot be encoded again stays one shared object.
            return held
        _value_slot.__set__(entry, snapshot)
    return held


def unshared_value(entry):
    """What a private-copies ``entry`` holds, without handing it out: the
    value itself if no read took it yet, else a copy."""
    held = _value_slot.__get__(entry)
    return held.copy() if type(held) is _Snapshot else held


def keep_private(entry):
    """Before ``entry`` is filled with a mutable value: turn it into its
    private-copies form (see the module docstring).  Entries of other kinds
    (an actor's lease...) are left as they are."""
    cls = _PRIVATE_FORM.get(type(entry))
    if cls is not None:
        entry.__class__ = cls


def result_entry(value):
    """A ready entry holding ``value``, a result decoded in this process."""
    e = _PrivateEntry() if type(value) not in _IMMUTABLE else _Entry()
    e.value = value
    e.ready = True
    return e


class _PrivateEntry(_Entry):
    """An ``_Entry`` holding a mutable value: each read gets its own copy."""

    __slots__ = ()
    value = property(_private_value, _value_slot.__set__)


class _PrivateBorrowedEntry(_BorrowedEntry):
    """A ``_BorrowedEntry`` holding a mutable value: each read gets its own copy."""

    __slots__ = ()
    value = property(_private_value, _value_slot.__set__)


_PRIVATE_FORM = {_Entry: _PrivateEntry, _BorrowedEntry: _PrivateBorrowedEntry}
PRIVATE_TYPES = frozenset(_PRIVATE_FORM.values())


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
        return thaw(self.frame, self.buffers, self.refs)
