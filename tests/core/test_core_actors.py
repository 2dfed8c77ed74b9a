"""Core runtime: actors (sync, async, threaded), names, kill, handles."""
import asyncio
import os
import threading
import time

import pytest

import ray_lite as ray
from ray_lite.exceptions import ActorDiedError, RayActorError

# Public API only: these run on Ray too (--backend=ray; see conftest.py).
pytestmark = pytest.mark.both_backends

T = 60


@ray.remote
class Counter:
    def __init__(self, start=0):
        self.n = start

    def incr(self, by=1):
        self.n += by
        return self.n

    def get(self):
        return self.n

    def pid(self):
        return os.getpid()

    def fail(self):
        raise KeyError("nope")


def test_calls_run_in_submission_order(rt):
    c = Counter.remote(10)
    refs = [c.incr.remote() for _ in range(200)]
    assert ray.get(refs, timeout=T) == list(range(11, 211))
    assert ray.get(c.get.remote(), timeout=T) == 210


def test_each_actor_is_its_own_process(rt):
    a, b = Counter.remote(), Counter.remote()
    pa, pb = ray.get([a.pid.remote(), b.pid.remote()], timeout=T)
    assert pa != pb and os.getpid() not in (pa, pb)


def test_actor_errors_and_bad_method(rt):
    c = Counter.remote()
    with pytest.raises(KeyError):
        ray.get(c.fail.remote(), timeout=T)
    assert ray.get(c.incr.remote(), timeout=T) == 1   # it lives on
    with pytest.raises(AttributeError, match="no_such"):
        c.no_such.remote()
    with pytest.raises(TypeError, match=r"Counter.remote\(\)"):
        Counter()


def test_constructor_error_fails_every_call(rt):
    @ray.remote
    class Broken:
        def __init__(self):
            raise RuntimeError("cannot start")

        def f(self):
            return 1
    b = Broken.remote()
    with pytest.raises(ActorDiedError, match="cannot start"):
        ray.get(b.f.remote(), timeout=T)


@pytest.mark.local_only
def test_named_actors_and_get_actor(rt):
    c = Counter.options(name="counter").remote(5)
    same = ray.get_actor("counter")
    assert ray.get(same.incr.remote(), timeout=T) == 6
    with pytest.raises(ray.exceptions.ActorAlreadyExistsError, match="already exists") as err:
        Counter.options(name="counter").remote()
    assert isinstance(err.value, ValueError)    # as Ray's
    again = Counter.options(name="counter", get_if_exists=True).remote()
    assert ray.get(again.get.remote(), timeout=T) == 6
    with pytest.raises(ValueError, match="missing"):
        ray.get_actor("missing")
    ray.kill(c)
    with pytest.raises(ActorDiedError):
        ray.get(c.get.remote(), timeout=T)
    # The name is free once the death was noticed (the get above noticed it).
    with pytest.raises(ValueError):
        ray.get_actor("counter")


@ray.remote
class Looker:
    """Holds a handle to the actor named ``name``; once its calls fail, looks
    the name up again at once: what a caller refreshing a stale handle does."""

    def hold(self, name):
        self.name, self.h = name, ray.get_actor(name)
        return ray.get(self.h.incr.remote(), timeout=T)

    def call_then_look_up(self):
        while True:
            try:
                ray.get(self.h.incr.remote(), timeout=T)
            except RayActorError:
                break
        try:
            ray.get(ray.get_actor(self.name).get.remote(), timeout=T)
        except ValueError as exc:
            return "no such actor: " + str(exc)[:40]
        except RayActorError:
            return "a dead actor's handle"
        return "alive"


