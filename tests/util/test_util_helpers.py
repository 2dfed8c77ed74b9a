"""ray_lite.util: as_completed, map_unordered, get_node_ip_address,
inspect_serializability, and how ``ray_lite.util`` is reached."""
import io
import ipaddress
import subprocess
import sys
import threading

import pytest

import ray_lite
from ray_lite import util
from ray_lite.util import (as_completed, get_node_ip_address, inspect_serializability,
                           map_unordered)
from ray_lite.util.queue import Queue

# Public API only: these run on Ray too (--backend=ray; see conftest.py).
pytestmark = pytest.mark.both_backends


@ray_lite.remote
def echo(x):
    return x


@ray_lite.remote
def held(q):
    return q.get(timeout=30)


@ray_lite.remote
def fails(x):
    raise KeyError(x)


def test_util_is_reached_from_ray_lite_without_being_imported_up_front():
    code = ("import sys, ray_lite; assert 'ray_lite.util' not in sys.modules; "
            "from ray_lite.util.queue import Queue; "
            "assert ray_lite.util.ActorPool and ray_lite.util.queue.Queue is Queue "
            "and ray_lite.util.multiprocessing.Pool; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.strip() == "ok", out.stderr
    assert ray_lite.util is util
    with pytest.raises(AttributeError):
        ray_lite.not_a_module
    with pytest.raises(AttributeError):
        util.not_a_module


def test_as_completed_yields_every_value(rt):
    refs = [echo.remote(i) for i in range(25)]
    assert sorted(as_completed(refs)) == list(range(25))
    assert sorted(as_completed(refs, chunk_size=3)) == list(range(25))
    got = list(as_completed(refs, yield_obj_refs=True))
    assert sorted(got, key=lambda r: r.hex()) == sorted(refs, key=lambda r: r.hex())
    assert list(as_completed([])) == []


def test_as_completed_yields_the_ready_ones_first(rt):
    q = Queue()
    slow = held.remote(q)
    refs = [slow] + [echo.remote(i) for i in range(3)]
    it = as_completed(refs, chunk_size=1)
    first = [next(it) for _ in range(3)]
    assert sorted(first) == [0, 1, 2]
    q.put("last")
    assert next(it) == "last"
    with pytest.raises(StopIteration):
        next(it)


def test_as_completed_raises_a_failed_tasks_error(rt):
    with pytest.raises(KeyError):
        list(as_completed([fails.remote("k")]))


def test_as_completed_passes_wait_arguments(rt):
    refs = [echo.remote(i) for i in range(4)]
    assert sorted(as_completed(refs, timeout=30, fetch_local=True)) == [0, 1, 2, 3]


def test_as_completed_bad_arguments(rt):
    refs = [echo.remote(1)]
    with pytest.raises(ValueError):
        list(as_completed(refs, chunk_size=0))
    with pytest.raises(ValueError, match="num_returns"):
        list(as_completed(refs, num_returns=1))


def test_map_unordered_yields_every_result(rt):
    assert sorted(map_unordered(echo, range(40))) == list(range(40))
    assert sorted(map_unordered(echo, range(40), backpressure_size=5, chunk_size=2)) == \
        list(range(40))
    assert sorted(map_unordered(echo, iter(range(7)), backpressure_size=None)) == \
        list(range(7))
    refs = list(map_unordered(echo, range(3), yield_obj_refs=True))
    assert sorted(ray_lite.get(refs)) == [0, 1, 2]


def test_map_unordered_bounds_the_calls_in_flight(rt):
    # With room for 2 calls, the third item is not submitted before a result
    # was taken: the generator does not run ahead of its consumer.
    submitted = []

    class Counting:
        def remote(self, item):
            submitted.append(item)
            return echo.remote(item)
    it = map_unordered(Counting(), range(10), backpressure_size=2, chunk_size=1)
    first = next(it)
    assert submitted == [0, 1]
    assert sorted([first, *it]) == list(range(10))
    assert submitted == list(range(10))


def test_map_unordered_bad_arguments(rt):
    with pytest.raises(ValueError):
        list(map_unordered(echo, [1], backpressure_size=0))
    with pytest.raises(ValueError):
        list(map_unordered(echo, [1], chunk_size=0))
    with pytest.raises(ValueError, match="num_returns"):
        list(map_unordered(echo, [1], num_returns=2))


@pytest.mark.local_only
def test_node_ip_address():
    ip = get_node_ip_address()
    assert ipaddress.ip_address(ip).version == 4
    assert get_node_ip_address("127.0.0.1:9") == "127.0.0.1"
    assert get_node_ip_address("no-port") == "127.0.0.1"


def test_node_instance_id(monkeypatch):
    from ray_lite.util import get_node_instance_id
    monkeypatch.delenv("RAY_CLOUD_INSTANCE_ID", raising=False)
    assert get_node_instance_id() == ""
    monkeypatch.setenv("RAY_CLOUD_INSTANCE_ID", "i-0abc")
    assert get_node_instance_id() == "i-0abc"


class Holder:
    def __init__(self):
        self.fine = [1, 2, 3]
        self.lock = threading.Lock()


_global_lock = threading.Lock()


def test_a_serializable_object_passes():
    out = io.StringIO()
    ok, failures = inspect_serializability({"a": [1, 2]}, name="d", print_file=out)
    assert ok is True and failures == set()
    assert "Checking Serializability" in out.getvalue()


@pytest.mark.local_only
def test_the_non_serializable_member_is_named():
    holder = Holder()
    ok, failures = inspect_serializability(holder, name="holder", print_file=io.StringIO())
    assert ok is False
    (failure,) = failures
    assert failure.obj is holder.lock
    assert failure.name == "lock" and failure.path == ("holder", "lock")
    assert failure.parent is holder


@pytest.mark.local_only
def test_a_functions_non_serializable_global_is_named():
    # Defined here (not importable by name), so it is pickled by value, globals included.
    def uses_a_global_lock():
        return _global_lock
    ok, failures = inspect_serializability(uses_a_global_lock, print_file=io.StringIO())
    assert ok is False
    (failure,) = failures
    assert failure.obj is _global_lock and failure.name == "_global_lock"
    assert failure.parent is uses_a_global_lock


@pytest.mark.local_only
def test_a_closure_variable_is_named():
    lock = threading.Lock()

    def closure():
        return lock
    ok, failures = inspect_serializability(closure, name="closure", print_file=io.StringIO())
    assert not ok
    assert [f.name for f in failures] == ["lock"]
    assert "lock" in repr(next(iter(failures)))


def test_depth_limits_the_search():
    holder = Holder()
    ok, failures = inspect_serializability(holder, depth=0, print_file=io.StringIO())
    assert not ok
    assert [f.obj for f in failures] == [holder]


def test_the_report_goes_to_stdout_by_default(capsys):
    inspect_serializability(threading.Lock(), name="lk")
    out = capsys.readouterr().out
    assert "FAIL" in out and "lk" in out


def test_pickling_is_cloudpickles():
    # A lambda does not pickle with pickle but does with cloudpickle: passes.
    ok, failures = inspect_serializability(lambda x: x + 1, print_file=io.StringIO())
    assert ok and not failures
