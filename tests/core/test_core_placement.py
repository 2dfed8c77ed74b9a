"""Placement groups and scheduling strategies on one node (issue 11)."""
import os

import pytest

import ray_lite as ray
from ray_lite._private.process import state
from ray_lite._private.process.ids import node_id_hex as local_node_id
from ray_lite.exceptions import RayActorError
from ray_lite.util.placement_group import (
    PlacementGroup, get_placement_group, placement_group, placement_group_table,
    remove_placement_group)
from ray_lite.util.scheduling_strategies import (
    NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy)

from resource_helpers import NOT_YET, T, Holder, one, scheduled


@pytest.fixture
def rt4():
    ray.init(num_cpus=4, resources={"x": 2})
    try:
        yield state.node
    finally:
        ray.shutdown()


def in_pg(pg, index=-1):
    return PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=index)


def test_create_ready_wait_and_remove(rt4):
    pg = placement_group([{"CPU": 1}, {"CPU": 2, "x": 1}], strategy="SPREAD", name="pg1")
    assert isinstance(pg, PlacementGroup)
    assert ray.get(pg.ready(), timeout=T) == pg
    assert pg.wait(T) is True
    assert pg.bundle_specs == [{"CPU": 1}, {"CPU": 2, "x": 1}]
    assert pg.bundle_count == 2
    table = placement_group_table(pg)
    assert table["state"] == "CREATED" and table["name"] == "pg1"
    assert table["strategy"] == "SPREAD"
    assert pg.id.hex() in placement_group_table()      # keyed by hex, as in Ray
    assert get_placement_group("pg1") == pg
    # Its resources are reserved from the node.
    assert scheduled(rt4.resources.available_resources()) == {"CPU": 1, "x": 1}
    remove_placement_group(pg)
    assert placement_group_table(pg)["state"] == "REMOVED"
    assert scheduled(rt4.resources.available_resources()) == {"CPU": 4, "x": 2}
    with pytest.raises(ValueError, match="pg1"):
        get_placement_group("pg1")
    remove_placement_group(pg)     # twice: no error, as in Ray


def test_a_group_larger_than_the_machine_is_refused(rt4):
    with pytest.raises(ValueError, match="more than this machine has"):
        placement_group([{"CPU": 3}, {"CPU": 2}])
    with pytest.raises(ValueError, match="more than this machine has"):
        placement_group([{"x": 3}])
    with pytest.raises(ValueError, match="more than this machine has"):
        placement_group([{"GPU": 1}])
    with pytest.raises(ValueError, match="STRICT_SPREAD"):
        placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD")
    # Nothing was reserved by the refused ones.
    assert scheduled(rt4.resources.available_resources()) == {"CPU": 4, "x": 2}
    assert placement_group_table() == {}


def test_bad_placement_group_arguments_are_refused(rt4):
    for bundles in ([], [{}], "CPU", [{"CPU": -1}], [{"CPU": 0}], [["CPU", 1]]):
        with pytest.raises((ValueError, TypeError)):
            placement_group(bundles)
    with pytest.raises(ValueError, match="strategy"):
        placement_group([{"CPU": 1}], strategy="NEAR")
    for lifetime in ("forever", "non_detached"):      # (an actor's value; Ray refuses it here)
        with pytest.raises(ValueError, match="lifetime"):
            placement_group([{"CPU": 1}], lifetime=lifetime)
    remove_placement_group(placement_group([{"CPU": 1}], lifetime="detached"))
    placement_group([{"CPU": 1}], name="dup")
    with pytest.raises(ValueError, match="already exists"):
        placement_group([{"CPU": 1}], name="dup")
    with pytest.raises(TypeError):
        remove_placement_group("not a group")
    with pytest.raises(ValueError):
        get_placement_group("")


def test_a_group_stays_pending_until_its_resources_are_free(rt4):
    a = Holder.options(num_cpus=4).remote()
    ray.get(a.ping.remote(), timeout=T)
    pg = placement_group([{"CPU": 2}])
    assert pg.wait(NOT_YET) is False
    assert placement_group_table(pg)["state"] == "PENDING"
    ray.kill(a)
    assert pg.wait(T) is True
    assert placement_group_table(pg)["state"] == "CREATED"


