"""``ray_lite.util.register_serializer``: Ray's custom serialization of a
class that cannot be pickled, wherever its instances travel."""
import pickle
import threading

import pytest

import ray_lite as ray
from ray_lite.util import deregister_serializer, register_serializer

T = 60


class Guarded:
    """Holds a lock: not picklable as it is."""

    def __init__(self, value):
        self.value = value
        self.lock = threading.Lock()


def _to_value(obj):
    return {"value": obj.value}


def _from_value(d):
    return Guarded(d["value"])


@ray.remote
def bump(g):
    assert isinstance(g.lock, type(threading.Lock()))
    return g.value + 1


@ray.remote
def make(value):
    # Kept in this worker (the runtime, and with it the worker, ends with the
    # test): the result is serialised after the function returns.
    register_serializer(Guarded, serializer=_to_value, deserializer=_from_value)
    return [Guarded(value), {"nested": Guarded(value * 2)}]


@pytest.fixture
def registered():
    register_serializer(Guarded, serializer=_to_value, deserializer=_from_value)
    yield
    deregister_serializer(Guarded)


def test_instances_travel_as_their_serialised_form(rt, registered):
    assert ray.get(bump.remote(Guarded(41)), timeout=T) == 42
    got = ray.get(ray.put([Guarded(1), (Guarded(2),)]))
    assert [got[0].value, got[1][0].value] == [1, 2]
    assert got[0].lock is not None


def test_a_worker_registers_for_what_it_sends(rt):
    flat, nested = ray.get(make.remote(5), timeout=T)
    assert (flat.value, nested["nested"].value) == (5, 10)


def test_deregistering_restores_the_error_and_bad_arguments_are_refused(rt):
    register_serializer(Guarded, serializer=_to_value, deserializer=_from_value)
    assert pickle.loads(pickle.dumps(Guarded(3))).value == 3
    deregister_serializer(Guarded)
    with pytest.raises(TypeError, match="put"):
        ray.put(Guarded(1))
    deregister_serializer(Guarded)          # twice: nothing to undo
    with pytest.raises(TypeError, match="takes a class"):
        register_serializer(Guarded(1), serializer=_to_value, deserializer=_from_value)
    with pytest.raises(TypeError, match="deserializer must be callable"):
        register_serializer(Guarded, serializer=_to_value, deserializer=None)
