"""``ray_lite.util.state``: Ray's state API for what is running now.

``list_actors``, ``list_tasks``, ``list_objects``, ``list_workers``,
``list_nodes``, ``list_placement_groups`` and ``list_jobs`` ask the driver (one request) and
return one record per actor, task, object, process, node (this machine),
placement group or job (this one) with Ray's field names; ``get_<kind>(id)``
finds one by its id; a record reads both as a dict
(``a["state"]``) and by attribute (``a.state``), as Ray's state records do.
``summarize_tasks`` and ``summarize_actors`` count them by function or class
and state, in Ray's shape.  Unlike Ray, nothing is kept about what has
finished: actors that died, tasks and calls that returned, objects that were
freed and processes that ended are not listed.
"""
from ray_lite import _ray
from ray_lite._private.process import backend as _backend
from ray_lite._private.links import protocol as P
from ray_lite._private.process import state as _state
from ray_lite._private.process.ids import JOB_ID_HEX as _JOB_ID_HEX

__all__ = ["list_actors", "list_tasks", "list_objects", "list_workers", "list_nodes",
           "list_placement_groups", "list_jobs", "get_actor", "get_task", "get_job",
           "get_node", "get_worker", "get_placement_group", "get_objects", "summarize_tasks",
           "summarize_actors", "summarize_objects"]

DEFAULT_LIMIT = 100
_PREDICATES = {"=": lambda a, b: _same(a, b), "!=": lambda a, b: not _same(a, b)}


class StateRecord(dict):
    """One actor, task or object: a dict whose keys read as attributes too."""

    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None


def _same(value, wanted):
    # Ray's filters compare the text of a field ("pid", "=", "1234" matches).
    return value == wanted or str(value) == str(wanted)


def _check_filters(filters):
    for f in filters or ():
        if not (isinstance(f, (tuple, list)) and len(f) == 3):
            raise ValueError(f"A filter is (key, predicate, value), got {f!r}")
        if f[1] not in _PREDICATES:
            raise ValueError(f"Unsupported filter predicate {f[1]!r}: use '=' or '!='")


def _rows(what):
    node = _state.get_node()
    if what == "list_nodes":
        return [_node_row(n) for n in node.request(P.OP_INTROSPECT, "nodes")]
    if what == "list_placement_groups":
        return [_placement_group_row(t) for t in node.request(P.OP_PG_TABLE, None).values()]
    return node.request(P.OP_INTROSPECT, what)


def _node_row(n):
    return {"node_id": n["NodeID"], "node_ip": n["NodeManagerAddress"], "is_head_node": True,
            "state": "ALIVE", "state_message": None, "node_name": n["NodeName"],
            "resources_total": dict(n["Resources"]), "labels": dict(n["Labels"])}


def _placement_group_row(t):
    return {"placement_group_id": t["placement_group_id"], "name": t["name"],
            "creator_job_id": _JOB_ID_HEX, "state": t["state"],
            "strategy": t["strategy"], "is_detached": False, "stats": None,
            "bundles": [{"bundle_id": f"{t['placement_group_id']}:{i}", "node_id": None,
                         "unit_resources": dict(b)} for i, b in sorted(t["bundles"].items())]}


def _list(what, filters, limit, detail, raise_on_missing_output):
    _check_filters(filters)
    if not isinstance(limit, int) or limit < 0:
        raise ValueError(f"limit must be a non-negative int, got {limit!r}")
    rows = _rows(what)
    out = []
    for row in rows:
        if all(f[0] in row and _PREDICATES[f[1]](row[f[0]], f[2]) for f in filters or ()):
            out.append(StateRecord(row))
            if len(out) >= limit:
                break
    return out


def _listing(name, address, filters, limit, timeout, detail, raise_on_missing_output,
             _explain):
    # Ray's own listing on the Ray backend, the driver's tables here.
    if _backend.RAY:
        return _ray.util.state_function(name)(address, filters, limit, timeout, detail,
                                              raise_on_missing_output, _explain)
    return _list(name, filters, limit, detail, raise_on_missing_output)


def list_actors(address=None, filters=None, limit=DEFAULT_LIMIT, timeout=30, detail=False,
                raise_on_missing_output=True, _explain=False):
    """The live actors: ``actor_id``, ``class_name``, ``state`` ("ALIVE"),
    ``name``, ``pid``, ``ray_namespace``, ``job_id``, ``node_id``..."""
    return _listing("list_actors", address, filters, limit, timeout, detail,
                    raise_on_missing_output, _explain)


