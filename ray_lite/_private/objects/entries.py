"""The value slots behind ``ObjectRef``s (see ``refs.py``).

One ``_Entry`` per object in a process, shared by every ref to it there;
``_BorrowedEntry`` for an object another process owns (with its share of
the owner's count); ``_FrozenEntry`` for what ``put`` keeps (a snapshot
decoded afresh by each ``get``).  The store's entries (``stored.py``)
subclass these.
"""
import copy
import threading


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
