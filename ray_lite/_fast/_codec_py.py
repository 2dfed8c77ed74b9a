"""Pure-Python twin of the codec, and the specification of its frame format.

The compiled twin ``_codec_c`` must produce the very same bytes and raise the
very same errors (with the same messages); when the two disagree, the
compiled one is wrong.  This twin does not use the msgpack library: writing
the format out by hand keeps depth limits, error paths and byte layout under
our control and identical in both twins (msgpack is the oracle in the tests).

Frame
-----
A frame is exactly one msgpack object.

* ``None``, ``bool``, ``int`` in [-2**63, 2**64 - 1], ``float``, ``str``,
  ``bytes``, ``list`` and ``dict`` of *exactly* these types are plain msgpack,
  in its minimal encodings: the smallest int/str/bin/array/map header that
  holds the value (non-negative ints use the unsigned forms, negative ints the
  signed ones), floats always as float64, ``str`` in the str family (UTF-8),
  ``bytes`` in the bin family.  Dict key order is kept.  The decoder also
  accepts float32.
* Everything else is an ext object (minimal ext header: fixext 1/2/4/8/16
  when the payload has exactly that length, else ext 8/16/32):

  ``EXT_TUPLE`` (1)
      payload: the items as one msgpack array.  Tuples stay tuples at any
      depth (and as dict keys).
  ``EXT_BIGINT`` (2)
      payload: an int outside the 64-bit ranges, little-endian two's
      complement, in the fewest bytes that hold its sign.
  ``EXT_PICKLE`` (3)
      payload: ``first`` and ``count`` (big-endian uint32 each), then a
      protocol-5 pickle of the object: the standard pickler's where every
      class and function in it can be imported by name, cloudpickle's
      otherwise (``__main__``, lambdas, closures, local classes: by value;
      see ``_pickling``).  The pickle's out-of-band buffers are
      ``buffers[first:first + count]``.  Used for every type not
      listed here, *including subclasses* of the plain types (IntEnum,
      OrderedDict, defaultdict, namedtuple, str subclasses, numpy scalars...)
      so that their type survives, and for ``str`` values holding lone
      surrogates (UTF-8 cannot carry them; pickle can, so they round-trip).
  ``EXT_OOB`` (4)
      payload: ``kind`` (uint8) and ``index`` (big-endian uint32): the value
      is ``buffers[index]``, returned as bytes (``kind`` 0, one copy),
      bytearray (1, one copy) or memoryview (2, zero-copy over the delivered
      buffer, flat unsigned bytes).
  ``EXT_BUFFER`` (5)
      payload: ``kind`` (as above) then the bytes: an in-band bytearray or
      memoryview, so that both come back as their own type.  A memoryview
      comes back read-only, flat (format ``'B'``, 1-D), over a private copy.

Out-of-band buffers
-------------------
With ``oob_threshold`` not ``None``, a bytes/bytearray/memoryview of at least
``oob_threshold`` bytes, and each pickle-5 buffer (numpy array data) of at
least that size, is not copied into the frame: a 1-D ``'B'`` memoryview of it
is appended to the frame's out-of-band buffers, returned by ``encode_into``
as a tuple (``()`` when there are none), for the transport to deliver beside
the frame.  These views alias the original objects: deliver them
before mutating the objects.  A non-contiguous memoryview is copied once.

``OOB_THRESHOLD`` = 64 KiB: below it a copy into the ring slot (a few
microseconds at memory bandwidth) is cheaper than a separate shared-memory
segment (tens of microseconds to create, map and unlink), and a frame stays
small enough for a ring of a few MiB to hold many of them; above it the copy
grows with the size while the out-of-band cost does not.  Pickle-5 buffers
below the threshold stay in the pickle for the same reason.  A ring passes
its own threshold, higher (half its inline limit, see
``_ring_py.oob_threshold``): measured, a copy in and out of a ring stays
cheaper than a side segment up to the sizes the ring holds inline.

Limits and errors
-----------------
* Containers (list, dict, tuple) nest at most ``MAX_DEPTH`` deep in a
  frame.  A value with a container inside ``MAX_DEPTH`` others (a
  self-referencing list or dict ends here) is encoded whole as one
  ``EXT_PICKLE``: pickle keeps its cycles and shared parts; a value pickle
  cannot take either (nested past Python's recursion limit) raises
  ``SerializationError``.  Decoding a frame nested deeper raises
  ``DecodeError``.  Pickled objects are opaque and not counted.
* A value nothing can serialise raises ``SerializationError`` naming its type
  and where it sat (``value['a'][2]``; ``list(value)[1]`` is a dict key), with
  the pickling error chained.  The path is found only once encoding has
  failed (by searching the value for the failing object), so the success
  path pays nothing for it.
* ``encode_into`` raises ``BufferTooSmallError`` whose ``needed`` is the exact
  frame size (bytes from ``offset``); the destination beyond ``offset`` may
  have been written.  Bytes before ``offset`` are never touched.
* ``decode`` raises ``DecodeError`` for anything that is not exactly one valid
  frame: truncation, trailing bytes, the unused type byte 0xc1, lengths past
  the end (checked before anything is allocated), invalid UTF-8, unhashable
  map keys, unknown ext types, out-of-range buffer references, corrupt
  pickles.  Decoding a pickle runs code chosen by the frame's writer: decode
  frames only from processes you trust (ours).
"""
import operator
import pickle
import struct

