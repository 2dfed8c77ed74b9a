"""Placement groups on one machine: the driver's side (``PlacementMixin``).

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


class PlacementMixin:
    """Creating, finding and removing placement groups (part of ``DriverNode``)."""

    def create_placement_group(self, bundles, strategy, name, lifetime):
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
        with self._sched:
            if strategy == "STRICT_SPREAD" and len(bundles) > 1:
                raise ValueError(f"A STRICT_SPREAD placement group of {len(bundles)} bundles "
                                 f"needs {len(bundles)} nodes; ray_lite runs on one")
            pg = PlacementGroupState(os.urandom(18).hex(), name, strategy, bundles)
            need = pg.need()
            for k, v in need.items():
                if self.total.get(k, 0) < v - 1e-9:
                    raise ValueError(f"The placement group {bundles} needs {need} in all, more "
                                     f"than this machine has ({self.total}): it could never "
                                     f"be created")
            if name:
                if name in self.pg_names:
                    raise ValueError(f"Failed to create placement group '{name}' because a "
                                     f"placement group with the same name already exists")
                self.pg_names[name] = pg.id
            self.pgs[pg.id] = pg
            if not self._reserve(pg):
                self.res_waiters.append(lambda: self._reserve(pg))
            return pg.id, bundles

    def _reserve(self, pg):
        """Reserve ``pg``'s resources if they are free; True once it is no longer pending."""
        if pg.state != "PENDING":
            return True
        need = pg.need()
        cpus = need.get(CPU, 0)
        custom = tuple((k, v) for k, v in need.items() if k != CPU)
        if self.cpu_cap - self.busy + 1e-9 < cpus or not _fits(self.free_custom, custom):
            return False
        self.cpu_cap = round(self.cpu_cap - cpus, 4)
        _take(self.free_custom, custom, 1)
        pg.state = "CREATED"
        if self.placed_queue:
            self.dispatch_placed()
        return True

    def remove_placement_group(self, pg_id):
        with self._sched:
            pg = self.pgs.get(pg_id)
            if pg is None or pg.state == "REMOVED":
                return
            was_created = pg.state == "CREATED"
            pg.state = "REMOVED"
            if self.pg_names.get(pg.name) == pg_id:
                del self.pg_names[pg.name]
            # Its actors die with it, as in Ray (and are not restarted); so do
            # its running tasks (not retried: their callers get WorkerCrashedError).
            for aid in list(pg.actors):
                self.kill_actor(aid, no_restart=True)
            for w in list(self.pool.values()):
                spec = w.task
                if spec is not None and spec.demand is not None and spec.demand.pg == pg_id:
                    spec.retries = 0
                    try:
                        os.kill(w.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            if was_created:
                need = pg.need()
                self.cpu_cap = round(self.cpu_cap + need.get(CPU, 0), 4)
                _take(self.free_custom, tuple((k, v) for k, v in need.items() if k != CPU), -1)
            # Tasks waiting for it fail (dispatch_placed sees it removed).
            self.resources_freed()

    def get_placement_group(self, name):
        with self._sched:
            pg_id = self.pg_names.get(name)
            if pg_id is None:
                raise ValueError(f"Failed to look up placement group with name: {name}")
            pg = self.pgs[pg_id]
            return pg.id, pg.bundles

    def placement_group_table(self, pg_id):
        with self._sched:
            if pg_id is not None:
                pg = self.pgs.get(pg_id)
                return {} if pg is None else pg.table()
            return {i: pg.table() for i, pg in self.pgs.items()}

    # ------------------------------------------------ capturing child tasks
    def captured_demand(self, peer, demand, kind):
        """What a child task or actor (``kind``) of ``peer`` asks for: its
        ``demand`` in ``peer``'s group when ``peer`` runs there capturing its
        children and the child named no strategy or group of its own (Ray's
        rule; the child captures its own children in turn); else ``demand``."""
        pg = self.captured.get(peer)
        if pg is None or (demand is not None and (demand.pg is not None or demand.pinned)):
            return demand
        if demand is None:
            return Demand(1 if kind == "task" else 0, (), pg, -1, explicit=False, capture=True)
        return Demand(demand.cpus, demand.custom, pg, -1, explicit=demand.explicit,
                      capture=True)

    def captured_actor_request(self, peer, request):
        """An actor creation ``request`` of ``peer`` with its demand captured."""
        extra = dict(request[10]) if len(request) > 10 and request[10] else {}
        extra["demand"] = self.captured_demand(peer, extra.get("demand"), "actor")
        return tuple(request[:10]) + (extra,) + tuple(request[11:])
