"""The codec: both twins through ``codec_impl``, plus cross-twin agreement.

The pure twin (``_codec_py``) is the specification of the frame format; the
compiled twin must produce the same bytes and raise the same errors.
msgpack-python is the outside oracle for the plain-msgpack subset.
"""
import array
import collections
import enum
import fractions
import math
import mmap
import pickle
import socket
import struct
import threading

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ray_lite._fast import _codec_py
from ray_lite._fast.errors import BufferTooSmallError, DecodeError, SerializationError


def examples(n):
    """Hypothesis settings: n examples, no deadline (a shared, noisy machine).

    The twin fixtures yield a module, so sharing one across examples is right.
    """
    return settings(max_examples=n, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


EXT_TUPLE, EXT_BIGINT, EXT_PICKLE, EXT_OOB, EXT_BUFFER = 1, 2, 3, 4, 5


@pytest.fixture
def twins(twin_pair):
    """The (compiled, python) codec modules, for tests that compare the two."""
    return tuple(t.module("codec") for t in twin_pair)


# ---------------------------------------------------------------- helpers

def canon(x):
    """A comparable form of a value that keeps every type (and float sign/nan)."""
    t = type(x)
    if t is float:
        return ("float", repr(x))
    if t in (list, tuple):
        return (t.__name__, [canon(i) for i in x])
    if t is dict:
        return ("dict", [(canon(k), canon(v)) for k, v in x.items()])
    if t is memoryview:
        return ("memoryview", x.tobytes())
    return (t.__name__, x)


def roundtrip(codec, value, **kw):
    """encode_into a bytearray, decode a memoryview of the slot (as a ring does)."""
    buf = bytearray(len(codec.dumps(value)) + 64)
    end, buffers = codec.encode_into(value, buf, 0, **kw)
    return codec.decode(memoryview(buf)[:end], buffers)


def ext(code, payload):
    """A msgpack ext object with the minimal header."""
    n = len(payload)
    fixed = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}.get(n)
    if fixed:
        head = bytes((fixed,))
    elif n <= 0xFF:
        head = bytes((0xC7, n))
    elif n <= 0xFFFF:
        head = b"\xc8" + struct.pack(">H", n)
    else:
        head = b"\xc9" + struct.pack(">I", n)
    return head + struct.pack(">b", code) + payload


def frame_of(codec, value):
    buf = bytearray(1 << 20)
    end, _ = codec.encode_into(value, buf, 0, None)
    return bytes(buf[:end])


# Types defined here travel by reference (the module is importable); the
# lambda and the local class travel by value through cloudpickle.
class Color(enum.IntEnum):
    RED = 1
    GREEN = 2


Point = collections.namedtuple("Point", "x y")


class MyStr(str):
    pass


class MyInt(int):
    pass


class MyFloat(float):
    pass


class MyList(list):
    pass


class MyDict(dict):
    pass


class MyTuple(tuple):
    pass


class MyBytes(bytes):
    pass


class Thing:
    def __init__(self, value):
        self.value = value

    def __eq__(self, other):
        return type(other) is Thing and other.value == self.value

    def __hash__(self):
        return hash(self.value)


def module_function(x):
    return x * 2


# ---------------------------------------------------------------- round trips

INTS = [0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1,
        -1, -32, -33, -128, -129, -2**15, -2**15 - 1, -2**31, -2**31 - 1, -2**63]
BIG_INTS = [2**64, -2**63 - 1, -2**64, 2**120, -2**120, 2**127 - 1, 2**200, -2**200, 10**100]
FLOATS = [0.0, -0.0, 1.5, -2.25, 1e308, 5e-324, math.inf, -math.inf, math.nan]
STRS = ["", "hello", "a" * 31, "a" * 32, "a" * 255, "a" * 256, "a" * 65535, "a" * 65536,
        "héllo wörld ✓ 🎉", "\x00nul", "日本語" * 20]
BINS = [b"", b"\x00\xff", b"x" * 255, b"x" * 256, b"x" * 65535, b"x" * 65536]
CONTAINERS = [
    [], {}, (), [1, "a", None, 2.5, b"b"], {"a": 1, "b": [1, 2]},
    {"b": 1, "a": 2, "c": 3},  # order kept
    [[1, 2], (1, 2)], ((1, (2, (3, ()))),), [(), [()], {"t": ((),)}],
    {(1, 2): "a", (1, (2, 3)): "b", (): "empty"},
    {1: "int", None: "none", b"k": "bytes", False: "bool", 2.5: "float", -7: "neg"},
    list(range(16)), {str(i): i for i in range(16)}, tuple(range(16)),
    list(range(70000)), {str(i): i for i in range(70000)},
    {"token": "hello", "index": 17, "logprob": -0.25},
]


@pytest.mark.parametrize("value", INTS + BIG_INTS + FLOATS + STRS + BINS + CONTAINERS + [None, True, False],
                         ids=lambda v: repr(v)[:40])
def test_round_trip_common_types(codec_impl, value):
    assert canon(roundtrip(codec_impl, value)) == canon(value)
    assert canon(codec_impl.loads(codec_impl.dumps(value))) == canon(value)


def test_dict_key_order_is_kept(codec_impl):
    value = {k: i for i, k in enumerate(["zeta", "alpha", "mid", 3, (1,), b"b"])}
    assert list(roundtrip(codec_impl, value)) == list(value)


def test_negative_zero_keeps_its_sign(codec_impl):
    assert math.copysign(1.0, roundtrip(codec_impl, -0.0)) == -1.0


@pytest.mark.parametrize("value", [
    Color.GREEN, collections.OrderedDict([("b", 1), ("a", 2)]), Point(1, 2),
    MyStr("s"), MyInt(5), MyFloat(1.5), MyList([1, 2]), MyDict(a=1), MyTuple((1, 2)), MyBytes(b"x"),
    {1, 2, 3}, frozenset({"a"}), 3 + 4j, fractions.Fraction(1, 3), Thing(5),
    [Color.RED, {"k": Point(3, 4)}],
], ids=lambda v: type(v).__name__)
def test_subclasses_and_other_types_keep_their_type(codec_impl, value):
    out = roundtrip(codec_impl, value)
    assert type(out) is type(value)
    assert out == value


def test_defaultdict_keeps_type_and_factory(codec_impl):
    value = collections.defaultdict(list, {"a": [1]})
    out = roundtrip(codec_impl, value)
    assert type(out) is collections.defaultdict and out == value
    out["new"].append(1)  # the factory came along
    assert out["new"] == [1]