def list_tasks(address=None, filters=None, limit=DEFAULT_LIMIT, timeout=30, detail=False,
               raise_on_missing_output=True, _explain=False):
    """Tasks waiting or running (``task_id``, ``name``, ``state``, ``type``,
    ``worker_pid``...) and the actor calls the driver waits for."""
    return _listing("list_tasks", address, filters, limit, timeout, detail,
                    raise_on_missing_output, _explain)


def list_objects(address=None, filters=None, limit=DEFAULT_LIMIT, timeout=30, detail=False,
                 raise_on_missing_output=True, _explain=False):
    """Objects the driver owns that are still being computed or that other
    processes borrow (``object_id``, ``task_status``, ``pid``...)."""
    return _listing("list_objects", address, filters, limit, timeout, detail,
                    raise_on_missing_output, _explain)


def list_workers(address=None, filters=None, limit=DEFAULT_LIMIT, timeout=30, detail=False,
                 raise_on_missing_output=True, _explain=False):
    """The runtime's live processes: ``worker_id``, ``worker_type`` ("DRIVER"
    or "WORKER": pool workers and actors), ``pid``, ``is_alive``..."""
    return _listing("list_workers", address, filters, limit, timeout, detail,
                    raise_on_missing_output, _explain)


def list_nodes(address=None, filters=None, limit=DEFAULT_LIMIT, timeout=30, detail=False,
               raise_on_missing_output=True, _explain=False):
    """This machine, the head node: ``node_id``, ``node_ip``, ``state`` ("ALIVE"),
    ``resources_total``, ``labels``..."""
    return _listing("list_nodes", address, filters, limit, timeout, detail,
                    raise_on_missing_output, _explain)


def list_placement_groups(address=None, filters=None, limit=DEFAULT_LIMIT, timeout=30,
                          detail=False, raise_on_missing_output=True, _explain=False):
    """The placement groups made, removed ones too (``state`` "REMOVED", as
    Ray keeps them): ``placement_group_id``, ``name``, ``state``,
    ``strategy``, ``bundles`` (each ``unit_resources``)..."""
    return _listing("list_placement_groups", address, filters, limit, timeout, detail,
                    raise_on_missing_output, _explain)


def summarize_tasks(address=None, timeout=30, raise_on_missing_output=True, _explain=False):
    """Ray's task summary of what waits or runs, by function name: ``{"cluster":
    {"summary": {name: {"func_or_class_name", "type", "state_counts"}},
    "total_tasks", "total_actor_tasks", "total_actor_scheduled", "summary_by"}}``."""
    if _backend.RAY:
        return _ray.util.state_function("summarize_tasks")(address, timeout,
                                                           raise_on_missing_output, _explain)
    summary, totals = {}, {"NORMAL_TASK": 0, "ACTOR_TASK": 0, "ACTOR_CREATION_TASK": 0}
    for t in _rows("list_tasks"):
        name = t["func_or_class_name"]
        entry = summary.setdefault(name, {"func_or_class_name": name, "type": t["type"],
                                          "state_counts": {}})
        counts = entry["state_counts"]
        counts[t["state"]] = counts.get(t["state"], 0) + 1
        totals[t["type"]] = totals.get(t["type"], 0) + 1
    return {"cluster": {"summary": summary, "total_tasks": totals["NORMAL_TASK"],
                        "total_actor_tasks": totals["ACTOR_TASK"],
                        "total_actor_scheduled": totals["ACTOR_CREATION_TASK"],
                        "summary_by": "func_name"}}


def summarize_actors(address=None, timeout=30, raise_on_missing_output=True, _explain=False):
    """Ray's actor summary of the live actors, by class: ``{"cluster": {"summary":
    {class_name: {"class_name", "state_counts"}}, "total_actors", "summary_by"}}``."""
    if _backend.RAY:
        return _ray.util.state_function("summarize_actors")(address, timeout,
                                                            raise_on_missing_output, _explain)
    summary = {}
    actors = _rows("list_actors")
    for a in actors:
        entry = summary.setdefault(a["class_name"], {"class_name": a["class_name"],
                                                     "state_counts": {}})
        counts = entry["state_counts"]
        counts[a["state"]] = counts.get(a["state"], 0) + 1
    return {"cluster": {"summary": summary, "total_actors": len(actors),
                        "summary_by": "class"}}