from ._pickling import dumps as _pickle_dumps
from .errors import BufferTooSmallError, DecodeError, SerializationError

__all__ = [
    "EXT_TUPLE", "EXT_BIGINT", "EXT_PICKLE", "EXT_OOB", "EXT_BUFFER",
    "OOB_THRESHOLD", "MAX_DEPTH",
    "encode_into", "encode_growing", "dumps", "decode", "loads",
    "BufferTooSmallError", "DecodeError", "SerializationError",
]

EXT_TUPLE = 1
EXT_BIGINT = 2
EXT_PICKLE = 3
EXT_OOB = 4
EXT_BUFFER = 5

OOB_THRESHOLD = 64 * 1024
MAX_DEPTH = 512

# ``kind`` byte of EXT_OOB / EXT_BUFFER payloads.
KIND_BYTES = 0
KIND_BYTEARRAY = 1
KIND_MEMORYVIEW = 2

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_F32 = struct.Struct(">f")
_F64 = struct.Struct(">d")
_PICKLE_HEAD = struct.Struct(">II")
_OOB_REF = struct.Struct(">BI")

_U32_MAX = 0xFFFFFFFF
_FIXEXT_CODES = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}

# ---------------------------------------------------------------- encoding

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

    The encoder failed at the first value it could not serialise, and walks in
    this same order, so the first occurrence is where it failed.  Iterative:
    the value may be nested MAX_DEPTH deep.
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
            if type(child) in (list, tuple, dict) and len(stack) < MAX_DEPTH:
                stack.append(_children(child, path))
                break
        else:
            stack.pop()
    return "an unknown place in value"


class _Unserialisable(Exception):
    """Raised inside the encoder; the entry point turns it into SerializationError."""

    def __init__(self, obj, cause):
        super().__init__(obj, cause)
        self.obj = obj
        self.cause = cause


def _serialisation_error(root, exc):
    obj, cause = exc.obj, exc.cause
    return SerializationError(
        f"cannot serialise object of type {_type_name(type(obj))!r} at "
        f"{_locate(root, obj)}: {type(cause).__name__}: {cause}")


class _TooDeep(Exception):
    """A container inside MAX_DEPTH others: the entry point pickles the whole value."""


def _too_deep():
    return _TooDeep()


