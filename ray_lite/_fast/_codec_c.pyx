# cython: language_level=3
# cython: binding=False
# (binding=False: plain builtin functions are called ~6 ns faster than
# Cython's function objects, a tenth of encode_into("hello"); we need no
# introspection of these functions.)
"""Compiled twin of the codec: msgpack written straight into the destination.

``_codec_py`` specifies the frame format, the limits and every error message;
this module produces the same bytes and raises the same errors.  What it adds
is speed: the encoder writes through a raw pointer into the caller's buffer
(a ring slot), with exact type checks and no intermediate object for the
common types, and the decoder reads from a raw pointer.  The ring cimports
``encode_to_ptr`` / ``decode_from_ptr`` (see ``_codec_c.pxd``).
"""
cimport cython
from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_Next, PyDict_SetItem, PyDict_Size
from cpython.exc cimport PyErr_Clear, PyErr_ExceptionMatches
from cpython.float cimport PyFloat_AS_DOUBLE
from cpython.list cimport PyList_AsTuple, PyList_GET_ITEM, PyList_GET_SIZE, PyList_New, PyList_SET_ITEM
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.object cimport PyObject, PyTypeObject, Py_TYPE
from cpython.ref cimport Py_INCREF, Py_XDECREF
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE, PyTuple_New, PyTuple_SET_ITEM
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy, memmove

import pickle

from ._pickling import dumps as _pickle_dumps
from .errors import BufferTooSmallError, DecodeError, SerializationError

__all__ = [
    "EXT_TUPLE", "EXT_BIGINT", "EXT_PICKLE", "EXT_OOB", "EXT_BUFFER",
    "OOB_THRESHOLD", "MAX_DEPTH",
    "encode_into", "encode_growing", "dumps", "decode", "loads",
    "BufferTooSmallError", "DecodeError", "SerializationError",
]


cdef extern from "Python.h":
    PyTypeObject PyUnicode_Type
    PyTypeObject PyLong_Type
    PyTypeObject PyFloat_Type
    PyTypeObject PyDict_Type
    PyTypeObject PyList_Type
    PyTypeObject PyBool_Type
    PyTypeObject PyBytes_Type
    PyTypeObject PyTuple_Type
    PyTypeObject PyByteArray_Type
    PyTypeObject PyMemoryView_Type
    # Declared here without an exception clause so that a failure comes back
    # as NULL / -1 for us to handle (a lone surrogate goes to pickle; an
    # out-of-range int becomes a big int) instead of propagating.
    const char* _utf8_and_size "PyUnicode_AsUTF8AndSize"(object, Py_ssize_t*)
    long long _as_long_long "PyLong_AsLongLongAndOverflow"(object, int*)
    unsigned long long _as_unsigned_long_long "PyLong_AsUnsignedLongLong"(object)
    PyObject* _err_occurred "PyErr_Occurred"()
    int _get_buffer "PyObject_GetBuffer"(object, Py_buffer*, int)
    PyObject* _decode_utf8 "PyUnicode_DecodeUTF8"(const char*, Py_ssize_t, const char*)
    PyObject* PyUnicode_New(Py_ssize_t, Py_UCS4)
    Py_ssize_t PyUnicode_GET_LENGTH(object)
    void* PyUnicode_DATA(object)
    bint PyUnicode_IS_ASCII(object)
    bint PyUnicode_IS_COMPACT_ASCII(object)
    object PyMemoryView_FromMemory(char*, Py_ssize_t, int)
    Py_buffer* PyMemoryView_GET_BUFFER(object)
    int PyBUF_READ
    Py_ssize_t PyDict_GET_SIZE(object)

cdef extern from *:
    """
    /* Big-endian loads and stores at unaligned addresses; compilers turn
       these byte loops into single bswap'd moves. */
    static inline void rl_store16(unsigned char *p, uint16_t v) {
        p[0] = (unsigned char)(v >> 8); p[1] = (unsigned char)v;
    }
    static inline void rl_store32(unsigned char *p, uint32_t v) {
        p[0] = (unsigned char)(v >> 24); p[1] = (unsigned char)(v >> 16);
        p[2] = (unsigned char)(v >> 8); p[3] = (unsigned char)v;
    }
    static inline void rl_store64(unsigned char *p, uint64_t v) {
        rl_store32(p, (uint32_t)(v >> 32)); rl_store32(p + 4, (uint32_t)v);
    }
    static inline uint16_t rl_load16(const unsigned char *p) {
        return (uint16_t)(((uint16_t)p[0] << 8) | p[1]);
    }
    static inline uint32_t rl_load32(const unsigned char *p) {
        return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
    }
    static inline uint64_t rl_load64(const unsigned char *p) {
        return ((uint64_t)rl_load32(p) << 32) | rl_load32(p + 4);
    }
    static inline uint64_t rl_double_bits(double d) { uint64_t u; memcpy(&u, &d, 8); return u; }
    static inline double rl_bits_double(uint64_t u) { double d; memcpy(&d, &u, 8); return d; }
    static inline double rl_bits_float(uint32_t u) { float f; memcpy(&f, &u, 4); return (double)f; }
    #define RL_U32_MAX ((uint64_t)0xFFFFFFFFu)
    /* Keys of at most 31 bytes (fixstr) are read as a few overlapping
       words instead of byte by byte.  n <= 3: bytes 0, n/2 and n-1 cover
       them all; 4..7: two 4-byte words; 8..31: 8-byte words at 0, 8, 16
       (as far as they fit) and n-8. */
    static inline void rl_key_words(const unsigned char *p, Py_ssize_t n,
                                    uint64_t *a, uint64_t *b, uint64_t *c) {
        uint32_t x, y;
        *c = 0;
        if (n >= 8) {
            memcpy(a, p, 8); memcpy(b, p + n - 8, 8);
            if (n > 16) {
                uint64_t m = 0;
                memcpy(c, p + 8, 8);
                if (n > 24) memcpy(&m, p + 16, 8);
                *c ^= m * 0xFF51AFD7ED558CCDULL;
            }
        } else if (n >= 4) {
            memcpy(&x, p, 4); memcpy(&y, p + n - 4, 4); *a = x; *b = y;
        } else if (n > 0) {
            *a = p[0] | ((uint64_t)p[n >> 1] << 8) | ((uint64_t)p[n - 1] << 16); *b = 0;
        } else {
            *a = *b = 0;
        }
    }
    /* Spreads short keys over the key cache's slots (a miss costs only speed). */
    static inline size_t rl_key_slot(const unsigned char *p, Py_ssize_t n) {
        uint64_t a, b, c, h;
        rl_key_words(p, n, &a, &b, &c);
        h = (a * 0x9E3779B97F4A7C15ULL) ^ (b * 0xC2B2AE3D27D4EB4FULL) ^ c ^ (uint64_t)n;
        return (size_t)(h ^ (h >> 29) ^ (h >> 47));
    }
    /* Equality of two keys of n <= 31 bytes, with the words above. */
    static inline int rl_short_eq(const unsigned char *p, const unsigned char *q, Py_ssize_t n) {
        uint64_t a, b, c, d, e, f;
        if (n > 24) return memcmp(p, q, n) == 0;
        rl_key_words(p, n, &a, &b, &c);
        rl_key_words(q, n, &d, &e, &f);
        return ((a ^ d) | (b ^ e) | (c ^ f)) == 0;
    }
    /* Holding a memoryview the way a buffer export does, without filling
       in a Py_buffer: while exports > 0, release() raises BufferError. */
    static inline void rl_memoryview_hold(PyObject *op) { ((PyMemoryViewObject *)op)->exports++; }
    static inline void rl_memoryview_unhold(PyObject *op) { ((PyMemoryViewObject *)op)->exports--; }
    static inline PyObject *rl_steal(PyObject *o) { return o; }
    static inline int rl_is_ascii(const unsigned char *p, Py_ssize_t n) {
        uint64_t acc = 0, w;
        Py_ssize_t i = 0;
        for (; i + 8 <= n; i += 8) { memcpy(&w, p + i, 8); acc |= w; }
        for (; i < n; i++) acc |= p[i];
        return (acc & 0x8080808080808080ULL) == 0;
    }
    #define RL_I32_MIN ((int64_t)-2147483647 - 1)
    /* An exact-type int small enough to read without a call (every int
       below 2**30 in magnitude); 0 means "take the general path". */
    static inline int rl_small_long(PyObject *o, long long *v) {
    #if PY_VERSION_HEX >= 0x030C0000
        if (!PyUnstable_Long_IsCompact((PyLongObject *)o)) return 0;
        *v = (long long)PyUnstable_Long_CompactValue((PyLongObject *)o);
        return 1;
    #else
        Py_ssize_t size = Py_SIZE(o);
        if (size < -1 || size > 1) return 0;
        *v = size * (long long)((PyLongObject *)o)->ob_digit[0];
        return 1;
    #endif
    }
    /* A memoryview whose bytes can be read in place: not released, C-contiguous. */
    static inline int rl_memoryview_usable(PyObject *op) {
        PyMemoryViewObject *mv = (PyMemoryViewObject *)op;
        return (mv->flags & (_Py_MEMORYVIEW_RELEASED | _Py_MEMORYVIEW_C)) == _Py_MEMORYVIEW_C;
    }
    """
    uint64_t _U32_MAX "RL_U32_MAX"
    int64_t _I32_MIN "RL_I32_MIN"
    void rl_store16(unsigned char*, uint16_t) noexcept nogil
    void rl_store32(unsigned char*, uint32_t) noexcept nogil
    void rl_store64(unsigned char*, uint64_t) noexcept nogil
    uint16_t rl_load16(const unsigned char*) noexcept nogil
    uint32_t rl_load32(const unsigned char*) noexcept nogil
    uint64_t rl_load64(const unsigned char*) noexcept nogil
    uint64_t rl_double_bits(double) noexcept nogil
    double rl_bits_double(uint64_t) noexcept nogil
    double rl_bits_float(uint32_t) noexcept nogil
    size_t rl_key_slot(const unsigned char*, Py_ssize_t) noexcept nogil
    bint rl_short_eq(const unsigned char*, const unsigned char*, Py_ssize_t) noexcept nogil
    void rl_memoryview_hold(object) noexcept
    void rl_memoryview_unhold(object) noexcept
    bint rl_is_ascii(const unsigned char*, Py_ssize_t) noexcept nogil
    bint rl_memoryview_usable(object) noexcept
    bint rl_small_long(object, long long*) noexcept
    object _steal "rl_steal"(PyObject*)   # hands over the reference we own


