"""The driver's answers about the runtime's state (``request(OP_INTROSPECT, what, ...)``).

Every process asks the same way (in the driver the request is a call): the
runtime context, the resources, the state listings of ``util.state``.
Nothing here runs per task or per call.
"""
import itertools

from ..links import protocol as P
from ..process.errors import EXITED, actor_died_message
from ..process.ids import JOB_ID_HEX, NODE_IP, actor_id_hex, node_id_hex, task_id_hex, worker_id_hex
from ..scheduling import cluster


def requests(driver):
    """The request handlers this module adds to ``driver.requests``."""
    def introspect(peer, what, *args):
        return _ANSWERS[what](driver, peer, *args)

    def actor_exiting(peer):
        info = driver.actors.get(peer)
        if info is not None:
            driver.death_causes[peer] = actor_died_message(info, EXITED)
    return {P.OP_INTROSPECT: introspect, P.OP_ACTOR_EXITING: actor_exiting}


def _actor_info(driver, peer, actor_id):
    return driver.actors.get(actor_id)


def _demand_of(driver, peer):
    """(is a pool worker, the Demand of what the calling process runs or None)."""
    w = driver.pool.get(peer)
    if w is not None:
        return True, getattr(w.task, "demand", None)
    held = driver.resources.actor_demands.get(peer)
    return False, held[0] if held else None


def _assigned(driver, peer):
    """The resources the calling process holds (Ray: 1 CPU for a task, none for an actor)."""
    is_task, demand = _demand_of(driver, peer)
    if demand is not None:
        return {k: float(v) for k, v in demand.as_dict().items()}
    return {"CPU": 1.0} if is_task else {}


def _placement(driver, peer):
    """The placement group the calling task or actor runs in: (id, its bundles,
    whether its children go there too), or None."""
    _, demand = _demand_of(driver, peer)
    pg = driver.placement.groups.get(demand.pg) if demand is not None and demand.pg else None
    return None if pg is None else (pg.id, pg.bundles, demand.capture)


def _restarted(driver, peer, actor_id):
    record = driver.actor_restarts.records.get(actor_id)
    return bool(record is not None and getattr(record, "count", 0))


def _resources(driver, peer):
    return cluster.resources(driver)


def _nodes(driver, peer):
    return cluster.node_table(driver)


def _list_actors(driver, peer):
    node_id = node_id_hex(driver.driver_pid)
    out = []
    for aid, info in sorted(driver.actors.items()):
        out.append({
            "actor_id": actor_id_hex(aid), "class_name": info.class_name, "state": "ALIVE",
            "job_id": JOB_ID_HEX, "name": info.name or "", "node_id": node_id,
            "pid": info.pid, "ray_namespace": info.namespace, "serialized_runtime_env": "{}",
            "required_resources": {}, "death_cause": None, "is_detached": False,
            "placement_group_id": None, "repr_name": "", "num_restarts": _restarts(driver, aid),
        })
    return out


def _restarts(driver, aid):
    record = driver.actor_restarts.records.get(aid)
    return getattr(record, "count", 0) if record is not None else 0


def _task_row(driver, oid, name, state, kind, pid=None, worker=None, actor_id=None):
    node_hex = node_id_hex(driver.driver_pid)
    return {
        "task_id": task_id_hex(oid), "attempt_number": 0, "name": name, "state": state,
        "job_id": JOB_ID_HEX, "actor_id": actor_id, "type": kind,
        "func_or_class_name": name, "parent_task_id": None, "node_id": node_hex,
        "worker_id": worker_id_hex(node_hex, worker) if worker is not None else None,
        "worker_pid": pid, "error_type": None, "language": "PYTHON",
    }