def _ext_header(code, n):
    fixed = _FIXEXT_CODES.get(n)
    if fixed is not None:
        return bytes((fixed, code))
    if n <= 0xFF:
        return bytes((0xC7, n, code))
    if n <= 0xFFFF:
        return b"\xc8" + _U16.pack(n) + bytes((code,))
    return b"\xc9" + _U32.pack(n) + bytes((code,))


# msgpack's length-prefixed families: (fix tag, largest fix length or -1,
# 8-bit tag or None, 16-bit tag, 32-bit tag).
_STR_HEADER = (0xA0, 31, 0xD9, b"\xda", b"\xdb")
_BIN_HEADER = (0, -1, 0xC4, b"\xc5", b"\xc6")
_ARRAY_HEADER = (0x90, 15, None, b"\xdc", b"\xdd")
_MAP_HEADER = (0x80, 15, None, b"\xde", b"\xdf")


def _sized_header(out, n, obj, family):
    """Append the shortest header of ``family`` for ``n`` bytes or items."""
    fix_tag, fix_max, tag8, tag16, tag32 = family
    if n <= fix_max:
        out.append(fix_tag | n)
    elif tag8 is not None and n <= 0xFF:
        out += bytes((tag8, n))
    elif n <= 0xFFFF:
        out += tag16 + _U16.pack(n)
    elif n <= _U32_MAX:
        out += tag32 + _U32.pack(n)
    else:
        raise _too_long(obj)


def _too_long(obj):
    return _Unserialisable(obj, ValueError("longer than msgpack's 4 GiB limit"))


def _list_items(seq, n):
    # Exactly the n items the header announced, even if a pickled item's
    # reduction changes the list under us.
    for i in range(n):
        if i >= len(seq):
            raise RuntimeError("list changed size during serialisation")
        yield seq[i]
    if len(seq) != n:
        raise RuntimeError("list changed size during serialisation")


def _dict_items(mapping):
    # Iterating the dict itself (no snapshot) raises RuntimeError if a pickled
    # value's reduction resizes it, as the compiled twin does.
    for key, value in mapping.items():
        yield key
        yield value