cdef enum:
    _KEY_CACHE_SIZE = 512      # a power of two
    _KEY_CACHE_MAX_LEN = 31    # fixstr keys only
    _EXT_TUPLE = 1
    _EXT_BIGINT = 2
    _EXT_PICKLE = 3
    _EXT_OOB = 4
    _EXT_BUFFER = 5
    _KIND_BYTES = 0
    _KIND_BYTEARRAY = 1
    _KIND_MEMORYVIEW = 2
    _MAX_DEPTH = 512
    _OOB_THRESHOLD = 64 * 1024
    _OOB_REF_SIZE = 5          # kind (uint8) + index (uint32)
    _PICKLE_HEAD_SIZE = 8      # first, count (uint32 each)
    _DUMPS_STACK = 256         # dumps() starts in a buffer this big on the C stack


EXT_TUPLE = _EXT_TUPLE
EXT_BIGINT = _EXT_BIGINT
EXT_PICKLE = _EXT_PICKLE
EXT_OOB = _EXT_OOB
EXT_BUFFER = _EXT_BUFFER
OOB_THRESHOLD = _OOB_THRESHOLD
MAX_DEPTH = _MAX_DEPTH


# ================================================================ encoding

cdef struct Writer:
    unsigned char* base
    Py_ssize_t pos        # bytes the frame needs so far (may pass cap: see _room)
    Py_ssize_t cap
    bint growable         # dumps(): grow on the heap instead of overflowing
    bint on_heap          # base is ours to free
    bint no_memory        # growing failed
    # The list receiving out-of-band buffers.  encode_into starts with NULL
    # and makes one only for a frame that has some (_buffer_list), so that
    # the common frame allocates no list; the writer then owns it.
    PyObject* buffers
    bint owns_buffers
    PyObject* root        # the value being encoded, for error paths
    Py_ssize_t threshold  # < 0: everything in-band
    bint readonly_arrays  # numpy arrays decode read-only (see _arrays)
    # A bytearray destination is written through its raw pointer without a
    # buffer export, which saves the export on the common path.  That is safe
    # only while no Python code can run (it could resize the bytearray), so
    # every step that may run Python code (pickling, creating memoryviews or
    # other objects the garbage collector tracks) first calls _pin(), which
    # takes the export; encode_into releases it.
    PyObject* pin_owner   # NULL: base is already stable
    Py_ssize_t pin_offset
    bint pinned
    Py_buffer pin_view


cdef unsigned char* _grow(Writer* w, Py_ssize_t start) noexcept:
    cdef Py_ssize_t size = w.cap * 2
    cdef unsigned char* base
    if w.no_memory:
        return NULL
    if size < w.pos:
        size = w.pos
    if w.on_heap:
        base = <unsigned char*>PyMem_Realloc(w.base, size)
    else:
        base = <unsigned char*>PyMem_Malloc(size)
        if base != NULL:
            memcpy(base, w.base, start)
    if base == NULL:
        w.no_memory = True
        return NULL
    w.base = base
    w.cap = size
    w.on_heap = True
    return base + start


cdef inline unsigned char* _room(Writer* w, Py_ssize_t n) noexcept:
    """Where the next ``n`` bytes go, or NULL when they do not fit.

    ``pos`` advances either way: once the frame has outgrown a fixed
    destination the encoder carries on without writing, so that
    BufferTooSmallError can report the exact size needed, in one pass.
    """
    cdef Py_ssize_t start = w.pos
    w.pos = start + n
    if w.pos <= w.cap:
        return w.base + start
    if w.growable:
        return _grow(w, start)
    return NULL


cdef int _pin(Writer* w) except -1:
    cdef Py_ssize_t size
    if w.pin_owner == NULL or w.pinned:
        return 0
    PyObject_GetBuffer(<object>w.pin_owner, &w.pin_view, PyBUF_WRITABLE)
    w.pinned = True
    # Nothing can have resized the bytearray yet; re-reading base and
    # capacity costs nothing and does not rely on it.
    size = w.pin_view.len
    if w.pin_offset > size:
        w.pin_offset = size
    w.base = <unsigned char*>w.pin_view.buf + w.pin_offset
    w.cap = size - w.pin_offset
    return 0


