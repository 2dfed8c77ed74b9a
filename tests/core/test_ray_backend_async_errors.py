"""Errors reached through asyncio (``await ref``, ``async for`` over a
streaming generator) are ray_lite's exception classes on both backends, as
those reached through ``get`` and ``next`` are."""
import asyncio
import time

import pytest

import ray_lite as ray
from ray_lite.exceptions import RayTaskError

pytestmark = pytest.mark.both_backends

T = 60


@ray.remote
def fails(message):
    raise KeyError(message)


@ray.remote
def fails_at_item_2():
    yield 0
    yield 1
    raise ValueError("item 2")


@ray.remote
class AsyncRelay:
    async def await_failed(self):
        # ``await`` of a failed task inside an async actor (Ray's own path there).
        try:
            await fails.remote("inside")
        except RayTaskError as exc:
            return "caught", isinstance(exc, KeyError), "inside" in str(exc)
        except Exception as exc:        # noqa: BLE001 - reported to the driver by name
            return "missed", type(exc).__mro__[1].__module__, type(exc).__name__


def test_await_of_a_failed_task_is_a_ray_task_error(rt):
    async def main():
        with pytest.raises(RayTaskError) as info:
            await asyncio.wait_for(asyncio.ensure_future(fails.remote("boom")), T)
        return info.value
    error = asyncio.run(main())
    # Also the user's class, with the remote message, as ``get`` gives it.
    assert isinstance(error, KeyError)
    assert "boom" in str(error)
    with pytest.raises(RayTaskError):
        ray.get(fails.remote("again"), timeout=T)


def test_async_for_over_a_generator_that_raises_at_item_2(rt):
    async def main():
        seen = []
        with pytest.raises(RayTaskError) as info:
            async for ref in fails_at_item_2.remote():
                seen.append(await asyncio.wait_for(asyncio.ensure_future(ref), T))
        return seen, info.value
    seen, error = asyncio.run(main())
    assert seen == [0, 1]
    assert isinstance(error, ValueError) and "item 2" in str(error)


def test_await_in_an_async_actor_catches_ray_task_error(rt):
    relay = AsyncRelay.remote()
    assert ray.get(relay.await_failed.remote(), timeout=T) == ("caught", True, True)


@ray.remote
class Mortal:
    def ping(self):
        return "pong"


@ray.remote
class Started:
    def __init__(self):
        self.started = False

    def set(self):
        self.started = True

    def is_set(self):
        return self.started


@ray.remote
def blocks_until_cancelled(started):
    import time
    ray.get(started.set.remote())
    # The body that is cancelled, not a wait of the test's; in short sleeps,
    # as Ray's cancel interrupts Python code but not one long time.sleep.
    for _ in range(60000):
        time.sleep(0.01)


def _dead_actor():
    actor = Mortal.remote()
    assert ray.get(actor.ping.remote(), timeout=T) == "pong"
    ray.kill(actor)
    # Ray's kill lands a moment later: a call sent right after it can still
    # run.  Calls until one fails, so the actor is dead on both backends.
    deadline = time.monotonic() + T
    while time.monotonic() < deadline:
        try:
            ray.get(actor.ping.remote(), timeout=T)
        except ray.exceptions.RayActorError:
            return actor
    raise AssertionError(f"the killed actor still answered after {T} s")


def test_await_of_a_call_on_a_dead_actor_is_an_actor_died_error(rt):
    from ray_lite.exceptions import ActorDiedError, RayActorError
    actor = _dead_actor()

    async def main():
        with pytest.raises(ActorDiedError) as info:
            await asyncio.wait_for(asyncio.ensure_future(actor.ping.remote()), T)
        return info.value
    assert isinstance(asyncio.run(main()), RayActorError)


def test_await_of_a_cancelled_task_is_a_task_cancelled_error(rt):
    from ray_lite.exceptions import TaskCancelledError
    # Cancelled once it runs: Ray can lose a cancel that arrives while the
    # task is being handed to a worker (ray-project/ray#46157), which is not
    # what this test is about.
    started = Started.remote()
    ref = blocks_until_cancelled.remote(started)
    deadline = time.monotonic() + T
    while not ray.get(started.is_set.remote(), timeout=T):
        assert time.monotonic() < deadline, "the task never started"
    ray.cancel(ref)

    async def main():
        with pytest.raises(TaskCancelledError):
            await asyncio.wait_for(asyncio.ensure_future(ref), T)
    asyncio.run(main())
    with pytest.raises(TaskCancelledError):
        ray.get(ref, timeout=T)


@ray.remote
class DeadCaller:
    async def await_dead(self, actor):
        from ray_lite.exceptions import RayActorError
        try:
            await actor.ping.remote()
        except RayActorError:
            return "caught"
        except Exception as exc:        # noqa: BLE001 - reported to the driver by name
            return "missed", type(exc).__module__, type(exc).__name__
        return "answered"


def test_await_in_an_async_actor_of_a_call_on_a_dead_actor(rt):
    caller = DeadCaller.remote()
    assert ray.get(caller.await_dead.remote(_dead_actor()), timeout=T) == "caught"
