"""Streaming generators at their edges: a task iterating one lends its CPU slot,
``next_ready`` after the last item, ``get`` of a generator."""
import pytest

import ray_lite as ray
from ray_lite.exceptions import GetTimeoutError

T = 60


@ray.remote
def produce(n):
    yield from range(n)

def test_a_task_iterating_a_generator_lends_its_cpu_slot():
    # One CPU: the consumer holds it while it waits for the producer's items.
    ray.init(num_cpus=1)
    try:
        @ray.remote
        def consume(n):
            return [ray.get(ref) for ref in produce.remote(n)]
        assert ray.get(consume.remote(4), timeout=T) == [0, 1, 2, 3]

        @ray.remote
        def consume_with_timeout(n):
            g = produce.remote(n)
            out = []
            while True:
                try:
                    ref = g._next_sync(timeout_s=T)
                except StopIteration:
                    return out
                if ref.is_nil():
                    raise GetTimeoutError("no item")
                out.append(ray.get(ref))
        assert ray.get(consume_with_timeout.remote(3), timeout=T) == [0, 1, 2]
    finally:
        ray.shutdown()


def test_next_ready_is_false_once_the_stream_is_exhausted(rt):
    g = produce.remote(2)
    ray.get(g.completed(), timeout=T)
    assert g.next_ready() and not g.is_finished()
    assert [ray.get(r) for r in g] == [0, 1]
    assert not g.next_ready()
    assert g.is_finished()
    ready, _ = ray.wait([g], timeout=T)      # wait still sees the end as ready
    assert ready == [g]


def test_get_of_a_generator_returns_it(rt):
    g = produce.remote(1)
    assert ray.get(g) is g
    assert ray.get(g, timeout=1) is g
    with pytest.raises(TypeError):
        ray.get([g])