def summarize_objects(address=None, timeout=30, raise_on_missing_output=True, _explain=False):
    """Ray's object summary of the objects held now, by call site (ray_lite
    records none: one key, "disabled", as Ray's without call sites):
    ``{"cluster": {"summary": {call_site: {"total_objects", "total_size_mb",
    "total_num_workers", "total_num_nodes", "task_state_counts",
    "ref_type_counts"}}, "total_objects", "total_size_mb",
    "callsite_enabled", "summary_by"}}``."""
    if _backend.RAY:
        return _ray.util.state_function("summarize_objects")(address, timeout,
                                                             raise_on_missing_output, _explain)
    summary, pids = {}, {}
    total_mb = 0.0
    objects = _rows("list_objects")
    for o in objects:
        key = o["call_site"] or "disabled"
        entry = summary.setdefault(key, {"total_objects": 0, "total_size_mb": 0.0,
                                         "total_num_workers": 0, "total_num_nodes": 1,
                                         "task_state_counts": {}, "ref_type_counts": {}})
        entry["total_objects"] += 1
        for field, value in (("task_state_counts", o["task_status"]),
                             ("ref_type_counts", o["reference_type"])):
            entry[field][value] = entry[field].get(value, 0) + 1
        if o["object_size"] is not None and o["object_size"] >= 0:
            entry["total_size_mb"] += o["object_size"] / 2**20
            total_mb += o["object_size"] / 2**20
        pids.setdefault(key, set()).add(o["pid"])
    for key, seen in pids.items():
        summary[key]["total_num_workers"] = len(seen)
    return {"cluster": {"summary": summary, "total_objects": len(objects),
                        "total_size_mb": total_mb, "callsite_enabled": False,
                        "summary_by": "callsite"}}


def get_objects(id, address=None, timeout=30, _explain=False):  # noqa: A002 - Ray's name
    """The records of the object with this hex id (a list, as Ray's: one per
    process that refers to it; here the driver's one)."""
    if _backend.RAY:
        return _ray.util.state_function("get_objects")(id, address, timeout, _explain)
    return _list("list_objects", [("object_id", "=", id)], DEFAULT_LIMIT, False, True)


def get_actor(id, address=None, timeout=30, _explain=False):  # noqa: A002 - Ray's name
    """The record of the actor with this hex id, or None."""
    return _get("actor", "actor_id", id, address, timeout, _explain)


def get_task(id, address=None, timeout=30, _explain=False):  # noqa: A002 - Ray's name
    """The record of the waiting or running task with this hex id, or None."""
    return _get("task", "task_id", id, address, timeout, _explain)


def list_jobs(address=None, filters=None, limit=DEFAULT_LIMIT, timeout=30, detail=False,
              raise_on_missing_output=True, _explain=False):
    """This job, as Ray lists a driver's job: ``job_id``, ``type`` ("DRIVER"),
    ``status`` ("RUNNING"), ``metadata`` (``JobConfig``'s), ``runtime_env``,
    ``start_time``, ``driver_info``..."""
    return _listing("list_jobs", address, filters, limit, timeout, detail,
                    raise_on_missing_output, _explain)


def _get(kind, key, id, address, timeout, _explain):   # noqa: A002
    if _backend.RAY:
        return _ray.util.state_function(f"get_{kind}")(id, address, timeout, _explain)
    found = _list(f"list_{kind}s", [(key, "=", id)], 1, False, True)
    return found[0] if found else None


def get_job(id, address=None, timeout=30, _explain=False):  # noqa: A002 - Ray's name
    """The record of the job submitted with this submission id, or None, as
    Ray's (a driver's job, the only kind here, has none: ``list_jobs``
    lists it)."""
    return _get("job", "submission_id", id, address, timeout, _explain)


def get_node(id, address=None, timeout=30, _explain=False):  # noqa: A002 - Ray's name
    """The record of the node with this hex id (this machine's), or None."""
    return _get("node", "node_id", id, address, timeout, _explain)


def get_worker(id, address=None, timeout=30, _explain=False):  # noqa: A002 - Ray's name
    """The record of the process with this worker id, or None."""
    return _get("worker", "worker_id", id, address, timeout, _explain)


def get_placement_group(id, address=None, timeout=30, _explain=False):  # noqa: A002
    """The record of the placement group with this hex id, or None."""
    return _get("placement_group", "placement_group_id", id, address, timeout, _explain)