def test_tasks_in_a_group_take_from_its_bundles(rt4):
    pg = placement_group([{"CPU": 1}, {"CPU": 2}])
    assert pg.wait(T)
    assert ray.get([one.options(scheduling_strategy=in_pg(pg, 0)).remote(),
                    one.options(num_cpus=2, scheduling_strategy=in_pg(pg)).remote(),
                    one.options(num_cpus=2, scheduling_strategy=in_pg(pg, 1)).remote()],
                   timeout=T) == [1, 1, 1]
    # Ray's older spelling of the same.
    assert ray.get(one.options(placement_group=pg, placement_group_bundle_index=1).remote(),
                   timeout=T) == 1
    # The node's CPU outside the group is still there for other tasks.
    assert ray.get(one.remote(), timeout=T) == 1
    with pytest.raises(ValueError, match="could never run"):
        one.options(num_cpus=2, scheduling_strategy=in_pg(pg, 0)).remote()
    with pytest.raises(ValueError, match="out of range"):
        one.options(scheduling_strategy=in_pg(pg, 2)).remote()
    with pytest.raises(ValueError):
        one.options(scheduling_strategy=in_pg(pg, -2))


def test_a_task_waits_for_room_in_its_bundle(rt4):
    pg = placement_group([{"CPU": 1}])
    a = Holder.options(num_cpus=1, scheduling_strategy=in_pg(pg)).remote()
    ray.get(a.ping.remote(), timeout=T)
    ref = one.options(scheduling_strategy=in_pg(pg)).remote()
    assert ray.wait([ref], timeout=NOT_YET)[0] == []
    ray.kill(a)
    assert ray.get(ref, timeout=T) == 1


def test_removing_a_group_kills_its_actors_and_fails_its_waiting_tasks(rt4):
    pg = placement_group([{"CPU": 1}])
    a = Holder.options(num_cpus=1, scheduling_strategy=in_pg(pg)).remote()
    ray.get(a.ping.remote(), timeout=T)
    waiting = one.options(scheduling_strategy=in_pg(pg)).remote()
    remove_placement_group(pg)
    with pytest.raises(RayActorError):
        ray.get(a.ping.remote(), timeout=T)
    with pytest.raises(ValueError, match="removed"):
        ray.get(waiting, timeout=T)
    with pytest.raises(ValueError, match="removed"):
        one.options(scheduling_strategy=in_pg(pg)).remote()
    assert scheduled(rt4.resources.available_resources()) == {"CPU": 4, "x": 2}


def test_removing_a_group_kills_its_running_tasks(rt4):
    from ray_lite.exceptions import WorkerCrashedError
    from ray_lite.util.queue import Queue

    @ray.remote
    def started_then_hangs(q):
        import time
        q.put("started")
        time.sleep(300)    # the workload: the group's removal ends it
    pg = placement_group([{"CPU": 1}])
    q = Queue()
    running = started_then_hangs.options(scheduling_strategy=in_pg(pg)).remote(q)
    assert q.get(timeout=T) == "started"
    remove_placement_group(pg)
    with pytest.raises(WorkerCrashedError):    # as in Ray; it ran on, holding its CPU
        ray.get(running, timeout=T)
    assert ray.get(one.remote(), timeout=T) == 1
    assert scheduled(rt4.resources.available_resources()) == {"CPU": 4, "x": 2}


def test_a_groups_id_is_rays_id_object(rt4):
    pg = placement_group([{"CPU": 1}])
    assert len(pg.id.binary()) == 18 and pg.id.hex() == pg.id.binary().hex()
    assert placement_group_table(pg)["placement_group_id"] == pg.id.hex()
    assert PlacementGroup(pg.id) == pg and PlacementGroup.empty().is_empty
    with pytest.raises(ValueError, match="bundle index must be -1"):
        one.options(placement_group_bundle_index=0).remote()


def test_placement_groups_from_inside_a_task(rt4):
    @ray.remote
    def make():
        pg = placement_group([{"CPU": 1}], name="inner")
        ok = pg.wait(T)
        value = ray.get(one.options(scheduling_strategy=in_pg(pg)).remote(), timeout=T)
        return ok, value, pg
    ok, value, pg = ray.get(make.remote(), timeout=T)
    assert (ok, value) == (True, 1)
    assert get_placement_group("inner") == pg


