"""The stream table in pure Python: the executable specification of
``_stream_table_c`` (see ``stream_table.py`` for what the table is for).

Semantics, precisely (both twins raise the same classes with the same messages):

* Indices are 0-based ints (``operator.index``: a float is a ``TypeError``;
  beyond a signed 64-bit range is an ``OverflowError``, as C does).
* ``report(index, payload)``: any payload except ``NOT_READY`` itself (which
  ``try_next`` could not tell from "not reported"); ``ValueError`` when
  ``index`` is negative, at or after a known end, or already reported
  (including indices already consumed).
* ``report_end(count)``: ``count >= 0``; ``ValueError`` when the end is
  already known (by ``report_end`` or ``report_error``) or when an index
  ``>= count`` was already reported.
* ``report_error(index, error)``: ``error`` must be an exception instance
  (``TypeError`` otherwise).  Item ``index`` is the error and the stream ends
  after it: the end becomes ``index + 1``.  So the same rules as for
  ``report`` and ``report_end(index + 1)`` apply: ``ValueError`` when
  ``index`` is negative or already reported, when the end is already known,
  or when a later index was already reported.
* ``try_next()``: the payload of item ``num_consumed`` and advance; else
  ``NOT_READY`` when it is not reported yet; raises ``StopIteration`` when
  every item was taken (again on every later call); raises the stored error
  when the item is an error, which counts as consumed, so the stream is then
  finished and the following ``try_next`` raises ``StopIteration``.
* ``num_reported`` counts reported items, an error item included;
  ``num_consumed`` counts taken items (again including an error);
  ``num_unconsumed = num_reported - num_consumed``; ``end_index`` is the
  item count (an error item included) once known, else -1.
* ``capacity``: slots in the circular window (a diagnostic, for tests of the
  memory bound).

Memory: items live in a power-of-two circular buffer of slots, item ``i`` in
slot ``i & mask``, covering the window ``[num_consumed, num_consumed +
capacity)``.  An empty slot holds ``NOT_READY``, so taking a reported item is
one load, one compare and one store.  A report past the window grows it
when that keeps the buffer within a constant factor of what is unconsumed (or
small); a report far ahead of everything else goes to a dict (the "spill")
instead, so one far-out-of-order index cannot make the buffer huge.  When the
consumer catches up (``try_next`` finds nothing), a buffer much larger than
what it holds shrinks.  So a stream of any length, consumed as it goes, holds
only its unconsumed items.

Threads: the runtime reports from whichever thread drives the links while
another thread takes items.  A method of the compiled twin runs under the
GIL without calling back into Python, so it is atomic; here a method can be
preempted between any two bytecodes (a report may resize the buffer while a
``try_next`` is half-way through taking a slot), so every public method holds
the table's lock to behave the same.
"""
import operator
import threading

__all__ = ["StreamTable", "NOT_READY"]


class _NotReadyType:
    """Type of the ``NOT_READY`` sentinel: one instance, even across pickling."""

    __slots__ = ()
    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = object.__new__(cls)
        return cls._instance

    def __repr__(self):
        return "NOT_READY"

    def __reduce__(self):
        # Pickled by name, so it unpickles to the very same object.
        return "NOT_READY"


#: What ``try_next`` returns when the next item has not been reported yet.
#: One object shared by both twins (``_stream_table_c`` imports it from here),
#: so ``x is NOT_READY`` holds whichever twin made ``x``.
NOT_READY = _NotReadyType()

# A report at most this far past the window always grows the buffer (a few KiB
# of pointers at worst); further than this, it grows only while the buffer
# stays within _GROW_FACTOR times the unconsumed count, else the item spills.
_DENSE_REACH = 1024
_GROW_FACTOR = 4
_MIN_CAPACITY = 16
# Signed 64-bit, as Py_ssize_t in the compiled twin.
_INDEX_MIN = -(1 << 63)
_INDEX_MAX = (1 << 63) - 1


def _as_index(value):
    value = operator.index(value)
    if value < _INDEX_MIN or value > _INDEX_MAX:
        raise OverflowError("Python int too large to convert to C ssize_t")
    return value


def _pow2_above(n):
    """The smallest power of two > n, at least _MIN_CAPACITY."""
    cap = _MIN_CAPACITY
    while cap <= n:
        cap <<= 1
    return cap


