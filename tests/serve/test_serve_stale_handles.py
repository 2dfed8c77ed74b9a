"""A ``DeploymentHandle`` left idle while replicas went away (scaled down, or
killed) routes its next calls to the replicas that remain; a call already
running on a replica that dies still fails with Ray's error."""
import os
import signal
import threading

import pytest

import ray_lite as ray
from ray_lite import serve
from ray_lite.serve import _core
from ray_lite.serve.handle import get_router

from serve_helpers import process_gone, wait_until

T = 60


@serve.deployment(num_replicas=2, graceful_shutdown_wait_loop_s=0, graceful_shutdown_timeout_s=1)
class Pids:
    def __init__(self):
        self.release = threading.Event()

    def pid(self):
        return os.getpid()

    def pids(self, n):
        for _ in range(n):
            yield os.getpid()

    def hang(self, marker):
        # Tells the test it has started, then runs until the process is killed.
        with open(marker, "w") as f:
            f.write("started")
        self.release.wait(T)
        return "finished"


def _replica_ids():
    """The replica ids the handles of this process route to now (no call made)."""
    return {r.actor_id for r in get_router("stale", "Pids").replicas}


def _both_pids(h):
    pids = set()
    for _ in range(200):
        pids.add(h.pid.remote().result(timeout_s=T))
        if len(pids) == 2:
            return pids
    raise AssertionError(f"calls reached only {pids}")


def test_idle_handle_skips_a_replica_killed_meanwhile(serve_port):
    h = serve.run(Pids.bind(), name="stale", route_prefix=None)
    pids = _both_pids(h)
    victim = min(pids)
    before = _replica_ids()
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: process_gone(victim), "the killed replica to exit")
    # The controller's replacement reaches the idle handle without a call.
    wait_until(lambda: len(_replica_ids() - before) == 1 and len(_replica_ids()) == 2,
                "the handle to learn of the replacement")
    for _ in range(20):
        assert h.pid.remote().result(timeout_s=T) != victim


def test_idle_handle_skips_a_replica_scaled_down_meanwhile(serve_port):
    # (Versioned, as a config file's deploy: the second run is then an
    # update in place; serve.run's own would replace every replica.)
    h = serve.run(Pids.bind(), name="stale", route_prefix=None, _code_version="v1")
    pids = _both_pids(h)
    serve.run(Pids.options(num_replicas=1).bind(), name="stale", route_prefix=None,
              _code_version="v1")
    # The idle handle learns of the drained replica before it stops.
    wait_until(lambda: len(_replica_ids()) == 1, "the handle to drop the drained replica")
    wait_until(lambda: any(process_gone(p) for p in pids), "the drained replica to stop")
    victim, = [p for p in pids if process_gone(p)]
    for _ in range(20):
        assert h.pid.remote().result(timeout_s=T) != victim


def test_call_running_on_a_killed_replica_fails(serve_port, tmp_path):
    h = serve.run(Pids.options(num_replicas=1).bind(), name="stale", route_prefix=None)
    pid = h.pid.remote().result(timeout_s=T)
    marker = str(tmp_path / "started")
    resp = h.hang.remote(marker)
    wait_until(lambda: os.path.exists(marker), "the call to start")
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(ray.exceptions.ActorDiedError):
        resp.result(timeout_s=T)
    # The replacement serves the next calls.
    assert h.pid.remote().result(timeout_s=T) != pid


@pytest.mark.parametrize("stream", [False, True])
def test_call_refused_by_a_dead_replica_goes_to_another(serve_port, monkeypatch, stream):
    # A handle whose set still holds a replica that died (the controller's
    # update not in yet, nor the death in the set): the call it sends there
    # fails at once, unseen by the replica, and goes to the other one.
    h = serve.run(Pids.bind(), name="stale", route_prefix=None)
    pids = _both_pids(h)
    victim = min(pids)
    router = get_router("stale", "Pids")
    monkeypatch.setattr(router, "apply", lambda snap: None)     # the set stays as it is
    ids = _replica_ids()
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: ids & set(_core.dead_actor_ids()), "this process to see the death")
    monkeypatch.setattr(_core, "dead_actor_ids", lambda: frozenset())
    if stream:
        for _ in range(20):
            assert victim not in list(h.options(stream=True).pids.remote(2))
    else:
        for _ in range(20):
            assert h.pid.remote().result(timeout_s=T) != victim
    assert len(_replica_ids()) == 1


class _ControllerNotToldYet:
    """The controller as a caller sees it just after a replica died: its
    first answer still names the dead replica; asked again with the dead
    ones named, it answers as the real one does."""

    def __init__(self, real, stale_snapshot):
        self.real = real
        self.stale = stale_snapshot
        self.dead_named = []

    @property
    def wait_replicas(self):
        return self

    def remote(self, app, dep, version, timeout_s, held=False, dead=()):
        if not dead:
            return ray.put(self.stale)
        self.dead_named.append(list(dead))
        return self.real.wait_replicas.remote(app, dep, version, timeout_s, held, dead)


def test_call_waits_for_the_replacement_of_its_only_replica(serve_port, monkeypatch):
    # Every replica this process knows of died and the controller has not
    # heard yet: the call waits for the replacement instead of failing with
    # DeploymentUnavailableError (Ray's handle waits for a replica too).
    from ray_lite.serve import context
    h = serve.run(Pids.options(num_replicas=1).bind(), name="stale", route_prefix=None)
    pid = h.pid.remote().result(timeout_s=T)
    router = get_router("stale", "Pids")
    real = context.get_controller()
    stale = _core.get(real.wait_replicas.remote("stale", "Pids", -1), timeout=T)
    monkeypatch.setattr(router, "poll_update", lambda: None)   # only what it asks for
    ids = _replica_ids()
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: ids & set(_core.dead_actor_ids()), "this process to see the death")
    fake = _ControllerNotToldYet(real, stale)
    monkeypatch.setattr(context, "get_controller", lambda: fake)
    assert h.pid.remote().result(timeout_s=T) != pid
    assert [set(d) for d in fake.dead_named] == [ids]
