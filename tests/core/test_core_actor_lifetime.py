"""An actor's lifetime, as in Ray: it ends when its creator's handle goes
(after the calls sent before), or on ``handle.__ray_terminate__.remote()``."""
import asyncio
import gc
import os
import select
import signal
import time

import pytest

import ray_lite as ray
from ray_lite.exceptions import RayActorError, WorkerCrashedError

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

    def pid(self):
        return os.getpid()


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


@ray.remote
def call_through(handle):
    return ray.get(handle.echo.remote("in a task"))


@ray.remote
def hand_back(handle):
    return [handle]


def test_an_actor_ends_when_the_last_copy_in_another_process_goes(rt):
    a = Member.remote()
    pid = ray.get(a.pid.remote(), timeout=T)
    keeper = Keeper.remote(a)
    del a
    gc.collect()
    # The end would have been asked for before this call reaches it.
    assert ray.get(keeper.call.remote(), timeout=T) == "through a copy"
    keeper_pid = ray.get(keeper.pid.remote(), timeout=T)
    del keeper
    gc.collect()
    assert wait_dead(keeper_pid, T)
    assert wait_dead(pid, T), "the actor outlived the last copy of its handle"


def test_an_actor_ends_when_the_process_holding_its_last_copy_is_killed(rt):
    a = Member.remote()
    pid = ray.get(a.pid.remote(), timeout=T)
    keeper = Keeper.remote(a)
    assert ray.get(keeper.call.remote(), timeout=T) == "through a copy"
    keeper_pid = ray.get(keeper.pid.remote(), timeout=T)
    del a
    gc.collect()
    os.kill(keeper_pid, signal.SIGKILL)
    assert wait_dead(keeper_pid, T)
    assert wait_dead(pid, T), "the actor outlived the process that held its last handle"


@ray.remote
class Creator:
    """Creates an actor of its own (it owns it) and hands out its handle."""

    def make(self):
        self.child = Member.remote()
        return [self.child]

    def forget(self):
        self.child = None
        gc.collect()
        return True


def test_an_actor_ends_when_a_process_without_a_link_to_its_owner_held_the_last_copy(rt):
    # The keeper got the handle from the driver, not from the actor's
    # creator: what it holds is reported to the creator through the driver,
    # and so is its death.
    creator = Creator.remote()
    (child,) = ray.get(creator.make.remote(), timeout=T)
    pid = ray.get(child.pid.remote(), timeout=T)
    keeper = Keeper.remote(child)
    assert ray.get(keeper.call.remote(), timeout=T) == "through a copy"
    keeper_pid = ray.get(keeper.pid.remote(), timeout=T)
    del child
    gc.collect()
    assert ray.get(creator.forget.remote(), timeout=T)
    assert ray.get(keeper.call.remote(), timeout=T) == "through a copy"
    os.kill(keeper_pid, signal.SIGKILL)
    assert wait_dead(keeper_pid, T)
    assert wait_dead(pid, T), "the actor outlived the process that held its last handle"


@ray.remote(max_retries=0)
def crash_holding(handles):
    os._exit(1)


def test_an_actor_ends_when_a_task_holding_a_copy_crashed(rt):
    a = Member.remote()
    pid = ray.get(a.pid.remote(), timeout=T)
    with pytest.raises(WorkerCrashedError):
        ray.get(crash_holding.remote([a]), timeout=T)
    del a
    gc.collect()
    assert wait_dead(pid, T), "the actor outlived the crashed task that held a copy"


def test_an_actor_passed_to_a_task_ends_after_the_task_and_the_handle(rt):
    a = Member.remote()
    pid = ray.get(a.pid.remote(), timeout=T)
    assert ray.get(call_through.remote(a), timeout=T) == "in a task"
    # A copy that came back to the creator is its own handle again.
    [back] = ray.get(hand_back.remote(a), timeout=T)
    del a
    gc.collect()
    assert ray.get(back.echo.remote("still here"), timeout=T) == "still here"
    del back
    gc.collect()
    assert wait_dead(pid, T), "the actor outlived its handles"


class Tally:
    """Appends a line to a file per ``add``: what ran is there after it ended."""

    def __init__(self, path):
        self.path = path

    def pid(self):
        return os.getpid()

    def add(self, i):
        with open(self.path, "a") as f:
            f.write(f"{i}\n")


class AsyncTally(Tally):
    async def add(self, i):
        Tally.add(self, i)


@ray.remote
def send_and_drop(handle, n):
    # The only handle left is this task's copy: calls sent, then it goes.
    pid = ray.get(handle.pid.remote())
    for i in range(n):
        handle.add.remote(i)
    return pid


