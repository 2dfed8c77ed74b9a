"""The get of a call's result without a timeout: it waits on the answering
process's ring and dispatches right there (``DrivingMixin._wait_entry_driving``),
handing over to the general wait loop when that peer dies, another thread
waits too, or the budget passes.  Every get here has no timeout of its own, so
each runs in a thread joined with a bound: a hang fails the test."""
import os
import threading

import pytest

import ray_lite as ray
from ray_lite.exceptions import RayActorError

from serve_helpers import wait_until

T = 60


def _bounded(fn, *args):
    """``fn(*args)`` in a thread; its value, or the test fails if it did not
    return within ``T`` s.  An error it raised is re-raised."""
    out = {}

    def run():
        try:
            out["value"] = fn(*args)
        except BaseException as exc:      # noqa: BLE001 - handed to the test
            out["error"] = exc
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(T)
    assert not t.is_alive(), "ray.get without a timeout did not return"
    if "error" in out:
        raise out["error"]
    return out["value"]


@ray.remote
class Echo:
    def echo(self, x):
        return x

    def pid(self):
        return os.getpid()


@ray.remote
class DiesOnce:
    """Its first incarnation dies in ``work``; the restarted one answers."""

    def __init__(self, marker):
        self.marker = marker

    def work(self):
        if not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os._exit(1)
        return "after the restart"


@ray.remote
def plus_one(x):
    return x + 1


def test_results_of_tasks_and_actor_calls_in_a_loop(rt):
    e = Echo.remote()

    def loop():
        return [(ray.get(e.echo.remote(i)), ray.get(plus_one.remote(i))) for i in range(300)]
    assert _bounded(loop) == [(i, i + 1) for i in range(300)]


def test_the_answering_actor_dies_and_restarts_during_the_wait(rt, tmp_path):
    a = DiesOnce.options(max_restarts=1, max_task_retries=1).remote(str(tmp_path / "died"))
    assert _bounded(ray.get, a.work.remote()) == "after the restart"


def test_the_answering_actor_is_killed_during_the_wait(rt, tmp_path):
    a = DiesOnce.remote(str(tmp_path / "died"))
    with pytest.raises(RayActorError):
        _bounded(ray.get, a.work.remote())


def test_threads_waiting_at_once_each_get_their_own_results(rt):
    actors = [Echo.remote() for _ in range(3)]
    failures = []

    def loop(k, a):
        try:
            for i in range(300):
                v = ray.get(a.echo.remote((k, i)))
                if v != (k, i) and v != [k, i]:
                    failures.append((k, i, v))
                    return
        except BaseException as exc:      # noqa: BLE001 - reported below
            failures.append(exc)
    threads = [threading.Thread(target=loop, args=(k, a), daemon=True)
               for k, a in enumerate(actors)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(T)
    assert not any(t.is_alive() for t in threads), "a thread's get did not return"
    assert failures == []


def test_a_handle_makes_each_method_once_and_still_travels(rt):
    e = Echo.remote()
    first = e.echo      # makes it (what it returns also holds the handle: see ActorMethod)
    assert first._hard is e and e.echo._hard is None
    assert e.echo is e.echo               # kept on the handle after its first use
    assert ray.get(e.echo.remote(1), timeout=T) == 1

    @ray.remote
    def call(h):
        return ray.get(h.pid.remote())
    assert ray.get(call.remote(e), timeout=T) == ray.get(e.pid.remote(), timeout=T)
    with pytest.raises(AttributeError, match="has no method 'nope'"):
        e.nope


@ray.remote
def nested_plus_one(x):
    # The driver dispatches plus_one to another worker and passes its result
    # on to this one: the answer the driver waits for needs a message that
    # comes on another link than this worker's.
    return ray.get(plus_one.remote(x))


@ray.remote
class CallsATask:
    def call(self, x):
        return ray.get(plus_one.remote(x))


def test_a_wait_on_one_peer_reads_the_other_links_while_nested_tasks_run(rt, monkeypatch):
    """With the wait's time on the peer's ring alone made an hour, only a wait
    that reads the other links while the driver passes a nested task's
    result on gets these answers: otherwise each nested call would hang for
    the whole budget (it stalled 2 ms each before)."""
    from ray_lite._private.links import drive
    monkeypatch.setattr(drive, "HINT_BUDGET_S", 3600.0)
    a = CallsATask.remote()

    def loop():
        return [(ray.get(nested_plus_one.remote(i)), ray.get(a.call.remote(i)))
                for i in range(20)]
    assert _bounded(loop) == [(i + 1, i + 1) for i in range(20)]


class _CountedCondition:
    """The node's service condition, counting the notifies a wait's end sends."""

    def __init__(self, cond):
        self.cond = cond
        self.notifies = 0

    def __enter__(self):
        return self.cond.__enter__()

    def __exit__(self, *exc):
        return self.cond.__exit__(*exc)

    def notify(self, n=1):
        self.notifies += 1
        self.cond.notify(n)

    def notify_all(self):
        self.cond.notify_all()


@ray.remote
def waits_for_item(q):
    return q.get(timeout=T)


@pytest.mark.local_only
def test_the_service_thread_sleeps_through_a_long_wait_but_not_between_short_ones(rt):
    """A get that lasts lets the driver's service thread sleep until it ends
    (one notify then); a loop of short gets must not make it park and be
    notified again and again: each wake-up takes the GIL from the loop."""
    from ray_lite._private.process import state
    from ray_lite.util.queue import Queue
    node = state.get_node()
    counted = _CountedCondition(node.service.cond)
    node.service.cond = counted
    try:
        q = Queue()
        ref = waits_for_item.remote(q)
        out = {}
        t = threading.Thread(target=lambda: out.update(v=ray.get(ref)), daemon=True)
        t.start()
        wait_until(lambda: node.service.parked, "the service thread to sleep through a long get",
                   timeout=T)
        q.put("item")
        t.join(T)
        assert out == {"v": "item"}
        e = Echo.remote()
        ray.get(e.echo.remote(0))
        before = counted.notifies

        def loop():
            for i in range(20000):
                ray.get(e.echo.remote(i))
        _bounded(loop)
        assert counted.notifies - before <= 3, counted.notifies - before
    finally:
        node.service.cond = counted.cond