def test_functions_classes_and_lambdas(codec_impl):
    def closure(x, _k=3):
        return x + _k

    class Local:
        def twice(self, x):
            return 2 * x

    f, g, h, cls, thing_cls = roundtrip(codec_impl, [module_function, lambda x: x + 1, closure, Local, Thing])
    assert f(2) == 4 and g(1) == 2 and h(1) == 4
    assert cls().twice(3) == 6
    assert thing_cls is Thing  # importable: by reference


def test_main_module_function_and_class_travel_by_value(codec_impl):
    # As if defined in a script run as __main__: a reader process has another
    # __main__, so they must travel by value.  Here, by reference would fail:
    # this process's __main__ has no such names.
    namespace = {"__name__": "__main__"}
    exec("def add(x):\n    return x + 41\n"
         "class Seven:\n    def value(self):\n        return 7\n", namespace)
    add, seven = roundtrip(codec_impl, [namespace["add"], namespace["Seven"]])
    assert add(1) == 42 and seven().value() == 7


def _exec_as_main(source):
    namespace = {"__name__": "__main__"}
    exec(source, namespace)
    return namespace


def _pickle_payload(frame):
    """The pickle inside a frame that is one EXT_PICKLE."""
    code, payload = msgpack.unpackb(frame, ext_hook=lambda c, d: (c, d))
    assert code == EXT_PICKLE
    return payload[8:]


@pytest.fixture
def no_cloudpickle(monkeypatch):
    """cloudpickle.dumps (and its Pickler) made to fail: what still encodes needs neither."""
    import cloudpickle

    def refuse(*args, **kwargs):
        raise AssertionError("cloudpickle used")

    monkeypatch.setattr(cloudpickle, "dumps", refuse)
    monkeypatch.setattr(cloudpickle.Pickler, "dump", refuse)
    # The codec looks cloudpickle up once; make it look again.
    from ray_lite._fast import _pickling
    monkeypatch.setattr(_pickling, "_cloudpickle_dumps", None)


@pytest.mark.parametrize("readonly_arrays", [False, True])
def test_arrays_and_importable_classes_need_no_cloudpickle(codec_impl, no_cloudpickle,
                                                           readonly_arrays):
    value = [np.arange(6.0).reshape(2, 3), collections.OrderedDict(a=Point(1, 2)),
             Color.GREEN, np.float32(1.5), fractions.Fraction(1, 3), _Holder(np.arange(3))]
    buf, end, buffers = codec_impl.encode_growing(value, bytearray(64),
                                                  readonly_arrays=readonly_arrays)
    out = codec_impl.decode(memoryview(buf)[:end], deliver(buffers))
    np.testing.assert_array_equal(out[0], value[0])
    assert out[0].flags.writeable is not readonly_arrays
    assert out[1] == value[1] and type(out[1]["a"]) is Point
    assert out[2] is Color.GREEN and type(out[3]) is np.float32 and out[3] == 1.5
    assert out[4] == fractions.Fraction(1, 3)
    assert type(out[5]) is _Holder and out[5].array.tolist() == [0, 1, 2]
    assert out[5].array.flags.writeable is not readonly_arrays


@pytest.mark.parametrize("make", [
    lambda: _exec_as_main("def f():\n    return 5\n")["f"],
    lambda: collections.OrderedDict(f=_exec_as_main("def f():\n    return 5\n")["f"]),
    lambda: _Holder(_exec_as_main("class C:\n    pass\n")["C"]()),
    lambda: _Holder(lambda: 5),
], ids=["main-function", "main-function-inside", "main-instance-inside", "lambda-inside"])
def test_what_must_travel_by_value_still_does(codec_impl, make):
    value = make()
    out = codec_impl.loads(codec_impl.dumps(value))
    if isinstance(value, collections.OrderedDict):
        assert out["f"]() == 5
    elif isinstance(value, _Holder) and callable(value.array):
        assert out.array() == 5
    elif isinstance(value, _Holder):
        assert type(out.array).__name__ == "C"
    else:
        assert out() == 5
    payload = _pickle_payload(codec_impl.dumps(value))
    # Saved by value: loadable in a process whose __main__ lacks the names.
    pickle.loads(payload)


def test_a_main_singleton_saved_by_name_travels_by_value(codec_impl):
    # A TypeVar reduces to its name: the standard pickler would save
    # "__main__.T", which no reader can import.
    t = _exec_as_main("import typing\nT = typing.TypeVar('T')\n")["T"]
    frame = codec_impl.dumps(_Holder(t))
    assert codec_impl.loads(frame).array.__name__ == "T"
    pickle.loads(_pickle_payload(frame))    # this process's __main__ has no T


def test_a_class_whose_module_is_not_imported_travels_by_value(codec_impl):
    import types
    module = types.ModuleType("rl_codec_module_never_imported")
    exec("class Dyn:\n    def value(self):\n        return 11\n", module.__dict__)
    frame = codec_impl.dumps(_Holder(module.Dyn()))
    assert codec_impl.loads(frame).array.value() == 11


def test_modules_registered_by_value_travel_by_value(codec_impl):
    import sys

    import cloudpickle
    here = sys.modules[module_function.__module__]
    cloudpickle.register_pickle_by_value(here)
    try:
        f = codec_impl.loads(codec_impl.dumps(module_function))
    finally:
        cloudpickle.unregister_pickle_by_value(here)
    assert f is not module_function and f(2) == module_function(2)
    assert codec_impl.loads(codec_impl.dumps(module_function)) is module_function


def test_a_pickle_given_up_leaves_no_out_of_band_buffer_behind(codec_impl):
    # The standard pickler sets the array's data aside, then meets the lambda:
    # cloudpickle starts over, and only its buffer is in the frame's list.
    big = np.arange(100_000, dtype=np.float64)
    value = ["plain", _Holder((big, lambda: 7))]
    end, buffers = codec_impl.encode_into(value, bytearray(4096), 0)
    assert len(buffers) == 1 and buffers[0].nbytes == big.nbytes
    buf, end, buffers = codec_impl.encode_growing(value, bytearray(64))
    out = codec_impl.decode(memoryview(buf)[:end], deliver(buffers))
    np.testing.assert_array_equal(out[1].array[0], big)
    assert out[1].array[1]() == 7


def test_tuple_stays_tuple_and_list_stays_list(codec_impl):
    out = roundtrip(codec_impl, ([1, (2, [3, (4,)])], [(5,)]))
    assert type(out) is tuple and type(out[0]) is list and type(out[0][1]) is tuple
    assert type(out[0][1][1]) is list and type(out[0][1][1][1]) is tuple and type(out[1][0]) is tuple