cdef inline Py_ssize_t _ext_header_size(Py_ssize_t n) noexcept:
    if n == 1 or n == 2 or n == 4 or n == 8 or n == 16:
        return 2
    if n <= 0xFF:
        return 3
    if n <= 0xFFFF:
        return 4
    return 6


cdef inline void _put_ext_header(unsigned char* p, int code, Py_ssize_t n) noexcept:
    if n == 1:
        p[0] = 0xD4
    elif n == 2:
        p[0] = 0xD5
    elif n == 4:
        p[0] = 0xD6
    elif n == 8:
        p[0] = 0xD7
    elif n == 16:
        p[0] = 0xD8
    elif n <= 0xFF:
        p[0] = 0xC7
        p[1] = <unsigned char>n
        p += 1
    elif n <= 0xFFFF:
        p[0] = 0xC8
        rl_store16(p + 1, <uint16_t>n)
        p += 2
    else:
        p[0] = 0xC9
        rl_store32(p + 1, <uint32_t>n)
        p += 4
    p[1] = <unsigned char>code


cdef unsigned char* _ext_room(Writer* w, int code, Py_ssize_t n) noexcept:
    """Room for an ext of payload length n: writes the header, returns the payload's place."""
    cdef Py_ssize_t h = _ext_header_size(n)
    cdef unsigned char* p = _room(w, h + n)
    if p == NULL:
        return NULL
    _put_ext_header(p, code, n)
    return p + h


cdef int _unserialisable(Writer* w, object obj, object cause) except -1:
    # The path is searched for only now, so the success path keeps no trace
    # of where it is.
    raise SerializationError(
        f"cannot serialise object of type {_type_name(type(obj))!r} at "
        f"{_locate(<object>w.root, obj)}: {type(cause).__name__}: {cause}") from cause


cdef int _too_long(Writer* w, object obj) except -1:
    return _unserialisable(w, obj, ValueError("longer than msgpack's 4 GiB limit"))


class _TooDeep(Exception):
    """A container inside MAX_DEPTH others: ``_encode`` pickles the whole value."""


cdef object _too_deep():
    return _TooDeep()


cdef inline bint _put_ascii_fixstr(Writer* w, object obj) noexcept:
    """A compact ASCII str of at most 31 characters (most keys and tokens) in one step."""
    cdef Py_ssize_t n
    cdef unsigned char* p
    if not PyUnicode_IS_COMPACT_ASCII(obj):
        return False
    n = PyUnicode_GET_LENGTH(obj)
    if n > 31:
        return False
    p = _room(w, 1 + n)
    if p != NULL:
        p[0] = 0xA0 | <unsigned char>n
        memcpy(p + 1, PyUnicode_DATA(obj), n)
    return True


cdef int _enc_str(Writer* w, object obj) except -1:
    cdef Py_ssize_t n
    cdef const char* s
    cdef unsigned char* p
    if _put_ascii_fixstr(w, obj):
        return 0
    s = _utf8_and_size(obj, &n)
    if s == NULL:
        if not PyErr_ExceptionMatches(UnicodeEncodeError):
            return -1  # MemoryError, already set
        # Lone surrogates (e.g. undecodable file names): UTF-8 cannot carry
        # them, pickle can, so the str still round-trips.
        PyErr_Clear()
        return _enc_pickle(w, obj)
    if n <= 31:
        p = _room(w, 1 + n)
        if p != NULL:
            p[0] = 0xA0 | <unsigned char>n
            memcpy(p + 1, s, n)
    elif n <= 0xFF:
        p = _room(w, 2 + n)
        if p != NULL:
            p[0] = 0xD9
            p[1] = <unsigned char>n
            memcpy(p + 2, s, n)
    elif n <= 0xFFFF:
        p = _room(w, 3 + n)
        if p != NULL:
            p[0] = 0xDA
            rl_store16(p + 1, <uint16_t>n)
            memcpy(p + 3, s, n)
    elif <uint64_t>n <= _U32_MAX:
        p = _room(w, 5 + n)
        if p != NULL:
            p[0] = 0xDB
            rl_store32(p + 1, <uint32_t>n)
            memcpy(p + 5, s, n)
    else:
        return _too_long(w, obj)
    return 0


cdef inline void _put_uint(Writer* w, uint64_t v) noexcept:
    cdef unsigned char* p
    if v <= 0x7F:
        p = _room(w, 1)
        if p != NULL:
            p[0] = <unsigned char>v
    elif v <= 0xFF:
        p = _room(w, 2)
        if p != NULL:
            p[0] = 0xCC
            p[1] = <unsigned char>v
    elif v <= 0xFFFF:
        p = _room(w, 3)
        if p != NULL:
            p[0] = 0xCD
            rl_store16(p + 1, <uint16_t>v)
    elif v <= 0xFFFFFFFFu:
        p = _room(w, 5)
        if p != NULL:
            p[0] = 0xCE
            rl_store32(p + 1, <uint32_t>v)
    else:
        p = _room(w, 9)
        if p != NULL:
            p[0] = 0xCF
            rl_store64(p + 1, v)


cdef inline void _put_negative(Writer* w, int64_t v) noexcept:
    cdef unsigned char* p
    if v >= -32:
        p = _room(w, 1)
        if p != NULL:
            p[0] = <unsigned char>(<uint8_t>(<int8_t>v))
    elif v >= -0x80:
        p = _room(w, 2)
        if p != NULL:
            p[0] = 0xD0
            p[1] = <unsigned char>(<uint8_t>(<int8_t>v))
    elif v >= -0x8000:
        p = _room(w, 3)
        if p != NULL:
            p[0] = 0xD1
            rl_store16(p + 1, <uint16_t>(<int16_t>v))
    elif v >= _I32_MIN:
        p = _room(w, 5)
        if p != NULL:
            p[0] = 0xD2
            rl_store32(p + 1, <uint32_t>(<int32_t>v))
    else:
        p = _room(w, 9)
        if p != NULL:
            p[0] = 0xD3
            rl_store64(p + 1, <uint64_t>v)


cdef int _enc_int(Writer* w, object obj) except -1:
    cdef int overflow = 0
    cdef long long v
    cdef unsigned long long u
    if rl_small_long(obj, &v):
        overflow = 0
    else:
        v = _as_long_long(obj, &overflow)
    if overflow == 0:
        if v >= 0:
            _put_uint(w, <uint64_t>v)
        else:
            _put_negative(w, <int64_t>v)
        return 0
    if overflow > 0:
        u = _as_unsigned_long_long(obj)
        if not (u == <unsigned long long>-1 and _err_occurred() != NULL):
            _put_uint(w, <uint64_t>u)
            return 0
        PyErr_Clear()
    return _enc_bigint(w, obj)


cdef int _enc_bigint(Writer* w, object obj) except -1:
    cdef Py_ssize_t n
    cdef unsigned char* p
    _pin(w)
    n = ((obj if obj >= 0 else ~obj).bit_length() + 8) // 8
    if <uint64_t>n > _U32_MAX:
        return _too_long(w, obj)
    payload = obj.to_bytes(n, "little", signed=True)
    p = _ext_room(w, _EXT_BIGINT, n)
    if p != NULL:
        memcpy(p, PyBytes_AS_STRING(payload), n)
    return 0


cdef inline void _put_float(Writer* w, double d) noexcept:
    cdef unsigned char* p = _room(w, 9)
    if p != NULL:
        p[0] = 0xCB
        rl_store64(p + 1, rl_double_bits(d))


