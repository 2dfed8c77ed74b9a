# cython: language_level=3
# Layout of the compiled stream table, so that other compiled hot paths (the
# owner's report reader in the core runtime) can cimport it and call its
# methods at C level, with no Python call in between:
#
#     from ray_lite._fast._stream_table_c cimport StreamTable
#     table.report(index, payload); item = table.try_next()
#
# The class is final: a C-level call is then a direct call, not a vtable
# look-up, and cpdef methods need no check for a Python override.
# Semantics: see _stream_table_py.py (the executable specification).
cimport cython


@cython.final
cdef class StreamTable:
    # Circular buffer: item i lives in _slots[i & _mask]; an empty slot holds
    # NOT_READY.  A Python list (not a C array) so the garbage collector sees
    # the payloads and cycles through them are collected.
    cdef list _slots
    cdef Py_ssize_t _mask
    cdef Py_ssize_t _next            # the next index to take == num_consumed
    cdef Py_ssize_t _num_reported
    cdef Py_ssize_t _max_reported    # -1 before the first report
    cdef Py_ssize_t _end             # item count once known, else -1
    cdef Py_ssize_t _error_index     # -1 when no error is pending
    cdef object _error
    cdef dict _spill                 # index -> payload, for indices far past the window

    cpdef object try_next(self)
    cpdef bint is_next_ready(self)
    cpdef bint is_finished(self)
    cpdef report(self, Py_ssize_t index, object payload)
    cpdef report_end(self, Py_ssize_t count)
    cpdef report_error(self, Py_ssize_t index, object error)

    cdef object _take_slow(self)
    cdef int _check_new_index(self, Py_ssize_t index) except -1
    cdef int _check_new_end(self, Py_ssize_t count) except -1
    cdef bint _is_reported(self, Py_ssize_t index)
    cdef int _store(self, Py_ssize_t index, object payload) except -1
    cdef int _resize(self, Py_ssize_t capacity) except -1
    cdef int _maybe_shrink(self) except -1
    cdef int _release(self) except -1