def test_lone_surrogates_round_trip(codec_impl):
    # Decided: str that UTF-8 cannot carry (undecodable file names under
    # surrogateescape) goes through pickle and comes back equal.
    value = {"\udc80abc": ["x\ud800y", "ok"]}
    assert roundtrip(codec_impl, value) == value
    frame = codec_impl.dumps("\ud800")
    assert frame[0] == 0xC7 and frame[2] == EXT_PICKLE


def test_bytearray_and_small_memoryview_keep_their_type(codec_impl):
    out = roundtrip(codec_impl, [bytearray(b"abc"), memoryview(b"xyz"), bytearray()])
    assert type(out[0]) is bytearray and out[0] == b"abc"
    assert type(out[1]) is memoryview and out[1].tobytes() == b"xyz"
    assert out[1].readonly and out[1].format == "B"
    assert type(out[2]) is bytearray and out[2] == b""


@pytest.mark.parametrize("view", [
    memoryview(bytes(range(100)))[::3],                 # non-contiguous
    memoryview(array.array("d", [1.5, 2.5, -3.0])),     # not bytes
    memoryview(bytes(range(24))).cast("B", (2, 3, 4)),  # 3-D
    memoryview(np.zeros((0, 3))),                       # zeros in the shape
    memoryview(np.arange(12.0).reshape(3, 4).T),        # Fortran order
], ids=["strided", "doubles", "3d", "empty-2d", "fortran"])
@pytest.mark.parametrize("threshold", [None, 0])
def test_memoryview_of_any_shape_round_trips_as_flat_bytes(codec_impl, view, threshold):
    out = roundtrip(codec_impl, view, oob_threshold=threshold)
    assert type(out) is memoryview and out.ndim == 1 and out.format == "B"
    assert out.tobytes() == view.tobytes()


def test_released_memoryview_is_unserialisable(codec_impl):
    view = memoryview(b"abc")
    view.release()
    with pytest.raises(SerializationError, match=r"'memoryview' at value\[0\]"):
        codec_impl.dumps([view])


# ---------------------------------------------------------------- frame layout

@pytest.mark.parametrize("value", INTS + FLOATS + STRS + BINS + [
    None, True, False, [], {}, [1, [2, [3]]], {"a": {"b": [None, 1.5]}}, list(range(70000)),
    {str(i): i for i in range(20)}, {1: 2, b"k": "v"}], ids=lambda v: repr(v)[:40])
def test_plain_values_are_plain_minimal_msgpack(codec_impl, value):
    frame = codec_impl.dumps(value)
    assert frame == msgpack.packb(value, use_bin_type=True)
    assert frame_of(codec_impl, value) == frame


@pytest.mark.parametrize("count, header", [
    (0, b"\xd4"), (1, b"\xd5"), (2, b"\xc7\x03"), (3, b"\xd6"), (7, b"\xd7"), (15, b"\xd8"),
    (16, b"\xc7\x13"), (252, b"\xc7\xff"), (253, b"\xc8\x01\x00"), (65532, b"\xc8\xff\xff"),
    (65533, b"\xc9\x00\x01\x00\x00"),
])
def test_tuple_is_ext_with_minimal_header(codec_impl, count, header):
    value = (0,) * count
    frame = codec_impl.dumps(value)
    assert frame == header + bytes((EXT_TUPLE,)) + msgpack.packb([0] * count)
    assert codec_impl.loads(frame) == value
    # The header is moved into place in the destination too (compiled twin).
    assert frame_of(codec_impl, value) == frame


@pytest.mark.parametrize("value", BIG_INTS)
def test_big_int_is_minimal_twos_complement(codec_impl, value):
    n = ((value if value >= 0 else ~value).bit_length() + 8) // 8
    payload = value.to_bytes(n, "little", signed=True)
    assert codec_impl.dumps(value) == ext(EXT_BIGINT, payload)
    with pytest.raises(OverflowError):  # minimal: one byte fewer cannot hold it
        value.to_bytes(n - 1, "little", signed=True)


def test_pickle_ext_carries_buffer_range(codec_impl):
    # msgpack sees one ext object of our type: first and count (0, 0), then a pickle.
    code, payload = msgpack.unpackb(codec_impl.dumps({1, 2}), ext_hook=lambda c, d: (c, d))
    assert code == EXT_PICKLE and payload[:8] == b"\0" * 8
    assert pickle.loads(payload[8:]) == {1, 2}
    buf = bytearray(4096)
    big = np.arange(codec_impl.OOB_THRESHOLD)
    end, buffers = codec_impl.encode_into([b"\1" * codec_impl.OOB_THRESHOLD, big], buf, 0)
    items = msgpack.unpackb(bytes(buf[:end]), ext_hook=lambda c, d: (c, d))
    assert items[1][0] == EXT_PICKLE and items[1][1][:8] == struct.pack(">II", 1, 1)


def test_constants_and_names(codec_impl):
    assert (codec_impl.EXT_TUPLE, codec_impl.EXT_BIGINT, codec_impl.EXT_PICKLE, codec_impl.EXT_OOB) == \
        (EXT_TUPLE, EXT_BIGINT, EXT_PICKLE, EXT_OOB)
    assert codec_impl.OOB_THRESHOLD == 64 * 1024 and codec_impl.MAX_DEPTH == 512
    for name in codec_impl.__all__:
        assert hasattr(codec_impl, name), name
    assert codec_impl.SerializationError is SerializationError
    assert codec_impl.DecodeError is DecodeError
    assert codec_impl.BufferTooSmallError is BufferTooSmallError
    assert issubclass(SerializationError, TypeError)


# ---------------------------------------------------------------- out of band

def deliver(buffers):
    """What a transport does: the reader gets its own copies of the buffers."""
    return [bytearray(b) for b in buffers]


def test_numpy_array_travels_out_of_band_and_decodes_zero_copy(codec_impl):
    arr = np.arange(100_000, dtype=np.float64)
    buf = bytearray(4096)
    end, buffers = codec_impl.encode_into({"a": arr, "n": 1}, buf, 0)
    assert end < 200  # the data is not in the frame
    assert len(buffers) == 1 and buffers[0].nbytes == arr.nbytes
    assert buffers[0].ndim == 1 and buffers[0].format == "B"
    assert np.shares_memory(np.frombuffer(buffers[0], np.uint8), arr)  # no copy on encode
    delivered = deliver(buffers)
    out = codec_impl.decode(memoryview(buf)[:end], delivered)
    assert out["n"] == 1 and out["a"].dtype == arr.dtype
    np.testing.assert_array_equal(out["a"], arr)
    assert np.shares_memory(out["a"], np.frombuffer(delivered[0], np.uint8))  # none on decode


