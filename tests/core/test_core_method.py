"""ray_lite.method, static num_returns on tasks and actor methods, exit_actor."""
import os

import pytest

import ray_lite as ray
from ray_lite.exceptions import ActorDiedError, RayActorError, RayTaskError

from procs import wait_dead

# Public API only: these run on Ray too (--backend=ray; see conftest.py).
pytestmark = pytest.mark.both_backends

T = 60


@ray.remote(num_returns=2)
def pair(x):
    return x, x + 1


@ray.remote
def returns(values):
    return values


@ray.remote(concurrency_groups={"io": 1})
class Methods:
    @ray.method(num_returns=2)
    def two(self):
        return "a", "b"

    @ray.method(num_returns=3)
    def wrong(self):
        return 1, 2

    @ray.method(num_returns=0)
    def nothing(self):
        return None

    @ray.method(concurrency_group="io")
    def grouped(self):
        return "grouped"

    def one(self):
        return (1, 2)


@ray.remote
class AsyncMethods:
    @ray.method(num_returns=2)
    async def two(self):
        return "x", "y"

    @ray.method(num_returns=2)
    async def wrong(self):
        return 1


def test_static_num_returns_on_tasks(rt):
    a, b = pair.remote(1)
    assert ray.get([a, b], timeout=T) == [1, 2]
    x, y, z = returns.options(num_returns=3).remote([7, 8, 9])
    assert ray.get([x, y, z], timeout=T) == [7, 8, 9]
    assert returns.options(num_returns=0).remote(None) is None


@pytest.mark.local_only
def test_a_wrong_number_of_values_fails_every_ref_with_rays_error(rt):
    refs = returns.options(num_returns=2).remote([1, 2, 3])
    assert len(refs) == 2
    for r in refs:
        with pytest.raises(ValueError, match=r"Task returned 3 objects, but num_returns=2\.") as e:
            ray.get(r, timeout=T)
        assert isinstance(e.value, RayTaskError)
    # One object that is not a sequence counts as one, as in Ray.
    for r in returns.options(num_returns=2).remote(5):
        with pytest.raises(ValueError, match=r"Task returned 1 objects, but num_returns=2\."):
            ray.get(r, timeout=T)


def test_method_decorator_num_returns(rt):
    m = Methods.remote()
    a, b = m.two.remote()
    assert ray.get([a, b], timeout=T) == ["a", "b"]
    assert m.nothing.remote() is None
    assert ray.get(m.one.remote(), timeout=T) == (1, 2)     # undecorated: one ref
    for r in m.wrong.remote():
        with pytest.raises(ValueError, match=r"Task returned 2 objects, but num_returns=3\."):
            ray.get(r, timeout=T)
    # .options() overrides what the decorator declared.
    x, y = m.one.options(num_returns=2).remote()
    assert ray.get([x, y], timeout=T) == [1, 2]
    assert ray.get(m.two.options(num_returns=1).remote(), timeout=T) == ("a", "b")


@pytest.mark.local_only
def test_method_decorator_on_an_async_actor(rt):
    m = AsyncMethods.remote()
    a, b = m.two.remote()
    assert ray.get([a, b], timeout=T) == ["x", "y"]
    for r in m.wrong.remote():
        with pytest.raises(ValueError, match=r"Task returned 1 objects, but num_returns=2\."):
            ray.get(r, timeout=T)


@pytest.mark.local_only
def test_concurrency_group_is_recorded_and_accepted(rt):
    assert Methods._cls.grouped.__ray_concurrency_group__ == "io"
    m = Methods.remote()
    assert ray.get(m.grouped.remote(), timeout=T) == "grouped"
    assert m.grouped._options["concurrency_group"] == "io"
    assert ray.get(m.one.options(concurrency_group="io").remote(), timeout=T) == (1, 2)


def test_method_decorator_refuses_bad_use():
    with pytest.raises(AssertionError, match="at least one of"):
        ray.method()
    with pytest.raises(AssertionError, match="at least one of"):
        ray.method(lambda self: None)
    with pytest.raises(AssertionError, match="Unexpected keyword argument"):
        ray.method(num_cpus=1)
    assert ray.actor.method is ray.method


@pytest.mark.local_only
def test_a_bad_declared_value_is_refused_when_the_actor_is_created(rt):
    @ray.remote
    class Bad:
        @ray.method(num_returns=-1)
        def f(self):
            return 1
    with pytest.raises(ValueError, match="num_returns"):
        Bad.remote()


# ------------------------------------------------------------------ exit_actor
@ray.remote
class Gate:
    """Lets a test wait, without sleeping, until calls have started."""

    def __init__(self):
        import asyncio
        self.count = 0
        self.changed = asyncio.Event()
        self.opened = asyncio.Event()

    async def arrive(self):
        self.count += 1
        self.changed.set()
        await self.opened.wait()

    async def until(self, n):
        while self.count < n:
            self.changed.clear()
            await self.changed.wait()
        return self.count

    async def open(self):
        self.opened.set()