class _Encoder:
    """Appends one frame to ``out``.

    Iterative (a stack of the open containers' item iterators) so that
    MAX_DEPTH levels never meet Python's recursion limit.
    """
    __slots__ = ("out", "buffers", "threshold", "readonly_arrays")

    def __init__(self, buffers, threshold, readonly_arrays=False):
        self.out = bytearray()
        self.buffers = buffers
        self.threshold = threshold
        self.readonly_arrays = readonly_arrays

    def encode(self, obj):
        stack = []
        self.value(obj, stack)
        while stack:
            try:
                child = next(stack[-1])
            except StopIteration:
                stack.pop()
            else:
                self.value(child, stack)

    def tuple_items(self, tup, start):
        yield from tup
        # Now that the payload is written its length is known: put the
        # minimal ext header in front of it.
        out = self.out
        size = len(out) - start
        if size > _U32_MAX:
            raise _too_long(tup)
        out[start:start] = _ext_header(EXT_TUPLE, size)

    def value(self, obj, stack):
        """Write a scalar, or a container's header and push its items."""
        out = self.out
        t = type(obj)
        if t is str:
            try:
                data = obj.encode("utf-8")
            except UnicodeEncodeError:
                return self.pickled(obj)
            _sized_header(out, len(data), obj, _STR_HEADER)
            out += data
        elif t is int:
            if 0 <= obj:
                if obj <= 0x7F:
                    out.append(obj)
                elif obj <= 0xFF:
                    out += bytes((0xCC, obj))
                elif obj <= 0xFFFF:
                    out += b"\xcd" + _U16.pack(obj)
                elif obj <= 0xFFFFFFFF:
                    out += b"\xce" + _U32.pack(obj)
                elif obj <= 0xFFFFFFFFFFFFFFFF:
                    out += b"\xcf" + _U64.pack(obj)
                else:
                    self.bigint(obj)
            elif obj >= -32:
                out.append(obj & 0xFF)
            elif obj >= -0x80:
                out += b"\xd0" + _I8.pack(obj)
            elif obj >= -0x8000:
                out += b"\xd1" + _I16.pack(obj)
            elif obj >= -0x80000000:
                out += b"\xd2" + _I32.pack(obj)
            elif obj >= -0x8000000000000000:
                out += b"\xd3" + _I64.pack(obj)
            else:
                self.bigint(obj)
        elif t is float:
            out += b"\xcb" + _F64.pack(obj)
        elif t is dict:
            if len(stack) >= MAX_DEPTH:
                raise _too_deep()
            n = len(obj)
            _sized_header(out, n, obj, _MAP_HEADER)
            if n:
                stack.append(_dict_items(obj))
        elif t is list:
            if len(stack) >= MAX_DEPTH:
                raise _too_deep()
            n = len(obj)
            self.array_header(obj, n)
            if n:
                stack.append(_list_items(obj, n))
        elif obj is None:
            out.append(0xC0)
        elif t is bool:
            out.append(0xC3 if obj else 0xC2)
        elif t is bytes:
            n = len(obj)
            if 0 <= self.threshold <= n:
                return self.out_of_band(KIND_BYTES, memoryview(obj))
            _sized_header(out, n, obj, _BIN_HEADER)
            out += obj
        elif t is tuple:
            if len(stack) >= MAX_DEPTH:
                raise _too_deep()
            start = len(out)
            self.array_header(obj, len(obj))
            stack.append(self.tuple_items(obj, start))
        elif t is bytearray:
            if 0 <= self.threshold <= len(obj):
                return self.out_of_band(KIND_BYTEARRAY, memoryview(obj))
            self.in_band(KIND_BYTEARRAY, obj, obj)
        elif t is memoryview:
            self.memoryview(obj)
        else:
            self.pickled(obj)

    def array_header(self, obj, n):
        _sized_header(self.out, n, obj, _ARRAY_HEADER)

    def bigint(self, obj):
        n = ((obj if obj >= 0 else ~obj).bit_length() + 8) // 8
        if n > _U32_MAX:
            raise _too_long(obj)
        self.out += _ext_header(EXT_BIGINT, n) + obj.to_bytes(n, "little", signed=True)

    def in_band(self, kind, obj, data):
        n = 1 + len(data)
        if n > _U32_MAX:
            raise _too_long(obj)
        self.out += _ext_header(EXT_BUFFER, n)
        self.out.append(kind)
        self.out += data

    def out_of_band(self, kind, view):
        index = len(self.buffers)
        self.buffers.append(view)
        self.out += _ext_header(EXT_OOB, _OOB_REF.size) + _OOB_REF.pack(kind, index)

    def memoryview(self, obj):
        try:
            nbytes = obj.nbytes
            contiguous = obj.c_contiguous
        except ValueError as exc:  # a released memoryview
            raise _Unserialisable(obj, exc) from exc
        if 0 <= self.threshold <= nbytes:
            return self.out_of_band(KIND_MEMORYVIEW, _flat_view(obj, contiguous))
        self.in_band(KIND_MEMORYVIEW, obj, obj.tobytes())

    def pickled(self, obj):
        buffers = self.buffers
        first = len(buffers)
        callback = None
        if self.threshold >= 0:
            threshold = self.threshold

            def callback(buffer):
                try:
                    raw = buffer.raw()
                except BufferError:
                    return True  # non-contiguous: pickle decides (in-band or error)
                if raw.nbytes < threshold:
                    return True
                buffers.append(raw)
                return False
        try:
            payload = _pickle_dumps(obj, self.readonly_arrays, callback,
                                    buffers if callback is not None else None)
        except Exception as exc:
            raise _Unserialisable(obj, exc) from exc
        n = _PICKLE_HEAD.size + len(payload)
        if n > _U32_MAX:
            raise _too_long(obj)
        self.out += _ext_header(EXT_PICKLE, n)
        self.out += _PICKLE_HEAD.pack(first, len(buffers) - first)
        self.out += payload