def test_small_numpy_array_stays_in_band(codec_impl):
    arr = np.arange(10, dtype=np.int32)
    buf = bytearray(4096)
    end, buffers = codec_impl.encode_into(arr, buf, 0)
    assert buffers == ()
    out = codec_impl.decode(memoryview(buf)[:end])
    np.testing.assert_array_equal(out, arr)
    buf[:end] = bytes(end)  # the slot is reused: the array must not live in it
    np.testing.assert_array_equal(out, arr)


class _ArraySubclass(np.ndarray):
    pass


class _Holder:
    """A plain object holding an array: pickled as a whole, array inside."""

    def __init__(self, array):
        self.array = array


def _readonly_round_trip(codec_impl, value, **kwargs):
    buf = bytearray(64)
    buf, end, buffers = codec_impl.encode_growing(value, buf, readonly_arrays=True, **kwargs)
    return codec_impl.decode(memoryview(buf)[:end], deliver(buffers))


@pytest.mark.parametrize("array", [
    np.arange(10, dtype=np.int32),                                  # in band
    np.arange(100_000, dtype=np.float64),                           # out of band
    np.arange(12.0).reshape(3, 4).T,                                # Fortran order
    np.arange(20.0)[::3],                                           # not contiguous
    np.array(3.5),                                                  # 0-d
    np.zeros((0, 4)),                                               # empty
    np.array([(1, 2.0)], dtype=[("a", "i4"), ("b", "f8")]),         # structured
], ids=["small", "large", "fortran", "strided", "0d", "empty", "structured"])
def test_readonly_arrays_decode_read_only_with_their_values(codec_impl, array):
    for value, pick in ((array, lambda v: v), ({"k": [array]}, lambda v: v["k"][0]),
                        (_Holder(array), lambda v: v.array)):
        out = pick(_readonly_round_trip(codec_impl, value))
        assert type(out) is np.ndarray and not out.flags.writeable
        assert out.dtype == array.dtype and out.shape == array.shape
        np.testing.assert_array_equal(out, array)
        with pytest.raises(ValueError, match="read-only"):
            out[...] = 0
    assert array.flags.writeable        # the sender's array is untouched


def test_readonly_arrays_keep_large_data_out_of_band(codec_impl):
    arr = np.arange(100_000, dtype=np.float64)
    end, buffers = codec_impl.encode_into(arr, bytearray(4096), 0, readonly_arrays=True)
    assert end < 300 and len(buffers) == 1 and buffers[0].nbytes == arr.nbytes
    assert np.shares_memory(np.frombuffer(buffers[0], np.uint8), arr)   # still no copy


def test_readonly_arrays_is_off_by_default(codec_impl):
    # The codec's other users (the MessageQueue, the executor's replies)
    # keep pickle's semantics: arrays come back writable.
    for n in (10, 100_000):
        buf, end, buffers = codec_impl.encode_growing(np.zeros(n), bytearray(64))
        assert codec_impl.decode(memoryview(buf)[:end], deliver(buffers)).flags.writeable
        assert codec_impl.loads(codec_impl.dumps(np.zeros(n))).flags.writeable
    assert not codec_impl.loads(codec_impl.dumps(np.zeros(3), readonly_arrays=True)).flags.writeable


def test_readonly_arrays_leave_other_arrays_alone(codec_impl):
    objects = np.array([{"a": 1}, None], dtype=object)    # Python objects, not a buffer
    sub = np.arange(3).view(_ArraySubclass)               # a subclass: its own reduction
    out = _readonly_round_trip(codec_impl, [objects, sub, np.float64(2.5)])
    assert out[0].flags.writeable and out[0][0] == {"a": 1}
    assert type(out[1]) is _ArraySubclass and out[1].flags.writeable
    assert type(out[2]) is np.float64 and out[2] == 2.5


def test_readonly_arrays_keep_shared_arrays_shared(codec_impl):
    arr = np.arange(5)
    out = _readonly_round_trip(codec_impl, _Holder([arr, arr]))
    assert out.array[0] is out.array[1]


def test_readonly_arrays_yield_to_a_registered_serializer(codec_impl):
    from ray_lite.util.serialization import deregister_serializer, register_serializer
    register_serializer(np.ndarray, serializer=lambda a: a.tolist(), deserializer=np.array)
    try:
        out = _readonly_round_trip(codec_impl, _Holder(np.arange(3)))
    finally:
        deregister_serializer(np.ndarray)
    assert out.array.flags.writeable and out.array.tolist() == [0, 1, 2]


def test_readonly_arrays_frames_are_the_same_in_both_twins(twins):
    compiled, pure = twins
    value = {"a": np.arange(10), "h": _Holder(np.ones(3))}
    frames = [t.dumps(value, readonly_arrays=True) for t in (compiled, pure)]
    assert frames[0] == frames[1]
    assert not pure.loads(frames[0])["a"].flags.writeable


def test_no_threshold_keeps_everything_in_band(codec_impl):
    value = [np.ones(50_000), b"x" * 100_000, bytearray(70_000), memoryview(b"y" * 70_000)]
    buf = bytearray(1 << 20)
    end, buffers = codec_impl.encode_into(value, buf, 0, None)
    assert buffers == ()
    out = codec_impl.decode(bytes(buf[:end]))
    np.testing.assert_array_equal(out[0], value[0])
    assert out[1] == value[1] and type(out[2]) is bytearray and out[3].tobytes() == b"y" * 70_000
    assert codec_impl.loads(codec_impl.dumps(value))[1] == value[1]


