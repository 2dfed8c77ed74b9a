"""``num_returns="dynamic"``: Ray's older generator tasks (deprecated there,
still supported): one ref, ready at the generator's end, whose value is a
``DynamicObjectRefGenerator`` of the items' refs.  Expected values measured
on Ray 2.60."""
import os
import pickle
import warnings

import pytest

import ray_lite as ray
from ray_lite.exceptions import RayTaskError, TaskCancelledError, WorkerCrashedError
from ray_lite.util.annotations import RayDeprecationWarning

T = 30
# Ray's deprecation warning, given where each of these is declared: expected
# (test_only_generators_and_a_deprecation_warning checks it).
pytestmark = pytest.mark.filterwarnings("ignore::ray_lite.util.annotations.RayDeprecationWarning")
warnings.filterwarnings("ignore", category=RayDeprecationWarning, module=__name__)


@ray.remote(num_returns="dynamic")
def split(n, fail_at=None):
    for i in range(n):
        if i == fail_at:
            raise ValueError(f"boom at {i}")
        yield i * 10


@ray.remote
def consume(items):
    return type(items).__name__, [ray.get(r) for r in items]


@ray.remote
class Splitter:
    @ray.method(num_returns="dynamic")
    def split(self, n):
        yield from range(n)


def test_one_ref_whose_value_is_the_items_refs(rt):
    ref = split.remote(3)
    assert isinstance(ref, ray.ObjectRef)
    items = ray.get(ref, timeout=T)
    assert isinstance(items, ray.DynamicObjectRefGenerator) and len(items) == 3
    assert [ray.get(r, timeout=T) for r in items] == [0, 10, 20]
    assert len(items) == 0              # iterating takes them, as in Ray
    assert ray.wait([split.remote(2)], timeout=T)[0]
    # Passed to a task, the ref arrives as the generator.
    assert ray.get(consume.remote(split.remote(2)), timeout=T) == \
        ("DynamicObjectRefGenerator", [0, 10])
    assert len(ray.get(split.remote(0), timeout=T)) == 0
    again = pickle.loads(pickle.dumps(ray.get(split.remote(1), timeout=T)))
    assert [ray.get(r, timeout=T) for r in again] == [0]


def test_options_and_actor_methods(rt):
    opts = split.options(num_returns="dynamic")
    assert [ray.get(r, timeout=T) for r in ray.get(opts.remote(2), timeout=T)] == [0, 10]
    a = Splitter.remote()
    assert [ray.get(r, timeout=T) for r in ray.get(a.split.remote(3), timeout=T)] == [0, 1, 2]


def test_an_error_in_the_generator_is_its_last_ref(rt):
    refs = list(ray.get(split.remote(4, fail_at=2), timeout=T))
    assert len(refs) == 3
    assert [ray.get(r, timeout=T) for r in refs[:2]] == [0, 10]
    with pytest.raises(ValueError, match="boom at 2") as info:
        ray.get(refs[2], timeout=T)
    assert isinstance(info.value, RayTaskError)


@ray.remote(num_returns="dynamic", max_retries=0)
def crash():
    yield 1
    os._exit(1)


@ray.remote(num_returns="dynamic")
def slow(path):
    open(path, "w").close()
    import time
    while True:
        time.sleep(0.01)        # (the task being cancelled: no test waits on this)
        yield 1


def test_a_failed_call_is_the_error_of_its_ref(rt, tmp_path):
    with pytest.raises(WorkerCrashedError):
        ray.get(crash.remote(), timeout=T)
    path = str(tmp_path / "started")
    ref = slow.remote(path)
    from serve_helpers import wait_until
    wait_until(lambda: os.path.exists(path), "the task started", T)
    ray.cancel(ref)
    with pytest.raises(TaskCancelledError):
        ray.get(ref, timeout=T)


def test_only_generators_and_a_deprecation_warning():
    with pytest.raises(ValueError, match="only be used with generator functions"):
        @ray.remote(num_returns="dynamic")
        def plain():
            return 1

        plain.remote()
    with pytest.warns(RayDeprecationWarning, match="streaming") as record:
        @ray.remote(num_returns="dynamic")
        def gen():
            yield 1

        class Actor:
            @ray.method(num_returns="dynamic")
            def gen(self):
                yield 1
    # Each at the user's line, as Ray's (not inside ray_lite).
    assert len(record) == 2 and all(w.filename == __file__ for w in record)