def _list_tasks(driver, peer):
    """Pool tasks that wait or run, and the actor calls the driver waits for."""
    out = []
    with driver._sched:
        for w in driver.pool.values():
            spec = w.task
            if spec is not None:
                out.append(_task_row(driver, spec.oid, spec.name, "RUNNING", "NORMAL_TASK",
                                     w.pid, w.id))
        for spec in itertools.chain(driver.book.nested_queue, driver.book.queue):
            if not spec.cancelled:
                out.append(_task_row(driver, spec.oid, spec.name, "PENDING_NODE_ASSIGNMENT",
                                     "NORMAL_TASK"))
        for spec in driver.dispatch.waiting_deps.values():
            out.append(_task_row(driver, spec.oid, spec.name, "PENDING_ARGS_AVAIL",
                                 "NORMAL_TASK"))
    for aid, fl in list(driver.inflight.items()):
        info = driver.actors.get(aid)
        if info is None:
            continue
        for oid, kind in list(fl.items()):
            if kind in (P.ACTOR_CALL, P.STREAM):
                # The method's name stays with the call, not in the driver's tables.
                out.append(_task_row(driver, oid, info.class_name, "SUBMITTED_TO_WORKER",
                                     "ACTOR_TASK", info.pid, aid, actor_id_hex(aid)))
    return out


def _list_objects(driver, peer):
    """Objects the driver owns that a task or call still has to fill, or that it lent."""
    out = []
    for oid, target in list(driver.pending.items()):
        n = len(target) if type(target) is list else 1
        for i in range(n):
            out.append(_object_row(driver, oid + i, "PENDING_OBJECT_CREATION"))
    from ..actors.lease import _ActorLease
    for oid, rec in list(driver.objects.exported.items()):
        if type(rec[0]) is not _ActorLease:     # what keeps an actor: not a user's object
            out.append(_object_row(driver, oid, "FINISHED"))
    return out


def _list_workers(driver, peer):
    """The runtime's processes: the driver, pool workers, actors (all alive)."""
    node_hex = node_id_hex(driver.driver_pid)
    procs = [(0, driver.driver_pid, "DRIVER")]
    with driver._sched:
        procs += [(w.id, w.pid, "WORKER") for w in driver.pool.values()]
    procs += [(aid, info.pid, "WORKER") for aid, info in sorted(driver.actors.items())
              if info.pid]
    return [{"worker_id": worker_id_hex(node_hex, wid), "is_alive": True,
             "worker_type": kind, "exit_type": None, "node_id": node_hex, "ip": NODE_IP,
             "pid": pid, "exit_detail": None} for wid, pid, kind in procs]


def _list_jobs(driver, peer):
    """This job (the one driver): Ray's job record, ``type`` "DRIVER"."""
    job = getattr(driver, "job", None) or {}
    return [{"job_id": JOB_ID_HEX, "submission_id": None, "type": "DRIVER",
             "status": "RUNNING", "entrypoint": job.get("entrypoint", ""), "message": None,
             "error_type": None, "start_time": job.get("start_time_ms"), "end_time": None,
             "metadata": dict(job.get("metadata") or {}),
             "runtime_env": dict(job.get("runtime_env") or {}),
             "driver_info": {"id": JOB_ID_HEX, "node_ip_address": NODE_IP,
                             "pid": str(driver.driver_pid)},
             "driver_node_id": node_id_hex(driver.driver_pid), "driver_exit_code": None}]


def _object_row(driver, oid, status):
    return {"object_id": f"{driver.id & 0xffffffff:08x}{oid:016x}", "object_size": None,
            "task_status": status, "reference_type": "LOCAL_REFERENCE", "call_site": "",
            "type": "DRIVER", "pid": driver.driver_pid, "ip": NODE_IP}


_ANSWERS = {
    "actor_info": _actor_info, "assigned": _assigned, "restarted": _restarted,
    "placement": _placement,
    "resources": _resources, "nodes": _nodes, "list_actors": _list_actors,
    "list_tasks": _list_tasks, "list_objects": _list_objects, "list_workers": _list_workers,
    "list_jobs": _list_jobs,
}