def test_node_affinity_for_the_local_node(rt4):
    me = local_node_id(os.getpid())
    assert ray.get(one.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(me, soft=False)).remote(),
        timeout=T) == 1
    other = "ab" * 28
    with pytest.raises(ValueError, match="soft=True"):
        one.options(scheduling_strategy=NodeAffinitySchedulingStrategy(other, soft=False))
    assert ray.get(one.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(other, soft=True)).remote(),
        timeout=T) == 1
    h = Holder.options(scheduling_strategy=NodeAffinitySchedulingStrategy(me, soft=False))
    assert ray.get(h.remote().ping.remote(), timeout=T)
    # The NodeID object itself (``get_runtime_context().node_id``), as Ray takes it.
    node_id = ray.get_runtime_context().node_id
    assert not isinstance(node_id, str)
    assert ray.get(one.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
        node_id, soft=False)).remote(), timeout=T) == 1


def test_node_label_strategy_on_the_one_nodes_labels(rt4):
    from ray_lite.util.scheduling_strategies import (DoesNotExist, Exists, In,
                                                     NodeLabelSchedulingStrategy, NotIn)
    me = local_node_id(os.getpid())
    assert ray.nodes()[0]["Labels"] == {"ray.io/node-id": me}      # Ray's default label
    for hard in ({"ray.io/node-id": In(me)}, {"ray.io/node-id": Exists()},
                 {"region": DoesNotExist()}, {"region": NotIn("us")}):
        s = NodeLabelSchedulingStrategy(hard)
        assert ray.get(one.options(scheduling_strategy=s).remote(), timeout=T) == 1
    # Soft constraints only prefer: it runs on the one node.
    soft = NodeLabelSchedulingStrategy({}, soft={"gpu": Exists()})
    assert ray.get(one.options(scheduling_strategy=soft).remote(), timeout=T) == 1
    h = Holder.options(scheduling_strategy=NodeLabelSchedulingStrategy(
        {"ray.io/node-id": In(me)}))
    assert ray.get(h.remote().ping.remote(), timeout=T)
    with pytest.raises(ValueError, match=r"do not match the hard constraints on \['region'\]"):
        one.options(scheduling_strategy=NodeLabelSchedulingStrategy({"region": In("us")}))
    with pytest.raises(ValueError, match="do not match"):
        Holder.options(scheduling_strategy=NodeLabelSchedulingStrategy({"gpu": Exists()}))
    # Ray's checks.
    with pytest.raises(ValueError, match="cannot both be empty"):
        NodeLabelSchedulingStrategy({})
    with pytest.raises(ValueError, match="must be one of the `In`"):
        NodeLabelSchedulingStrategy({"k": "v"})
    with pytest.raises(ValueError, match="non-empty tuple"):
        In()
    with pytest.raises(ValueError, match="must be str"):
        NotIn("a", 1)


def test_label_selector_and_its_fallbacks_on_the_one_nodes_labels(rt4):
    """Ray's label_selector: matched against the node's labels; one that no
    node matches (nor any of its fallbacks) is refused when declared, where
    Ray would leave the task or actor pending for good."""
    me = local_node_id(os.getpid())
    for selector in ({"ray.io/node-id": me}, {"ray.io/node-id": f"in(other, {me})"},
                     {"ray.io/node-id": "!other"}, {"region": "!us"},
                     {"region": "!in(us, eu)"}):
        assert ray.get(one.options(label_selector=selector).remote(), timeout=T) == 1
    h = Holder.options(label_selector={"ray.io/node-id": me}).remote()
    assert ray.get(h.ping.remote(), timeout=T)
    for selector in ({"region": "us"}, {"region": "in(us, eu)"}, {"ray.io/node-id": f"!{me}"},
                     {"ray.io/node-id": f"!in(x,{me})"}, {"ray.io/node-id": "other"}):
        with pytest.raises(ValueError, match="matches no node: this task could never run"):
            one.options(label_selector=selector)
    with pytest.raises(ValueError, match="matches no node: this actor could never run"):
        Holder.options(label_selector={"gpu": "a100"})
    # A fallback that matches lets it run; none that does, refused.
    fallback = [{"label_selector": {"region": "eu"}}, {"label_selector": {"ray.io/node-id": me}}]
    assert ray.get(one.options(label_selector={"region": "us"},
                               fallback_strategy=fallback).remote(), timeout=T) == 1
    with pytest.raises(ValueError, match="and its fallback_strategy match no node"):
        one.options(label_selector={"region": "us"},
                    fallback_strategy=[{"label_selector": {"region": "eu"}}])