@pytest.mark.parametrize("kind", ["sync", "async", "threaded"])
def test_calls_the_last_copy_sent_before_it_went_run_before_the_end(rt, tmp_path, kind):
    cls = ray.remote(AsyncTally if kind == "async" else Tally)
    if kind == "threaded":
        cls = cls.options(max_concurrency=4)
    path = tmp_path / "tally"
    pid = ray.get(send_and_drop.remote(cls.remote(str(path)), 50), timeout=T)
    assert wait_dead(pid, T), "the actor outlived the last copy of its handle"
    assert sorted(int(x) for x in path.read_text().split()) == list(range(50))


def _read_fifo(path, timeout):
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        ready = select.select([fd], [], [], timeout)[0]
        return os.read(fd, 16) if ready else b""
    finally:
        os.close(fd)


def _write_fifo(path, data, timeout):
    # Opening a FIFO to write blocks until a reader opens it: bounded here.
    deadline = time.monotonic() + timeout
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError:     # ENXIO: no reader yet
            if time.monotonic() > deadline:
                raise
            select.select([], [], [], 0.001)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


class GatedTally(Tally):
    def hold(self, inside, go):
        """Busy, not reading its links, until the test lets it go."""
        _write_fifo(inside, b"in", T)
        return _read_fifo(go, T)


class AsyncGatedTally(GatedTally):
    async def add(self, i):
        Tally.add(self, i)


@pytest.mark.local_only
@pytest.mark.parametrize("kind", ["sync", "async", "threaded"])
def test_calls_read_after_the_out_of_scope_end_still_run(rt, tmp_path, kind):
    # What the out-of-scope end must allow for: calls that another process
    # sent before its copy went, read by the actor after the end itself
    # (from another link, or later in the same drain).  Here all on one
    # link, in that order, written while the actor is busy and does not
    # read.  (``__ray_terminate__`` would fail them.)
    from ray_lite._private.links import protocol as P
    from ray_lite._private.process import state
    from ray_lite._private.actors.actor_exit import OUT_OF_SCOPE
    cls = ray.remote(AsyncGatedTally if kind == "async" else GatedTally)
    if kind == "threaded":
        cls = cls.options(max_concurrency=4)
    path, inside, go = tmp_path / "tally", tmp_path / "inside", tmp_path / "go"
    os.mkfifo(inside)
    os.mkfifo(go)
    a = cls.remote(str(path))
    pid = ray.get(a.pid.remote(), timeout=T)
    held = a.hold.remote(str(inside), str(go))
    assert _read_fifo(inside, T) == b"in"
    node = state.node
    node.send(a._info.actor_id, P.method_msg(node.new_oid(), OUT_OF_SCOPE, [], {}, 1, False, 0))
    refs = [a.add.remote(i) for i in range(20)]
    _write_fifo(go, b"go", T)
    assert ray.get(held, timeout=T) == b"go"
    assert ray.get(refs, timeout=T) == [None] * 20
    assert wait_dead(pid, T), "the out-of-scope end did not end the actor"
    assert sorted(int(x) for x in path.read_text().split()) == list(range(20))


@pytest.mark.local_only
def test_a_handle_a_remote_function_captured_keeps_the_actor(rt):
    # The function's blob is loaded by every worker that runs it, any number
    # of times: the handle inside is pinned (as Ray pins what a remote
    # function captures), never counted once per load and ended too early.
    a = Member.remote()
    pid = ray.get(a.pid.remote(), timeout=T)

    def capturing(handle):
        @ray.remote
        def through_captured(i):
            return ray.get(handle.echo.remote(i))
        return through_captured

    through_captured = capturing(a)
    del a
    gc.collect()
    assert ray.get([through_captured.remote(i) for i in range(6)], timeout=T) == list(range(6))
    assert ray.get([through_captured.remote(i) for i in range(6)], timeout=T) == list(range(6))
    assert not wait_dead(pid, 0)


@pytest.mark.local_only
def test_a_pinned_handle_is_kept_once_however_many_blobs_carry_it(rt):
    # A pool's function is pickled again for every map: its refs are pinned
    # once, not once per blob (which would grow without bound).
    import cloudpickle
    from ray_lite._private.objects.refs import pinning_refs
    a = Member.remote()
    for _ in range(3):
        with pinning_refs():
            cloudpickle.dumps(lambda: a)
    assert list(rt.objects.pinned_refs) == [a._lease._id]


def test_a_handle_inside_a_put_object_keeps_the_actor(rt):
    a = Member.remote()
    pid = ray.get(a.pid.remote(), timeout=T)
    ref = ray.put({"actor": a})
    del a
    gc.collect()
    assert ray.get(call_through.remote(ray.get(ref, timeout=T)["actor"]), timeout=T) == "in a task"
    del ref
    gc.collect()
    assert wait_dead(pid, T), "the actor outlived the object holding its handle"


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
