"""What Ray's own tests found wrong (issue 11), each fixed: one test each."""
import asyncio
import gc
import os
import subprocess
import sys
import threading
import time

import pytest

import ray_lite as ray
from ray_lite.exceptions import (ActorDiedError, GetTimeoutError, RayActorError, RayTaskError,
                                 TaskCancelledError)

T = 60


@ray.remote
def produce(n):
    yield from range(n)


def test_a_task_iterating_a_generator_lends_its_cpu_slot():
    # One CPU: the consumer holds it while it waits for the producer's items.
    ray.init(num_cpus=1)
    try:
        @ray.remote
        def consume(n):
            return [ray.get(ref) for ref in produce.remote(n)]
        assert ray.get(consume.remote(4), timeout=T) == [0, 1, 2, 3]

        @ray.remote
        def consume_with_timeout(n):
            g = produce.remote(n)
            out = []
            while True:
                try:
                    ref = g._next_sync(timeout_s=T)
                except StopIteration:
                    return out
                if ref.is_nil():
                    raise GetTimeoutError("no item")
                out.append(ray.get(ref))
        assert ray.get(consume_with_timeout.remote(3), timeout=T) == [0, 1, 2]
    finally:
        ray.shutdown()


def test_next_ready_is_false_once_the_stream_is_exhausted(rt):
    g = produce.remote(2)
    ray.get(g.completed(), timeout=T)
    assert g.next_ready() and not g.is_finished()
    assert [ray.get(r) for r in g] == [0, 1]
    assert not g.next_ready()
    assert g.is_finished()
    ready, _ = ray.wait([g], timeout=T)      # wait still sees the end as ready
    assert ready == [g]


def test_get_of_a_generator_returns_it(rt):
    g = produce.remote(1)
    assert ray.get(g) is g
    assert ray.get(g, timeout=1) is g
    with pytest.raises(TypeError):
        ray.get([g])


def test_remote_refuses_an_async_function():
    async def f():
        return 1
    with pytest.raises(ValueError, match="'async def' should not be used for remote tasks"):
        ray.remote(f)
    with pytest.raises(ValueError, match="async def"):
        ray.remote(num_cpus=1)(f)


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


def test_a_queued_task_cancelled_is_a_plain_task_cancelled_error(rt):
    gates = [Gate.remote() for _ in range(2)]
    blockers = [spin.remote(g) for g in gates]
    for g in gates:
        ray.get(g.arrived.remote(), timeout=T)
    # Both hold their CPU again (each lent it while it waited in get).
    assert rt.wait_until(lambda: rt.busy == rt.num_cpus, T)
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


def test_threads_of_an_actor_reaching_a_new_peer_at_once_share_one_link(rt):
    # Each thread used to make its own link; the second replaced (and closed)
    # the first, and the peer, attaching the closed one, died.
    @ray.remote
    class Peer:
        async def ping(self, i):
            return i

    @ray.remote(max_concurrency=8)
    class Caller:
        def call(self, peer, i):
            return ray.get(peer.ping.remote(i))
    for _ in range(3):
        peer, caller = Peer.remote(), Caller.remote()
        assert ray.get([caller.call.remote(peer, i) for i in range(8)], timeout=T) == \
            list(range(8))
        assert ray.get(peer.ping.remote(-1), timeout=T) == -1



@ray.remote
class _Pinged:
    async def ping(self, i):
        return i


@ray.remote
class _Mailbox:
    def __init__(self):
        self.letters = asyncio.Queue()

    async def put(self, letter):
        self.letters.put_nowait(letter)

    async def take(self):
        return await self.letters.get()


def _until(cond):
    deadline = time.monotonic() + T
    while not cond():
        assert time.monotonic() < deadline
        time.sleep(0.001)


def _until_the_links_sleep(node):
    """Until a thread of ``node``'s process sleeps in poll on the links it had
    (``drive._poll``): a link made now is not among them."""
    _until(lambda: node._polling)


