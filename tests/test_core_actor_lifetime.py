"""An actor's lifetime, as in Ray: it ends when its creator's handle goes
(after the calls sent before), or on ``handle.__ray_terminate__.remote()``."""
import asyncio
import gc
import os

import pytest

import ray_lite as ray
from ray_lite.exceptions import RayActorError

from procs import wait_dead

# Public API only: these run on Ray too (--backend=ray; see conftest.py).
pytestmark = pytest.mark.both_backends

T = 60


@ray.remote
class Member:
    def pid(self):
        return os.getpid()

    def echo(self, x):
        return x


@ray.remote
class AsyncMember:
    async def pid(self):
        return os.getpid()


@ray.remote
class Keeper:
    """Holds a copy of a handle (passed to it) and calls through it."""

    def __init__(self, handle):
        self.handle = handle

    def call(self):
        return ray.get(self.handle.echo.remote("through a copy"))


@pytest.mark.parametrize("make", [lambda: Member.remote(), lambda: AsyncMember.remote(),
                                  lambda: Member.options(max_concurrency=2).remote()],
                         ids=["sync", "async", "threaded"])
def test_an_actor_ends_when_its_handle_goes(rt, make):
    a = make()
    pid = ray.get(a.pid.remote(), timeout=T)
    del a
    gc.collect()
    assert wait_dead(pid, T), "the actor outlived its only handle"


def test_calls_sent_before_the_handle_went_still_run(rt):
    a = Member.remote()
    pid = ray.get(a.pid.remote(), timeout=T)
    refs = [a.echo.remote(i) for i in range(20)]
    del a
    assert ray.get(refs, timeout=T) == list(range(20))
    assert wait_dead(pid, T)


def test_its_cpu_is_free_again(rt):
    # Each asks for every CPU: the next can only start once the last ended.
    for _ in range(3):
        a = Member.options(num_cpus=2).remote()
        assert ray.get(a.echo.remote("ran"), timeout=T) == "ran"
        del a


def test_a_named_actor_ends_too(rt):
    a = Member.options(name="lifetime-named").remote()
    pid = ray.get(a.pid.remote(), timeout=T)
    del a
    assert wait_dead(pid, T)


def test_a_handle_passed_on_keeps_the_actor(rt):
    a = Member.remote()
    keeper = Keeper.remote(a)
    del a
    gc.collect()
    # The end would have been asked for before this call reaches it.
    assert ray.get(keeper.call.remote(), timeout=T) == "through a copy"


def test_ray_terminate(rt):
    a = Member.remote()
    pid = ray.get(a.pid.remote(), timeout=T)
    before = a.echo.remote("before")
    end = a.__ray_terminate__.remote()
    assert ray.get(before, timeout=T) == "before"
    with pytest.raises(RayActorError):
        ray.get(end, timeout=T)
    assert wait_dead(pid, T)
    with pytest.raises(RayActorError):
        ray.get(a.echo.remote("after"), timeout=T)


@ray.remote
class FailsToStart:
    def __init__(self):
        raise ValueError("no start")

    def echo(self, x):
        return x


def test_ray_ready(rt):
    # Ray's (and its libraries') way to wait for an actor to start.
    for cls in (Member, AsyncMember, Member.options(max_concurrency=3)):
        assert ray.get(cls.remote().__ray_ready__.remote(), timeout=T) is True
    with pytest.raises(RayActorError, match="no start"):
        ray.get(FailsToStart.remote().__ray_ready__.remote(), timeout=T)


@ray.remote
class Box:
    """Holds one value; ``first`` waits for it (the caller's get bounds the wait)."""

    def __init__(self):
        self.value = None
        self.event = asyncio.Event()

    async def put(self, value):
        self.value = value
        self.event.set()

    async def first(self):
        await self.event.wait()
        return self.value


@ray.remote
class Reports:
    def __init__(self, box):
        box.put.remote(os.getpid())

    def ping(self):
        return "pong"


@ray.remote
def make_and_drop(box, call):
    # An actor this task creates: its handle goes when the task returns.
    r = Reports.remote(box)
    if call:
        assert ray.get(r.ping.remote()) == "pong"
    return ray.get(box.first.remote())


@pytest.mark.parametrize("call", [True, False], ids=["called", "never_called"])
def test_an_actor_a_task_made_ends_with_the_task(rt, call):
    box = Box.remote()
    pid = ray.get(make_and_drop.remote(box, call), timeout=T)
    assert wait_dead(pid, T), "the actor outlived the task that made it"


@ray.remote
class Owner:
    def make_child(self):
        self.child = Member.remote()       # kept: only its owner's end ends it
        return self.child, ray.get(self.child.pid.remote())


def test_an_actor_ends_with_the_process_that_created_it(rt):
    # As Ray: an actor's owner is the process that created it.
    owner = Owner.remote()
    child, child_pid = ray.get(owner.make_child.remote(), timeout=T)
    assert ray.get(child.echo.remote("alive"), timeout=T) == "alive"
    ray.kill(owner)
    assert wait_dead(child_pid, T), "the actor outlived its owner"
    with pytest.raises(RayActorError):
        ray.get(child.echo.remote("after"), timeout=T)
