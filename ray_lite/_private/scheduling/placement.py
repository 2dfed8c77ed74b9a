"""Placement groups on one machine: the driver's side (``PlacementGroups``, a
part of the driver's node: ``driver.placement``).

A group reserves the sum of its bundles from the node when it is created
(at once if that much is free, else as soon as it is: until then it is
PENDING); tasks and actors scheduled into it take from its bundles.  Every
strategy puts all bundles on this one node, so STRICT_SPREAD with more than
one bundle can never be placed and is refused, as is a group bigger than the
machine (Ray would leave both pending for ever).
"""
import os
import signal

from .scheduler import CPU, Demand, PlacementGroupState, _fits, _take, check_resource_dict

STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


def check_bundles(bundles):
    """``bundles`` validated: a non-empty list of non-empty {resource: amount}."""
    if not isinstance(bundles, (list, tuple)) or not bundles:
        raise ValueError("The placement group `bundles` argument must be a non-empty list "
                         f"of dicts, got {bundles!r}")
    out = []
    for i, b in enumerate(bundles):
        if not isinstance(b, dict) or not b:
            raise ValueError(f"Bundles cannot be an empty dictionary or a non-dict: "
                             f"bundle {i} is {b!r}")
        custom = check_resource_dict({k: v for k, v in b.items() if k not in (CPU, "GPU")},
                                     f"bundle {i}")
        for k in (CPU, "GPU"):
            if k in b:
                v = b[k]
                if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                    raise ValueError(f"bundle {i}: {k} must be a non-negative number, "
                                     f"got {v!r}")
                custom[k] = v
        if all(v == 0 for v in custom.values()):
            raise ValueError(f"Bundle {i} has only zero resources {b!r}: a bundle must "
                             f"ask for something")
        out.append(custom)
    return out


class PlacementGroups:
    """Creating, finding and removing placement groups.  Owns the groups; the
    resources they reserve are the driver's ledger (``driver.resources``,
    ``scheduler.py``)."""

    def __init__(self, driver):
        self.driver = driver
        self.groups = {}        # pg id -> PlacementGroupState
        self.names = {}         # name -> pg id

    def create(self, bundles, strategy, name, lifetime):
        d = self.driver
        bundles = check_bundles(bundles)
        if strategy not in STRATEGIES:
            raise ValueError(f"Invalid placement group strategy {strategy!r}; valid ones "
                             f"are {list(STRATEGIES)}")
        if lifetime not in (None, "detached"):
            raise ValueError(f"Placement group `lifetime` argument must be either `None` or "
                             f"'detached'. Got {lifetime!r}.")
        # (Every group here lives until removed or the runtime ends: a
        # detached one is no different.)
        if not isinstance(name, str):
            raise TypeError(f"placement group name must be a str, got {name!r}")
        with d._sched:
            if strategy == "STRICT_SPREAD" and len(bundles) > 1:
                raise ValueError(f"A STRICT_SPREAD placement group of {len(bundles)} bundles "
                                 f"needs {len(bundles)} nodes; ray_lite runs on one")
            pg = PlacementGroupState(os.urandom(18).hex(), name, strategy, bundles)
            need = pg.need()
            total = d.resources.total
            for k, v in need.items():
                if total.get(k, 0) < v - 1e-9:
                    raise ValueError(f"The placement group {bundles} needs {need} in all, more "
                                     f"than this machine has ({total}): it could never "
                                     f"be created")
            if name:
                if name in self.names:
                    raise ValueError(f"Failed to create placement group '{name}' because a "
                                     f"placement group with the same name already exists")
                self.names[name] = pg.id
            self.groups[pg.id] = pg
            if not self._reserve(pg):
                d.book.res_waiters.append(lambda: self._reserve(pg))
            return pg.id, bundles

    def _reserve(self, pg):
        """Reserve ``pg``'s resources if they are free; True once it is no longer pending."""
        if pg.state != "PENDING":
            return True
        resources = self.driver.resources
        book = resources.book
        need = pg.need()
        cpus = need.get(CPU, 0)
        custom = tuple((k, v) for k, v in need.items() if k != CPU)
        if book.cpu_cap - book.busy + 1e-9 < cpus or not _fits(resources.free_custom, custom):
            return False
        book.cpu_cap = round(book.cpu_cap - cpus, 4)
        _take(resources.free_custom, custom, 1)
        pg.state = "CREATED"
        if book.placed_queue:
            resources.dispatch_placed()
        return True

    def remove(self, pg_id):
        d = self.driver
        with d._sched:
            pg = self.groups.get(pg_id)
            if pg is None or pg.state == "REMOVED":
                return
            was_created = pg.state == "CREATED"
            pg.state = "REMOVED"
            if self.names.get(pg.name) == pg_id:
                del self.names[pg.name]
            # Its actors die with it, as in Ray (and are not restarted); so do
            # its running tasks (not retried: their callers get WorkerCrashedError).
            for aid in list(pg.actors):
                d.kill_actor(aid, no_restart=True)
            for w in list(d.pool.values()):
                spec = w.task
                if spec is not None and spec.demand is not None and spec.demand.pg == pg_id:
                    spec.retries = 0
                    try:
                        os.kill(w.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            resources = d.resources
            if was_created:
                need = pg.need()
                resources.book.cpu_cap = round(resources.book.cpu_cap + need.get(CPU, 0), 4)
                _take(resources.free_custom,
                      tuple((k, v) for k, v in need.items() if k != CPU), -1)
            # Tasks waiting for it fail (dispatch_placed sees it removed).
            resources.freed()

    def get(self, name):
        d = self.driver
        with d._sched:
            pg_id = self.names.get(name)
            if pg_id is None:
                raise ValueError(f"Failed to look up placement group with name: {name}")
            pg = self.groups[pg_id]
            return pg.id, pg.bundles

    def table(self, pg_id):
        d = self.driver
        with d._sched:
            if pg_id is not None:
                pg = self.groups.get(pg_id)
                return {} if pg is None else pg.table()
            return {i: pg.table() for i, pg in self.groups.items()}


# ------------------------------------------------ capturing child tasks
# ``captured``: the resource ledger's map of the processes that run in a
# group capturing their children -> that group.

def captured_demand(captured, peer, demand, kind):
    """What a child task or actor (``kind``) of ``peer`` asks for: its
    ``demand`` in ``peer``'s group when ``peer`` runs there capturing its
    children and the child named no strategy or group of its own (Ray's
    rule; the child captures its own children in turn); else ``demand``."""
    pg = captured.get(peer)
    if pg is None or (demand is not None and (demand.pg is not None or demand.pinned)):
        return demand
    if demand is None:
        return Demand(1 if kind == "task" else 0, (), pg, -1, explicit=False, capture=True)
    return Demand(demand.cpus, demand.custom, pg, -1, explicit=demand.explicit, capture=True)


def captured_actor_request(captured, peer, request):
    """An actor creation ``request`` of ``peer`` with its demand captured."""
    extra = dict(request[10]) if len(request) > 10 and request[10] else {}
    extra["demand"] = captured_demand(captured, peer, extra.get("demand"), "actor")
    return tuple(request[:10]) + (extra,) + tuple(request[11:])
