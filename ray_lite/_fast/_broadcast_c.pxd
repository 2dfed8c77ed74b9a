# cython: language_level=3
# The compiled broadcast queue's object layout, for other compiled modules that
# want to call it without a Python-level dispatch.  Semantics and the segment
# layout: see _broadcast_py.py (the executable specification).
from libc.stdint cimport int64_t, uint32_t, uint64_t

cdef class MessageQueue:
    cdef object _name
    cdef object _mm             # the mmap that backs the mapping
    cdef Py_buffer _view        # holds the mapping while we use raw pointers into it
    cdef bint _has_view
    cdef char* _base
    cdef int _rank              # -1: the writer
    cdef uint32_t _n_readers
    cdef uint32_t _n_chunks
    cdef uint32_t _writer_pid
    cdef uint64_t _chunk_bytes
    cdef uint64_t _stride
    cdef uint64_t _chunks_offset
    cdef uint64_t _data_offset
    cdef uint64_t _next         # number of the next message to write or read
    cdef uint32_t _cursor       # _next % _n_chunks, kept incrementally
    cdef int _closed            # read with atomics from nogil wait loops
    cdef int _busy
    cdef bint _released
    cdef object _oob_threshold
    cdef list _oob_names        # writer: out-of-band segment last published per chunk
    cdef object _wake           # broadcast_wake's sockets of this end
    cdef dict _peers
    cdef object __weakref__

    cdef char* _chunk(self, uint32_t c) noexcept nogil
    cdef _setup(self, name, mm, int rank)
    cdef _read_geometry(self)
    cdef void _bump(self, uint32_t off) noexcept
    cdef int _mark_read(self, char* chunk, uint64_t k, object seg_name) except -1
    cdef int _enter(self) except -1
    cdef void _leave(self)
    cdef int _close_end(self, char* b) except -1
    cdef bint _chunk_free(self, uint32_t c, uint64_t k) except -1
    cdef int _write(self, uint32_t c, uint64_t k, object obj) except -1
    cdef int _wake_readers(self) except -1
    cdef int _poll(self, uint32_t c, uint64_t k) except -1
    cdef object _read(self, uint32_t c, uint64_t k)
    cdef int _sleep(self, char* futex, uint32_t seen, int64_t deadline, str timeout_message) except -1
    cdef int _wait_space(self, uint32_t c, uint64_t k, int64_t deadline) except -1
    cdef int _wait_message(self, uint32_t c, uint64_t k, int64_t deadline) except -1
