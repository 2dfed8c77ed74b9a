"""``ray_lite.util.state``: Ray's state API for what is running now.

``list_actors``, ``list_tasks`` and ``list_objects`` ask the driver (one
request) and return one record per actor, task or object with Ray's field
names; a record reads both as a dict (``a["state"]``) and by attribute
(``a.state``), as Ray's state records do.  Unlike Ray, nothing is kept
about what has finished: actors that died, tasks and calls that returned and
objects that were freed are not listed.
"""
from ray_lite import _ray
from ray_lite._private import backend as _backend
from ray_lite._private import protocol as P
from ray_lite._private import state as _state

__all__ = ["list_actors", "list_tasks", "list_objects", "get_actor", "get_task"]

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


def _list(what, filters, limit, detail, raise_on_missing_output):
    _check_filters(filters)
    if not isinstance(limit, int) or limit < 0:
        raise ValueError(f"limit must be a non-negative int, got {limit!r}")
    rows = _state.get_node().request(P.OP_INTROSPECT, what)
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


def get_actor(id, address=None, timeout=30, _explain=False):  # noqa: A002 - Ray's name
    """The record of the actor with this hex id, or None."""
    if _backend.RAY:
        return _ray.util.state_function("get_actor")(id, address, timeout, _explain)
    found = list_actors(filters=[("actor_id", "=", id)], limit=1)
    return found[0] if found else None


def get_task(id, address=None, timeout=30, _explain=False):  # noqa: A002 - Ray's name
    """The record of the waiting or running task with this hex id, or None."""
    if _backend.RAY:
        return _ray.util.state_function("get_task")(id, address, timeout, _explain)
    found = list_tasks(filters=[("task_id", "=", id)], limit=1)
    return found[0] if found else None