@pytest.mark.parametrize("opts, error, words", [
    ({"label_selector": "region=us"}, TypeError, "keyword 'label_selector' must be"),
    ({"label_selector": {"bad key!": "x"}}, ValueError, "Invalid label key name `bad key!`"),
    ({"label_selector": {"-a/b": "x"}}, ValueError, "Invalid label key prefix `-a`"),
    ({"label_selector": {"a": "in()"}}, ValueError, "Invalid label selector value `in\\(\\)`"),
    ({"label_selector": {"a": "!!x"}}, ValueError, "Invalid label selector value `!!x`"),
    ({"label_selector": {"a": "x" * 64}}, ValueError, "Invalid label selector value"),
    ({"fallback_strategy": {"label_selector": {}}}, TypeError,
     "keyword 'fallback_strategy' must be"),
    ({"fallback_strategy": [{}]}, ValueError, "Empty dictionary found in `fallback_strategy`"),
    ({"fallback_strategy": [{"num_cpus": 1}]}, ValueError, "Unsupported option found: 'num_cpus'"),
    ({"fallback_strategy": ["x"]}, ValueError, "Each element in fallback_strategy must be"),
    ({"fallback_strategy": [{"label_selector": {"a": "in(,)"}}]}, ValueError,
     "Invalid label selector value"),
])
def test_malformed_label_options_get_rays_errors(rt4, opts, error, words):
    with pytest.raises(error, match=words):
        one.options(**opts)
    with pytest.raises(error, match=words):
        Holder.options(**opts)


def test_bundle_label_selector_on_the_one_nodes_labels(rt4):
    """A selector per bundle, matched as label_selector: a group one of whose
    bundles the node does not match is refused (Ray: pending for good)."""
    me = local_node_id(os.getpid())
    pg = placement_group([{"CPU": 1}, {"CPU": 1}],
                         bundle_label_selector=[{"ray.io/node-id": me}, {"region": "!us"}])
    ray.get(pg.ready(), timeout=T)
    assert ray.get(one.options(scheduling_strategy=in_pg(pg, 1)).remote(), timeout=T) == 1
    remove_placement_group(pg)
    with pytest.raises(ValueError, match=r"bundle_label_selector\[1\]=\{'region': 'us'\} "
                                         r"matches no node: this placement group could never"):
        placement_group([{"CPU": 1}, {"CPU": 1}],
                        bundle_label_selector=[{"ray.io/node-id": me}, {"region": "us"}])
    assert placement_group_table() == {pg.id.hex(): placement_group_table(pg)}   # none added


@pytest.mark.parametrize("selectors, words", [
    ([], "The length of `bundle_label_selector` should equal the length of `bundles`"),
    ({"a": "b"}, "bundle_label_selector must be a list, got <class 'dict'>"),
    ([{"a": 1}], "must be a list of string dictionary label selectors"),
    ([{"bad key!": "x"}], "Detailed error: 'Invalid label key name `bad key!`"),
    ([{"a": "in()"}], "Detailed error: 'Invalid label selector value `in\\(\\)`"),
])
def test_malformed_bundle_label_selectors_get_rays_errors(rt4, selectors, words):
    with pytest.raises(ValueError, match=words):
        placement_group([{"CPU": 1}], bundle_label_selector=selectors)


def test_an_actor_in_a_pending_group_starts_when_the_group_is_created(rt4):
    holder = Holder.options(num_cpus=4).remote()
    ray.get(holder.ping.remote(), timeout=T)
    pg = placement_group([{"CPU": 1}])

    @ray.remote(num_cpus=0)
    def start_in_group(pg):
        a = Holder.options(scheduling_strategy=in_pg(pg)).remote()
        return ray.get(a.ping.remote(), timeout=T)
    ref = start_in_group.remote(pg)
    assert ray.wait([ref], timeout=NOT_YET)[0] == []
    ray.kill(holder)
    assert isinstance(ray.get(ref, timeout=T), int)