def _exiting_class(kind, marker):
    def on_exit():
        with open(marker, "w") as f:
            f.write("ran")

    class Exiting:
        def __init__(self):
            import atexit
            atexit.register(on_exit)

        def work(self, gate, value):
            ray.get(gate.arrive.remote())
            return value

        def quit(self):
            ray.actor.exit_actor()

        def ping(self):
            return "pong"

    class AsyncExiting:
        def __init__(self):
            import atexit
            atexit.register(on_exit)

        async def work(self, gate, value):
            await gate.arrive.remote()
            return value

        async def quit(self):
            ray.actor.exit_actor()

        async def ping(self):
            return "pong"
    if kind == "async":
        return ray.remote(AsyncExiting)
    return ray.remote(max_concurrency=4 if kind == "threaded" else 1)(Exiting)


@pytest.mark.parametrize("kind", ["sync", "threaded", "async"])
@pytest.mark.local_only
def test_exit_actor_ends_the_actor_gracefully(rt, kind, tmp_path):
    marker = tmp_path / "atexit"
    a = _exiting_class(kind, str(marker)).options(name=f"exiting-{kind}").remote()
    assert ray.get(a.ping.remote(), timeout=T) == "pong"
    gate = Gate.remote()
    running = []
    if kind != "sync":
        # Calls already running when the actor exits finish and deliver.
        running = [a.work.remote(gate, i) for i in range(2)]
        assert ray.get(gate.until.remote(2), timeout=T) == 2
    quit_ref = a.quit.remote()
    if kind == "sync":
        later = a.ping.remote()      # queued behind quit: refused
    ray.get(gate.open.remote(), timeout=T)
    assert ray.get(running, timeout=T) == list(range(len(running)))
    with pytest.raises(ActorDiedError, match=r"exit_actor\(\) is called") as e:
        ray.get(quit_ref, timeout=T)
    assert isinstance(e.value, RayActorError)
    assert "class_name: Exiting" in str(e.value) or "class_name: AsyncExiting" in str(e.value)
    if kind == "sync":
        with pytest.raises(RayActorError):
            ray.get(later, timeout=T)
    with pytest.raises(RayActorError):
        ray.get(a.ping.remote(), timeout=T)     # refused, or the process is gone
    assert wait_dead(a._info.pid, T)
    assert marker.read_text() == "ran"          # its atexit handlers ran
    assert rt.wait_until(lambda: a._info.actor_id in rt.dead_peers, T)
    with pytest.raises(ValueError):
        ray.get_actor(f"exiting-{kind}")


def test_exit_actor_outside_an_actor_raises_type_error(rt):
    with pytest.raises(TypeError, match="non-actor worker"):
        ray.actor.exit_actor()

    @ray.remote
    def in_a_task():
        try:
            ray.actor.exit_actor()
        except TypeError as exc:
            return str(exc)
    assert "non-actor worker, 1" in ray.get(in_a_task.remote(), timeout=T)
    assert os.getpid()      # the driver is still here


def test_static_num_returns_on_a_generator_and_exit_from_a_generator_method(rt):
    @ray.remote(num_returns=2)
    def gen():
        yield "first"
        yield "second"
    a, b = gen.remote()
    assert ray.get([a, b], timeout=T) == ["first", "second"]

    @ray.remote
    class Streams:
        def items(self):
            yield 1
            ray.actor.exit_actor()

        def ping(self):
            return "pong"
    s = Streams.remote()
    g = s.items.remote()
    assert ray.get(next(g), timeout=T) == 1
    with pytest.raises(ActorDiedError, match=r"exit_actor\(\) is called"):
        ray.get(next(g), timeout=T)
    with pytest.raises(RayActorError):
        ray.get(s.ping.remote(), timeout=T)


@ray.remote(max_retries=0)
def yields(n, fail):
    for i in range(n):
        yield i
    if fail:
        raise ValueError("stopped")


@ray.remote
class Yields:
    def yields(self, n, fail):
        for i in range(n):
            yield i
        if fail:
            raise ValueError("stopped")


def test_a_generator_with_a_fixed_num_returns_fills_the_refs_it_yields(rt):
    # As Ray: each yield fills the next ref; the refs a generator did not
    # fill (it raised, or stopped early) get that error; extra yields are
    # not taken.
    for call in (yields.options(num_returns=3).remote,
                 Yields.remote().yields.options(num_returns=3).remote):
        first, second, third = call(1, True)
        assert ray.get(first, timeout=T) == 0
        for ref in (second, third):
            with pytest.raises(ValueError, match="stopped"):
                ray.get(ref, timeout=T)
        first, second, _ = call(1, False)
        assert ray.get(first, timeout=T) == 0
        with pytest.raises(ValueError, match="returned 1 objects, but num_returns=3"):
            ray.get(second, timeout=T)
        assert ray.get(call(5, False), timeout=T) == [0, 1, 2]
        with pytest.raises(ValueError, match="stopped"):
            ray.get(call(0, True)[0], timeout=T)
