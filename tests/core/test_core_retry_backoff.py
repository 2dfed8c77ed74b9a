"""A failed task is run again after the retry delay, not at once (as in Ray,
whose owner resubmits it at its next heartbeat): for a listed exception, a
streaming generator's exception and a dead worker alike.

The tests replace the driver's timer (``retries.later``) with one that
records the delay and fires when the test says, so nothing depends on time.
"""
import os
import threading
import time

import pytest

import ray_lite as ray
from ray_lite._private.process import state
from ray_lite._private.scheduling.task_retries import RETRY_DELAY_S
from ray_lite.exceptions import TaskCancelledError

T = 60
NOT_YET = 0.3    # how long a task that must wait is seen still waiting


@ray.remote(num_cpus=0)
class Runs:
    """Counts runs; ``flag`` is what a generator looks at to fail or not."""

    def __init__(self):
        self.n = 0
        self.flag = True

    def bump(self):
        self.n += 1
        return self.n - 1

    def count(self):
        return self.n

    def failing(self):
        return self.flag

    def stop_failing(self):
        self.flag = False


@ray.remote
def fail_until(runs, good_run):
    n = ray.get(runs.bump.remote())
    if n < good_run:
        raise KeyError(f"run {n}")
    return n


@ray.remote
def die_until(runs, good_run):
    if ray.get(runs.bump.remote()) < good_run:
        os._exit(1)
    return "survived"


@ray.remote(retry_exceptions=[ValueError], max_retries=10)
def yield_until_told(runs):
    ray.get(runs.bump.remote())
    for i in range(5):
        if i == 3 and ray.get(runs.failing.remote()):
            raise ValueError("told to fail")
        yield i


class Timer:
    """Stands in for the driver's timer: records each (delay, fn)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.calls = []

    def __call__(self, delay, fn):
        with self.lock:
            self.calls.append((delay, fn))

    def wait_for(self, n):
        deadline = time.monotonic() + T
        while True:
            with self.lock:
                if len(self.calls) >= n:
                    return self.calls[n - 1]
            assert time.monotonic() < deadline, f"no retry number {n} scheduled"
            time.sleep(0.01)

    def fire(self, n):
        delay, fn = self.wait_for(n)
        fn()
        return delay


@pytest.fixture
def timer():
    ray.init(num_cpus=2)
    try:
        t = Timer()
        state.node.retries.later = t
        yield t
    finally:
        ray.shutdown()


def test_a_task_failing_with_a_listed_exception_is_run_again_after_the_delay(timer):
    runs = Runs.remote()
    ref = fail_until.options(max_retries=3, retry_exceptions=True).remote(runs, 2)
    assert timer.wait_for(1)[0] == RETRY_DELAY_S == 1.0
    ready, _ = ray.wait([ref], timeout=NOT_YET)
    assert ready == []
    assert ray.get(runs.count.remote(), timeout=T) == 1     # not run again yet
    timer.fire(1)
    assert timer.fire(2) == RETRY_DELAY_S
    assert ray.get(ref, timeout=T) == 2
    assert ray.get(runs.count.remote(), timeout=T) == 3
    assert len(timer.calls) == 2


def test_a_streaming_generator_is_run_again_after_the_delay(timer):
    # Ray's test_generator_basic: the generator fails at item 3 until told
    # otherwise; with retries spread in time, the word comes before the
    # ten retries are spent.
    runs = Runs.remote()
    gen = yield_until_told.remote(runs)
    assert [ray.get(next(gen), timeout=T) for _ in range(3)] == [0, 1, 2]
    assert timer.wait_for(1)[0] == RETRY_DELAY_S
    assert ray.get(runs.count.remote(), timeout=T) == 1
    ray.get(runs.stop_failing.remote(), timeout=T)
    timer.fire(1)
    assert [ray.get(ref, timeout=T) for ref in gen] == [3, 4]
    assert ray.get(runs.count.remote(), timeout=T) == 2
    assert len(timer.calls) == 1


def test_a_task_whose_worker_died_is_run_again_after_the_delay(timer):
    runs = Runs.remote()
    ref = die_until.options(max_retries=2).remote(runs, 1)
    assert timer.wait_for(1)[0] == RETRY_DELAY_S
    ready, _ = ray.wait([ref], timeout=NOT_YET)
    assert ready == []
    timer.fire(1)
    assert ray.get(ref, timeout=T) == "survived"
    assert ray.get(runs.count.remote(), timeout=T) == 2


def test_a_task_cancelled_while_it_waits_to_be_run_again_is_not_run(timer):
    runs = Runs.remote()
    ref = fail_until.options(max_retries=3, retry_exceptions=True).remote(runs, 2)
    timer.wait_for(1)
    ray.cancel(ref)
    with pytest.raises(TaskCancelledError):
        ray.get(ref, timeout=T)
    timer.fire(1)                       # the resubmission finds it cancelled
    assert ray.get(runs.count.remote(), timeout=T) == 1


def test_the_retry_is_resubmitted_by_the_drivers_timer_while_the_driver_waits(rt):
    runs = Runs.remote()
    ref = fail_until.options(max_retries=1, retry_exceptions=True).remote(runs, 1)
    assert ray.get(ref, timeout=T) == 1     # the driver blocked in get meanwhile


def test_the_service_threads_timers_run_in_due_order(rt):
    order = []
    done = threading.Event()
    service = state.node.service
    service.call_later(0.05, lambda: (order.append("later"), done.set()))
    service.call_later(0.0, lambda: order.append("sooner"))
    assert done.wait(T)
    assert order == ["sooner", "later"]
