"""What a cancelled task or call raises (running or queued), and what calls
to an actor killed with ``ray.kill`` say, from the driver or from a task."""
import asyncio

import pytest

import ray_lite as ray
from ray_lite.exceptions import ActorDiedError, RayActorError, RayTaskError, TaskCancelledError

T = 60


@ray.remote
def produce(n):
    yield from range(n)

@ray.remote
class Gate:
    def __init__(self):
        self.event = asyncio.Event()

    async def arrive(self):
        self.event.set()

    async def arrived(self):
        await self.event.wait()


@ray.remote(max_retries=0)
def spin(gate):
    """Says it runs, then computes for ever (never calls into ray_lite again)."""
    ray.get(gate.arrive.remote())
    while True:
        pass


def test_a_cancelled_running_task_raises_a_ray_task_error(rt):
    gate = Gate.remote()
    ref = spin.remote(gate)
    ray.get(gate.arrived.remote(), timeout=T)       # the task runs
    ray.cancel(ref)
    with pytest.raises(RayTaskError) as e:
        ray.get(ref, timeout=T)
    assert isinstance(e.value, TaskCancelledError)
    assert "was cancelled" in str(e.value)
    # Caught either way, as in Ray.
    try:
        ray.get(ref, timeout=T)
    except TaskCancelledError:
        pass


def test_a_cancelled_running_async_actor_call_raises_a_ray_task_error(rt):
    @ray.remote
    class Waiter:
        async def wait(self, gate):
            await gate.arrive.remote()
            await asyncio.Event().wait()
    gate = Gate.remote()
    w = Waiter.remote()
    ref = w.wait.remote(gate)
    ray.get(gate.arrived.remote(), timeout=T)
    ray.cancel(ref)
    with pytest.raises(RayTaskError) as e:
        ray.get(ref, timeout=T)
    assert isinstance(e.value, TaskCancelledError)


def test_an_async_actor_call_cancelled_before_it_starts_raises_and_is_forgotten(rt, tmp_path):
    # The call's message and its cancel are read together while the actor's
    # loop is busy: the call's Task is cancelled before its first step, so
    # its coroutine never runs; the caller still gets its answer.
    import os
    import select

    @ray.remote
    class Held:
        def hold(self, started, release):
            # Says it runs, then blocks the actor's loop (a plain def runs
            # on it) until the test writes to ``release``.
            out = os.open(started, os.O_RDWR)
            os.write(out, b"!")
            os.close(out)
            fd = os.open(release, os.O_RDONLY | os.O_NONBLOCK)
            try:
                readable, _, _ = select.select([fd], [], [], T)
                return bool(readable) and os.read(fd, 1)
            finally:
                os.close(fd)

        async def call(self):
            return "ran"

        async def running_calls(self):
            import gc
            from ray_lite._private.actors.async_actor import AsyncActor
            (actor,) = [o for o in gc.get_objects() if type(o) is AsyncActor]
            return sorted(oid for oid, task in actor.running.items() if task.done())

    started, release = str(tmp_path / "started"), str(tmp_path / "release")
    os.mkfifo(started)
    os.mkfifo(release)
    a = Held.remote()
    assert ray.get(a.call.remote(), timeout=T) == "ran"
    heard = os.open(started, os.O_RDONLY | os.O_NONBLOCK)
    writer = os.open(release, os.O_RDWR)      # (no wait for a reader)
    try:
        held = a.hold.remote(started, release)
        assert select.select([heard], [], [], T)[0], "hold() did not start"
        refs = [a.call.remote() for _ in range(3)]     # read once hold() returns
        for ref in refs:
            ray.cancel(ref)
        os.write(writer, b"x")
        assert ray.get(held, timeout=T) == b"x"
    finally:
        os.close(writer)
        os.close(heard)
    for ref in refs:
        with pytest.raises(TaskCancelledError):
            ray.get(ref, timeout=T)
    # Nothing of them stays in the actor.
    assert ray.get(a.running_calls.remote(), timeout=T) == []