def _flat_view(view, contiguous):
    """``view`` as a 1-D unsigned-byte memoryview, zero-copy when it is C-contiguous."""
    if contiguous:
        try:
            return view.cast("B")
        except TypeError:  # e.g. a shape with zeros: nothing to share anyway
            pass
    return memoryview(view.tobytes())


def _threshold(oob_threshold):
    if oob_threshold is None:
        return -1
    value = operator.index(oob_threshold)
    return value if value >= 0 else -1


def _encode(obj, buffers, threshold, readonly_arrays=False):
    encoder = _Encoder(buffers, threshold, readonly_arrays)
    first = len(buffers)
    try:
        try:
            encoder.encode(obj)
        except _TooDeep:
            # Self-referencing (or very deep) containers: the whole value as
            # one pickle, which keeps its cycles and shared parts as Ray does.
            del buffers[first:]
            encoder.out = bytearray()
            encoder.pickled(obj)
    except _Unserialisable as exc:
        raise _serialisation_error(obj, exc) from exc.cause
    return encoder.out


def encode_into(obj, buf, offset=0, oob_threshold=OOB_THRESHOLD, *, readonly_arrays=False):
    """Write the frame of ``obj`` into ``buf`` at ``offset``; return ``(end, buffers)``.

    ``buf`` is any writable C-contiguous buffer (bytearray, memoryview of an
    mmap...).  ``buffers`` is a tuple, ``()`` when everything is in-band.
    ``oob_threshold=None`` (or negative) keeps everything in-band.
    ``readonly_arrays``: numpy arrays decode read-only (see ``_arrays``).
    """
    offset = operator.index(offset)
    threshold = _threshold(oob_threshold)
    try:
        view = memoryview(buf)
    except TypeError:
        raise TypeError(f"encode_into needs a writable buffer, not {type(buf).__name__!r}") from None
    # Released on every path, so that the caller can close an mmap at once.
    with view:
        if view.readonly or not view.c_contiguous:
            raise TypeError("encode_into needs a writable C-contiguous buffer")
        # Held while encoding: a pickled object's reduction cannot resize a
        # bytearray destination under us (the compiled twin behaves the same).
        with view.cast("B") as dest:
            capacity = dest.nbytes
            if not 0 <= offset <= capacity:
                raise ValueError(f"offset {offset} outside the buffer of {capacity} bytes")
            buffers = []
            frame = _encode(obj, buffers, threshold, readonly_arrays)
            n = len(frame)
            if n > capacity - offset:
                raise BufferTooSmallError(
                    f"frame needs {n} bytes, {capacity - offset} available", needed=n)
            dest[offset:offset + n] = frame
    return offset + n, tuple(buffers)


def encode_growing(obj, buf, oob_threshold=OOB_THRESHOLD, *, limit=None, on_retry=None,
                   readonly_arrays=False):
    """Encode ``obj`` into the bytearray ``buf``, or into a bigger one when it
    does not fit; return ``(buf, end, buffers)``: the bytearray that holds the
    frame at ``[0:end]`` and a list of its out-of-band buffers.

    A retry takes ``max(needed, 2 * len(buf))`` bytes.  ``limit``: a frame
    of more bytes raises ``BufferTooSmallError`` (``needed`` is its length).
    ``on_retry()`` runs before each retry (state the encoding built, such as
    a list of lent references, starts again).
    """
    if type(buf) is not bytearray:
        raise TypeError(f"encode_growing needs a bytearray, not {type(buf).__name__!r}")
    while True:
        try:
            end, buffers = encode_into(obj, buf, 0, oob_threshold,
                                       readonly_arrays=readonly_arrays)
            return buf, end, list(buffers)
        except BufferTooSmallError as exc:
            needed = exc.needed
        buf = _grown(buf, needed, limit, on_retry)