def test_many_buffers_keep_their_order(codec_impl):
    big = codec_impl.OOB_THRESHOLD
    value = (b"a" * big, [np.full(big, 7, np.uint8), {"m": memoryview(b"c" * big)}],
             bytearray(b"d" * big), np.full(2 * big, 9, np.uint8))
    buf = bytearray(4096)
    end, buffers = codec_impl.encode_into(value, buf, 0)
    assert [b.nbytes for b in buffers] == [big, big, big, big, 2 * big]
    out = codec_impl.decode(memoryview(buf)[:end], deliver(buffers))
    assert type(out) is tuple and out[0] == b"a" * big
    assert (out[1][0] == 7).all() and out[1][1]["m"].tobytes() == b"c" * big
    assert type(out[2]) is bytearray and out[2] == b"d" * big and (out[3] == 9).all()


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_large_bytes_like_out_of_band(codec_impl, kind):
    size = codec_impl.OOB_THRESHOLD
    source = bytearray(range(256)) * (size // 256)
    value = kind(source) if kind is not memoryview else memoryview(bytes(source))
    buf = bytearray(64)
    end, buffers = codec_impl.encode_into(value, buf, 0)
    assert end <= 8 and len(buffers) == 1
    assert buffers[0].nbytes == size and buffers[0].format == "B" and buffers[0].ndim == 1
    delivered = deliver(buffers)
    out = codec_impl.decode(memoryview(buf)[:end], delivered)
    assert type(out) is kind and bytes(out) == bytes(source)
    delivered[0][0] ^= 0xFF
    if kind is memoryview:
        assert out[0] == delivered[0][0]  # zero-copy over the delivered buffer
    else:
        assert out[0] == source[0]  # bytes/bytearray got their own copy


def test_just_under_threshold_stays_in_band(codec_impl):
    size = codec_impl.OOB_THRESHOLD - 1
    for value in (b"x" * size, bytearray(size), memoryview(b"z" * size)):
        buf = bytearray(size + 64)
        end, buffers = codec_impl.encode_into(value, buf, 0)
        assert buffers == () and end > size
        assert bytes(codec_impl.decode(memoryview(buf)[:end])) == bytes(value)


def test_custom_threshold(codec_impl):
    buf = bytearray(256)
    end, buffers = codec_impl.encode_into([b"12345", b"1234", b""], buf, 0, 5)
    assert [bytes(b) for b in buffers] == [b"12345"]
    assert codec_impl.decode(memoryview(buf)[:end], buffers) == [b"12345", b"1234", b""]
    end, buffers = codec_impl.encode_into([b""], buf, 0, 0)
    assert len(buffers) == 1
    end, buffers = codec_impl.encode_into([b"x" * 100], buf, 0, -1)  # negative: in-band
    assert buffers == ()


def test_decoded_values_never_reference_the_input(codec_impl):
    value = {"s": "text" * 10, "é": "ünï", "b": b"bytes" * 10, "ba": bytearray(b"ba"),
             "mv": memoryview(b"mv"), "t": ("x", b"y"), "set": {1, 2}, "np": np.arange(5),
             "big": 2**100, "thing": Thing("v")}
    slot = bytearray(4096)
    end, buffers = codec_impl.encode_into(value, slot, 0)
    assert buffers == ()
    out = codec_impl.decode(memoryview(slot)[:end])
    expected = canon({k: v for k, v in out.items() if k != "np"})
    slot[:] = b"\xee" * len(slot)  # the ring reuses the slot
    assert canon({k: v for k, v in out.items() if k != "np"}) == expected
    np.testing.assert_array_equal(out["np"], np.arange(5))
    assert out["mv"].tobytes() == b"mv" and out["thing"] == Thing("v")


# ---------------------------------------------------------------- encode_into

def test_encode_into_mmap_at_offset_leaves_the_rest_untouched(codec_impl):
    value = {"token": "hello", "index": (17, 2**70), "data": b"\x00" * 300}
    with mmap.mmap(-1, 4096) as mm:
        mm[:] = b"\xab" * 4096
        view = memoryview(mm)
        try:
            end, buffers = codec_impl.encode_into(value, view, 100)
            assert buffers == () and end > 100
            assert mm[:100] == b"\xab" * 100 and mm[end:] == b"\xab" * (4096 - end)
            assert mm[100:end] == codec_impl.dumps(value)
            assert codec_impl.decode(view[100:end]) == value
            with pytest.raises(BufferTooSmallError):
                codec_impl.encode_into(value, view[:200], 100)
            assert mm[:100] == b"\xab" * 100
        finally:
            view.release()


@pytest.mark.parametrize("value", [
    "hello", "x" * 40, 2**70, -2**63, 1.5, b"b" * 300, [1, [2, (3, 4)], {"k": "v"}],
    (0,) * 300, {(1, 2): {1, 2}}, ["é" * 40, bytearray(b"ba"), memoryview(b"mv"), None, True],
    {"token": "hello", "index": 17, "logprob": -0.25},
], ids=lambda v: repr(v)[:30])
def test_too_small_buffer_at_every_size(codec_impl, value):
    frame = codec_impl.dumps(value)
    for size in range(len(frame)):
        for offset in (0, 3):
            buf = bytearray(b"\x5a" * (size + offset))
            with pytest.raises(BufferTooSmallError) as info:
                codec_impl.encode_into(value, buf, offset)
            assert info.value.needed == len(frame)
            assert buf[:offset] == b"\x5a" * offset
    buf = bytearray(len(frame) + 3)
    end, buffers = codec_impl.encode_into(value, buf, 3)
    assert end == len(buf) and bytes(buf[3:]) == frame and buffers == ()


def test_too_small_for_large_frames(codec_impl):
    value = [(i, "v" * (i % 50)) for i in range(3000)]
    frame = codec_impl.dumps(value)
    for size in (0, 1, 100, 4095, len(frame) // 2, len(frame) - 1):
        with pytest.raises(BufferTooSmallError) as info:
            codec_impl.encode_into(value, bytearray(size))
        assert info.value.needed == len(frame)
    assert codec_impl.encode_into(value, bytearray(len(frame)))[0] == len(frame)


@pytest.mark.parametrize("dest", [bytearray, lambda n: memoryview(bytearray(n))])
def test_out_of_band_buffers_come_back_as_a_tuple(codec_impl, dest):
    big = codec_impl.OOB_THRESHOLD
    # No buffers: the empty tuple, also when pickle was asked for some.
    for value in ("hello", {"token": "hello", "index": 17}, {1, 2}, b"x" * (big - 1)):
        end, buffers = codec_impl.encode_into(value, dest(big + 64), 0)
        assert type(buffers) is tuple and buffers == ()
    # Out-of-band bytes and pickle-5 buffers, in frame order.
    value = [b"a" * big, np.full(big, 3, np.uint8), {"m": bytearray(b"b" * big)}]
    buf = dest(4096)
    end, buffers = codec_impl.encode_into(value, buf, 0)
    assert type(buffers) is tuple and [bytes(b[:1]) for b in buffers] == [b"a", b"\3", b"b"]
    assert all(type(b) is memoryview for b in buffers)
    out = codec_impl.decode(memoryview(buf)[:end], buffers)
    assert out[0] == value[0] and (out[1] == 3).all() and out[2]["m"] == value[2]["m"]


def test_too_small_with_out_of_band_buffers(codec_impl):
    value = ["x" * 100, b"y" * codec_impl.OOB_THRESHOLD]
    buf = bytearray(4096)
    end, buffers = codec_impl.encode_into(value, buf, 0)
    assert len(buffers) == 1
    with pytest.raises(BufferTooSmallError) as info:
        codec_impl.encode_into(value, bytearray(end - 1))
    assert info.value.needed == end


def test_encode_growing_grows_until_the_frame_fits(codec_impl):
    value = ["x" * 5000, b"y" * codec_impl.OOB_THRESHOLD, 7]
    small = bytearray(16)
    retries = []
    buf, end, buffers = codec_impl.encode_growing(value, small, on_retry=lambda: retries.append(1))
    assert type(buf) is bytearray and buf is not small and len(buf) >= end > 5000
    assert type(buffers) is list and len(buffers) == 1
    assert retries == [1]                                   # needed was exact: one retry
    assert codec_impl.decode(memoryview(buf)[:end], buffers) == value
    same, end2, none = codec_impl.encode_growing(7, small)  # fits: the bytearray given
    assert same is small and none == [] and codec_impl.decode(small[:end2]) == 7
    big, end3, inband = codec_impl.encode_growing(value, bytearray(16), None)
    assert inband == [] and codec_impl.decode(big[:end3]) == value


def test_encode_growing_refuses_a_frame_over_its_limit(codec_impl):
    frame = codec_impl.dumps("z" * 3000)
    with pytest.raises(BufferTooSmallError) as info:
        codec_impl.encode_growing("z" * 3000, bytearray(64), limit=len(frame) - 1)
    assert info.value.needed == len(frame)
    # A frame within the limit is encoded even when doubling would pass it.
    buf, end, _ = codec_impl.encode_growing("z" * 3000, bytearray(2000), limit=len(frame))
    assert bytes(buf[:end]) == frame
    with pytest.raises(TypeError):
        codec_impl.encode_growing(1, memoryview(bytearray(64)))


def test_encode_into_argument_errors(codec_impl):
    with pytest.raises(TypeError):
        codec_impl.encode_into(1, b"read-only bytes")
    with pytest.raises(TypeError):
        codec_impl.encode_into(1, memoryview(bytearray(8))[::2])
    with pytest.raises(TypeError):
        codec_impl.encode_into(1, 12)
    for offset in (-1, 9):
        with pytest.raises(ValueError):
            codec_impl.encode_into(1, bytearray(8), offset)
        with pytest.raises(ValueError):
            codec_impl.encode_into(1, memoryview(bytearray(8)), offset)
    with pytest.raises(TypeError):
        codec_impl.decode(12)
    with pytest.raises(TypeError):
        codec_impl.decode(memoryview(b"\x92\x00\x01\x00\x02")[::2])


def test_destination_resized_while_pickling_is_refused(codec_impl):
    buf = bytearray(4096)

    class Resizer:
        def __reduce__(self):
            buf.extend(b"\0" * 100_000)  # the destination is exported: refused
            return (int, (0,))

    with pytest.raises(SerializationError) as info:
        codec_impl.encode_into(["before", Resizer(), "after"], buf, 0)
    assert isinstance(info.value.__cause__, BufferError)
    assert len(buf) == 4096
    with pytest.raises(SerializationError) as info:
        codec_impl.encode_growing(["before", Resizer(), "after"], buf)
    assert isinstance(info.value.__cause__, BufferError)
    assert len(buf) == 4096


def test_container_mutated_while_pickling_raises_cleanly(codec_impl):
    items = []

    class Shrinker:
        def __reduce__(self):
            items.clear()
            return (int, (0,))

    items.extend([Shrinker(), "a" * 100, "b" * 100, [1, 2, 3]])
    with pytest.raises(RuntimeError):
        codec_impl.dumps(items)
    mapping = {}

    class Grower:
        def __reduce__(self):
            mapping.update((i, i) for i in range(100))
            return (int, (0,))

    mapping.update(a=Grower(), b="x")
    with pytest.raises(RuntimeError):
        codec_impl.dumps(mapping)


_INPUT = []


def _release_input():
    _INPUT[0].release()  # refused (BufferError) while a decoder holds an export
    return "released"


class ReleasesInput:
    def __reduce__(self):
        return (_release_input, ())


def test_input_released_while_decoding_is_safe(codec_impl):
    buf = bytearray(1024)
    end, _ = codec_impl.encode_into([ReleasesInput(), "after" * 10], buf, 0)
    view = memoryview(buf)[:end]
    _INPUT[:] = [view]
    try:
        assert codec_impl.decode(view) == ["released", "after" * 10]
    except DecodeError as exc:  # the compiled twin reads the view in place
        assert isinstance(exc.__cause__, BufferError)
    finally:
        _INPUT.clear()
    view.release()  # the decoder's hold on the view ended with the call
    container = memoryview(codec_impl.dumps({"k": [1, 2.5, "s"]}))
    assert codec_impl.decode(container) == {"k": [1, 2.5, "s"]}
    container.release()
    released = memoryview(b"\x90")
    released.release()
    with pytest.raises(ValueError):
        codec_impl.decode(released)


# ---------------------------------------------------------------- errors: encode

def test_unserialisable_value_names_type_and_path(codec_impl):
    lock = threading.Lock()
    with pytest.raises(SerializationError) as info:
        codec_impl.dumps({"a": [1, 2, lock]})
    message = str(info.value)
    assert message.startswith("cannot serialise object of type '_thread.lock' at value['a'][2]: ")
    assert isinstance(info.value, TypeError)
    assert isinstance(info.value.__cause__, TypeError)
    assert "_thread.lock" in str(info.value.__cause__)


@pytest.mark.parametrize("make_value, type_name, path", [
    (lambda bad: bad, "generator", "value"),
    (lambda bad: [0, (1, bad)], "generator", "value[1][1]"),
    (lambda bad: {1: {(1, 2): bad}}, "generator", "value[1][(1, 2)]"),
    (lambda bad: {"k": [{}, {bad: 1}]}, "generator", "list(value['k'][1])[0]"),
    (lambda bad: ["ok", collections.OrderedDict(x=bad)], "collections.OrderedDict", "value[1]"),
])
def test_error_path_forms(codec_impl, make_value, type_name, path):
    bad = (i for i in range(3))
    with pytest.raises(SerializationError) as info:
        codec_impl.encode_into(make_value(bad), bytearray(1024))
    assert str(info.value).startswith(f"cannot serialise object of type '{type_name}' at {path}: ")


def test_unserialisable_socket(codec_impl):
    with socket.socket() as sock:
        with pytest.raises(SerializationError, match=r"'socket\.socket' at value\['s'\]"):
            codec_impl.dumps({"s": sock})


def test_nesting_limit_on_encode(codec_impl):
    depth = codec_impl.MAX_DEPTH
    value = [None]
    for i in range(depth - 1):
        value = [value] if i % 3 else ({"k": value} if i % 2 else (value,))
    out = roundtrip(codec_impl, value)  # exactly MAX_DEPTH containers
    expected = value
    for _ in range(depth):
        assert type(out) is type(expected)
        out, expected = (out["k"], expected["k"]) if type(out) is dict else (out[0], expected[0])
    assert expected is None and out is None
    # One level more: the whole value is pickled (one EXT_PICKLE frame).
    for too_deep in ([value], (value,), {"k": value}):
        frame = codec_impl.dumps(too_deep)
        assert frame[0] in (0xC7, 0xC8, 0xC9) and EXT_PICKLE in frame[1:6]
        assert codec_impl.loads(frame) == too_deep


def test_self_referencing_containers_round_trip_as_one_pickle(codec_impl):
    # Ray pickles such values; a frame cannot hold a cycle, so the whole
    # value becomes one pickle, which keeps its cycles and sharing.
    loop = [1]
    loop.append(loop)
    cycle = {"a": (1, 2)}
    cycle["self"] = [cycle, cycle]
    for value in (loop, cycle, [[1], loop]):
        end, buffers = codec_impl.encode_into(value, bytearray(1 << 16))
        assert buffers == ()
    out = codec_impl.loads(codec_impl.dumps(loop))
    assert out[0] == 1 and out[1] is out
    out = codec_impl.loads(codec_impl.dumps(cycle))
    assert out["self"][0] is out and out["self"][1] is out and out["a"] == (1, 2)
    # The out-of-band buffer the first attempt took is dropped (pickle keeps
    # bytes in-band): the frame refers to no buffer.
    cycle["big"] = b"z" * 100_000
    buf = bytearray(1 << 18)
    end, buffers = codec_impl.encode_into(cycle, buf, 0, oob_threshold=1000)
    assert buffers == ()
    out = codec_impl.decode(buf[:end])
    assert out["self"][1] is out and out["big"] == b"z" * 100_000
    # Too deep for pickle as well: a clear error, not a crash.
    deep = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(SerializationError, match="recursion"):
        codec_impl.dumps(deep)


# ---------------------------------------------------------------- errors: decode

VALID_FRAMES = [
    None, 300, -70000, 2**64 - 1, 2**80, 1.5, "héllo" * 10, b"x" * 300, [1, [2, "3"]],
    {"a": (1, (2,)), (3,): b"4"}, (0,) * 300, {1, 2}, bytearray(b"ba"), memoryview(b"mv"),
    {"token": "hello", "index": 17, "logprob": -0.25},
]


@pytest.mark.parametrize("value", VALID_FRAMES, ids=lambda v: repr(v)[:30])
def test_every_truncation_is_a_decode_error(codec_impl, value):
    frame = codec_impl.dumps(value)
    for n in range(len(frame)):
        with pytest.raises(DecodeError):
            codec_impl.decode(frame[:n])
        with pytest.raises(DecodeError):
            codec_impl.decode(bytearray(frame[:n]))


@pytest.mark.parametrize("value", VALID_FRAMES, ids=lambda v: repr(v)[:30])
def test_trailing_bytes_are_a_decode_error(codec_impl, value):
    frame = codec_impl.dumps(value)
    with pytest.raises(DecodeError, match="trailing bytes"):
        codec_impl.decode(frame + b"\x00")


HUGE = [
    b"\xdb\xff\xff\xff\xffabc",          # str32 of 4 GiB
    b"\xc6\xff\xff\xff\xff\x00",         # bin32
    b"\xdd\xff\xff\xff\xff\x00",         # array32 of 4 G items
    b"\xdf\xff\xff\xff\xff\x00\x00",     # map32
    b"\xdc\xff\xff" + b"\x00" * 100,     # array16 that cannot fit
    b"\xc9\xff\xff\xff\xff\x01\x90",     # ext32
    b"\xd9\x05ab",                       # str8 past the end
]


@pytest.mark.parametrize("frame", HUGE, ids=lambda f: f[:6].hex())
def test_huge_claimed_lengths_are_refused_before_allocating(codec_impl, frame):
    with pytest.raises(DecodeError):
        codec_impl.decode(frame)


BAD = {
    "invalid type byte": b"\xc1",
    "invalid type byte nested": b"\x92\x01\xc1",
    "invalid utf-8": b"\xa2\xff\xfe",
    "utf-8 surrogate": b"\xa3\xed\xa0\x80",
    "invalid utf-8 key": b"\x81\xa2\xc3\x28\x01",
    "unhashable list key": b"\x81\x90\x01",
    "unhashable map key": b"\x81\x80\x01",
    "unhashable tuple key": b"\x81" + ext(EXT_TUPLE, b"\x91\x90") + b"\x01",
    "unknown ext": b"\xd4\x7f\x00",
    "timestamp ext": b"\xd6\xff\x00\x00\x00\x00",
    "empty bigint": b"\xc7\x00\x02",
    "tuple not an array": ext(EXT_TUPLE, b"\x01"),
    "empty tuple payload": b"\xc7\x00\x01",
    "tuple trailing": ext(EXT_TUPLE, b"\x91\x01\x02"),
    "tuple item past payload": ext(EXT_TUPLE, b"\x92\x01") + b"\x02",
    "oob without buffers": ext(EXT_OOB, b"\x00\x00\x00\x00\x00"),
    "oob index": ext(EXT_OOB, b"\x00\xff\xff\xff\xff"),
    "oob kind": ext(EXT_OOB, b"\x09\x00\x00\x00\x00"),
    "oob size": ext(EXT_OOB, b"\x00\x00\x00\x00"),
    "buffer kind": ext(EXT_BUFFER, b"\x07abc"),
    "empty buffer": b"\xc7\x00\x05",
    "pickle short": ext(EXT_PICKLE, b"\x00\x00"),
    "pickle oob range": ext(EXT_PICKLE, b"\x00\x00\x00\x00\x00\x00\x00\x02" + pickle.dumps(1)),
    "pickle oob overflow": ext(EXT_PICKLE, b"\xff\xff\xff\xff\xff\xff\xff\xff" + pickle.dumps(1)),
    "corrupt pickle": ext(EXT_PICKLE, b"\x00" * 8 + b"\x80\x05garbage"),
    "truncated pickle": ext(EXT_PICKLE, b"\x00" * 8 + pickle.dumps([1, 2, 3])[:-3]),
    "empty": b"",
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_corrupt_frames_are_decode_errors(codec_impl, name):
    with pytest.raises(DecodeError):
        codec_impl.decode(BAD[name])


def test_corrupt_pickle_chains_the_cause(codec_impl):
    with pytest.raises(DecodeError, match="corrupt pickle") as info:
        codec_impl.decode(BAD["corrupt pickle"])
    assert info.value.__cause__ is not None


def test_out_of_band_buffer_that_is_not_bytes_like(codec_impl):
    with pytest.raises(DecodeError, match="out-of-band buffer 0"):
        codec_impl.decode(ext(EXT_OOB, b"\x02\x00\x00\x00\x00"), [12])


def test_nesting_limit_on_decode(codec_impl):
    depth = codec_impl.MAX_DEPTH
    assert codec_impl.decode(b"\x91" * (depth - 1) + b"\x90") is not None
    for frame in (b"\x91" * depth + b"\x90", b"\x81\xc0" * depth + b"\x80",
                  b"\xdc\x00\x01" * 100_000 + b"\x90"):
        with pytest.raises(DecodeError, match="nested deeper than 512"):
            codec_impl.decode(frame)
    # Tuples count as one level each, like lists.
    value = ()
    for _ in range(depth - 1):
        value = (value,)
    frame = codec_impl.dumps(value)
    assert codec_impl.decode(frame) == value
    with pytest.raises(DecodeError, match="nested deeper"):
        codec_impl.decode(ext(EXT_TUPLE, b"\x91" + frame))


def test_key_cache_does_not_confuse_keys(codec_impl):
    # Many short keys (more than the compiled twin's cache has slots), some
    # differing only in order of their bytes, decoded repeatedly.
    keys = [f"k{i}" for i in range(2000)] + ["ab", "ba", "a\x00", "\x00a", "é", "e"]
    value = {k: i for i, k in enumerate(keys)}
    frame = codec_impl.dumps(value)
    for _ in range(3):
        assert codec_impl.loads(frame) == value
    for k in keys:
        assert codec_impl.loads(codec_impl.dumps({k: 1})) == {k: 1}


# ---------------------------------------------------------------- hypothesis

hashable_scalars = (st.none() | st.booleans() | st.integers() | st.text(max_size=20)
                    | st.binary(max_size=20))
keys = hashable_scalars | st.lists(hashable_scalars, max_size=3).map(tuple)
scalars = (st.none() | st.booleans() | st.integers() | st.integers(-2**70, 2**70)
           | st.floats() | st.text() | st.binary()
           | st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), max_size=3))
values = st.recursive(
    scalars,
    lambda children: (st.lists(children, max_size=6) | st.lists(children, max_size=6).map(tuple)
                      | st.dictionaries(keys, children, max_size=6)),
    max_leaves=30)


def plain(value):
    """True if msgpack.packb alone must produce our frame for this value."""
    t = type(value)
    if t is int:
        return -2**63 <= value < 2**64
    if t is str:
        return not any(0xD800 <= ord(c) <= 0xDFFF for c in value)
    if t is list:
        return all(plain(v) for v in value)
    if t is dict:
        return all(plain(k) and plain(v) for k, v in value.items())
    return t in (type(None), bool, float, bytes)


@examples(150)
@given(value=values)
def test_random_values_round_trip(codec_impl, value):
    assert canon(roundtrip(codec_impl, value)) == canon(value)


@examples(150)
@given(value=values)
def test_twins_produce_identical_frames_that_each_other_decodes(twins, value):
    compiled, python = twins
    frame = frame_of(compiled, value)
    assert frame_of(python, value) == frame
    assert compiled.dumps(value) == python.dumps(value) == frame
    assert canon(python.decode(frame)) == canon(value)
    assert canon(compiled.decode(frame)) == canon(value)
    if plain(value):
        assert frame == msgpack.packb(value, use_bin_type=True)


@examples(300)
@given(data=st.binary(max_size=64))
def test_random_garbage_is_a_value_or_a_decode_error(codec_impl, data):
    try:
        codec_impl.decode(data)
    except DecodeError:
        pass


@examples(300)
@given(data=st.binary(max_size=64) | values.map(_codec_py.dumps),
       cut=st.integers(0, 64), flip=st.integers(0, 255))
def test_twins_agree_on_corrupt_input(twins, data, cut, flip):
    compiled, python = twins
    if data:
        data = bytearray(data)
        data[cut % len(data)] ^= flip  # a valid frame with one byte changed
        data = bytes(data)
    outcomes = []
    for codec in (compiled, python):
        try:
            outcomes.append(("value", canon(codec.decode(data))))
        except DecodeError as exc:
            outcomes.append(("error", str(exc)))
    assert outcomes[0] == outcomes[1]


# ---------------------------------------------------------------- twins agree

def released():
    view = memoryview(b"")
    view.release()
    return view


ERROR_VALUES = [
    lambda: {"a": [1, 2, threading.Lock()]}, lambda: [(i for i in ()), 1],
    lambda: {threading.Lock(): 1}, lambda: {"x": released()},
    lambda: {"k": {"deep": [collections.OrderedDict(g=(i for i in ()))]}},
]


@pytest.mark.parametrize("index", range(len(ERROR_VALUES)))
def test_twins_raise_the_same_encode_errors(twins, index):
    value = ERROR_VALUES[index]()
    messages = []
    for codec in twins:
        with pytest.raises(SerializationError) as info:
            codec.encode_into(value, bytearray(256))
        messages.append(str(info.value))
    assert messages[0] == messages[1]


@pytest.mark.parametrize("name", sorted(BAD))
def test_twins_raise_the_same_decode_errors(twins, name):
    messages = []
    for codec in twins:
        with pytest.raises(DecodeError) as info:
            codec.decode(BAD[name])
        messages.append(str(info.value))
    assert messages[0] == messages[1]


def test_twins_agree_on_large_frames(twins):
    compiled, python = twins
    for value in ([(i, "v" * (i % 50)) for i in range(3000)], (0,) * 70000, ["x" * 1000] * 100,
                  {str(i): [i, (i,)] for i in range(5000)}):
        frame = compiled.dumps(value)
        assert python.dumps(value) == frame == frame_of(python, value) == frame_of(compiled, value)
        assert python.loads(frame) == compiled.loads(frame) == value