cdef int _put_container_header(Writer* w, object obj, Py_ssize_t n,
                               unsigned char fix, unsigned char code16) except -1:
    # fix: 0x90 (array) or 0x80 (map); code16 + 1 is the 32-bit form.
    cdef unsigned char* p
    if n <= 15:
        p = _room(w, 1)
        if p != NULL:
            p[0] = fix | <unsigned char>n
    elif n <= 0xFFFF:
        p = _room(w, 3)
        if p != NULL:
            p[0] = code16
            rl_store16(p + 1, <uint16_t>n)
    elif <uint64_t>n <= _U32_MAX:
        p = _room(w, 5)
        if p != NULL:
            p[0] = code16 + 1
            rl_store32(p + 1, <uint32_t>n)
    else:
        return _too_long(w, obj)
    return 0


cdef int _enc_list(Writer* w, object obj, int depth) except -1:
    cdef Py_ssize_t n = PyList_GET_SIZE(obj)
    cdef Py_ssize_t i
    cdef object item
    if depth >= _MAX_DEPTH:
        raise _too_deep()
    _put_container_header(w, obj, n, 0x90, 0xDC)
    for i in range(n):
        # Size re-checked and a reference held on each item: pickling an item
        # runs arbitrary code, which may shrink the list under us.
        if i >= PyList_GET_SIZE(obj):
            raise RuntimeError("list changed size during serialisation")
        item = <object>PyList_GET_ITEM(obj, i)
        _enc(w, item, depth + 1)
    if PyList_GET_SIZE(obj) != n:
        raise RuntimeError("list changed size during serialisation")
    return 0


cdef int _enc_dict(Writer* w, object obj, int depth) except -1:
    cdef Py_ssize_t n = PyDict_Size(obj)
    cdef Py_ssize_t pos = 0, i = 0
    cdef PyObject* key_ptr
    cdef PyObject* value_ptr
    cdef object key, value
    if depth >= _MAX_DEPTH:
        raise _too_deep()
    _put_container_header(w, obj, n, 0x80, 0xDE)
    while PyDict_Next(obj, &pos, &key_ptr, &value_ptr):
        if i >= n or PyDict_GET_SIZE(obj) != n:
            raise RuntimeError("dictionary changed size during iteration")
        key = <object>key_ptr
        value = <object>value_ptr
        if not (Py_TYPE(key) == &PyUnicode_Type and _put_ascii_fixstr(w, key)):
            _enc(w, key, depth + 1)
        _enc(w, value, depth + 1)
        i += 1
    if i != n:
        raise RuntimeError("dictionary changed size during iteration")
    return 0


cdef int _enc_tuple(Writer* w, object obj, int depth) except -1:
    cdef Py_ssize_t n = PyTuple_GET_SIZE(obj)
    cdef Py_ssize_t i, start, size, h
    cdef unsigned char* base
    if depth >= _MAX_DEPTH:
        raise _too_deep()
    # The ext header needs the payload's length, known only once it is
    # written.  Reserve the smallest header (2 bytes, fixext), write the
    # payload, then move it up if the minimal header for its length is
    # bigger: the frame is byte-identical to the pure twin's, and a buffer
    # big enough for the final frame is always big enough for the moves.
    start = w.pos
    _room(w, 2)
    _put_container_header(w, obj, n, 0x90, 0xDC)
    for i in range(n):
        _enc(w, <object>PyTuple_GET_ITEM(obj, i), depth + 1)
    size = w.pos - start - 2
    if <uint64_t>size > _U32_MAX:
        return _too_long(w, obj)
    h = _ext_header_size(size)
    if h > 2:
        _room(w, h - 2)
    if w.pos <= w.cap:  # everything so far was written (pos only grows)
        base = w.base + start
        if h > 2:
            memmove(base + h, base + 2, size)
        _put_ext_header(base, _EXT_TUPLE, size)
    return 0


cdef list _buffer_list(Writer* w):
    cdef list buffers
    if w.buffers == NULL:
        buffers = []
        Py_INCREF(buffers)
        w.buffers = <PyObject*>buffers
        w.owns_buffers = True
    return <list>w.buffers


cdef inline Py_ssize_t _buffer_total(Writer* w) noexcept:
    return 0 if w.buffers == NULL else PyList_GET_SIZE(<object>w.buffers)


cdef int _enc_oob(Writer* w, int kind, object view) except -1:
    # The caller has pinned the destination (creating ``view`` may collect garbage).
    cdef list buffers = _buffer_list(w)
    cdef Py_ssize_t index = len(buffers)
    cdef unsigned char* p
    buffers.append(view)
    p = _ext_room(w, _EXT_OOB, _OOB_REF_SIZE)
    if p != NULL:
        p[0] = <unsigned char>kind
        rl_store32(p + 1, <uint32_t>index)
    return 0


cdef int _enc_in_band(Writer* w, int kind, object obj, const char* data, Py_ssize_t n) except -1:
    cdef unsigned char* p
    if <uint64_t>(n + 1) > _U32_MAX:
        return _too_long(w, obj)
    p = _ext_room(w, _EXT_BUFFER, n + 1)
    if p != NULL:
        p[0] = <unsigned char>kind
        memcpy(p + 1, data, n)
    return 0


cdef int _enc_bytes(Writer* w, object obj) except -1:
    cdef Py_ssize_t n = PyBytes_GET_SIZE(obj)
    cdef unsigned char* p
    if 0 <= w.threshold <= n:
        _pin(w)
        return _enc_oob(w, _KIND_BYTES, memoryview(obj))
    if n <= 0xFF:
        p = _room(w, 2 + n)
        if p != NULL:
            p[0] = 0xC4
            p[1] = <unsigned char>n
            memcpy(p + 2, PyBytes_AS_STRING(obj), n)
    elif n <= 0xFFFF:
        p = _room(w, 3 + n)
        if p != NULL:
            p[0] = 0xC5
            rl_store16(p + 1, <uint16_t>n)
            memcpy(p + 3, PyBytes_AS_STRING(obj), n)
    elif <uint64_t>n <= _U32_MAX:
        p = _room(w, 5 + n)
        if p != NULL:
            p[0] = 0xC6
            rl_store32(p + 1, <uint32_t>n)
            memcpy(p + 5, PyBytes_AS_STRING(obj), n)
    else:
        return _too_long(w, obj)
    return 0


cdef int _enc_bytearray(Writer* w, object obj) except -1:
    cdef Py_ssize_t n = PyByteArray_GET_SIZE(obj)
    if 0 <= w.threshold <= n:
        _pin(w)
        return _enc_oob(w, _KIND_BYTEARRAY, memoryview(obj))
    return _enc_in_band(w, _KIND_BYTEARRAY, obj, PyByteArray_AS_STRING(obj), n)


cdef int _enc_memoryview(Writer* w, object obj) except -1:
    cdef Py_buffer view
    _pin(w)
    try:
        nbytes = obj.nbytes
        contiguous = obj.c_contiguous
    except ValueError as exc:  # a released memoryview
        return _unserialisable(w, obj, exc)
    if 0 <= w.threshold <= nbytes:
        return _enc_oob(w, _KIND_MEMORYVIEW, _flat_view(obj, contiguous))
    if not contiguous:
        data = obj.tobytes()
        return _enc_in_band(w, _KIND_MEMORYVIEW, obj, PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data))
    PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE)
    try:
        _enc_in_band(w, _KIND_MEMORYVIEW, obj, <const char*>view.buf, view.len)
    finally:
        PyBuffer_Release(&view)
    return 0


