"""num_cpus and custom resources, honoured by the driver's scheduler (issue 11)."""
import os
import select

import pytest

import ray_lite as ray
from ray_lite._private.process import state
from ray_lite.exceptions import RayActorError, TaskCancelledError

from resource_helpers import NOT_YET, T, Holder, one, scheduled


@pytest.fixture
def rt4():
    ray.init(num_cpus=4, resources={"x": 1, "slots": 2})
    try:
        yield state.node
    finally:
        ray.shutdown()


def _fifo(tmp_path, name):
    path = str(tmp_path / name)
    os.mkfifo(path)
    return path


def _read_fifo(path, timeout=T):
    """Block until a writer writes to ``path`` (bounded)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        while True:
            ready, _, _ = select.select([fd], [], [], timeout)
            if not ready:
                raise TimeoutError(path)
            if os.read(fd, 64):
                return
    finally:
        os.close(fd)


def _write_fifo(path, timeout=T):
    # Opening for writing blocks until the reader has it open.
    import threading
    done = threading.Event()

    def write():
        with open(path, "w") as f:
            f.write("go")
        done.set()
    t = threading.Thread(target=write, daemon=True)
    t.start()
    assert done.wait(timeout)


@ray.remote
def hold(started, release):
    _write_fifo(started)
    _read_fifo(release)
    return "held"


def test_a_task_asking_for_every_cpu_waits_until_all_are_free(tmp_path):
    ray.init(num_cpus=2)
    try:
        started, release = _fifo(tmp_path, "started"), _fifo(tmp_path, "release")
        h = hold.remote(started, release)
        _read_fifo(started)                       # it runs and holds 1 of the 2 CPUs
        big = one.options(num_cpus=2).remote()
        ready, _ = ray.wait([big], timeout=NOT_YET)
        assert ready == []                        # only 1 CPU is free
        assert ray.get(one.remote(), timeout=T) == 1   # a 1-CPU task still fits
        _write_fifo(release)
        assert ray.get(h, timeout=T) == "held"
        assert ray.get(big, timeout=T) == 1
    finally:
        ray.shutdown()


def test_an_actor_holds_its_num_cpus_for_its_lifetime(rt4):
    assert rt4.resources.available_resources()["CPU"] == 4
    a = Holder.options(num_cpus=4).remote()
    assert ray.get(a.ping.remote(), timeout=T)
    assert "CPU" not in rt4.resources.available_resources()
    ref = one.remote()
    assert ray.wait([ref], timeout=NOT_YET)[0] == []    # no CPU left for a task
    ray.kill(a)
    assert ray.get(ref, timeout=T) == 1
    assert rt4.resources.available_resources()["CPU"] == 4


def test_actors_by_default_hold_no_cpu():
    # Ray's rule: 1 CPU to be scheduled, 0 while running.
    ray.init(num_cpus=1)
    try:
        actors = [Holder.remote() for _ in range(6)]
        assert len(set(ray.get([a.ping.remote() for a in actors], timeout=T))) == 6
        assert ray.get(one.remote(), timeout=T) == 1
        assert state.node.resources.available_resources()["CPU"] == 1
    finally:
        ray.shutdown()


def test_custom_resources_are_taken_and_given_back(rt4):
    assert scheduled(rt4.resources.cluster_resources()) == {"CPU": 4, "x": 1, "slots": 2}
    a = Holder.options(resources={"x": 1}).remote()
    ray.get(a.ping.remote(), timeout=T)
    assert "x" not in rt4.resources.available_resources()
    ref = one.options(resources={"x": 1}).remote()
    assert ray.wait([ref], timeout=NOT_YET)[0] == []
    # Another resource is unaffected.
    assert ray.get(one.options(resources={"slots": 2}).remote(), timeout=T) == 1
    ray.kill(a)
    assert ray.get(ref, timeout=T) == 1
    assert scheduled(rt4.resources.available_resources()) == {"CPU": 4, "x": 1, "slots": 2}


def test_memory_is_a_resource_the_scheduler_honours(rt4):
    # Ray's logical "memory" (70 % of the machine's): a task asking for most
    # of it waits while an actor holds most of it, and runs once it is gone.
    total = ray.cluster_resources()["memory"]
    assert total == rt4.resources.cluster_resources()["memory"] > 0
    big = int(total * 0.6)
    a = Holder.options(memory=big).remote()
    ray.get(a.ping.remote(), timeout=T)
    assert ray.available_resources()["memory"] == total - big
    ref = one.options(memory=big).remote()
    assert ray.wait([ref], timeout=NOT_YET)[0] == []
    assert ray.get(one.options(memory=int(total * 0.3)).remote(), timeout=T) == 1
    ray.kill(a)
    assert ray.get(ref, timeout=T) == 1
    assert ray.available_resources()["memory"] == total
    with pytest.raises(ValueError, match="could never run"):
        one.options(memory=int(total * 2)).remote()


def test_fractional_and_zero_cpu_tasks(rt4):
    refs = [one.options(num_cpus=0.5).remote() for _ in range(8)]
    refs += [one.options(num_cpus=0).remote() for _ in range(3)]
    assert ray.get(refs, timeout=T) == [1] * 11
    assert rt4.resources.available_resources()["CPU"] == 4


def test_a_request_that_can_never_fit_is_refused(rt4):
    with pytest.raises(ValueError, match="could never run"):
        one.options(num_cpus=5).remote()
    with pytest.raises(ValueError, match="could never run"):
        one.options(resources={"gpu_like": 1}).remote()
    with pytest.raises(ValueError, match="could never run"):
        one.options(resources={"x": 2}).remote()
    with pytest.raises(ValueError, match="could never run"):
        Holder.options(num_cpus=8).remote()
    # The runtime is unharmed.
    assert ray.get(one.remote(), timeout=T) == 1


def test_a_nested_task_that_can_never_fit_fails_at_get(rt4):
    @ray.remote
    def parent():
        ref = one.options(num_cpus=64).remote()
        try:
            ray.get(ref, timeout=T)
        except ValueError as exc:
            return str(exc)
        return "ran"
    assert "could never run" in ray.get(parent.remote(), timeout=T)


def test_bad_resource_values_are_refused():
    for opts in ({"num_cpus": -1}, {"num_cpus": "2"}, {"num_cpus": 1.5},
                 {"resources": {"CPU": 1}}, {"resources": {"x": -1}}, {"resources": "x"},
                 {"resources": {"": 1}}, {"scheduling_strategy": "NOWHERE"},
                 {"scheduling_strategy": object()}):
        with pytest.raises((ValueError, TypeError)):
            one.options(**opts)
    with pytest.raises(ValueError):
        ray.init(num_cpus=1, resources={"GPU": 1})
    with pytest.raises(TypeError):
        ray.init(num_cpus=1, resources=["x"])
    assert not ray.is_initialized()


def test_a_node_with_no_cpu():
    # As Ray: init(num_cpus=0) (and a float object_store_memory) is taken;
    # tasks that ask for no CPU run, one that asks for a CPU could never
    # (Ray leaves it pending; here get says why).
    for bad in (-1, 1.0, True):
        with pytest.raises(ValueError, match="num_cpus"):
            ray.init(num_cpus=bad)
    ray.init(num_cpus=0, object_store_memory=200e6)
    try:
        assert ray.get(one.options(num_cpus=0).remote(), timeout=T) == 1
        with pytest.raises(ValueError, match="init\\(num_cpus=0\\)"):
            ray.get(one.remote(), timeout=T)
        assert ray.cluster_resources().get("CPU", 0) == 0
    finally:
        ray.shutdown()


def test_an_actor_created_from_a_task_takes_the_cpu_its_blocked_creator_lends():
    ray.init(num_cpus=2)
    try:
        first = Holder.options(num_cpus=1).remote()
        first_pid = ray.get(first.ping.remote(), timeout=T)

        @ray.remote
        def make_second():
            # Its 1 CPU is the last one: the handle comes at once, and while
            # the task waits in get it lends its CPU, which the actor takes
            # (as in Ray; the task's .remote() waited for `first` to go).
            second = Holder.options(num_cpus=1).remote()
            return ray.get(second.ping.remote(), timeout=T)
        assert ray.get(make_second.remote(), timeout=T) not in (None, first_pid)
        assert ray.get(first.ping.remote(), timeout=T) == first_pid
    finally:
        ray.shutdown()


def test_a_killed_actor_gives_back_what_it_held(rt4):
    a = Holder.options(num_cpus=2, resources={"slots": 1}).remote()
    ray.get(a.ping.remote(), timeout=T)
    assert scheduled(rt4.resources.available_resources()) == {"CPU": 2, "x": 1, "slots": 1}
    ray.kill(a)
    with pytest.raises(RayActorError):
        ray.get(a.ping.remote(), timeout=T)
    assert scheduled(rt4.resources.available_resources()) == {"CPU": 4, "x": 1, "slots": 2}


def test_blocked_task_lends_its_cpus_back(rt4):
    @ray.remote(num_cpus=4)
    def outer():
        # Waiting in get, it lends its 4 CPUs: the inner task can run.
        return ray.get(one.options(num_cpus=4).remote(), timeout=T) + 1
    assert ray.get(outer.remote(), timeout=T) == 2
    assert rt4.resources.available_resources()["CPU"] == 4


def test_an_actor_whose_resources_are_taken_starts_when_they_are_free(rt4):
    first = Holder.options(num_cpus=4).remote()
    ray.get(first.ping.remote(), timeout=T)
    # As in Ray, the handle comes at once (the driver waited in .remote(): a
    # program that frees the CPUs after this line deadlocked).
    second = Holder.options(num_cpus=2).remote()
    call = second.ping.remote()
    assert ray.wait([call], timeout=NOT_YET)[0] == []      # no CPU is free: not started
    assert rt4.resources.available_resources().get("CPU", 0) == 0
    waiting = Holder.options(num_cpus=4).remote()
    lost = waiting.ping.remote()
    ray.kill(waiting)                                        # killed while it waits
    with pytest.raises(RayActorError):
        ray.get(lost, timeout=T)
    cancelled = second.ping.remote()
    ray.cancel(cancelled)                                    # cancelled before it starts
    ray.kill(first)
    with pytest.raises(TaskCancelledError):
        ray.get(cancelled, timeout=T)
    assert isinstance(ray.get(call, timeout=T), int)
    assert [ray.get(second.ping.remote(), timeout=T) for _ in range(3)] == [ray.get(call)] * 3
    assert rt4.resources.available_resources()["CPU"] == 2


def test_a_waiting_async_actor_runs_the_calls_made_meanwhile_in_order(rt4):
    @ray.remote(num_cpus=4)
    class Log:
        def __init__(self):
            self.seen = []

        async def add(self, x):
            self.seen.append(x)
            return list(self.seen)
    first = Holder.options(num_cpus=4).remote()
    ray.get(first.ping.remote(), timeout=T)
    log = Log.remote()
    calls = [log.add.remote(i) for i in range(5)]
    assert ray.wait(calls, timeout=NOT_YET)[0] == []
    ray.kill(first)
    assert ray.get(calls[-1], timeout=T) == [0, 1, 2, 3, 4]


@ray.remote
def _leaf():
    return 0


@ray.remote
def _middle():
    return ray.get(_leaf.remote(), timeout=T)


@ray.remote
def _top():
    return ray.get(_middle.remote(), timeout=T)


def test_a_blocked_tasks_nested_task_runs_before_queued_ones():
    # Ray's test_fair_queueing: with one CPU, the tasks a blocked task waits on
    # go ahead of the driver's queued ones.  Served after them, every queued
    # top task started (a process each, lending its CPU in get) before the
    # first middle one ran: 20 chains took ~41 processes, 1,000 took 51 s.
    ray.init(num_cpus=1)
    try:
        # 20 chains top -> middle -> leaf, each level blocked in get on the next.
        assert ray.get([_top.remote() for _ in range(20)], timeout=T) == [0] * 20
        assert len(state.node.pool) < 10
    finally:
        ray.shutdown()


def test_nested_tasks_with_a_demand_go_first_too(rt4):
    # The same through the queue of tasks with a Demand (2 CPUs each, so at
    # most two levels run at once unless a blocked one lends its CPUs).

    @ray.remote(num_cpus=2)
    def leaf():
        return 0

    @ray.remote(num_cpus=2)
    def middle():
        return ray.get(leaf.remote(), timeout=T)

    @ray.remote(num_cpus=2)
    def top():
        return ray.get(middle.remote(), timeout=T)
    assert ray.get([top.remote() for _ in range(12)], timeout=T) == [0] * 12
    assert len(rt4.pool) < 12
    assert rt4.resources.available_resources()["CPU"] == 4
