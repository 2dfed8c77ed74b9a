"""Ray's ``max_calls`` on remote functions: a pool worker that has run a
function that many times exits, and a fresh one takes its place."""
import os

import pytest

import ray_lite as ray

from procs import wait_dead

T = 30


@ray.remote(max_calls=1)
def pid_once():
    return os.getpid()


@ray.remote(max_calls=2)
def pid_twice():
    return os.getpid()


@ray.remote
def pid_plain():
    return os.getpid()


@ray.remote(max_calls=1)
def square_once(x):
    return x * x, os.getpid()


@ray.remote(max_calls=1, max_retries=2, retry_exceptions=[KeyError])
def fail_first(path):
    if not os.path.exists(path):
        with open(path, "w") as f:
            f.write(str(os.getpid()))
        raise KeyError("first run")
    return os.getpid()


@ray.remote
def nested_pids(n):
    return [ray.get(pid_once.remote()) for _ in range(n)]


@pytest.mark.local_only
def test_a_worker_exits_after_max_calls_and_another_takes_its_place(rt):
    pids = [ray.get(pid_once.remote(), timeout=T) for _ in range(3)]
    assert len(set(pids)) == 3
    for pid in pids:
        assert wait_dead(pid, T), f"worker {pid} still runs after its max_calls"
    # The pool is whole again: both CPUs run tasks, on workers that did not leave.
    fresh = ray.get([pid_plain.remote() for _ in range(4)], timeout=T)
    assert not set(fresh) & set(pids)


@pytest.mark.local_only
def test_the_count_is_per_worker_and_per_function(rt):
    # Sequential calls go to the worker that went idle last: it runs
    # pid_twice twice, with a call of another function between (which does
    # not count), then exits.
    a1 = ray.get(pid_twice.remote(), timeout=T)
    other = ray.get(pid_plain.remote(), timeout=T)
    a2 = ray.get(pid_twice.remote(), timeout=T)
    assert other == a1 == a2
    assert wait_dead(a1, T)
    b1 = ray.get(pid_twice.remote(), timeout=T)
    assert b1 != a1
    assert ray.get(pid_twice.remote(), timeout=T) == b1


@pytest.mark.local_only
def test_no_result_is_lost_while_workers_come_and_go(rt):
    got = ray.get([square_once.remote(i) for i in range(16)], timeout=60)
    assert [v for v, _ in got] == [i * i for i in range(16)]
    assert len({pid for _, pid in got}) == 16     # each task had a fresh worker


@pytest.mark.local_only
def test_a_retried_task_counts_its_failed_run(rt, tmp_path):
    # The run that raised used the worker's one call: the retry runs elsewhere.
    path = str(tmp_path / "first_pid")
    pid = ray.get(fail_first.remote(path), timeout=T)
    first = int(open(path).read())
    assert pid != first
    assert wait_dead(first, T)


@pytest.mark.local_only
def test_a_task_submitted_from_a_task_counts_too(rt):
    pids = ray.get(nested_pids.remote(3), timeout=T)
    assert len(set(pids)) == 3


@pytest.mark.both_backends
def test_max_calls_belongs_to_the_function_not_its_options(rt):
    with pytest.raises(ValueError, match="max_calls.*not supported in '.options\\(\\)'"):
        pid_plain.options(max_calls=1)


@pytest.mark.local_only
def test_bad_max_calls_are_refused_with_rays_errors(rt):
    with pytest.raises(ValueError, match="only accepts None, 0 or a positive integer"):
        ray.remote(max_calls=-1)(lambda: 0)
    with pytest.raises(TypeError, match="max_calls"):
        ray.remote(max_calls="1")(lambda: 0)
    with pytest.raises(ValueError, match="Invalid option keyword max_calls for actors"):
        @ray.remote(max_calls=1)
        class A:
            pass


@pytest.mark.local_only
def test_max_calls_0_or_none_is_no_limit(rt):
    for limit in (0, None):
        f = ray.remote(max_calls=limit)(lambda: os.getpid())
        pids = {ray.get(f.remote(), timeout=T) for _ in range(3)}
        assert len(pids) == 1
