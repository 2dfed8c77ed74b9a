"""A task's built-in exception keeps its class: ``except MemoryError`` catches
the ``RayTaskError`` of a task that raised ``MemoryError``, as in Ray."""
import builtins

import pytest

import ray_lite
from ray_lite.exceptions import RayTaskError


_SPECIAL_ARGS = {
    UnicodeDecodeError: ("utf-8", b"\xff", 0, 1, "boom"),
    UnicodeEncodeError: ("ascii", "\xff", 0, 1, "boom"),
    UnicodeTranslateError: ("\xff", 0, 1, "boom"),
}


# Exception groups (Python 3.11+) hold other exceptions: not one class to keep.
_GROUPS = tuple(getattr(builtins, n) for n in ("BaseExceptionGroup",) if hasattr(builtins, n))


def _builtin_exception_classes():
    for name in dir(builtins):
        cls = getattr(builtins, name)
        if isinstance(cls, type) and issubclass(cls, BaseException) \
                and not issubclass(cls, _GROUPS):
            yield cls


@pytest.mark.parametrize("cls", list(_builtin_exception_classes()), ids=lambda c: c.__name__)
def test_every_builtin_exception_keeps_its_class_across_the_codec(codec_impl, cls):
    cause = cls(*_SPECIAL_ARGS.get(cls, ("boom",)))
    err = RayTaskError("f", "tb", cause, 1).as_instanceof_cause()
    assert isinstance(err, cls) and isinstance(err, RayTaskError)
    back = codec_impl.loads(codec_impl.dumps(err))
    assert isinstance(back, cls) and isinstance(back, RayTaskError)
    assert type(back.cause) is cls and back.cause.args == cause.args


@ray_lite.remote
def _raise_memory_error():
    raise MemoryError("no room for the tensor")


def test_a_tasks_memory_error_is_caught_by_except_memory_error(rt):
    with pytest.raises(MemoryError) as info:
        ray_lite.get(_raise_memory_error.remote())
    assert isinstance(info.value, RayTaskError)
    assert "no room for the tensor" in str(info.value)