cdef object _flat_view(object view, bint contiguous):
    """``view`` as a 1-D unsigned-byte memoryview, zero-copy when it is C-contiguous."""
    if contiguous:
        try:
            return view.cast("B")
        except TypeError:  # e.g. a shape with zeros: nothing to share anyway
            pass
    return memoryview(view.tobytes())


@cython.freelist(4)
cdef class _OutOfBandSink:
    """pickle's buffer_callback: big pickle-5 buffers go out of band."""
    cdef list buffers
    cdef Py_ssize_t threshold

    def __call__(self, buffer):
        try:
            raw = buffer.raw()
        except BufferError:
            return True  # non-contiguous: pickle decides (in-band or error)
        if raw.nbytes < self.threshold:
            return True
        self.buffers.append(raw)
        return False


cdef int _enc_pickle(Writer* w, object obj) except -1:
    cdef Py_ssize_t first = _buffer_total(w)
    cdef Py_ssize_t n, size
    cdef _OutOfBandSink sink = None
    cdef unsigned char* p
    _pin(w)
    if w.threshold >= 0:
        sink = _OutOfBandSink.__new__(_OutOfBandSink)
        sink.buffers = _buffer_list(w)
        sink.threshold = w.threshold
    try:
        payload = _pickle_dumps(obj, w.readonly_arrays, sink,
                                sink.buffers if sink is not None else None)
    except Exception as exc:
        return _unserialisable(w, obj, exc)
    n = PyBytes_GET_SIZE(payload)
    size = _PICKLE_HEAD_SIZE + n
    if <uint64_t>size > _U32_MAX:
        return _too_long(w, obj)
    p = _ext_room(w, _EXT_PICKLE, size)
    if p != NULL:
        rl_store32(p, <uint32_t>first)
        rl_store32(p + 4, <uint32_t>(_buffer_total(w) - first))
        memcpy(p + _PICKLE_HEAD_SIZE, PyBytes_AS_STRING(payload), n)
    return 0


cdef int _enc(Writer* w, object obj, int depth) except -1:
    # Exact type checks, most frequent first: a subclass (IntEnum,
    # OrderedDict, a str subclass...) must be pickled to keep its type.
    cdef PyTypeObject* t = Py_TYPE(obj)
    if t == &PyUnicode_Type:
        return _enc_str(w, obj)
    if t == &PyLong_Type:
        return _enc_int(w, obj)
    if t == &PyFloat_Type:
        _put_float(w, PyFloat_AS_DOUBLE(obj))
        return 0
    if t == &PyDict_Type:
        return _enc_dict(w, obj, depth)
    if t == &PyList_Type:
        return _enc_list(w, obj, depth)
    if obj is None:
        _put_byte(w, 0xC0)
        return 0
    if t == &PyBool_Type:
        _put_byte(w, 0xC3 if obj is True else 0xC2)
        return 0
    if t == &PyBytes_Type:
        return _enc_bytes(w, obj)
    if t == &PyTuple_Type:
        return _enc_tuple(w, obj, depth)
    if t == &PyByteArray_Type:
        return _enc_bytearray(w, obj)
    if t == &PyMemoryView_Type:
        return _enc_memoryview(w, obj)
    return _enc_pickle(w, obj)


cdef inline void _put_byte(Writer* w, unsigned char b) noexcept:
    cdef unsigned char* p = _room(w, 1)
    if p != NULL:
        p[0] = b


# ---------------------------------------------------------- error paths

def _type_name(t):
    module = getattr(t, "__module__", None)
    name = getattr(t, "__qualname__", None) or getattr(t, "__name__", "?")
    return name if module is None or module == "builtins" else f"{module}.{name}"


def _short_repr(obj):
    try:
        text = repr(obj)
    except Exception:
        return "<unrepresentable>"
    return text if len(text) <= 60 else text[:57] + "..."


def _children(obj, path):
    """The values inside a container, in encoding order, with their paths."""
    if type(obj) is dict:
        for i, (key, value) in enumerate(obj.items()):
            yield key, f"list({path})[{i}]"
            yield value, f"{path}[{_short_repr(key)}]"
    else:
        for i, item in enumerate(obj):
            yield item, f"{path}[{i}]"


def _locate(root, target):
    """Path of the first occurrence of ``target`` in ``root``, in encoding order.

    Searched only once encoding has failed, so the success path keeps no
    trace of where it is: the encoder stopped at the first value it could not
    serialise, and walks in this same order.
    """
    if root is target:
        return "value"
    if type(root) not in (list, tuple, dict):
        return "value"
    stack = [_children(root, "value")]
    while stack:
        for child, path in stack[-1]:
            if child is target:
                return path
            if type(child) in (list, tuple, dict) and len(stack) < _MAX_DEPTH:
                stack.append(_children(child, path))
                break
        else:
            stack.pop()
    return "an unknown place in value"


cdef inline void _init_writer(Writer* w, object obj, unsigned char* base, Py_ssize_t capacity,
                              PyObject* buffers, Py_ssize_t threshold) noexcept:
    w.base = base
    w.pos = 0
    w.cap = capacity
    w.growable = False
    w.on_heap = False
    w.no_memory = False
    w.buffers = buffers
    w.owns_buffers = False
    w.root = <PyObject*>obj
    w.threshold = threshold if threshold >= 0 else -1
    w.pin_owner = NULL
    w.pin_offset = 0
    w.pinned = False
    w.readonly_arrays = False


cdef inline bint _short_str(Writer* w, object obj) noexcept:
    """Encode a short ASCII str in one step (the commonest yield); False if ``obj`` is not one."""
    cdef Py_ssize_t n
    if Py_TYPE(obj) != &PyUnicode_Type or not PyUnicode_IS_COMPACT_ASCII(obj):
        return False
    n = PyUnicode_GET_LENGTH(obj)
    if n > 31 or n + 1 > w.cap:
        return False
    w.base[0] = 0xA0 | <unsigned char>n
    memcpy(w.base + 1, PyUnicode_DATA(obj), n)
    w.pos = n + 1
    return True


cdef Py_ssize_t _encode(Writer* w, object obj) except -1:
    cdef Py_ssize_t first
    if _short_str(w, obj):
        return w.pos
    # Errors are raised where they happen, already in their final form; the
    # one except here catches the rare value nested too deep for a frame.
    first = _buffer_total(w)
    try:
        _enc(w, obj, 0)
    except _TooDeep:
        # Self-referencing (or very deep) containers: the whole value as one
        # pickle, which keeps its cycles and shared parts as Ray does.
        if w.buffers != NULL:
            del (<list>w.buffers)[first:]
        w.pos = 0
        _enc_pickle(w, obj)
    if w.no_memory:
        raise MemoryError()
    if w.pos > w.cap:
        # A frame that did not make it leaves no out-of-band buffers behind.
        if w.buffers != NULL:
            del (<list>w.buffers)[first:]
        raise BufferTooSmallError(
            f"frame needs {w.pos} bytes, {w.cap} available", needed=w.pos)
    return w.pos


