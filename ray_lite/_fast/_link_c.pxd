# cython: language_level=3
# Layout of the compiled link (semantics: _link_py.py, the specification).
# Its rings are typed, so that sending and reading call the compiled ring at
# C level (``ShmRing._put``, ``_get_nowait``, ``rl_ring_poll``) with no Python
# call in between; its lock is a bare C lock, taken without a Python call.
from cpython.pythread cimport PyThread_type_lock

from ray_lite._fast._ring_c cimport ShmRing


cdef class Link:
    cdef readonly object names
    cdef readonly ShmRing _tx
    cdef readonly ShmRing _rx
    cdef PyThread_type_lock _lock
    cdef readonly bint _closed
    cdef readonly int _fd
    cdef public object on_full      # called (no lock held) while the peer's ring is full

    cdef int _acquire(self) except -1
    cdef list _recv_all(self)
