"""ray_lite.util.state: list_actors, list_tasks, list_objects for what is running."""
import asyncio
import os

import pytest

import ray_lite as ray
from ray_lite.util.state import get_actor, list_actors, list_objects, list_tasks

T = 60


@ray.remote
class Gate:
    def __init__(self):
        self.arrived = asyncio.Event()
        self.opened = asyncio.Event()

    async def arrive(self):
        self.arrived.set()
        await self.opened.wait()

    async def wait_arrived(self):
        await self.arrived.wait()

    async def open(self):
        self.opened.set()


@ray.remote
def held(gate):
    ray.get(gate.arrive.remote())
    return "released"


def test_list_actors(rt):
    g = Gate.options(name="the-gate", namespace="ns").remote()
    other = Gate.remote()
    ray.get([g.open.remote(), other.open.remote()], timeout=T)
    actors = list_actors()
    assert len(actors) == 2
    by_name = {a["name"]: a for a in actors}
    rec = by_name["the-gate"]
    assert rec["class_name"] == "Gate" and rec["state"] == "ALIVE"
    assert rec.state == "ALIVE"                         # attribute access, as in Ray
    assert rec["pid"] == g._info.pid and rec["ray_namespace"] == "ns"
    assert rec["job_id"] == ray.get_runtime_context().get_job_id()
    assert rec["node_id"] == ray.get_runtime_context().get_node_id()
    assert by_name[""]["pid"] == other._info.pid
    assert by_name[""]["ray_namespace"] == ray.get_runtime_context().namespace
    assert [a["name"] for a in list_actors(filters=[("name", "=", "the-gate")])] == ["the-gate"]
    assert len(list_actors(filters=[("state", "!=", "ALIVE")])) == 0
    assert len(list_actors(limit=1)) == 1
    assert get_actor(rec["actor_id"])["name"] == "the-gate"
    assert get_actor("ff" * 16) is None
    ray.kill(other)
    assert rt.wait_until(lambda: len(list_actors()) == 1, T)
    with pytest.raises(ValueError, match="predicate"):
        list_actors(filters=[("name", "~", "x")])


def test_list_tasks_and_objects(rt):
    gate = Gate.remote()
    ref = held.options(name="held-task").remote(gate)
    ray.get(gate.wait_arrived.remote(), timeout=T)
    tasks = list_tasks(filters=[("name", "=", "held-task")])
    assert len(tasks) == 1
    t = tasks[0]
    assert t["state"] == "RUNNING" and t["type"] == "NORMAL_TASK"
    assert t["worker_pid"] is not None and len(t["task_id"]) == 48
    objects = list_objects()
    assert ref.hex() in {o["object_id"] for o in objects}
    from ray_lite.util.state import get_objects, summarize_objects
    assert [o["object_id"] for o in get_objects(ref.hex())] == [ref.hex()]
    assert get_objects("00" * 12) == []
    s = summarize_objects()["cluster"]
    assert s["total_objects"] == len(objects) and not s["callsite_enabled"]
    assert sum(e["total_objects"] for e in s["summary"].values()) == len(objects)
    ray.get(gate.open.remote(), timeout=T)
    assert ray.get(ref, timeout=T) == "released"
    assert rt.wait_until(lambda: not list_tasks(filters=[("name", "=", "held-task")]), T)
    assert ref.hex() not in {o["object_id"] for o in list_objects()}
    # The gate's handle went to the task (its lease lent): not an object of the user's.
    assert gate._lease.hex() not in {o["object_id"] for o in objects}


def test_state_listing_from_a_task(rt):
    g = Gate.options(name="seen").remote()
    ray.get(g.open.remote(), timeout=T)

    @ray.remote
    def look():
        return [a["name"] for a in list_actors()], [t["name"] for t in list_tasks()]
    names, tasks = ray.get(look.remote(), timeout=T)
    assert names == ["seen"]
    assert [n for n in tasks if n.endswith("look")]     # the task sees itself running


