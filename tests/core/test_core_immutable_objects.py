"""Objects are immutable: what one ``get`` returns is its caller's own, as in
Ray, whether the object is a task's result, an actor call's, a streamed item
or a ref passed on; changing it changes no later ``get`` and no task given
the ref."""
import asyncio
import threading

import pytest

import ray_lite as ray

# Public API only: these run on Ray too (--backend=ray; see conftest.py).
pytestmark = pytest.mark.both_backends


@ray.remote
def make_list():
    return [1, 2, {"k": [3]}]


@ray.remote
def echo(x):
    return x


@ray.remote
def first_of(box):
    # ``box`` is [ref]: the ref arrives unresolved and is fetched here, twice.
    a = ray.get(box[0])
    a.append("changed here")
    return ray.get(box[0])


@ray.remote(num_returns=2)
def two_lists():
    return [1], [2]


@ray.remote
def with_ref():
    return [ray.put("inner")]


@ray.remote
class Holder:
    def __init__(self):
        self.items = {"a": [1]}

    def items_now(self):
        return self.items

    def stream(self):
        for i in range(3):
            yield [i]


@ray.remote
def stream_lists():
    for i in range(3):
        yield {"i": [i]}


def test_changing_a_tasks_result_changes_no_later_get(rt):
    ref = make_list.remote()
    first = ray.get(ref)
    first.append(9)
    first[2]["k"].append(4)
    assert ray.get(ref) == [1, 2, {"k": [3]}]
    second = ray.get(ref)
    assert second is not ray.get(ref)


def test_a_task_given_the_ref_gets_the_value_as_it_was_returned(rt):
    ref = make_list.remote()
    ray.get(ref).append(9)
    assert ray.get(echo.remote(ref)) == [1, 2, {"k": [3]}]


def test_a_ref_passed_on_inside_a_value_reaches_its_task_unchanged(rt):
    ref = make_list.remote()
    ray.get(ref).clear()
    assert ray.get(first_of.remote([ref])) == [1, 2, {"k": [3]}]


def test_an_actor_calls_result_is_the_callers_own(rt):
    h = Holder.remote()
    ref = h.items_now.remote()
    got = ray.get(ref)
    got["a"].append(2)
    got["b"] = 0
    assert ray.get(ref) == {"a": [1]}
    assert ray.get(h.items_now.remote()) == {"a": [1]}


def test_streamed_items_are_each_callers_own(rt):
    for gen in (stream_lists.remote(), Holder.remote().stream.remote()):
        refs = list(gen)
        for ref in refs:
            v = ray.get(ref)
            (v["i"] if isinstance(v, dict) else v).append("x")
        again = [ray.get(r) for r in refs]
        assert again in ([{"i": [0]}, {"i": [1]}, {"i": [2]}], [[0], [1], [2]])


def test_each_of_several_returns_is_its_callers_own(rt):
    a, b = two_lists.remote()
    ray.get(a).append(0)
    ray.get([a, b])[1].append(0)
    assert ray.get([a, b]) == [[1], [2]]


def test_a_list_of_refs_comes_back_as_a_new_list_of_working_refs(rt):
    ref = with_ref.remote()
    got = ray.get(ref)
    got.append(None)
    again = ray.get(ref)
    assert len(again) == 1 and ray.get(again[0]) == "inner"
    assert ray.get(got[0]) == "inner"


def test_await_gives_each_awaiter_its_own_value(rt):
    ref = make_list.remote()

    async def twice():
        a = await ref
        a.append(9)
        return await ref

    assert asyncio.run(twice()) == [1, 2, {"k": [3]}]


def test_threads_getting_at_once_never_share_a_value(rt):
    for _ in range(20):
        ref = make_list.remote()
        ray.wait([ref], timeout=60)
        got = [None] * 4
        start = threading.Barrier(4, timeout=60)

        def read(i):
            start.wait()
            got[i] = ray.get(ref)

        threads = [threading.Thread(target=read, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len({id(v) for v in got}) == 4
        assert all(v == [1, 2, {"k": [3]}] for v in got)


def test_numpy_arrays_in_a_result_keep_their_values(rt):
    np = pytest.importorskip("numpy")
    small = echo.remote([np.arange(4)])
    both = echo.remote({"small": np.arange(4), "big": np.zeros(1 << 20)})
    for ref in (small, both):
        got = ray.get(ref)
        for arr in (got if isinstance(got, list) else got.values()):
            try:
                arr[0] = 7
            except ValueError:
                pass            # read-only, as Ray's zero-copy arrays are
    assert ray.get(small)[0].tolist() == [0, 1, 2, 3]
    again = ray.get(both)
    assert again["small"].tolist() == [0, 1, 2, 3]
    assert again["big"][0] == 0 and again["big"].shape == (1 << 20,)


def test_immutable_results_are_kept_as_they_are(rt):
    # Nothing to copy: values of immutable types come back as they were.
    assert ray.get(echo.remote("text")) == "text"
    ref = echo.remote((1, "a"))
    assert ray.get(ref) == ray.get(ref) == (1, "a")