def _grown(buf, needed, limit, on_retry):
    if limit is not None and needed > limit:
        raise BufferTooSmallError(f"frame needs {needed} bytes, over the limit of {limit}",
                                  needed=needed)
    if on_retry is not None:
        on_retry()
    return bytearray(max(needed, 2 * len(buf)))


def dumps(obj, *, readonly_arrays=False):
    """The frame of ``obj`` as bytes, everything in-band."""
    return bytes(_encode(obj, [], -1, readonly_arrays))


# ---------------------------------------------------------------- decoding

_LIST, _TUPLE, _MAP = 0, 1, 2


class _Frame:
    """A container being decoded."""
    __slots__ = ("kind", "off", "remaining", "items", "key", "key_off", "has_key", "outer_end")

    def __init__(self, kind, off, remaining, outer_end):
        self.kind = kind
        self.off = off
        self.remaining = remaining
        self.items = {} if kind == _MAP else []
        self.key = None
        self.key_off = 0
        self.has_key = False
        self.outer_end = outer_end


class _Decoder:
    """Decodes one frame from ``data``.

    Iterative (a stack of open containers) so that MAX_DEPTH levels never
    meet Python's recursion limit.
    """
    __slots__ = ("data", "pos", "end", "buffers")

    def __init__(self, data, buffers):
        self.data = data
        self.pos = 0
        self.end = len(data)
        self.buffers = buffers

    def take(self, n):
        """The next n bytes (a copy: nothing decoded refers to the input)."""
        pos = self.pos
        if self.end - pos < n:
            raise DecodeError(
                f"truncated frame at offset {pos}: needs {n} bytes, {self.end - pos} left")
        self.pos = pos + n
        return self.data[pos:pos + n]

    def byte(self):
        pos = self.pos
        if pos >= self.end:
            raise DecodeError(f"truncated frame at offset {pos}: needs 1 bytes, 0 left")
        self.pos = pos + 1
        return self.data[pos]

    def decode(self):
        stack = []
        while True:
            off = self.pos
            depth = len(stack)
            value = self.value(off, stack)
            if len(stack) > depth:
                continue  # a container was opened: its items come next
            # Hand the value to the innermost open container, closing those
            # it completes.
            while stack:
                frame = stack[-1]
                if frame.kind == _MAP:
                    if not frame.has_key:
                        frame.key = value
                        frame.key_off = off
                        frame.has_key = True
                        break
                    try:
                        frame.items[frame.key] = value
                    except TypeError:
                        raise DecodeError(
                            f"unhashable map key of type {type(frame.key).__name__!r} "
                            f"at offset {frame.key_off}") from None
                    frame.key = None
                    frame.has_key = False
                else:
                    frame.items.append(value)
                frame.remaining -= 1
                if frame.remaining:
                    break
                stack.pop()
                off = frame.off
                value = self.close(frame)
            else:
                return value

    def open(self, kind, n, off, stack, outer_end=0):
        """Start a container of n items (n entries for a map)."""
        if len(stack) >= MAX_DEPTH:
            raise DecodeError(f"frame nested deeper than {MAX_DEPTH} containers at offset {off}")
        # Each item takes at least one byte: a count the rest of the input
        # cannot hold is corrupt, and is refused before anything is allocated.
        left = self.end - self.pos
        if (2 * n if kind == _MAP else n) > left:
            what = "map of" if kind == _MAP else "array of"
            raise DecodeError(
                f"corrupt frame at offset {off}: {what} {n} cannot fit in the {left} bytes left")
        frame = _Frame(kind, off, n, outer_end)
        if n == 0:
            return self.close(frame)
        stack.append(frame)
        return None

    def close(self, frame):
        if frame.kind == _LIST:
            return frame.items
        if frame.kind == _MAP:
            return frame.items
        if self.pos != self.end:
            raise DecodeError(
                f"corrupt frame at offset {frame.off}: tuple payload has "
                f"{self.end - self.pos} trailing bytes")
        self.end = frame.outer_end
        return tuple(frame.items)

    def value(self, off, stack):
        """Decode a scalar, or open a container (pushed on ``stack``)."""
        b = self.byte()
        if b <= 0x7F:
            return b
        if b >= 0xE0:
            return b - 0x100
        if b <= 0x8F:
            return self.open(_MAP, b & 0x0F, off, stack)
        if b <= 0x9F:
            return self.open(_LIST, b & 0x0F, off, stack)
        if b <= 0xBF:
            return self.str(b & 0x1F, off)
        if b == 0xC0:
            return None
        if b == 0xC2:
            return False
        if b == 0xC3:
            return True
        if b == 0xCB:
            return _F64.unpack(self.take(8))[0]
        if b == 0xCC:
            return self.byte()
        if b == 0xCD:
            return _U16.unpack(self.take(2))[0]
        if b == 0xCE:
            return _U32.unpack(self.take(4))[0]
        if b == 0xCF:
            return _U64.unpack(self.take(8))[0]
        if b == 0xD0:
            return _I8.unpack(self.take(1))[0]
        if b == 0xD1:
            return _I16.unpack(self.take(2))[0]
        if b == 0xD2:
            return _I32.unpack(self.take(4))[0]
        if b == 0xD3:
            return _I64.unpack(self.take(8))[0]
        if b == 0xD9:
            return self.str(self.byte(), off)
        if b == 0xDA:
            return self.str(_U16.unpack(self.take(2))[0], off)
        if b == 0xDB:
            return self.str(_U32.unpack(self.take(4))[0], off)
        if b == 0xC4:
            return self.take(self.byte())
        if b == 0xC5:
            return self.take(_U16.unpack(self.take(2))[0])
        if b == 0xC6:
            return self.take(_U32.unpack(self.take(4))[0])
        if b == 0xDC:
            return self.open(_LIST, _U16.unpack(self.take(2))[0], off, stack)
        if b == 0xDD:
            return self.open(_LIST, _U32.unpack(self.take(4))[0], off, stack)
        if b == 0xDE:
            return self.open(_MAP, _U16.unpack(self.take(2))[0], off, stack)
        if b == 0xDF:
            return self.open(_MAP, _U32.unpack(self.take(4))[0], off, stack)
        if 0xD4 <= b <= 0xD8:
            return self.ext(1 << (b - 0xD4), off, stack)
        if b == 0xC7:
            return self.ext(self.byte(), off, stack)
        if b == 0xC8:
            return self.ext(_U16.unpack(self.take(2))[0], off, stack)
        if b == 0xC9:
            return self.ext(_U32.unpack(self.take(4))[0], off, stack)
        if b == 0xCA:
            return _F32.unpack(self.take(4))[0]
        raise DecodeError(f"invalid type byte 0x{b:02x} at offset {off}")

    def str(self, n, off):
        data = self.take(n)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise DecodeError(f"invalid UTF-8 in str at offset {off}") from None

    def ext(self, n, off, stack):
        code = _I8.unpack(self.take(1))[0]
        left = self.end - self.pos
        if left < n:
            raise DecodeError(
                f"truncated frame at offset {self.pos}: needs {n} bytes, {left} left")
        if code == EXT_TUPLE:
            return self.tuple(n, off, stack)
        payload = self.take(n)
        if code == EXT_BIGINT:
            if n == 0:
                raise DecodeError(f"corrupt frame at offset {off}: empty big-int payload")
            return int.from_bytes(payload, "little", signed=True)
        if code == EXT_PICKLE:
            return self.pickled(payload, off)
        if code == EXT_OOB:
            if n != _OOB_REF.size:
                raise DecodeError(
                    f"corrupt frame at offset {off}: out-of-band reference payload "
                    f"must be {_OOB_REF.size} bytes, not {n}")
            kind, index = _OOB_REF.unpack(payload)
            return self.out_of_band(kind, index, off)
        if code == EXT_BUFFER:
            if n == 0:
                raise DecodeError(f"corrupt frame at offset {off}: empty buffer payload")
            return _buffer_of_kind(payload[0], payload[1:], off)
        raise DecodeError(f"unknown ext type {code} at offset {off}")

    def tuple(self, n, off, stack):
        # The payload is one array, decoded in place with reads bounded by
        # the payload's end; ``close`` checks that it filled the payload.
        outer_end = self.end
        self.end = self.pos + n
        b = self.data[self.pos] if n else None
        if b is not None and 0x90 <= b <= 0x9F:
            self.pos += 1
            count = b & 0x0F
        elif b == 0xDC:
            self.pos += 1
            count = _U16.unpack(self.take(2))[0]
        elif b == 0xDD:
            self.pos += 1
            count = _U32.unpack(self.take(4))[0]
        else:
            raise DecodeError(f"corrupt frame at offset {off}: tuple payload is not an array")
        return self.open(_TUPLE, count, off, stack, outer_end)

    def pickled(self, payload, off):
        if len(payload) < _PICKLE_HEAD.size:
            raise DecodeError(
                f"corrupt frame at offset {off}: pickle payload shorter than its "
                f"{_PICKLE_HEAD.size}-byte header")
        first, count = _PICKLE_HEAD.unpack_from(payload)
        available = len(self.buffers)
        if count and first + count > available:
            raise DecodeError(
                f"out-of-band buffers {first}..{first + count - 1} referenced at offset {off}, "
                f"{available} delivered")
        oob = self.buffers[first:first + count] if count else ()
        try:
            return pickle.loads(memoryview(payload)[_PICKLE_HEAD.size:], buffers=oob)
        except Exception as exc:
            raise DecodeError(
                f"corrupt pickle at offset {off}: {type(exc).__name__}: {exc}") from exc

    def out_of_band(self, kind, index, off):
        if kind > KIND_MEMORYVIEW:
            raise DecodeError(f"unknown buffer kind {kind} at offset {off}")
        available = len(self.buffers)
        if index >= available:
            raise DecodeError(
                f"out-of-band buffer {index} referenced at offset {off}, {available} delivered")
        try:
            view = memoryview(self.buffers[index])
            if view.ndim != 1 or view.format != "B":
                view = view.cast("B")
        except (TypeError, ValueError) as exc:
            raise DecodeError(
                f"out-of-band buffer {index} is not a C-contiguous bytes-like object") from exc
        if kind == KIND_MEMORYVIEW:
            return view
        return _buffer_of_kind(kind, view, off)