def test_workers_nodes_and_placement_groups(rt):
    from ray_lite.util import placement_group, remove_placement_group
    from ray_lite.util.state import (get_node, get_placement_group, get_worker, list_nodes,
                                     list_placement_groups, list_workers)
    g = Gate.remote()
    ray.get(g.open.remote(), timeout=T)
    workers = list_workers()
    ctx = ray.get_runtime_context()
    assert [w["pid"] for w in workers if w["worker_type"] == "DRIVER"] == [os.getpid()]
    assert [w for w in workers if w["pid"] == g._info.pid][0]["worker_type"] == "WORKER"
    assert {w["worker_id"] for w in workers if w["pid"] == os.getpid()} == {ctx.get_worker_id()}
    assert all(w["is_alive"] and w["node_id"] == ctx.get_node_id() for w in workers)
    assert list_workers(filters=[("pid", "=", str(g._info.pid))])[0]["pid"] == g._info.pid
    assert get_worker(ctx.get_worker_id())["pid"] == os.getpid()
    assert get_worker("f" * 56) is None
    (node,) = list_nodes()
    assert get_node(ctx.get_node_id()) == node
    assert node.state == "ALIVE" and node.is_head_node and node.node_id == ctx.get_node_id()
    assert node.resources_total["CPU"] == 2
    pg = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="PACK", name="pair")
    ray.get(pg.ready(), timeout=T)
    (row,) = list_placement_groups(filters=[("name", "=", "pair")])
    assert row.state == "CREATED" and row.strategy == "PACK"
    assert [b["unit_resources"] for b in row.bundles] == [{"CPU": 1}, {"CPU": 1}]
    assert get_placement_group(pg.id.hex()) == row
    remove_placement_group(pg)
    # Kept, as in Ray, as removed.
    assert rt.wait_until(lambda: list_placement_groups(
        filters=[("name", "=", "pair")])[0].state == "REMOVED", T)
    ray.kill(g)
    assert rt.wait_until(lambda: g._info.pid not in {w["pid"] for w in list_workers()}, T)


def test_the_job_is_listed(rt):
    from ray_lite.util.state import get_job, list_jobs
    (job,) = list_jobs()
    assert job.job_id == ray.get_runtime_context().get_job_id()
    assert (job.type, job.status, job.metadata) == ("DRIVER", "RUNNING", {})
    assert job.driver_info["pid"] == str(os.getpid())
    # Ray's get_job finds a submitted job by its submission id; a driver's has none.
    assert job.submission_id is None and get_job(job.job_id) is None
    # From a task too (the driver answers).
    assert ray.get(_jobs_seen_in_a_task.remote(), timeout=T) == [job.job_id]


@ray.remote
def _jobs_seen_in_a_task():
    from ray_lite.util.state import list_jobs
    return [j["job_id"] for j in list_jobs()]


def test_summaries_and_named_actors(rt):
    from ray_lite.util import list_named_actors
    from ray_lite.util.state import summarize_actors, summarize_tasks
    gates = [Gate.options(name="g1").remote(), Gate.options(name="g2", namespace="other").remote(),
             Gate.remote()]
    ray.get([g.open.remote() for g in gates], timeout=T)
    gate = Gate.remote()
    refs = [held.options(name="held-task").remote(gate)]
    ray.get(gate.wait_arrived.remote(), timeout=T)
    actors = summarize_actors()["cluster"]
    assert actors["summary"]["Gate"] == {"class_name": "Gate", "state_counts": {"ALIVE": 4}}
    assert actors["total_actors"] == 4 and actors["summary_by"] == "class"
    tasks = summarize_tasks()["cluster"]
    assert tasks["summary"]["held-task"]["state_counts"] == {"RUNNING": 1}
    assert tasks["summary"]["held-task"]["type"] == "NORMAL_TASK"
    assert tasks["total_tasks"] == 1 and tasks["summary_by"] == "func_name"
    assert sorted(list_named_actors()) == ["g1"]
    assert sorted(list_named_actors(all_namespaces=True), key=lambda d: d["name"]) == [
        {"name": "g1", "namespace": ray.get_runtime_context().namespace},
        {"name": "g2", "namespace": "other"}]
    ray.get(gate.open.remote(), timeout=T)
    assert ray.get(refs, timeout=T) == ["released"]
