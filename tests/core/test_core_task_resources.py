"""What a cancelled task's own tasks do, and the CPUs they give back.

``ray.cancel(ref)`` is recursive by default, as in Ray: the tasks that the
cancelled task submitted (and theirs) are cancelled too, so the CPUs they
hold are free for the tasks that wait for them, and the calls it made to
actors are cancelled.  ``recursive=False`` leaves them running.
"""
import asyncio
import os
import select
import signal
import sys
import time

import pytest

import ray_lite as ray
from ray_lite.exceptions import RayTaskError, TaskCancelledError, WorkerCrashedError

T = 60           # bound of every wait that should succeed
NOT_YET = 0.3    # how long a task that must wait is seen still waiting


@ray.remote(num_cpus=0)
class Registry:
    """Who runs (each task says so when it starts) and the refs they made."""

    def __init__(self):
        self.running = set()
        self.refs = {}
        self.pids = {}

    def arrive(self, name):
        self.running.add(name)

    def arrived(self, names):
        return self.running.issuperset(names)

    def keep(self, name, refs, pid=None):
        self.refs[name] = refs
        self.pids[name] = pid

    def pid(self, name):
        return self.pids.get(name)

    def kept(self, name):
        return self.refs.get(name)


def _run_for_ever():
    while True:             # works until it is cancelled
        time.sleep(0.02)


@ray.remote(num_cpus=0, max_retries=0)
def leaf(reg):
    reg.arrive.remote("leaf")
    _run_for_ever()


@ray.remote(num_cpus=1, max_retries=0)
def inner(reg):
    # No get: a task blocked in get lends its CPU, and this one must hold it.
    reg.keep.remote("inner", [leaf.remote(reg)])
    reg.arrive.remote("inner")
    _run_for_ever()


@ray.remote(num_cpus=1, max_retries=0)
def outer(reg):
    reg.keep.remote("outer", [inner.remote(reg)], os.getpid())
    _run_for_ever()


@ray.remote(max_retries=0)
def hold_a_cpu(reg):
    reg.keep.remote("hold", [], os.getpid())
    reg.arrive.remote("hold")
    _run_for_ever()


@ray.remote(num_cpus=2)
def every_cpu():
    return 300


def _until(cond, what):
    deadline = time.monotonic() + T
    while not cond():
        assert time.monotonic() < deadline, f"not {what} after {T} s"
        time.sleep(0.02)


def _start_tree():
    """outer (1 CPU) -> inner (1 CPU) -> leaf (0 CPU), all running: the
    node's 2 CPUs are taken; then a task that needs both."""
    reg = Registry.remote()
    top = outer.remote(reg)
    _until(lambda: ray.get(reg.arrived.remote(["inner", "leaf"]), timeout=T), "running")
    waiting = every_cpu.remote()
    ready, _ = ray.wait([waiting], timeout=NOT_YET)
    assert ready == []          # outer and inner hold both CPUs
    return reg, top, waiting


@pytest.mark.parametrize("end", ["cancel", "death"])
def test_the_cpu_of_a_task_whose_worker_died_goes_to_a_task_that_waits_for_it(end):
    """A task's worker killed (``cancel(force=True)``, or it died): the
    queued task that needs every CPU runs."""
    ray.init(num_cpus=2)
    try:
        reg = Registry.remote()
        held = hold_a_cpu.remote(reg)
        _until(lambda: ray.get(reg.arrived.remote(["hold"]), timeout=T), "running")
        waiting = every_cpu.remote()
        ready, _ = ray.wait([waiting], timeout=NOT_YET)
        assert ready == []
        if end == "cancel":
            ray.cancel(held, force=True)
        else:
            os.kill(ray.get(reg.pid.remote("hold"), timeout=T), signal.SIGKILL)
        with pytest.raises((TaskCancelledError, WorkerCrashedError)):
            ray.get(held, timeout=T)
        assert ray.get(waiting, timeout=T) == 300
    finally:
        ray.shutdown()