def test_a_thread_of_an_actor_reaching_a_new_peer_while_its_links_sleep_gets_the_answer(rt):
    # The actor's main thread slept in poll on the one link it had (to the
    # driver) and held the drive lock; a method's thread made a link to a new
    # peer, whose answer came on it: nothing woke the sleep, and the call hung.
    @ray.remote(max_concurrency=2)
    class Caller:
        def call(self, peer, i):
            from ray_lite._private.process import state
            _until_the_links_sleep(state.node)
            return ray.get(peer.ping.remote(i), timeout=T)
    caller = Caller.remote()
    for i in range(3):
        assert ray.get(caller.call.remote(_Pinged.remote(), i), timeout=T) == i


def test_a_thread_an_actor_started_reaching_a_new_peer_while_the_actor_idles_gets_the_answer(rt):
    # The same with one method thread (the main thread), idle: it slept on
    # its one link's ring, which only a message on that link wakes.
    @ray.remote
    class Background:
        def __init__(self, peer, mailbox):
            from ray_lite._private.process import state
            node = state.node

            def reach():
                _until(node._drive_lock.locked)    # the main thread idles in the drive loop
                mailbox.put.remote(ray.get(peer.ping.remote(5), timeout=T))
            threading.Thread(target=reach, daemon=True).start()

    mailbox = _Mailbox.remote()
    background = Background.remote(_Pinged.remote(), mailbox)
    assert ray.get(mailbox.take.remote(), timeout=T) == 5
    del background


def test_a_driver_thread_reaching_a_new_actor_while_another_thread_waits_gets_the_answer(rt):
    # The same in the driver: the main thread sleeps in poll (in get) on the
    # links it had; another thread starts an actor and calls it.
    mailbox = _Mailbox.remote()

    def reach_a_new_actor():
        try:
            _until_the_links_sleep(rt)
            answer = ray.get(_Pinged.remote().ping.remote(7), timeout=T)
        except BaseException as exc:    # noqa: BLE001 - told to the main thread
            answer = exc
        mailbox.put.remote(answer)
    t = threading.Thread(target=reach_a_new_actor)
    t.start()
    try:
        assert ray.get(mailbox.take.remote(), timeout=T) == 7
    finally:
        t.join(T)


def test_an_actor_waiting_for_resources_starts_when_another_thread_frees_them(rt):
    # Creating an actor that does not fit waits (asleep in poll, driving the
    # links) until resources are free; freed by another thread (a placement
    # group removed), they came with no message: nothing woke the wait.
    from ray_lite.util.placement_group import placement_group, remove_placement_group

    @ray.remote(num_cpus=2)
    class Big:
        def ping(self):
            return "pong"

    group = placement_group([{"CPU": 2}])
    ray.get(group.ready(), timeout=T)
    answers = []

    def start_big():
        answers.append(ray.get(Big.remote().ping.remote(), timeout=T))
    t = threading.Thread(target=start_big)
    t.start()
    _until_the_links_sleep(rt)
    remove_placement_group(group)
    t.join(T)
    assert answers == ["pong"]


HELPER_FROM_MAIN = """
import ray_lite as ray

def helper(x):
    return 1 / x

@ray.remote
def divide(x):
    return helper(x)

ray.init(num_cpus=1)
try:
    ray.get(divide.remote(0), timeout=60)
except ZeroDivisionError as exc:
    print(exc.traceback_str)
ray.shutdown()
"""


def test_a_helper_from_main_keeps_its_file_name_in_a_remote_traceback(tmp_path):
    """cloudpickle ships the helpers a task in ``__main__`` calls by value, and
    names their code ``<dynamic-code>``: the traceback lost their source."""
    script = tmp_path / "helper_from_main.py"
    script.write_text(HELPER_FROM_MAIN)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f'File "{script}", line 9, in divide' in proc.stdout, proc.stdout
    assert f'File "{script}", line 5, in helper' in proc.stdout, proc.stdout
    assert "return 1 / x" in proc.stdout and "<dynamic-code>" not in proc.stdout