cdef Py_ssize_t encode_to_ptr(object obj, char* dst, Py_ssize_t capacity,
                              list buffers, Py_ssize_t oob_threshold,
                              bint readonly_arrays) except -1:
    # On BufferTooSmallError ``buffers`` is left as it was; after any other
    # error it may hold buffers of the failed frame (discard the list).
    cdef Writer w
    _init_writer(&w, obj, <unsigned char*>dst, capacity, <PyObject*>buffers, oob_threshold)
    w.readonly_arrays = readonly_arrays
    return _encode(&w, obj)


cdef inline Py_ssize_t _threshold_arg(object oob_threshold) except? -2:
    cdef Py_ssize_t t
    if oob_threshold is None:
        return -1
    t = oob_threshold
    return t if t >= 0 else -1


cdef inline object _encoded(Py_ssize_t end, Writer* w):
    """``(end, buffers)`` as encode_into returns it."""
    # The shared empty tuple when there are no out-of-band buffers: the
    # common frame then allocates nothing but the pair itself.
    if w.buffers == NULL or PyList_GET_SIZE(<object>w.buffers) == 0:
        return end, ()
    return end, PyList_AsTuple(<object>w.buffers)


cdef inline void _finish_writer(Writer* w) noexcept:
    if w.pinned:
        PyBuffer_Release(&w.pin_view)
        w.pinned = False
    if w.owns_buffers:
        Py_XDECREF(w.buffers)
        w.buffers = NULL
        w.owns_buffers = False


def encode_into(obj, buf, Py_ssize_t offset=0, oob_threshold=OOB_THRESHOLD, *,
                bint readonly_arrays=False):
    """Write the frame of ``obj`` into ``buf`` at ``offset``; return ``(end, buffers)``.

    ``buf`` is any writable C-contiguous buffer (bytearray, memoryview of an
    mmap...).  ``buffers`` is a tuple, ``()`` when everything is in-band.
    ``oob_threshold=None`` (or negative) keeps everything in-band.
    ``readonly_arrays``: numpy arrays decode read-only (see ``_arrays``).
    """
    cdef Py_ssize_t threshold = _threshold_arg(oob_threshold)
    cdef Py_ssize_t size
    cdef Py_buffer view
    cdef Writer w
    if type(buf) is bytearray:
        size = PyByteArray_GET_SIZE(buf)
        if not 0 <= offset <= size:
            raise ValueError(f"offset {offset} outside the buffer of {size} bytes")
        _init_writer(&w, obj, <unsigned char*>PyByteArray_AS_STRING(buf) + offset, size - offset,
                     NULL, threshold)
        w.pin_owner = <PyObject*>buf
        w.pin_offset = offset
        w.readonly_arrays = readonly_arrays
        try:
            return _encoded(offset + _encode(&w, obj), &w)
        finally:
            _finish_writer(&w)
    if _get_buffer(buf, &view, PyBUF_WRITABLE) == -1:
        _raise_buffer_error("encode_into needs a writable C-contiguous buffer")
    _init_writer(&w, obj, <unsigned char*>view.buf, 0, NULL, threshold)
    w.readonly_arrays = readonly_arrays
    try:
        if not 0 <= offset <= view.len:
            raise ValueError(f"offset {offset} outside the buffer of {view.len} bytes")
        w.base += offset
        w.cap = view.len - offset
        return _encoded(offset + _encode(&w, obj), &w)
    finally:
        _finish_writer(&w)
        PyBuffer_Release(&view)


def encode_growing(obj, bytearray buf not None, oob_threshold=OOB_THRESHOLD, *, limit=None,
                   on_retry=None, bint readonly_arrays=False):
    """Encode ``obj`` into the bytearray ``buf``, or into a bigger one when it
    does not fit; return ``(buf, end, buffers)``: the bytearray that holds the
    frame at ``[0:end]`` and a list of its out-of-band buffers.

    A retry takes ``max(needed, 2 * len(buf))`` bytes.  ``limit``: a frame
    of more bytes raises ``BufferTooSmallError`` (``needed`` is its length).
    ``on_retry()`` runs before each retry (state the encoding built, such as
    a list of lent references, starts again).
    """
    cdef Py_ssize_t threshold = _threshold_arg(oob_threshold)
    cdef Py_ssize_t needed
    cdef list buffers
    cdef Py_buffer view
    while True:
        buffers = []
        # Exported while encoding: a reduction cannot resize it under us.
        PyObject_GetBuffer(buf, &view, PyBUF_WRITABLE)
        try:
            end = encode_to_ptr(obj, <char*>view.buf, view.len, buffers, threshold,
                                readonly_arrays)
            return buf, end, buffers
        except BufferTooSmallError as exc:
            needed = exc.needed
        finally:
            PyBuffer_Release(&view)
        buf = _grown(buf, needed, limit, on_retry)


def _grown(buf, needed, limit, on_retry):
    if limit is not None and needed > limit:
        raise BufferTooSmallError(f"frame needs {needed} bytes, over the limit of {limit}",
                                  needed=needed)
    if on_retry is not None:
        on_retry()
    return bytearray(max(needed, 2 * len(buf)))


cdef int _raise_buffer_error(str message) except -1:
    # PyObject_GetBuffer failed: a non-buffer object already raised
    # TypeError; read-only or non-contiguous buffers raise BufferError, which
    # we turn into TypeError as the pure twin does.
    if PyErr_ExceptionMatches(BufferError):
        PyErr_Clear()
        raise TypeError(message)
    return -1  # TypeError from a non-buffer object, already set


def dumps(obj, *, bint readonly_arrays=False):
    """The frame of ``obj`` as bytes, everything in-band."""
    cdef unsigned char local[_DUMPS_STACK]
    cdef Writer w
    _init_writer(&w, obj, local, _DUMPS_STACK, NULL, -1)
    w.growable = True
    w.readonly_arrays = readonly_arrays
    try:
        _encode(&w, obj)
        return PyBytes_FromStringAndSize(<char*>w.base, w.pos)
    finally:
        _finish_writer(&w)
        if w.on_heap:
            PyMem_Free(w.base)


# ================================================================ decoding

cdef PyObject* _key_cache[_KEY_CACHE_SIZE]   # strong references, or NULL

cdef struct Reader:
    const unsigned char* start
    const unsigned char* p
    const unsigned char* end
    PyObject* buffers     # sequence of out-of-band buffers, or None
    # A memoryview input is read without holding it, which saves the hold
    # for scalar frames.  That is safe only while no Python code can run (it
    # could release the view); containers and ext values may run some (the
    # garbage collector, pickle), so they call _pin_input() first.
    PyObject* pin_owner   # the memoryview being read, or NULL: the input is already stable
    bint pinned


cdef inline int _pin_input(Reader* r) noexcept:
    # Counted as a buffer export (see rl_memoryview_hold): the caller's
    # reference keeps the view alive, the count keeps it from being released.
    if r.pin_owner != NULL and not r.pinned:
        rl_memoryview_hold(<object>r.pin_owner)
        r.pinned = True
    return 0


cdef int _truncated(Reader* r, Py_ssize_t n) except -1:
    raise DecodeError(
        f"truncated frame at offset {r.p - r.start}: needs {n} bytes, {r.end - r.p} left")


cdef inline int _need(Reader* r, Py_ssize_t n) except -1:
    if r.end - r.p < n:
        return _truncated(r, n)
    return 0


cdef inline uint8_t _read8(Reader* r) except? 0xFF:
    if r.p >= r.end:
        _truncated(r, 1)
    r.p += 1
    return r.p[-1]