def _kept(reg, name):
    refs = ray.get(reg.kept.remote(name), timeout=T)
    assert refs is not None
    return refs[0]


def _cancelled(force):
    return (TaskCancelledError, WorkerCrashedError) if force else TaskCancelledError


@pytest.mark.parametrize("force", [False, True])
def test_cancelling_a_task_cancels_the_tasks_it_submitted(force):
    ray.init(num_cpus=2)
    try:
        reg, top, waiting = _start_tree()
        ray.cancel(top, force=force)
        with pytest.raises(_cancelled(force)):
            ray.get(top, timeout=T)
        # inner's CPU is given back too: the task that needs both CPUs runs.
        assert ray.get(waiting, timeout=T) == 300
        if not force:       # (force: the owner of these refs died with outer)
            for name in ("outer", "inner"):
                with pytest.raises(TaskCancelledError):
                    ray.get(_kept(reg, name), timeout=T)
    finally:
        ray.shutdown()


def test_cancel_with_recursive_false_leaves_the_submitted_tasks_running():
    ray.init(num_cpus=2)
    try:
        reg, top, waiting = _start_tree()
        ray.cancel(top, recursive=False)
        with pytest.raises(TaskCancelledError):
            ray.get(top, timeout=T)
        # outer's CPU is free (a 1-CPU task runs on it); inner still holds its own.
        assert ray.get(ray.remote(lambda: 1).remote(), timeout=T) == 1
        ready, _ = ray.wait([waiting], timeout=NOT_YET)
        assert ready == []
        child = _kept(reg, "outer")
        ready, _ = ray.wait([child], timeout=0)
        assert ready == []
        ray.cancel(child)       # recursive: inner, then leaf
        with pytest.raises(TaskCancelledError):
            ray.get(child, timeout=T)
        assert ray.get(waiting, timeout=T) == 300
    finally:
        ray.shutdown()


def test_a_cancelled_tasks_children_of_an_earlier_task_are_left_alone():
    """A pool worker runs one task after another: the tasks its earlier
    task submitted (and left running) are not the later task's."""
    ray.init(num_cpus=2)
    try:
        reg = Registry.remote()

        @ray.remote(num_cpus=0, max_retries=0)
        def start_leaf(reg):
            reg.keep.remote("first", [leaf.remote(reg)])
            return os.getpid()

        first_pid = ray.get(start_leaf.remote(reg), timeout=T)
        _until(lambda: ray.get(reg.arrived.remote(["leaf"]), timeout=T), "running")
        first = _kept(reg, "first")
        top = outer.remote(reg)
        _until(lambda: ray.get(reg.arrived.remote(["inner"]), timeout=T), "running")
        # The pool hands out the worker that became idle last: the one that ran start_leaf.
        assert ray.get(reg.pid.remote("outer"), timeout=T) == first_pid
        ray.cancel(top)
        with pytest.raises(TaskCancelledError):
            ray.get(top, timeout=T)
        with pytest.raises(TaskCancelledError):
            ray.get(_kept(reg, "outer"), timeout=T)
        ready, _ = ray.wait([first], timeout=NOT_YET)
        assert ready == []      # still running
        ray.cancel(first)
        with pytest.raises((TaskCancelledError, RayTaskError)):
            ray.get(first, timeout=T)
    finally:
        ray.shutdown()


@ray.remote(num_cpus=0)
class Door:
    """An async actor whose ``wait`` calls run until cancelled; it notes
    which started and which were cancelled."""

    def __init__(self):
        self.started = set()
        self.cancelled = set()

    async def wait(self, name, payload=None):
        self.started.add(name)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.add(name)
            raise

    async def seen(self):
        return sorted(self.started), sorted(self.cancelled)


@ray.remote(num_cpus=0, max_retries=0)
def calls_the_door(reg, door, name, waits_in_get=False):
    _call_the_door(reg, door, name, waits_in_get)


