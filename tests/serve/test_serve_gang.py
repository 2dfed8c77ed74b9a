"""Gang scheduling (``gang_scheduling_config``): replicas in gangs that start
whole, know their gang, are restarted together when a member dies, and are
scaled in whole gangs; Ray's checks of the config."""
import os
import signal

import pytest

import ray_lite as ray
from ray_lite import serve
from ray_lite.serve.config import (GangPlacementStrategy, GangRuntimeFailurePolicy,
                                   GangSchedulingConfig)
from serve_helpers import wait_until

T = 60


@ray.remote
class Registry:
    """Where each replica says who it is, once it is made."""

    def __init__(self):
        self.seen = {}

    def add(self, replica_id, info):
        self.seen[replica_id] = info

    def all(self):
        return dict(self.seen)


@serve.deployment(num_replicas=4, gang_scheduling_config=GangSchedulingConfig(gang_size=2))
class Member:
    def __init__(self):
        ctx = serve.get_replica_context()
        g = ctx.gang_context
        ray.get(ray.get_actor("gang_registry").add.remote(
            ctx.replica_id.unique_id,
            (os.getpid(), g.gang_id, g.rank, g.world_size, list(g.member_replica_ids))))

    def __call__(self):
        return os.getpid()


def _gangs(seen, alive_pids=None):
    gangs = {}
    for rid, (pid, gid, rank, size, members) in seen.items():
        if alive_pids is None or pid in alive_pids:
            gangs.setdefault(gid, {})[rank] = (rid, pid, size, members)
    return gangs


def _running(app="gangs"):
    return serve.status().applications[app].deployments["Member"].replica_states \
        .get("RUNNING", 0)


def _alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def test_gangs_start_whole_know_themselves_and_restart_together(serve_runtime):
    registry = Registry.options(name="gang_registry").remote()
    # (Versioned, as a config file's deploy: the scale-down below is then
    # an update in place; serve.run's own would replace every replica.)
    serve.run(Member.bind(), name="gangs", route_prefix=None, _code_version="v1")
    seen = ray.get(registry.all.remote(), timeout=T)
    gangs = _gangs(seen)
    assert len(seen) == 4 and len(gangs) == 2
    for members in gangs.values():
        assert sorted(members) == [0, 1]
        ids = [members[r][0] for r in (0, 1)]
        for rid, _, size, listed in members.values():
            assert size == 2 and listed == ids          # the members, by rank
    # A member dies: its gang is ended with it and a new gang starts; the
    # other gang is left alone.
    (hit, other) = list(gangs.values())
    os.kill(hit[0][1], signal.SIGKILL)
    wait_until(lambda: len(ray.get(registry.all.remote(), timeout=T)) == 6,
               "a new gang of two", T)
    wait_until(lambda: not _alive(hit[1][1]), "its mate ended", T)
    wait_until(lambda: _running() == 4, "four replicas running again", T)
    assert all(_alive(pid) for _, pid, _, _ in other.values())
    now = ray.get(registry.all.remote(), timeout=T)
    new = _gangs({rid: v for rid, v in now.items() if rid not in seen})
    assert len(new) == 1 and sorted(next(iter(new.values()))) == [0, 1]
    # Scaled down in whole gangs.
    serve.run(Member.options(num_replicas=2).bind(), name="gangs", route_prefix=None,
              _code_version="v1")
    wait_until(lambda: _running() == 2, "one gang left", T)
    left = [pid for pid, *_ in now.values() if _alive(pid)]
    wait_until(lambda: len([p for p in left if _alive(p)]) == 2, "one gang's processes", T)
    live = {v[1] for v in now.values() if _alive(v[0])}
    assert len(live) == 1                                # the two left are one gang


def test_gang_configs_are_checked_as_in_ray():
    assert GangSchedulingConfig(gang_size=2).dict() == {
        "gang_size": 2, "gang_placement_strategy": "PACK",
        "runtime_failure_policy": "RESTART_GANG"}
    assert GangPlacementStrategy("SPREAD") is GangPlacementStrategy.SPREAD
    with pytest.raises(ValueError, match="gang_size must be an int >= 1"):
        GangSchedulingConfig(gang_size=0)
    with pytest.raises(NotImplementedError, match="RESTART_REPLICA"):
        GangSchedulingConfig(gang_size=2,
                             runtime_failure_policy=GangRuntimeFailurePolicy.RESTART_REPLICA)
    with pytest.raises(ValueError, match=r"num_replicas \(3\) must be a multiple of gang_size"):
        Member.options(num_replicas=3)
    with pytest.raises(ValueError, match="max_replicas_per_node is not allowed"):
        Member.options(max_replicas_per_node=1)
    with pytest.raises(ValueError, match="unknown key 'colour'"):
        Member.options(gang_scheduling_config={"gang_size": 2, "colour": "red"})
    assert Member.options(gang_scheduling_config={"gang_size": 1}, num_replicas=3) is not None


@serve.deployment(num_replicas=2, gang_scheduling_config={"gang_size": 2})
class HalfFails:
    def __init__(self):
        ctx = serve.get_replica_context()
        ray.get(ray.get_actor("gang_registry").add.remote(
            ctx.replica_id.unique_id, (os.getpid(), ctx.gang_context.rank)))
        if ctx.gang_context.rank == 1:
            raise RuntimeError("member 1 cannot start")


def test_a_gang_starts_whole_or_not_at_all(serve_runtime):
    registry = Registry.options(name="gang_registry").remote()
    with pytest.raises(RuntimeError, match="member 1 cannot start"):
        serve.run(HalfFails.bind(), name="half", route_prefix=None)
    seen = ray.get(registry.all.remote(), timeout=T)
    started = [pid for pid, rank in seen.values() if rank == 0]
    assert started                                  # it was up, then ended with its gang
    wait_until(lambda: not any(_alive(p) for p in started), "the started member ended", T)


class ThreeReplicas:
    """Asks for 3 replicas each time, and counts its calls in a file."""

    def __init__(self, path):
        self.path = path

    def __call__(self, ctx):
        with open(self.path, "a") as f:
            f.write("called\n")
        return 3, {}


def test_an_autoscaler_decision_is_rounded_up_to_whole_gangs(serve_runtime, tmp_path):
    # 3 of gang size 2 is 4: the 4 replicas it started with stay (without
    # the rounding the target became 3, a whole gang was drained, and 2 were
    # left running for good).
    path = tmp_path / "calls"
    app = Scaled.options(autoscaling_config={
        "min_replicas": 2, "max_replicas": 4, "initial_replicas": 4,
        "metrics_interval_s": 0.1,
        "policy": {"policy_function": f"{__name__}:ThreeReplicas",
                   "policy_kwargs": {"path": str(path)}}})
    serve.run(app.bind(), name="scaled", route_prefix=None)

    def running():
        return serve.status().applications["scaled"].deployments["Scaled"] \
            .replica_states.get("RUNNING", 0)
    wait_until(lambda: path.exists() and len(path.read_text().split()) >= 5,
               "five calls of the policy", T)
    assert running() == 4


@serve.deployment(gang_scheduling_config={"gang_size": 2},
                  autoscaling_config={"min_replicas": 2, "max_replicas": 4})
class Scaled:
    def __call__(self):
        return serve.get_replica_context().gang_context.rank