def _buffer_of_kind(kind, data, off):
    if kind == KIND_BYTES:
        return bytes(data)
    if kind == KIND_BYTEARRAY:
        return bytearray(data)
    if kind == KIND_MEMORYVIEW:
        return memoryview(bytes(data))
    raise DecodeError(f"unknown buffer kind {kind} at offset {off}")


def decode(data, buffers=()):
    """Decode the one frame that fills ``data``; ``buffers`` are its out-of-band buffers."""
    if type(data) is not bytes:
        try:
            view = memoryview(data)
        except TypeError:
            raise TypeError(f"decode needs a bytes-like object, not {type(data).__name__!r}") from None
        with view:
            if not view.c_contiguous:
                raise TypeError("decode needs a C-contiguous bytes-like object")
            # One copy: the decoder then slices freely, and nothing it returns
            # can alias the caller's memory (a ring slot about to be reused).
            data = view.tobytes()
    if buffers is None:
        buffers = ()
    decoder = _Decoder(data, buffers)
    obj = decoder.decode()
    if decoder.pos != len(data):
        raise DecodeError(
            f"trailing bytes: frame ends at offset {decoder.pos}, input has {len(data)} bytes")
    return obj


def loads(data):
    """``decode(data)``: a frame with no out-of-band buffers."""
    return decode(data)