def _call_the_door(reg, door, name, waits_in_get):
    call = door.wait.remote(name)
    reg.keep.remote(name, [call], os.getpid())
    if waits_in_get:
        ray.get(call)
    _run_for_ever()


def _door_started(door, reg, names):
    """Until the calls ``names`` run in ``door`` and their refs are kept in ``reg``."""
    _until(lambda: set(ray.get(door.seen.remote(), timeout=T)[0]) >= set(names),
           f"{names} started")
    _until(lambda: all(ray.get(reg.kept.remote(n), timeout=T) is not None for n in names),
           f"{names} kept")


@pytest.mark.parametrize("force, recursive, waits_in_get", [
    (False, True, False), (False, True, True), (True, True, False), (False, False, False)])
def test_cancelling_a_task_cancels_the_actor_calls_it_made(force, recursive, waits_in_get):
    """As in Ray: recursive (the default) reaches the calls a task made to
    actors, without force (a running call of an async actor is cancelled),
    whether the task computes or waits for the call in ``get``;
    ``recursive=False`` leaves them running."""
    ray.init(num_cpus=2)
    try:
        reg, door = Registry.remote(), Door.remote()
        top = calls_the_door.remote(reg, door, "call", waits_in_get)
        _door_started(door, reg, ["call"])
        ray.cancel(top, force=force, recursive=recursive)
        with pytest.raises(_cancelled(force)):
            ray.get(top, timeout=T)
        if not recursive:
            ready, _ = ray.wait([_kept(reg, "call")], timeout=NOT_YET)
            assert ready == [] and ray.get(door.seen.remote(), timeout=T)[1] == []
            return
        _until(lambda: ray.get(door.seen.remote(), timeout=T)[1] == ["call"],
               "the actor call cancelled")
        if not force:       # (force: the owner of this ref died with the task)
            with pytest.raises(TaskCancelledError):
                ray.get(_kept(reg, "call"), timeout=T)
    finally:
        ray.shutdown()


@ray.remote(num_cpus=0, max_retries=0)
def calls_the_door_signalled_while_cancelling(reg, door, name):
    """``calls_the_door`` waiting in ``get``, in a worker where the cancel
    signal lands while the cancel's message is being handled (the moment
    a busy machine picks now and then; made certain here)."""
    from ray_lite._private.process import state
    from ray_lite._private.process.procutil import CANCEL_SIGNAL

    node = state.node
    cancel_calls = node._cancel_calls_since

    def signal_lands_first(first, later):
        node.on_cancel_signal(CANCEL_SIGNAL, sys._getframe())
        cancel_calls(first, later)

    node._cancel_calls_since = signal_lands_first
    _call_the_door(reg, door, name, True)


def test_a_cancel_signal_landing_while_its_message_is_handled_still_cancels_the_calls():
    ray.init(num_cpus=2)
    try:
        reg, door = Registry.remote(), Door.remote()
        top = calls_the_door_signalled_while_cancelling.remote(reg, door, "call")
        _door_started(door, reg, ["call"])
        ray.cancel(top)
        with pytest.raises(TaskCancelledError):
            ray.get(top, timeout=T)
        _until(lambda: ray.get(door.seen.remote(), timeout=T)[1] == ["call"],
               "the actor call cancelled")
        with pytest.raises(TaskCancelledError):
            ray.get(_kept(reg, "call"), timeout=T)
    finally:
        ray.shutdown()


