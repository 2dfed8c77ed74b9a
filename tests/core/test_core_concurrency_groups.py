"""concurrency_groups on async and threaded actors, ray_lite.method (issue 11)."""
import asyncio
import threading

import pytest

import ray_lite as ray

T = 30
NOT_YET = 0.3


def _poll_until(pred):
    # Each group has a loop of its own: what calls of different groups share
    # is thread-safe, and an async wait for it polls (bounded).
    async def wait():
        while not pred():
            await asyncio.sleep(0.002)
    return asyncio.wait_for(wait(), T)


@ray.remote(concurrency_groups={"io": 2, "compute": 1}, max_concurrency=1)
class AsyncGroups:
    def __init__(self):
        self.lock = threading.Lock()
        self.running = {"io": 0, "default": 0}
        self.peak = {"io": 0, "default": 0}
        self.gate = threading.Event()
        self.released = threading.Event()

    async def _enter(self, group):
        with self.lock:
            self.running[group] += 1
            self.peak[group] = max(self.peak[group], self.running[group])
        try:
            await _poll_until(self.gate.is_set)
        finally:
            with self.lock:
                self.running[group] -= 1

    @ray.method(concurrency_group="io")
    async def io(self):
        await self._enter("io")
        return "io"

    async def blocked_default(self, counted_in="default"):
        await self._enter(counted_in)
        return "default"

    @ray.method(concurrency_group="compute")
    async def until_running(self, **least):
        await _poll_until(lambda: all(self.running[g] >= n for g, n in least.items()))
        with self.lock:
            return dict(self.running)

    @ray.method(concurrency_group="compute")
    async def open_gate(self):
        self.gate.set()

    @ray.method(concurrency_group="compute")
    async def peaks(self):
        return self.peak

    async def blocks_its_loop(self):
        # A blocking wait inside an async def: it stalls its own group's loop.
        assert self.released.wait(T)
        return threading.get_ident()

    @ray.method(concurrency_group="io")
    async def io_thread(self):
        return threading.get_ident()

    @ray.method(concurrency_group="compute")
    def release(self):
        self.released.set()
        return threading.get_ident()

    @ray.method(concurrency_group="io")
    async def quit(self):
        ray.actor.exit_actor()


def test_async_groups_limit_each_group_on_its_own(rt):
    a = AsyncGroups.remote()
    ios = [a.io.remote() for _ in range(4)]
    held = a.blocked_default.remote()
    # The default group (max_concurrency=1) is full, the io group is at its
    # limit of 2: the compute group still runs.
    assert ray.get(a.until_running.remote(io=2, default=1), timeout=T) == {"io": 2, "default": 1}
    assert ray.wait(ios, num_returns=1, timeout=NOT_YET)[0] == []
    # A default method sent to the io group waits there, not in the default
    # group (counted with the io group's calls: it would make 3 if it ran).
    extra = a.blocked_default.options(concurrency_group="io").remote("io")
    assert ray.get(a.until_running.remote(default=1), timeout=T)["io"] == 2
    ray.get(a.open_gate.remote(), timeout=T)
    assert ray.get(ios + [held, extra], timeout=T) == ["io"] * 4 + ["default"] * 2
    assert ray.get(a.peaks.remote(), timeout=T) == {"io": 2, "default": 1}


@pytest.mark.both_backends
def test_async_groups_each_run_on_a_thread_and_loop_of_their_own(rt):
    # As Ray: a call that blocks its group's loop stalls that group only.
    a = AsyncGroups.remote()
    blocked = a.blocks_its_loop.remote()
    io_thread = ray.get(a.io_thread.remote(), timeout=T)       # answered meanwhile
    assert ray.wait([blocked], timeout=NOT_YET)[0] == []
    compute_thread = ray.get(a.release.remote(), timeout=T)
    default_thread = ray.get(blocked, timeout=T)
    assert len({io_thread, compute_thread, default_thread}) == 3
    # exit_actor() from a group's call ends the actor, as from any call.
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(a.quit.remote(), timeout=T)
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(a.io_thread.remote(), timeout=T)


@ray.remote(concurrency_groups={"io": 2})
class ThreadedGroups:
    def __init__(self):
        self.cond = threading.Condition()
        self.running = {"io": 0, "default": 0}
        self.peak = {"io": 0, "default": 0}
        self.open = False

    def _enter(self, group):
        with self.cond:
            self.running[group] += 1
            self.peak[group] = max(self.peak[group], self.running[group])
            self.cond.notify_all()
            assert self.cond.wait_for(lambda: self.open, T)
            self.running[group] -= 1
        return threading.current_thread().name

    @ray.method(concurrency_group="io")
    def io(self):
        return self._enter("io")

    def blocked_default(self):
        return self._enter("default")

    @ray.method(concurrency_group="io")
    def until_running(self, group, n):
        with self.cond:
            assert self.cond.wait_for(lambda: self.running[group] >= n, T)
            return dict(self.running)

    def open_gate(self):
        with self.cond:
            self.open = True
            self.cond.notify_all()

    def peaks(self):
        return self.peak


def test_threaded_groups_have_their_own_threads_and_limits(rt):
    a = ThreadedGroups.remote()
    # The default group (max_concurrency=1 for a sync actor) is held...
    held = a.blocked_default.remote()
    # ...and the io group, limit 2, runs one call that waits for it, and one more.
    first = a.io.remote()
    assert ray.get(a.until_running.remote("default", 1), timeout=T)["default"] == 1
    # The gate opens from the io group (the default group is full).
    ray.get(a.open_gate.options(concurrency_group="io").remote(), timeout=T)
    names = ray.get([first, held], timeout=T)
    assert names[0].startswith("actor-io") and not names[1].startswith("actor-io")
    assert ray.get(a.peaks.remote(), timeout=T) == {"io": 1, "default": 1}


def test_bad_concurrency_groups_are_refused(rt):
    for groups in ({"io": 0}, {"io": "2"}, {"": 1}, ["io"]):
        with pytest.raises((ValueError, TypeError)):
            AsyncGroups.options(concurrency_groups=groups)

    @ray.remote(concurrency_groups={"other": 1})
    class WrongGroup:
        @ray.method(concurrency_group="io")
        def f(self):
            return 1
    with pytest.raises(ValueError, match="'io'"):
        WrongGroup.remote()
    a = AsyncGroups.remote()
    with pytest.raises(ValueError, match="concurrency group"):
        a.io.options(concurrency_group="nope")

    @ray.remote
    class NoGroups:
        def f(self):
            return 1
    with pytest.raises(ValueError, match="concurrency group"):
        NoGroups.remote().f.options(concurrency_group="io")
    with pytest.raises(ValueError, match="concurrency_groups"):
        ray.remote(concurrency_groups={"io": 1})(lambda: 1)


def test_method_decorator_takes_keywords_only():
    # Ray refuses these with an AssertionError naming the valid keywords.
    with pytest.raises(AssertionError):
        ray.method(lambda self: 1)
    with pytest.raises(AssertionError):
        ray.method()
    with pytest.raises(AssertionError, match="nonsense"):
        ray.method(nonsense=1)

    def f(self):
        return 1
    assert ray.method(concurrency_group="io")(f) is f
    assert f.__ray_concurrency_group__ == "io"
