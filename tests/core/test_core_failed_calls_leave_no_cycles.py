"""Failed tasks and actor calls leave no reference cycles behind, and each
``get`` of a failed ref raises its own copy of the error."""
import gc
import os

import pytest

import ray_lite as ray

T = 60


class Failing:
    def fail(self):
        raise ValueError("no")

    def ok(self):
        return 1


class AsyncFailing:
    async def fail(self):
        raise ValueError("no")

    async def ok(self):
        return 1


def _garbage_per_calls(call, n):
    """What the collector finds after ``n`` calls (0: they left no cycle behind)."""
    for _ in range(3):      # warm-up: what the first calls create once
        call()
    gc.collect()
    gc.disable()
    try:
        for _ in range(n):
            call()
        return gc.collect()
    finally:
        gc.enable()


@pytest.mark.parametrize("cls", [Failing, AsyncFailing])
def test_failed_actor_calls_leave_no_reference_cycles(rt, cls):
    a = ray.remote(cls).remote()

    def failed_call():
        with pytest.raises(ValueError):
            ray.get(a.fail.remote(), timeout=T)
    n = 50
    # Before: about 12 objects in cycles per failed call.
    assert _garbage_per_calls(failed_call, n) < n
    assert _garbage_per_calls(lambda: ray.get(a.ok.remote(), timeout=T), n) < n

    ref = a.fail.remote()
    errors = []
    for _ in range(3):
        try:
            ray.get(ref, timeout=T)
        except ValueError as exc:
            errors.append(exc)
    # Each get raises its own copy, whose traceback does not grow from get to get.
    assert len({id(e) for e in errors}) == 3
    depths = []
    for e in errors:
        tb, d = e.__traceback__, 0
        while tb is not None:
            tb, d = tb.tb_next, d + 1
        depths.append(d)
    assert depths[0] == depths[1] == depths[2]


def test_failed_tasks_and_awaits_leave_no_reference_cycles(rt):
    @ray.remote
    def fail():
        raise KeyError("k")

    def failed_task():
        with pytest.raises(KeyError):
            ray.get(fail.remote(), timeout=T)
    assert _garbage_per_calls(failed_task, 30) < 30
    assert os.getpid()