@ray.remote
def where_placed():
    from ray_lite.util import get_current_placement_group
    ctx = ray.get_runtime_context()
    return (get_current_placement_group(), ctx.get_placement_group_id(),
            ctx.current_placement_group_id.hex())


@ray.remote
class Placed:
    def where(self):
        return ray.get(where_placed.remote()), ray.get_runtime_context().get_placement_group_id()


def test_a_task_and_an_actor_see_the_group_they_run_in(rt4):
    from ray_lite.util import get_current_placement_group
    pg = placement_group([{"CPU": 1}, {"CPU": 1}])
    ray.get(pg.ready(), timeout=T)
    found, pg_id, id_hex = ray.get(where_placed.options(scheduling_strategy=in_pg(pg)).remote(),
                                   timeout=T)
    assert found == pg and pg_id == id_hex == pg.id.hex()
    assert found.bundle_specs == [{"CPU": 1}, {"CPU": 1}]
    # Outside a group, and in the driver: none.
    nil = ray.PlacementGroupID.nil().hex()
    assert ray.get(where_placed.remote(), timeout=T) == (None, None, nil)
    assert get_current_placement_group() is None
    assert ray.get_runtime_context().get_placement_group_id() is None
    # An actor placed in it; a task it starts is not (Ray's capture is not done).
    a = Placed.options(scheduling_strategy=in_pg(pg, 1), num_cpus=1).remote()
    child, own = ray.get(a.where.remote(), timeout=T)
    assert own == pg.id.hex() and child == (None, None, nil)
    ray.kill(a)
    remove_placement_group(pg)


@ray.remote
def pg_of_child(opts, depth=1):
    """Where a child (with ``opts``) of this task runs, and its own child's
    place when ``depth`` > 1; and whether this task captures its children."""
    from ray_lite.util import get_current_placement_group
    here = get_current_placement_group()
    child = ray.get(pg_of_child.options(**opts).remote({}, depth - 1)) if depth else None
    return (here.id.hex() if here else None,
            ray.get_runtime_context().should_capture_child_tasks_in_placement_group, child)


@ray.remote
class ActorChild:
    def where(self):
        return ray.get_runtime_context().get_placement_group_id()


@ray.remote
def actor_child_of(opts):
    a = ActorChild.options(**opts).remote()
    try:
        return ray.get(a.where.remote())
    finally:
        ray.kill(a)


def test_a_capturing_task_places_its_children_in_its_group(rt4):
    pg = placement_group([{"CPU": 1}] * 3)
    ray.get(pg.ready(), timeout=T)
    me = pg.id.hex()
    capturing = PlacementGroupSchedulingStrategy(pg, placement_group_capture_child_tasks=True)
    # A child with no strategy of its own goes into the group and captures in turn.
    got = ray.get(pg_of_child.options(scheduling_strategy=capturing).remote({}, 2), timeout=T)
    assert got == (me, True, (me, True, (me, True, None)))
    # A child that names a strategy (even the default) stays out, as in Ray.
    got = ray.get(pg_of_child.options(scheduling_strategy=capturing).remote(
        {"scheduling_strategy": "DEFAULT"}), timeout=T)
    assert got == (me, True, (None, False, None))
    # Ray's older options say the same; without capture the child is not placed.
    got = ray.get(pg_of_child.options(placement_group=pg,
                                      placement_group_capture_child_tasks=True).remote({}),
                  timeout=T)
    assert got == (me, True, (me, True, None))
    got = ray.get(pg_of_child.options(scheduling_strategy=in_pg(pg)).remote({}), timeout=T)
    assert got == (me, False, (None, False, None))
    # An actor a capturing task creates lives in the group too.
    assert ray.get(actor_child_of.options(scheduling_strategy=capturing).remote({}),
                   timeout=T) == me
    assert ray.get(actor_child_of.options(scheduling_strategy=capturing).remote(
        {"scheduling_strategy": "DEFAULT"}), timeout=T) is None
    # A capturing actor's tasks likewise, for as long as it lives.
    a = Placed.options(scheduling_strategy=capturing, num_cpus=1).remote()
    for _ in range(2):
        (found, child_id, _), own = ray.get(a.where.remote(), timeout=T)
        assert own == child_id == me and found == pg
    ray.kill(a)
    remove_placement_group(pg)