def test_a_queued_task_cancelled_is_a_plain_task_cancelled_error(rt):
    gates = [Gate.remote() for _ in range(2)]
    blockers = [spin.remote(g) for g in gates]
    for g in gates:
        ray.get(g.arrived.remote(), timeout=T)
    # Both hold their CPU again (each lent it while it waited in get).
    assert rt.wait_until(lambda: rt.book.busy == rt.num_cpus, T)
    queued = produce.options(num_returns=1).remote(0)
    ray.cancel(queued)
    with pytest.raises(TaskCancelledError) as e:
        ray.get(queued, timeout=T)
    assert not isinstance(e.value, RayTaskError)
    for b in blockers:
        ray.cancel(b, force=True)


def test_an_actor_killed_by_ray_kill_says_so(rt):
    @ray.remote
    class Victim:
        async def wait(self):
            await asyncio.Event().wait()

        def ping(self):
            return "pong"
    v = Victim.options(name="victim").remote()
    pending = v.wait.remote()
    assert ray.get(v.ping.remote(), timeout=T) == "pong"
    ray.kill(v)
    for ref in (pending, v.ping.remote()):
        with pytest.raises(ActorDiedError) as e:
            ray.get(ref, timeout=T)
        text = str(e.value)
        assert "The actor is dead because it was killed by `ray.kill`." in text
        assert "class_name: Victim" in text and "name: victim" in text
    assert isinstance(e.value, RayActorError)
    # Once the driver has seen the process die, calls fail at once, saying the same.
    assert rt.wait_until(lambda: v._info.actor_id in rt.dead_peers, T)
    with pytest.raises(ActorDiedError, match="killed by `ray.kill`"):
        ray.get(v.ping.remote(), timeout=T)


def test_an_actor_killed_from_a_task_says_so_to_the_driver(rt):
    @ray.remote
    class Victim:
        def ping(self):
            return "pong"

    @ray.remote
    def killer(handle):
        ray.kill(handle)
        return "done"
    v = Victim.remote()
    assert ray.get(v.ping.remote(), timeout=T) == "pong"
    assert ray.get(killer.remote(v), timeout=T) == "done"
    with pytest.raises(ActorDiedError, match="killed by `ray.kill`"):
        ray.get(v.ping.remote(), timeout=T)


@ray.remote
class Waiter:
    async def wait(self, gate):
        await gate.arrive.remote()
        await asyncio.Event().wait()


@ray.remote
class Keeper:
    """Makes a call and hands out its ref (so that the caller is its owner)."""

    def start(self, waiter, gate):
        self.ref = waiter.wait.remote(gate)
        return [self.ref]


@ray.remote(max_retries=0)
def cancel_the_call(refs):
    ray.cancel(refs[0])
    with pytest.raises(TaskCancelledError):
        ray.get(refs[0], timeout=T)
    return "cancelled"


def test_a_borrowed_ref_of_an_actor_call_is_cancelled_through_its_owner(rt):
    """As in Ray: the cancel of a ref the canceller does not own goes to its
    owner, which cancels the call; from the driver and from a task."""
    gate, waiter, keeper = Gate.remote(), Waiter.remote(), Keeper.remote()
    (ref,) = ray.get(keeper.start.remote(waiter, gate), timeout=T)     # owned by keeper
    ray.get(gate.arrived.remote(), timeout=T)
    ray.cancel(ref)
    with pytest.raises(TaskCancelledError):
        ray.get(ref, timeout=T)
    gate = Gate.remote()
    ref = waiter.wait.remote(gate)              # owned by the driver, cancelled by a task
    ray.get(gate.arrived.remote(), timeout=T)
    assert ray.get(cancel_the_call.remote([ref]), timeout=T) == "cancelled"
    with pytest.raises(TaskCancelledError):
        ray.get(ref, timeout=T)
