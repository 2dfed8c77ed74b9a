"""Ray Serve's gang scheduling (``gang_scheduling_config``) on one machine.

A deployment's replicas come in gangs of ``gang_size``: a gang starts whole
or not at all (a member that fails to start ends the others), each member
knows its gang (``serve.get_replica_context().gang_context``: the gang's id,
its rank in it, the gang's size and its members' replica ids, by rank), and
when a member dies the whole gang is ended and a new one started
(``RESTART_GANG``, Ray's only policy).  Replica counts, set or chosen by the
autoscaler, are whole gangs; scaling down ends whole gangs.  On one node
``PACK`` and ``SPREAD`` place a gang alike.
"""
import dataclasses
import enum
import uuid
from typing import List

from ._plain_config import PlainConfig, normalized


@dataclasses.dataclass
class GangContext:
    """What a replica knows of its gang (Ray's ``ray.serve.gang.GangContext``)."""
    gang_id: str
    rank: int
    world_size: int
    member_replica_ids: List[str]
    pg_name: str = ""


class GangPlacementStrategy(str, enum.Enum):
    PACK = "PACK"
    SPREAD = "SPREAD"


class GangRuntimeFailurePolicy(str, enum.Enum):
    RESTART_GANG = "RESTART_GANG"
    RESTART_REPLICA = "RESTART_REPLICA"


class GangSchedulingConfig(PlainConfig):
    """Ray Serve's ``GangSchedulingConfig``: ``gang_size`` (replicas a gang,
    >= 1), ``gang_placement_strategy`` (PACK or SPREAD),
    ``runtime_failure_policy`` (RESTART_GANG; RESTART_REPLICA is not
    implemented, as in Ray)."""

    def __init__(self, gang_size, gang_placement_strategy=GangPlacementStrategy.PACK,
                 runtime_failure_policy=GangRuntimeFailurePolicy.RESTART_GANG):
        if not isinstance(gang_size, int) or isinstance(gang_size, bool) or gang_size < 1:
            raise ValueError(f"gang_size must be an int >= 1, got {gang_size!r}")
        try:
            strategy = GangPlacementStrategy(gang_placement_strategy)
            policy = GangRuntimeFailurePolicy(runtime_failure_policy)
        except ValueError as exc:
            raise ValueError(f"gang_scheduling_config: {exc}") from None
        if policy is GangRuntimeFailurePolicy.RESTART_REPLICA:
            raise NotImplementedError("RESTART_REPLICA policy is not yet implemented. File a "
                                      "GitHub issue if you need this feature.")
        self.gang_size = gang_size
        self.gang_placement_strategy = strategy
        self.runtime_failure_policy = policy

    FIELDS = ("gang_size", "gang_placement_strategy", "runtime_failure_policy")

    def dict(self, **_):
        return {"gang_size": self.gang_size,
                "gang_placement_strategy": self.gang_placement_strategy.value,
                "runtime_failure_policy": self.runtime_failure_policy.value}


def normalize_gang(value):
    """A deployment's ``gang_scheduling_config`` (the class, a dict of its
    fields, Ray's own, or None) as a plain dict, or None."""
    return normalized(GangSchedulingConfig, value, "gang_scheduling_config")


def check(cfg):
    """Ray's checks of a deployment config with a gang (normalised in place)."""
    gang = cfg["gang_scheduling_config"] = normalize_gang(cfg["gang_scheduling_config"])
    if gang is None:
        return
    n = cfg.get("num_replicas", 1)
    if not cfg.get("autoscaling_config") and isinstance(n, int) and n % gang["gang_size"]:
        raise ValueError(f"num_replicas ({n}) must be a multiple of gang_size "
                         f"({gang['gang_size']}).")
    if cfg.get("max_replicas_per_node") is not None:
        raise ValueError("Setting max_replicas_per_node is not allowed when "
                         "gang_scheduling_config is provided.")
    if cfg.get("placement_group_strategy") is not None:
        raise ValueError("Setting placement_group_strategy is not allowed when "
                         "gang_scheduling_config is provided. Use "
                         "gang_scheduling_config.gang_placement_strategy instead.")


# ------------------------------------------------------ for the controller
def size_of(dep):
    """The gang size of deployment ``dep`` (1: no gangs)."""
    gang = dep.config.get("gang_scheduling_config")
    return gang["gang_size"] if gang else 1


def whole(dep, n):
    """``n`` replicas rounded up to whole gangs."""
    size = size_of(dep)
    return -(-n // size) * size


def form(dep, rids):
    """Group the new replica ids ``rids`` (whole gangs) into gangs: each id's
    ``GangContext`` fields, and the gangs (lists of ids), recorded in
    ``dep.gangs``/``dep.gang_of``; {} and [] without gangs."""
    if not dep.config.get("gang_scheduling_config"):
        return {}, []
    size = size_of(dep)
    contexts, gangs = {}, []
    for start in range(0, len(rids), size):
        members = rids[start:start + size]
        gang_id = uuid.uuid4().hex[:12]
        ids = [rid.rpartition("#")[2] for rid in members]
        for rank, rid in enumerate(members):
            contexts[rid] = {"gang_id": gang_id, "rank": rank, "world_size": len(members),
                             "member_replica_ids": ids}
        gangs.append(members)
    return contexts, gangs


def mates(dep, rid):
    """The other members of ``rid``'s gang (it leaves the gang's record)."""
    gang = dep.gang_of.pop(rid, None)
    if gang is None:
        return []
    others = [r for r in gang if r != rid]
    for r in others:
        dep.gang_of.pop(r, None)
    return others


def newest_gangs(dep, n):
    """The replica ids of the newest whole gangs holding at least ``n`` replicas."""
    out = []
    for rid in reversed(list(dep.replicas)):
        if len(out) >= n:
            break
        if rid in out:
            continue
        gang = dep.gang_of.get(rid) or [rid]
        out.extend(r for r in gang if r in dep.replicas and r not in out)
    return out
