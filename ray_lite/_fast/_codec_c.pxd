# cython: language_level=3
# C-level entry points of the compiled codec, for the other compiled hot paths
# (the ring encodes straight into its slots and decodes from them).

cdef Py_ssize_t encode_to_ptr(object obj, char* dst, Py_ssize_t capacity,
                              list buffers, Py_ssize_t oob_threshold,
                              bint readonly_arrays) except -1
# Write the frame of ``obj`` at ``dst`` (at most ``capacity`` bytes); return its
# length.  Out-of-band buffers are appended to ``buffers``; ``oob_threshold < 0``
# keeps everything in-band; ``readonly_arrays``: numpy arrays decode read-only
# (ray_lite._fast._arrays).  Raises BufferTooSmallError / SerializationError.
# BufferTooSmallError.needed is the exact frame length; the bytes at ``dst`` may
# have been written, ``buffers`` is left as it was.  After any other error
# ``buffers`` may hold buffers of the failed frame: discard it.  ``dst`` must
# stay valid while Python code runs (pickling), as a ring slot does.

cdef object decode_from_ptr(const char* src, Py_ssize_t length, object buffers)
# Decode exactly one frame of ``length`` bytes at ``src``.  The result does not
# refer to ``src``; it may refer to the objects in ``buffers``.  Raises DecodeError.