cdef inline uint16_t _read16(Reader* r) except? 0xFFFF:
    _need(r, 2)
    r.p += 2
    return rl_load16(r.p - 2)


cdef inline uint32_t _read32(Reader* r) except? 0xFFFFFFFF:
    _need(r, 4)
    r.p += 4
    return rl_load32(r.p - 4)


cdef inline uint64_t _read64(Reader* r) except? 0xFFFFFFFFFFFFFFFF:
    _need(r, 8)
    r.p += 8
    return rl_load64(r.p - 8)


cdef object _dec_str(Reader* r, Py_ssize_t n, Py_ssize_t off):
    cdef PyObject* text
    _need(r, n)
    if n <= 64 and rl_is_ascii(r.p, n):
        # Most strings are short ASCII: skip the UTF-8 decoder's generality.
        text = PyUnicode_New(n, 127)
        if text == NULL:
            raise MemoryError()
        memcpy(PyUnicode_DATA(<object>text), r.p, n)
        r.p += n
        return _steal(text)
    text = _decode_utf8(<const char*>r.p, n, NULL)
    if text == NULL:
        _invalid_utf8(off)
        return None  # not reached: _invalid_utf8 always raises
    r.p += n
    return _steal(text)


cdef int _invalid_utf8(Py_ssize_t off) except -1:
    # Called with the decoder's error set.
    if PyErr_ExceptionMatches(UnicodeDecodeError):
        PyErr_Clear()
        raise DecodeError(f"invalid UTF-8 in str at offset {off}")
    return -1  # MemoryError, already set


cdef object _dec_key(Reader* r, Py_ssize_t n, Py_ssize_t off):
    """A str map key: short ASCII keys come from a cache.

    Messages repeat the same few keys; a cached key is neither allocated nor
    hashed again (a str caches its hash), which is most of the cost of
    building a small dict.
    """
    cdef PyObject* cached
    cdef size_t slot
    if n > _KEY_CACHE_MAX_LEN:
        return _dec_str(r, n, off)
    _need(r, n)
    slot = rl_key_slot(r.p, n) & (_KEY_CACHE_SIZE - 1)
    cached = _key_cache[slot]
    # Only ASCII keys are cached, so equal bytes mean an equal str.
    if (cached != NULL and PyUnicode_GET_LENGTH(<object>cached) == n
            and rl_short_eq(<const unsigned char*>PyUnicode_DATA(<object>cached), r.p, n)):
        r.p += n
        return <object>cached
    key = _dec_str(r, n, off)
    if PyUnicode_IS_ASCII(key):
        hash(key)
        Py_XDECREF(cached)
        Py_INCREF(key)
        _key_cache[slot] = <PyObject*>key
    return key


cdef object _dec_bin(Reader* r, Py_ssize_t n):
    _need(r, n)
    r.p += n
    return PyBytes_FromStringAndSize(<const char*>r.p - n, n)


cdef int _check_container(Reader* r, Py_ssize_t n, Py_ssize_t per_item, int depth,
                          Py_ssize_t off, str what) except -1:
    cdef Py_ssize_t left
    _pin_input(r)
    if depth >= _MAX_DEPTH:
        raise DecodeError(f"frame nested deeper than {_MAX_DEPTH} containers at offset {off}")
    # Each item takes at least one byte: a count the rest of the input cannot
    # hold is corrupt, and is refused before anything is allocated.
    left = r.end - r.p
    if <uint64_t>n * <uint64_t>per_item > <uint64_t>left:
        raise DecodeError(
            f"corrupt frame at offset {off}: {what} {n} cannot fit in the {left} bytes left")
    return 0


cdef object _dec_list(Reader* r, Py_ssize_t n, int depth, Py_ssize_t off):
    cdef Py_ssize_t i
    cdef object item
    _check_container(r, n, 1, depth, off, "array of")
    result = PyList_New(n)
    for i in range(n):
        item = _dec(r, depth + 1)
        Py_INCREF(item)
        PyList_SET_ITEM(result, i, item)
    return result


cdef object _dec_map(Reader* r, Py_ssize_t n, int depth, Py_ssize_t off):
    cdef Py_ssize_t i, key_off
    cdef object key, value
    cdef uint8_t b
    _check_container(r, n, 2, depth, off, "map of")
    result = {}
    for i in range(n):
        key_off = r.p - r.start
        b = r.p[0] if r.p < r.end else 0xC1
        if 0xA0 <= b <= 0xBF:  # fixstr: the usual key
            r.p += 1
            key = _dec_key(r, b & 0x1F, key_off)
            value = _dec(r, depth + 1)
        else:
            key = _dec(r, depth + 1)
            value = _dec(r, depth + 1)
            if Py_TYPE(key) != &PyUnicode_Type:
                _check_hashable(key, key_off)
        PyDict_SetItem(result, key, value)
    return result


cdef int _check_hashable(object key, Py_ssize_t key_off) except -1:
    try:
        hash(key)
    except TypeError:
        raise DecodeError(
            f"unhashable map key of type {type(key).__name__!r} at offset {key_off}") from None
    return 0


cdef object _dec_tuple(Reader* r, Py_ssize_t size, int depth, Py_ssize_t off):
    # The payload is one array, decoded in place with reads bounded by the
    # payload's end; it must fill the payload exactly.
    cdef const unsigned char* outer_end = r.end
    cdef Py_ssize_t n, i
    cdef uint8_t b
    cdef object item
    r.end = r.p + size
    b = r.p[0] if size else 0
    if 0x90 <= b <= 0x9F:
        r.p += 1
        n = b & 0x0F
    elif b == 0xDC:
        r.p += 1
        n = _read16(r)
    elif b == 0xDD:
        r.p += 1
        n = _read32(r)
    else:
        raise DecodeError(f"corrupt frame at offset {off}: tuple payload is not an array")
    _check_container(r, n, 1, depth, off, "array of")
    result = PyTuple_New(n)
    for i in range(n):
        item = _dec(r, depth + 1)
        Py_INCREF(item)
        PyTuple_SET_ITEM(result, i, item)
    if r.p != r.end:
        raise DecodeError(
            f"corrupt frame at offset {off}: tuple payload has {r.end - r.p} trailing bytes")
    r.end = outer_end
    return result


cdef Py_ssize_t _buffer_count(Reader* r) except -1:
    if <object>r.buffers is None:
        return 0
    return len(<object>r.buffers)


cdef object _dec_pickle(Reader* r, Py_ssize_t size, Py_ssize_t off):
    cdef uint64_t first, count
    cdef Py_ssize_t available
    if size < _PICKLE_HEAD_SIZE:
        raise DecodeError(
            f"corrupt frame at offset {off}: pickle payload shorter than its "
            f"{_PICKLE_HEAD_SIZE}-byte header")
    first = rl_load32(r.p)
    count = rl_load32(r.p + 4)
    available = _buffer_count(r)
    if count and first + count > <uint64_t>available:
        raise DecodeError(
            f"out-of-band buffers {first}..{first + count - 1} referenced at offset {off}, "
            f"{available} delivered")
    oob = (<object>r.buffers)[first:first + count] if count else ()
    # pickle reads the payload in place; the view is released afterwards so
    # that nothing can keep a way into the caller's memory.
    view = PyMemoryView_FromMemory(<char*>r.p + _PICKLE_HEAD_SIZE, size - _PICKLE_HEAD_SIZE, PyBUF_READ)
    try:
        return pickle.loads(view, buffers=oob)
    except Exception as exc:
        raise DecodeError(
            f"corrupt pickle at offset {off}: {type(exc).__name__}: {exc}") from exc
    finally:
        try:
            view.release()
        except BufferError:
            pass