class StreamTable:
    """Reported items of one streaming generator, taken in index order."""

    __slots__ = ("_slots", "_mask", "_next", "_num_reported", "_max_reported",
                 "_end", "_error_index", "_error", "_spill", "_lock")

    def __init__(self):
        self._lock = threading.Lock()   # see "Threads" in the module docstring
        self._slots = [NOT_READY] * _MIN_CAPACITY
        self._mask = _MIN_CAPACITY - 1
        self._next = 0              # index of the next item to take == num_consumed
        self._num_reported = 0
        self._max_reported = -1
        self._end = -1              # item count once known
        self._error_index = -1
        self._error = None
        self._spill = {}            # index -> payload, for indices far past the window

    # -- taking -------------------------------------------------------------

    def try_next(self):
        with self._lock:
            slots = self._slots
            slot = self._next & self._mask
            item = slots[slot]
            if item is not NOT_READY:
                slots[slot] = NOT_READY
                self._next += 1
                return item
            return self._take_slow()

    def _take_slow(self):
        index = self._next
        if self._spill:
            item = self._spill.pop(index, NOT_READY)
            if item is not NOT_READY:
                self._next = index + 1
                if not self._spill:
                    # A dict never shrinks its table on pop: drop a drained one.
                    self._spill = {}
                return item
        if index == self._error_index:
            error = self._error
            self._error = None
            self._error_index = -1
            self._next = index + 1
            self._release()
            raise error
        if index == self._end:
            self._release()
            raise StopIteration
        self._maybe_shrink()
        return NOT_READY

    def is_next_ready(self):
        with self._lock:
            index = self._next
            return (self._slots[index & self._mask] is not NOT_READY
                    or index == self._end
                    or index == self._error_index
                    or (bool(self._spill) and index in self._spill))

    def is_finished(self):
        return self._next == self._end

    # -- reporting ----------------------------------------------------------

    def report(self, index, payload):
        index = _as_index(index)
        with self._lock:
            if index < 0:
                raise ValueError(f"stream item index must be >= 0, got {index}")
            if payload is NOT_READY:
                raise ValueError("NOT_READY cannot be reported as a stream item")
            self._check_new_index(index)
            self._store(index, payload)
            self._num_reported += 1
            if index > self._max_reported:
                self._max_reported = index

    def report_end(self, count):
        count = _as_index(count)
        with self._lock:
            if count < 0:
                raise ValueError(f"stream item count must be >= 0, got {count}")
            self._check_new_end(count)
            self._end = count
            if self._next == count:
                self._release()

    def report_error(self, index, error):
        index = _as_index(index)
        with self._lock:
            if not isinstance(error, BaseException):
                raise TypeError(
                    f"report_error needs an exception instance, got {type(error).__name__}")
            if index < 0:
                raise ValueError(f"stream item index must be >= 0, got {index}")
            if index == _INDEX_MAX:
                raise OverflowError("stream item index too large")
            self._check_new_index(index)
            self._check_new_end(index + 1)
            self._error_index = index
            self._error = error
            self._end = index + 1
            self._num_reported += 1
            if index > self._max_reported:
                self._max_reported = index

    def _check_new_index(self, index):
        if self._end >= 0 and index >= self._end:
            raise ValueError(
                f"stream item {index} reported at or after the end of the stream ({self._end} items)")
        if index < self._next or self._is_reported(index):
            raise ValueError(f"stream item {index} reported twice")

    def _check_new_end(self, count):
        if self._end >= 0:
            raise ValueError(f"the end of the stream is already known ({self._end} items)")
        if count <= self._max_reported:
            raise ValueError(
                f"stream end {count} is before already reported item {self._max_reported}")

    def _is_reported(self, index):
        # Only called with index >= self._next.
        if index - self._next <= self._mask and self._slots[index & self._mask] is not NOT_READY:
            return True
        return index == self._error_index or (bool(self._spill) and index in self._spill)

    # -- the circular buffer ------------------------------------------------

    def _store(self, index, payload):
        offset = index - self._next
        if offset > self._mask:
            unconsumed = self._num_reported - self._next
            # offset // _GROW_FACTOR, as the compiled twin, where a far index
            # must not overflow a multiplication.
            if offset >= _DENSE_REACH and offset // _GROW_FACTOR >= unconsumed + 1:
                self._spill[index] = payload
                return
            self._resize(_pow2_above(offset))
        self._slots[index & self._mask] = payload

    def _resize(self, capacity):
        """Move the window into a buffer of ``capacity`` slots (a power of two
        that covers every item in the current buffer), taking in the spilled
        items that now fit."""
        old, old_mask = self._slots, self._mask
        slots = [NOT_READY] * capacity
        mask = capacity - 1
        start = self._next
        for index in range(start, start + min(old_mask + 1, capacity)):
            item = old[index & old_mask]
            if item is not NOT_READY:
                slots[index & mask] = item
        spill = self._spill
        if spill:
            for index in [i for i in spill if i - start < capacity]:
                slots[index & mask] = spill.pop(index)
        self._slots, self._mask = slots, mask

    def _maybe_shrink(self):
        # The consumer has caught up: a buffer much bigger than the reported
        # part of the window is wasted.  Spilled items stay in the spill.
        capacity = self._mask + 1
        if capacity <= _MIN_CAPACITY:
            return
        reach = self._max_reported - self._next   # < 0 when nothing is waiting
        if reach < 0:
            self._resize(_MIN_CAPACITY)
        elif reach <= self._mask and 4 * (reach + 1) <= capacity:
            self._resize(_pow2_above(2 * reach))
        # else: reported items past the window, maybe spilled; keep the buffer.

    def _release(self):
        # The stream is over: nothing is left to hold.
        if self._mask + 1 > _MIN_CAPACITY:
            self._slots = [NOT_READY] * _MIN_CAPACITY
            self._mask = _MIN_CAPACITY - 1
        self._spill.clear()

    # -- counters -----------------------------------------------------------

    @property
    def num_reported(self):
        return self._num_reported

    @property
    def num_consumed(self):
        return self._next

    @property
    def num_unconsumed(self):
        return self._num_reported - self._next

    @property
    def end_index(self):
        return self._end

    @property
    def capacity(self):
        return self._mask + 1

    def __repr__(self):
        return (f"StreamTable(consumed={self._next}, reported={self._num_reported}, "
                f"end={self._end})")