def _running(pid):
    """Whether ``pid`` still runs (not a zombie); its /proc entry may go
    between any two looks, once it is reaped: the open fails (ENOENT), or
    the read of a file opened just before (ESRCH)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.local_only
def test_a_name_never_leads_to_an_actor_that_just_died(rt):
    # The caller sees the death (its call fails) before the driver's loop
    # may have handled it: the lookup must not return the dead actor.
    c = Counter.options(name="victim").remote()
    victim = ray.get(c.pid.remote(), timeout=T)
    looker = Looker.remote()
    assert ray.get(looker.hold.remote("victim"), timeout=T) == 1
    os.kill(victim, 9)
    deadline = time.monotonic() + T
    while _running(victim):
        assert time.monotonic() < deadline, "the killed actor did not end"
        time.sleep(0.001)
    assert ray.get(looker.call_then_look_up.remote(), timeout=T).startswith("no such actor")


@ray.remote(max_calls=1)
def make_counters():
    """Creates a detached and an owned actor, then its worker exits (max_calls)."""
    Counter.options(name="kept", lifetime="detached").remote(10)
    owned = Counter.options(name="owned").remote(20)
    return ray.get(owned.pid.remote(), timeout=T)


@pytest.mark.local_only
def test_a_detached_actor_outlives_its_creator_and_its_handles(rt):
    owned_pid = ray.get(make_counters.remote(), timeout=T)
    deadline = time.monotonic() + T
    while _running(owned_pid):
        assert time.monotonic() < deadline, "the owned actor did not end with its creator"
        time.sleep(0.001)
    # The owned one ended with the worker that made it; the detached one lives on.
    assert ray.get(ray.get_actor("kept").incr.remote(), timeout=T) == 11
    # No handle keeps it either: dropped, it still answers by name.
    h = Counter.options(name="solo", lifetime="detached").remote(1)
    del h
    import gc
    gc.collect()
    assert ray.get(ray.get_actor("solo").incr.remote(), timeout=T) == 2
    ray.kill(ray.get_actor("solo"))


def test_kill_fails_pending_and_later_calls(rt):
    @ray.remote
    class Sleeper:
        def sleep(self):
            import time
            time.sleep(300)
    s = Sleeper.remote()
    pending = s.sleep.remote()
    ray.kill(s)
    with pytest.raises(RayActorError):
        ray.get(pending, timeout=T)
    with pytest.raises(ActorDiedError):
        ray.get(s.sleep.remote(), timeout=T)
    with pytest.raises(ValueError):
        ray.kill(Counter)


def test_handles_travel_to_tasks_and_actors(rt):
    c = Counter.remote()

    @ray.remote
    def bump(handle, n):
        return ray.get([handle.incr.remote() for _ in range(n)])[-1]
    assert ray.get(bump.remote(c, 3), timeout=T) == 3

    @ray.remote
    class Caller:
        def __init__(self, target):
            self.target = target

        def call(self):
            return ray.get(self.target.incr.remote(10))
    caller = Caller.remote(c)
    assert ray.get(caller.call.remote(), timeout=T) == 13
    assert ray.get(c.get.remote(), timeout=T) == 13


def test_async_actor_runs_calls_concurrently(rt):
    @ray.remote
    class Rendezvous:
        def __init__(self):
            self.event = asyncio.Event()

        async def wait_for_set(self):
            await self.event.wait()
            return "released"

        async def set(self):
            self.event.set()
            return "set"
    r = Rendezvous.remote()
    first = r.wait_for_set.remote()     # would block a sequential actor for ever
    assert ray.get(r.set.remote(), timeout=T) == "set"
    assert ray.get(first, timeout=T) == "released"


def test_threaded_actor_max_concurrency(rt):
    @ray.remote(max_concurrency=4)
    class Gate:
        def __init__(self):
            self.event = threading.Event()

        def wait_for_set(self):
            return self.event.wait(T)

        def set(self):
            self.event.set()
            return True
    g = Gate.remote()
    waiting = [g.wait_for_set.remote() for _ in range(2)]
    assert ray.get(g.set.remote(), timeout=T)
    assert ray.get(waiting, timeout=T) == [True, True]


def test_async_actor_awaits_refs_and_other_actors(rt):
    c = Counter.remote()

    @ray.remote
    class Agg:
        def __init__(self, counter):
            self.counter = counter

        async def total(self, n):
            vals = await asyncio.gather(*[self.counter.incr.remote() for _ in range(n)])
            return sum(vals)
    a = Agg.remote(c)
    assert ray.get(a.total.remote(4), timeout=T) == 1 + 2 + 3 + 4


def test_await_ref_in_driver(rt):
    async def main():
        c = Counter.remote()
        return await c.incr.remote(5)
    assert asyncio.run(asyncio.wait_for(main(), T)) == 5


@pytest.mark.local_only
def test_actor_options(rt):
    with pytest.raises(ValueError, match="must be one of 'detached', 'non_detached'"):
        Counter.options(lifetime="non-detached")      # Ray's check of the spelling
    with pytest.raises(ValueError, match="max_restarts"):
        Counter.options(max_restarts=-2)
    c = Counter.options(num_cpus=1, max_concurrency=1, namespace="x").remote()
    assert ray.get(c.incr.remote(), timeout=T) == 1


@pytest.mark.local_only
def test_actor_calls_another_actor_over_its_own_link(rt):
    """No hop through the driver: the caller opens a link to the callee itself."""
    @ray.remote
    class Target:
        def pid(self):
            return os.getpid()

    @ray.remote
    class Caller:
        def call_and_look(self, target):
            from ray_lite._private.process import state
            target_pid = ray.get(target.pid.remote())
            node = state.node
            peer = target._info.actor_id
            return target_pid, peer in node.links, node.peer_pids.get(peer)

    t = Target.remote()
    target_pid, linked, link_pid = ray.get(Caller.remote().call_and_look.remote(t), timeout=T)
    assert linked
    assert link_pid == target_pid


@ray.remote
class TreeNode:
    """Creates actors of its own class: the class ships inside its own pickle."""

    def __init__(self, depth):
        self.children = [TreeNode.remote(depth - 1) for _ in range(2)] if depth else []

    def size(self):
        return 1 + sum(ray.get([c.size.remote() for c in self.children]))


def test_actor_creates_actors_of_its_own_class(rt):
    assert ray.get(TreeNode.remote(2).size.remote(), timeout=T) == 7


@ray.remote
def fib(n):
    return n if n < 2 else sum(ray.get([fib.remote(n - 1), fib.remote(n - 2)]))


def test_task_calls_its_own_function(rt):
    assert ray.get(fib.remote(6), timeout=T) == 8


@ray.remote
class CallsItself:
    def __init__(self):
        self.seen = []

    def later(self, n, size):
        # Calls on its own handle: queued behind this one, run after it.
        me = ray.get_runtime_context().current_actor
        return [me.echo.remote("x" * size) for _ in range(n)]

    def echo(self, s):
        self.seen.append(len(s))
        return len(s)

    def seen_count(self):
        return len(self.seen)


@ray.remote
class AsyncCallsItself:
    async def outer(self, x):
        me = ray.get_runtime_context().current_actor
        return await me.inner.remote(x) + 1

    async def inner(self, x):
        return x * 2


@ray.remote(max_concurrency=2)
class ThreadedCallsItself:
    def outer(self, x):
        me = ray.get_runtime_context().current_actor
        return ray.get(me.inner.remote(x), timeout=T) + 1

    def inner(self, x):
        return x * 2


def test_an_actor_calls_its_own_methods(rt):
    # As Ray: the calls an actor makes on its own handle run after the
    # current call (a sync actor), or beside it (async, threaded).  They
    # used to be lost: the answer's ref never became ready.
    a = CallsItself.remote()
    refs = ray.get(a.later.remote(3, 10), timeout=T)
    assert ray.get(refs, timeout=T) == [10, 10, 10]
    # More than its link's ring holds at once (1 MiB): it drains as it sends.
    refs = ray.get(a.later.remote(6000, 400), timeout=T)
    assert ray.get(refs, timeout=T) == [400] * 6000
    assert ray.get(a.seen_count.remote(), timeout=T) == 6003
    assert ray.get(AsyncCallsItself.remote().outer.remote(5), timeout=T) == 11
    assert ray.get(ThreadedCallsItself.remote().outer.remote(5), timeout=T) == 11


class _Flags:
    def __init__(self):
        self.flag = True                    # an attribute named like a method
        self.run = lambda: "the instance's"  # a callable one, too

    def flag(self):
        return "the class's flag"

    def run(self):
        return "the class's run"

    def attr(self):
        return self.flag, self.run()


class _AsyncFlags(_Flags):
    async def run(self):
        return "the class's async run"


@pytest.mark.parametrize("make", [
    lambda: ray.remote(_Flags).remote(),
    lambda: ray.remote(_Flags).options(max_concurrency=4).remote(),
    lambda: ray.remote(_AsyncFlags).remote(),
], ids=["sync", "threaded", "async"])
def test_an_instance_attribute_does_not_hide_a_method(rt, make):
    # As in Ray: a call runs the class's method; the attribute is the
    # instance's own business.
    a = make()
    run = "the class's async run" if "Async" in repr(a) else "the class's run"
    assert ray.get([a.flag.remote(), a.run.remote(), a.attr.remote()], timeout=T) == [
        "the class's flag", run, (True, "the instance's")]


@ray.remote
class _Opener:
    """A gate that tasks wait at until the test opens it (bounded by T)."""

    def __init__(self):
        self.event = asyncio.Event()

    async def wait(self):
        await asyncio.wait_for(self.event.wait(), T)
        return "opened"

    async def open(self):
        self.event.set()


@ray.remote
def _behind_the_gate(gate):
    return ray.get(gate.wait.remote())


@ray.remote
class _Log:
    def __init__(self):
        self.log = []

    def record(self, what, value=None):
        self.log.append(what)
        return [what, value]

    def read(self):
        return self.log


@ray.remote
def _another_caller(log):
    return ray.get(log.record.remote("other caller"))


def test_a_call_waiting_for_its_argument_holds_back_only_its_callers_calls(rt):
    # As in Ray: a sync actor's call whose ref argument is not ready waits
    # aside with its caller's later calls; another caller's calls run.
    gate, log = _Opener.remote(), _Log.remote()
    slow = _behind_the_gate.remote(gate)
    held = log.record.remote("held", slow)
    after = log.record.remote("after")
    # It would time out (the test fails) if the held call blocked the actor.
    assert ray.get(_another_caller.remote(log), timeout=T) == ["other caller", None]
    ray.get(gate.open.remote(), timeout=T)
    assert ray.get([held, after], timeout=T) == [["held", "opened"], ["after", None]]
    assert ray.get(log.read.remote(), timeout=T) == ["other caller", "held", "after"]


def test_cancelling_a_call_that_waits_for_its_argument(rt):
    from ray_lite.exceptions import TaskCancelledError
    gate, log = _Opener.remote(), _Log.remote()
    held = log.record.remote("held", _behind_the_gate.remote(gate))
    after = log.record.remote("after")
    ray.cancel(held)
    with pytest.raises(TaskCancelledError):
        ray.get(held, timeout=T)
    # Its caller's next call no longer waits behind it.
    assert ray.get(after, timeout=T) == ["after", None]
    ray.get(gate.open.remote(), timeout=T)
    assert ray.get(log.read.remote(), timeout=T) == ["after"]


class _Base:
    BASE = 2


@ray.remote
class _WithClassAttributes(_Base):
    X = 3

    @staticmethod
    def four():
        return 4

    def read(self):
        # The decorated name, used inside the actor: the class's attributes.
        return _WithClassAttributes.X, _WithClassAttributes.BASE, _WithClassAttributes.four()


def test_an_actor_class_reads_through_to_the_class(rt):
    assert (_WithClassAttributes.X, _WithClassAttributes.BASE,
            _WithClassAttributes.four()) == (3, 2, 4)
    a = _WithClassAttributes.remote()
    assert ray.get(a.read.remote(), timeout=T) == (3, 2, 4)
    assert {"X", "four", "read", "remote", "options"} <= set(dir(_WithClassAttributes))
    assert {"read", "four"} <= set(dir(a))
    with pytest.raises(AttributeError):
        _WithClassAttributes.missing      # noqa: B018


def test_an_actor_class_cannot_be_subclassed(rt):
    with pytest.raises(TypeError, match="Inheriting from actor classes is not currently "
                                        "supported"):
        class Sub(_WithClassAttributes):   # noqa: F841
            pass


def test_constructor_arguments_go_by_cloudpickle(rt):
    # As Ray: an instance of a class defined in a function, or a lambda.
    class Local:
        def __init__(self, x):
            self.x = x

    @ray.remote
    class Holds:
        def __init__(self, value):
            self.value = value

        def read(self):
            return self.value.x if hasattr(self.value, "x") else self.value()

    assert ray.get([Holds.remote(Local(2)).read.remote(), Holds.remote(lambda: 7).read.remote()],
                   timeout=T) == [2, 7]