cdef object _buffer_of_kind(int kind, object data, Py_ssize_t off):
    if kind == _KIND_BYTES:
        return bytes(data)
    if kind == _KIND_BYTEARRAY:
        return bytearray(data)
    if kind == _KIND_MEMORYVIEW:
        return memoryview(bytes(data))
    raise DecodeError(f"unknown buffer kind {kind} at offset {off}")


cdef object _dec_out_of_band(Reader* r, Py_ssize_t size, Py_ssize_t off):
    cdef int kind
    cdef uint32_t index
    cdef Py_ssize_t available
    if size != _OOB_REF_SIZE:
        raise DecodeError(
            f"corrupt frame at offset {off}: out-of-band reference payload "
            f"must be {_OOB_REF_SIZE} bytes, not {size}")
    kind = r.p[0]
    index = rl_load32(r.p + 1)
    if kind > _KIND_MEMORYVIEW:
        raise DecodeError(f"unknown buffer kind {kind} at offset {off}")
    available = _buffer_count(r)
    if index >= <uint64_t>available:
        raise DecodeError(
            f"out-of-band buffer {index} referenced at offset {off}, {available} delivered")
    try:
        view = memoryview((<object>r.buffers)[index])
        if view.ndim != 1 or view.format != "B":
            view = view.cast("B")
    except (TypeError, ValueError) as exc:
        raise DecodeError(
            f"out-of-band buffer {index} is not a C-contiguous bytes-like object") from exc
    if kind == _KIND_MEMORYVIEW:
        return view
    return _buffer_of_kind(kind, view, off)


cdef object _dec_ext(Reader* r, Py_ssize_t size, int depth, Py_ssize_t off):
    cdef int code = <int8_t>_read8(r)
    cdef Py_ssize_t left = r.end - r.p
    _pin_input(r)
    if left < size:
        raise DecodeError(
            f"truncated frame at offset {r.p - r.start}: needs {size} bytes, {left} left")
    if code == _EXT_TUPLE:
        return _dec_tuple(r, size, depth, off)
    if code == _EXT_BIGINT:
        if size == 0:
            raise DecodeError(f"corrupt frame at offset {off}: empty big-int payload")
        r.p += size
        return int.from_bytes(PyBytes_FromStringAndSize(<const char*>r.p - size, size),
                              "little", signed=True)
    if code == _EXT_PICKLE:
        result = _dec_pickle(r, size, off)
        r.p += size
        return result
    if code == _EXT_OOB:
        result = _dec_out_of_band(r, size, off)
        r.p += size
        return result
    if code == _EXT_BUFFER:
        if size == 0:
            raise DecodeError(f"corrupt frame at offset {off}: empty buffer payload")
        r.p += size
        return _buffer_of_kind((r.p - size)[0],
                               PyBytes_FromStringAndSize(<const char*>r.p - size + 1, size - 1), off)
    r.p += size
    raise DecodeError(f"unknown ext type {code} at offset {off}")


cdef object _dec(Reader* r, int depth):
    cdef Py_ssize_t off = r.p - r.start
    cdef uint8_t b = _read8(r)
    if b <= 0x7F:
        return <long>b
    if b >= 0xE0:
        return <long>(<int8_t>b)
    if b <= 0x8F:
        return _dec_map(r, b & 0x0F, depth, off)
    if b <= 0x9F:
        return _dec_list(r, b & 0x0F, depth, off)
    if b <= 0xBF:
        return _dec_str(r, b & 0x1F, off)
    if b == 0xC0:
        return None
    if b == 0xC2:
        return False
    if b == 0xC3:
        return True
    if b == 0xCB:
        return rl_bits_double(_read64(r))
    if b == 0xCC:
        return _read8(r)
    if b == 0xCD:
        return _read16(r)
    if b == 0xCE:
        return _read32(r)
    if b == 0xCF:
        return _read64(r)
    if b == 0xD0:
        return <long>(<int8_t>_read8(r))
    if b == 0xD1:
        return <long>(<int16_t>_read16(r))
    if b == 0xD2:
        return <long>(<int32_t>_read32(r))
    if b == 0xD3:
        return <long long>(<int64_t>_read64(r))
    if b == 0xD9:
        return _dec_str(r, _read8(r), off)
    if b == 0xDA:
        return _dec_str(r, _read16(r), off)
    if b == 0xDB:
        return _dec_str(r, _read32(r), off)
    if b == 0xC4:
        return _dec_bin(r, _read8(r))
    if b == 0xC5:
        return _dec_bin(r, _read16(r))
    if b == 0xC6:
        return _dec_bin(r, _read32(r))
    if b == 0xDC:
        return _dec_list(r, _read16(r), depth, off)
    if b == 0xDD:
        return _dec_list(r, _read32(r), depth, off)
    if b == 0xDE:
        return _dec_map(r, _read16(r), depth, off)
    if b == 0xDF:
        return _dec_map(r, _read32(r), depth, off)
    if 0xD4 <= b <= 0xD8:
        return _dec_ext(r, 1 << (b - 0xD4), depth, off)
    if b == 0xC7:
        return _dec_ext(r, _read8(r), depth, off)
    if b == 0xC8:
        return _dec_ext(r, _read16(r), depth, off)
    if b == 0xC9:
        return _dec_ext(r, _read32(r), depth, off)
    if b == 0xCA:
        return rl_bits_float(_read32(r))
    raise DecodeError(f"invalid type byte 0x{b:02x} at offset {off}")


cdef inline void _init_reader(Reader* r, const char* src, Py_ssize_t length, object buffers) noexcept:
    r.start = <const unsigned char*>src
    r.p = r.start
    r.end = r.start + length
    r.buffers = <PyObject*>buffers
    r.pin_owner = NULL
    r.pinned = False


cdef object _decode(Reader* r):
    obj = _dec(r, 0)
    if r.p != r.end:
        raise DecodeError(
            f"trailing bytes: frame ends at offset {r.p - r.start}, input has {r.end - r.start} bytes")
    return obj


cdef object decode_from_ptr(const char* src, Py_ssize_t length, object buffers):
    cdef Reader r
    _init_reader(&r, src, length, buffers)
    return _decode(&r)


def decode(data, buffers=()):
    """Decode the one frame that fills ``data``; ``buffers`` are its out-of-band buffers."""
    cdef Py_buffer view
    cdef Py_buffer* direct
    cdef Reader r
    if type(data) is bytes:
        return decode_from_ptr(PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data), buffers)
    if type(data) is memoryview and rl_memoryview_usable(data):
        direct = PyMemoryView_GET_BUFFER(data)
        _init_reader(&r, <const char*>direct.buf, direct.len, buffers)
        r.pin_owner = <PyObject*>data
        try:
            return _decode(&r)
        finally:
            if r.pinned:
                rl_memoryview_unhold(data)
    if _get_buffer(data, &view, PyBUF_SIMPLE) == -1:
        _raise_buffer_error("decode needs a C-contiguous bytes-like object")
    try:
        return decode_from_ptr(<const char*>view.buf, view.len, buffers)
    finally:
        PyBuffer_Release(&view)


def loads(data):
    """``decode(data)``: a frame with no out-of-band buffers."""
    return decode(data)