@ray.remote(num_cpus=0, max_retries=0)
def calls_the_door_signalled_inside_the_call(reg, door, name):
    """Calls the door once its cancel has come, the cancel signal landing
    inside the runtime's own code of that ``.remote()`` (where it looks at
    the call's arguments: a moment a busy machine picks now and then; made
    certain here)."""
    from ray_lite._private.api import call_options
    from ray_lite._private.process import state
    from ray_lite._private.process.procutil import CANCEL_SIGNAL

    node = state.node
    # Hold the signal back until the cancel has come: its message (sent
    # before the signal) is then waiting to be read.
    r, w = os.pipe()
    handler = signal.signal(CANCEL_SIGNAL, lambda signum, frame: os.write(w, b"x"))
    reg.arrive.remote(name)
    assert select.select([r], [], [], T)[0], "no cancel signal came"
    signal.signal(CANCEL_SIGNAL, handler)
    os.close(r)
    os.close(w)
    probe = call_options.probe_serialisable

    def signal_lands_here(value):
        call_options.probe_serialisable = probe
        node.on_cancel_signal(CANCEL_SIGNAL, sys._getframe(1))
        return probe(value)

    call_options.probe_serialisable = signal_lands_here
    door.wait.remote(name, [name])      # (a list: its arguments are looked at)
    _run_for_ever()


def test_a_cancel_signal_landing_inside_a_call_the_task_makes_lets_the_call_finish():
    """The task's interrupt is raised in its own code, once the runtime's
    code it was in is done: the call goes out whole, and the task ends
    cancelled (cut short inside ``.remote()``, the call would be lost)."""
    ray.init(num_cpus=2)
    try:
        reg, door = Registry.remote(), Door.remote()
        top = calls_the_door_signalled_inside_the_call.remote(reg, door, "call")
        _until(lambda: ray.get(reg.arrived.remote(["call"]), timeout=T), "the task running")
        ray.cancel(top, recursive=False)
        with pytest.raises(TaskCancelledError):
            ray.get(top, timeout=T)
        _until(lambda: ray.get(door.seen.remote(), timeout=T)[0] == ["call"],
               "the call the task was making started")
    finally:
        ray.shutdown()


def test_a_cancel_reaches_an_async_generator_task_busy_in_its_own_code():
    """The runtime runs an async generator task's steps through asyncio's
    loop: the cancel signal lands in the task's code, below the loop's
    frames and the runtime's, and is raised there."""
    ray.init(num_cpus=1)
    try:
        @ray.remote(max_retries=0)
        async def busy(reg):
            yield 0
            reg.arrive.remote("busy")
            while True:
                pass

        reg = Registry.remote()
        gen = busy.remote(reg)
        assert ray.get(next(gen), timeout=T) == 0
        _until(lambda: ray.get(reg.arrived.remote(["busy"]), timeout=T), "the task busy")
        ray.cancel(gen)
        with pytest.raises(TaskCancelledError):
            for ref in gen:
                ray.get(ref, timeout=T)
        # Interrupted in its code (not only given up by this process): the
        # worker is free again.
        from ray_lite._private.process import state
        node = state.node
        assert node.wait_until(lambda: all(w.task is None for w in node.pool.values()), T)
    finally:
        ray.shutdown()


def test_a_cancelled_tasks_actor_calls_of_an_earlier_task_are_left_alone():
    ray.init(num_cpus=2)
    try:
        reg, door = Registry.remote(), Door.remote()

        @ray.remote(num_cpus=0, max_retries=0)
        def start_a_call(reg, door):
            reg.keep.remote("first", [door.wait.remote("first")])
            return os.getpid()

        first_pid = ray.get(start_a_call.remote(reg, door), timeout=T)
        _door_started(door, reg, ["first"])
        top = calls_the_door.remote(reg, door, "second")
        _door_started(door, reg, ["second"])
        # The pool hands out the worker that became idle last: the one that ran start_a_call.
        assert ray.get(reg.pid.remote("second"), timeout=T) == first_pid
        ray.cancel(top)
        _until(lambda: ray.get(door.seen.remote(), timeout=T)[1] == ["second"],
               "the later task's call cancelled")
        first = _kept(reg, "first")
        ready, _ = ray.wait([first], timeout=NOT_YET)
        assert ready == [] and ray.get(door.seen.remote(), timeout=T)[1] == ["second"]
    finally:
        ray.shutdown()
