# cython: language_level=3
"""The stream table, compiled.  Same names, behaviour and errors as
``_stream_table_py`` (the executable specification, which documents the
semantics and the memory layout); its C layout is in ``_stream_table_c.pxd``.
"""
cimport cython
from cpython.pyport cimport PY_SSIZE_T_MAX

from ray_lite._fast._stream_table_py import NOT_READY

__all__ = ["StreamTable", "NOT_READY"]

# A C-level reference to the one sentinel shared with the pure twin, so the
# hot path compares against a C global instead of looking up a module name.
cdef object _NOT_READY = NOT_READY


cdef enum:
    # Same constants as the pure twin (see there for why).
    DENSE_REACH = 1024
    GROW_FACTOR = 4
    MIN_CAPACITY = 16


cdef inline Py_ssize_t _pow2_above(Py_ssize_t n):
    cdef Py_ssize_t cap = MIN_CAPACITY
    while cap <= n:
        cap <<= 1
    return cap


@cython.final
cdef class StreamTable:
    """Reported items of one streaming generator, taken in index order."""

    def __cinit__(self):
        self._slots = [_NOT_READY] * MIN_CAPACITY
        self._mask = MIN_CAPACITY - 1
        self._next = 0
        self._num_reported = 0
        self._max_reported = -1
        self._end = -1
        self._error_index = -1
        self._error = None
        self._spill = {}

    # -- taking -------------------------------------------------------------

    # The hot path: one list load, one identity compare, one store.  The
    # slot index is masked into range, but turning the list bounds check off
    # here measured no difference (23 ns per call from Python either way, the
    # same as a no-op builtin method call), so it stays on.
    cpdef object try_next(self):
        cdef Py_ssize_t slot = self._next & self._mask
        item = self._slots[slot]
        if item is not _NOT_READY:
            self._slots[slot] = _NOT_READY
            self._next += 1
            return item
        return self._take_slow()

    cdef object _take_slow(self):
        cdef Py_ssize_t index = self._next
        if self._spill:
            item = self._spill.pop(index, _NOT_READY)
            if item is not _NOT_READY:
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
        return _NOT_READY

    cpdef bint is_next_ready(self):
        cdef Py_ssize_t index = self._next
        return (self._slots[index & self._mask] is not _NOT_READY
                or index == self._end
                or index == self._error_index
                or (bool(self._spill) and index in self._spill))

    cpdef bint is_finished(self):
        return self._next == self._end

    # -- reporting ----------------------------------------------------------

    cpdef report(self, Py_ssize_t index, object payload):
        if index < 0:
            raise ValueError(f"stream item index must be >= 0, got {index}")
        if payload is _NOT_READY:
            raise ValueError("NOT_READY cannot be reported as a stream item")
        self._check_new_index(index)
        self._store(index, payload)
        self._num_reported += 1
        if index > self._max_reported:
            self._max_reported = index

    cpdef report_end(self, Py_ssize_t count):
        if count < 0:
            raise ValueError(f"stream item count must be >= 0, got {count}")
        self._check_new_end(count)
        self._end = count
        if self._next == count:
            self._release()

    cpdef report_error(self, Py_ssize_t index, object error):
        if not isinstance(error, BaseException):
            raise TypeError(
                f"report_error needs an exception instance, got {type(error).__name__}")
        if index < 0:
            raise ValueError(f"stream item index must be >= 0, got {index}")
        if index == PY_SSIZE_T_MAX:
            raise OverflowError("stream item index too large")
        self._check_new_index(index)
        self._check_new_end(index + 1)
        self._error_index = index
        self._error = error
        self._end = index + 1
        self._num_reported += 1
        if index > self._max_reported:
            self._max_reported = index

    cdef int _check_new_index(self, Py_ssize_t index) except -1:
        if self._end >= 0 and index >= self._end:
            raise ValueError(
                f"stream item {index} reported at or after the end of the stream ({self._end} items)")
        if index < self._next or self._is_reported(index):
            raise ValueError(f"stream item {index} reported twice")
        return 0

    cdef int _check_new_end(self, Py_ssize_t count) except -1:
        if self._end >= 0:
            raise ValueError(f"the end of the stream is already known ({self._end} items)")
        if count <= self._max_reported:
            raise ValueError(
                f"stream end {count} is before already reported item {self._max_reported}")
        return 0

    cdef bint _is_reported(self, Py_ssize_t index):
        # Only called with index >= self._next.
        if index - self._next <= self._mask and self._slots[index & self._mask] is not _NOT_READY:
            return True
        return index == self._error_index or (bool(self._spill) and index in self._spill)

    # -- the circular buffer ------------------------------------------------

    cdef int _store(self, Py_ssize_t index, object payload) except -1:
        cdef Py_ssize_t offset = index - self._next
        cdef Py_ssize_t unconsumed
        if offset > self._mask:
            unconsumed = self._num_reported - self._next
            # Compared as offset // GROW_FACTOR so a far index cannot overflow.
            if offset >= DENSE_REACH and offset // GROW_FACTOR >= unconsumed + 1:
                self._spill[index] = payload
                return 0
            self._resize(_pow2_above(offset))
        self._slots[index & self._mask] = payload
        return 0

    cdef int _resize(self, Py_ssize_t capacity) except -1:
        cdef list old = self._slots
        cdef Py_ssize_t old_mask = self._mask
        cdef Py_ssize_t mask = capacity - 1
        cdef Py_ssize_t start = self._next
        cdef Py_ssize_t index
        cdef list slots = [_NOT_READY] * capacity
        for index in range(start, start + min(old_mask + 1, capacity)):
            item = old[index & old_mask]
            if item is not _NOT_READY:
                slots[index & mask] = item
        if self._spill:
            for index in [i for i in self._spill if i - start < capacity]:
                slots[index & mask] = self._spill.pop(index)
        self._slots = slots
        self._mask = mask
        return 0

    cdef int _maybe_shrink(self) except -1:
        cdef Py_ssize_t capacity = self._mask + 1
        cdef Py_ssize_t reach
        if capacity <= MIN_CAPACITY:
            return 0
        reach = self._max_reported - self._next
        if reach < 0:
            self._resize(MIN_CAPACITY)
        elif reach <= self._mask and 4 * (reach + 1) <= capacity:
            self._resize(_pow2_above(2 * reach))
        return 0

    cdef int _release(self) except -1:
        if self._mask + 1 > MIN_CAPACITY:
            self._slots = [_NOT_READY] * MIN_CAPACITY
            self._mask = MIN_CAPACITY - 1
        self._spill.clear()
        return 0

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
