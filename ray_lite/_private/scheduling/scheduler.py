"""Resources on one machine: what tasks, actors and placement groups ask for, and
the driver's ledger of what is free.

The common task (``num_cpus=1``, no custom resources, no strategy) has no
``Demand``: the driver counts it with the pool book's ``busy`` alone.
Anything else carries a ``Demand``, worked out once per set of options, and
goes through ``Resources`` (``driver.resources``).

Ray's rules kept here:
- a task takes 1 CPU unless it says otherwise; ``num_cpus`` may be a fraction;
- an actor takes 1 CPU to be *scheduled* and 0 while it *runs*, unless it
  sets ``num_cpus`` (or ``resources``), which it then holds for its lifetime;
- a task or actor in a placement group takes its resources from the group's
  bundles, which the group reserved from the node when it was created.

Where Ray would wait for ever (a request no node can ever satisfy), ray_lite
refuses with ``ValueError``: on one machine "never" is certain.
"""
import os

from ..links.protocol import START
from ..process.ids import node_id_hex
from .labels import check_label_options, check_labels_match


CPU = "CPU"
GPU = "GPU"
_EPS = 1e-9
_BUILTIN = {CPU, GPU, "memory", "object_store_memory"}


class Demand:
    """What a task or actor asks for beyond the default (picklable: nested tasks
    send theirs to the driver).  ``pg``: a placement group id; ``bundle``: its
    bundle index, -1 for any.  ``capture``: its child tasks and actors go into
    ``pg`` too (``placement_group_capture_child_tasks``); ``pinned``: its
    options named a strategy or group, so a capturing parent's group does
    not take it (both as in Ray; see ``placement.captured_demand``)."""

    __slots__ = ("cpus", "custom", "pg", "bundle", "explicit", "capture", "pinned")

    def __init__(self, cpus, custom, pg=None, bundle=-1, explicit=True, capture=False,
                 pinned=False):
        self.cpus = cpus
        self.custom = custom        # ((name, amount), ...)
        self.pg = pg
        self.bundle = bundle
        self.explicit = explicit    # an actor asked for resources (it holds them)
        self.capture = capture
        self.pinned = pinned

    def __reduce__(self):
        return (Demand, (self.cpus, self.custom, self.pg, self.bundle, self.explicit,
                         self.capture, self.pinned))

    def as_dict(self):
        d = {CPU: self.cpus} if self.cpus else {}
        d.update(self.custom)
        return d


def _amount(key, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"{key} must be a non-negative number, got {value!r}")
    if value > 1 and value != int(value):
        raise ValueError(f"{key}: a quantity above 1 must be a whole number, got {value!r}")
    return round(float(value), 4) if value != int(value) else int(value)


def check_resource_dict(resources, what="resources"):
    """``resources`` validated: {name: amount}; CPU and GPU go by their own options."""
    if resources is None:
        return {}
    if not isinstance(resources, dict):
        raise TypeError(f"{what} must be a dict, got {type(resources).__name__}")
    out = {}
    for k, v in resources.items():
        if not isinstance(k, str) or not k:
            raise ValueError(f"{what}: resource names must be non-empty strings, got {k!r}")
        if k in (CPU, GPU):
            raise ValueError(f"Use the 'num_cpus' and 'num_gpus' keyword instead of "
                             f"'{k}' in {what}")
        out[k] = _amount(f"{what}[{k!r}]", v)
    return out


def _node_labels(driver_pid):
    """The one node's labels (what label strategies and selectors match)."""
    from .cluster import node_labels
    return node_labels(node_id_hex(driver_pid))


def _strategy_target(strategy, driver_pid):
    """(pg id, bundle index) of a scheduling strategy; (None, -1) for the node."""
    if strategy is None or isinstance(strategy, str):
        if strategy not in (None, "DEFAULT", "SPREAD"):
            raise ValueError(f"Invalid scheduling_strategy {strategy!r}: 'DEFAULT', 'SPREAD' "
                             f"or a scheduling strategy object")
        return None, -1
    pg = getattr(strategy, "placement_group", None)
    if pg is not None or hasattr(strategy, "placement_group_bundle_index"):
        if pg is None:
            return None, -1
        return _pg_target(pg, getattr(strategy, "placement_group_bundle_index", -1))
    unmatched = getattr(strategy, "unmatched", None)
    if unmatched is not None:       # NodeLabelSchedulingStrategy
        labels = _node_labels(driver_pid)
        missed = unmatched(labels)
        if missed:
            raise ValueError(f"NodeLabelSchedulingStrategy: the one node's labels {labels} "
                             f"do not match the hard constraints on {missed} (ray_lite runs "
                             f"on one node; Ray would wait for a node that matches)")
        return None, -1
    node_id = getattr(strategy, "node_id", None)
    if node_id is not None:
        if node_id != node_id_hex(driver_pid) and not getattr(strategy, "soft", False):
            raise ValueError(f"NodeAffinitySchedulingStrategy: no node {node_id!r} (ray_lite "
                             f"runs on one node, {node_id_hex(driver_pid)!r}); use "
                             f"soft=True to run on it anyway")
        return None, -1
    raise ValueError(f"Invalid scheduling_strategy {strategy!r}")


def _pg_target(pg, index):
    pg_id = getattr(pg, "_hex", None)       # (a PlacementGroup's id, as the driver keys it)
    if not isinstance(pg_id, str):
        raise ValueError(f"placement_group must be a PlacementGroup, got {pg!r}")
    if not isinstance(index, int) or isinstance(index, bool) or index < -1:
        raise ValueError(f"placement_group_bundle_index must be an int >= -1, got {index!r}")
    # The bundles the handle carries (not bundle_count: that may ask the driver).
    cache = getattr(pg, "bundle_cache", None)
    count = None if cache is None else len(cache)
    if count is not None and index >= count:
        raise ValueError(f"placement_group_bundle_index {index} is out of range: the group "
                         f"has {count} bundles")
    return pg_id, index


def demand_of(opts, kind, driver_pid):
    """The ``Demand`` of a task's or actor's options; None for the default.

    ``kind``: "task" or "actor" (an actor's default is Ray's: 1 CPU to be
    scheduled, 0 held).
    """
    ncpu = opts.get("num_cpus")
    custom = check_resource_dict(opts.get("resources"))
    memory = opts.get("memory")
    if memory:
        # Ray's logical "memory" resource (bytes; the node has 70 % of its
        # RAM): honoured by the scheduler like any resource, not enforced.
        custom["memory"] = _amount("memory", memory)
    strategy = opts.get("scheduling_strategy")
    pg_id, index = _strategy_target(strategy, driver_pid)
    check_label_options(opts)
    if opts.get("label_selector"):
        check_labels_match(opts, _node_labels(driver_pid), kind)
    legacy = opts.get("placement_group")
    capture = bool(getattr(strategy, "placement_group_capture_child_tasks", False))
    if legacy not in (None, "default"):
        pg_id, index = _pg_target(legacy, opts.get("placement_group_bundle_index", -1))
        capture = bool(opts.get("placement_group_capture_child_tasks"))
    elif opts.get("placement_group_bundle_index", -1) != -1:
        raise ValueError("If placement group is not set, the value of bundle index must "
                         "be -1.")     # Ray's words
    capture = capture and pg_id is not None
    # Only a worker's child can be captured (a driver runs in no group): there
    # a strategy or group of its own is kept, even the default one.
    pinned = (strategy is not None or legacy not in (None, "default")) and \
        driver_pid != os.getpid()
    if ncpu is not None:
        ncpu = _amount("num_cpus", ncpu)
    if kind == "task":
        if (ncpu is None or ncpu == 1) and not custom and pg_id is None and not pinned:
            return None
        return Demand(1 if ncpu is None else ncpu, tuple(custom.items()), pg_id, index,
                      capture=capture, pinned=pinned)
    if ncpu is None and not custom and pg_id is None and not pinned:
        return None
    return Demand(ncpu or 0, tuple(custom.items()), pg_id, index,
                  explicit=ncpu is not None or bool(custom), capture=capture, pinned=pinned)


def _fits(free, demand_items):
    for k, v in demand_items:
        if free.get(k, 0) + _EPS < v:
            return False
    return True


def _take(free, items, sign):
    for k, v in items:
        free[k] = round(free.get(k, 0) - sign * v, 4)


class PlacementGroupState:
    """A placement group as the driver keeps it."""

    __slots__ = ("id", "name", "strategy", "bundles", "free", "state", "actors")

    def __init__(self, pg_id, name, strategy, bundles):
        self.id = pg_id
        self.name = name
        self.strategy = strategy
        self.bundles = bundles                 # [{resource: amount}]
        self.free = [dict(b) for b in bundles]
        self.state = "PENDING"
        self.actors = set()

    def need(self):
        total = {}
        for b in self.bundles:
            for k, v in b.items():
                total[k] = total.get(k, 0) + v
        return total

    def table(self):
        return {"placement_group_id": self.id, "name": self.name,
                "bundles": {i: dict(b) for i, b in enumerate(self.bundles)},
                "bundles_to_node_id": {i: None for i in range(len(self.bundles))},
                "strategy": self.strategy, "state": self.state, "stats": {}}


class Resources:
    """The driver's ledger (``driver.resources``; every method runs under ``_sched``).

    The counters the pool book reads on every task are the book's own
    (``driver.book``): ``busy``, the node's CPUs taken by running tasks (not
    in a group); ``cpu_cap``, the node's CPUs less those that actors and
    placement groups hold; ``placed_queue``, the tasks with a Demand waiting
    for resources; ``res_waiters``, callables retried when resources are
    freed.  This part owns the rest: ``total``, ``free_custom`` (custom
    resources not held or taken), ``light``, ``actor_demands`` (what each
    actor holds) and ``captured`` (the processes whose children go into
    their placement group).
    """

    def __init__(self, driver, num_cpus, custom):
        self.driver = driver
        self.book = driver.book     # busy, cpu_cap, placed_queue, res_waiters
        self.total = {CPU: num_cpus, **custom}
        self.free_custom = dict(custom)
        self.light = 0            # running tasks that take less than a CPU of the node
        self.actor_demands = {}   # actor id -> (Demand, where) held while it lives
        self.captured = {}        # process -> pg id its children go into (capture)

    # ------------------------------------------------------------ views
    def available_resources(self):
        book = self.book
        with self.driver._sched:
            out = {CPU: max(book.cpu_cap - book.busy, 0)}
            out.update(self.free_custom)
            return {k: v for k, v in out.items() if v > _EPS}

    def cluster_resources(self):
        return dict(self.total)

    # ------------------------------------------------------ feasibility
    def check_feasible(self, demand, what):
        """Raise ValueError when ``demand`` can never be met on this machine."""
        if demand.pg is not None:
            pg = self.driver.placement.groups.get(demand.pg)
            if pg is None or pg.state == "REMOVED":
                raise ValueError(f"{what}: its placement group {demand.pg} was removed "
                                 f"or never existed")
            indices = range(len(pg.bundles)) if demand.bundle < 0 else (demand.bundle,)
            if demand.bundle >= len(pg.bundles):
                raise ValueError(f"{what}: placement_group_bundle_index {demand.bundle} is "
                                 f"out of range ({len(pg.bundles)} bundles)")
            items = self._items(demand)
            if not any(_fits(pg.bundles[i], items) for i in indices):
                raise ValueError(f"{what} asks for {demand.as_dict()}, more than any bundle "
                                 f"of its placement group has ({pg.bundles}): it could never "
                                 f"run")
            return
        for k, v in self._items(demand):
            if self.total.get(k, 0) + _EPS < v:
                raise ValueError(f"{what} asks for {demand.as_dict()} but this machine has "
                                 f"{self.total} in all (init(num_cpus=..., resources=...)): "
                                 f"it could never run")

    @staticmethod
    def _items(demand):
        return ((CPU, demand.cpus),) + demand.custom if demand.cpus else demand.custom

    # ------------------------------------------------------------ tasks
    def acquire(self, spec):
        """Take what ``spec`` (a task with a Demand) needs; False if not free now."""
        d = spec.demand
        if d.pg is None:
            book = self.book
            if book.busy + d.cpus > book.cpu_cap + _EPS or not _fits(self.free_custom, d.custom):
                return False
            # Rounded: fractions of a CPU added and taken away must come back
            # to the whole number exactly (the common path compares busy + 1).
            book.busy = round(book.busy + d.cpus, 4)
            _take(self.free_custom, d.custom, 1)
            spec.held = None
        else:
            pg = self.driver.placement.groups.get(d.pg)
            if pg is None or pg.state == "REMOVED":
                raise ValueError(f"{spec.name}: its placement group was removed")
            if pg.state != "CREATED":
                return False
            items = self._items(d)
            indices = range(len(pg.free)) if d.bundle < 0 else (d.bundle,)
            for i in indices:
                if _fits(pg.free[i], items):
                    _take(pg.free[i], items, 1)
                    spec.held = (pg, i)
                    break
            else:
                return False
        if d.cpus < 1 or d.pg is not None:
            self.light += 1
        return True

    def node_cpus(self, spec):
        """The node's CPUs a running task takes (what a blocked task lends)."""
        d = spec.demand
        if d is None:
            return 1
        return d.cpus if d.pg is None else 0

    def release(self, spec, blocked):
        """Give back what ``spec`` took (``blocked``: its CPUs were lent already)."""
        d = spec.demand
        if d.pg is None:
            if not blocked:
                book = self.book
                book.busy = round(book.busy - d.cpus, 4)
            _take(self.free_custom, d.custom, -1)
        else:
            pg, i = spec.held
            if pg.state != "REMOVED":
                _take(pg.free[i], self._items(d), -1)
        if d.cpus < 1 or d.pg is not None:
            self.light -= 1
        self.freed()

    def enqueue_placed(self, spec):
        queue = self.book.placed_queue
        driver_id = self.driver.id
        if spec.owner != driver_id:
            # A worker's or actor's task goes before the driver's own (see
            # ``nested_queue``), after the others of its kind.
            for n, other in enumerate(queue):
                if other.owner == driver_id:
                    queue.insert(n, spec)
                    return
        queue.append(spec)

    def dispatch_placed(self):
        """Start the waiting tasks with a Demand that fit now (in order, skipping
        those that do not: a big task does not hold back small ones)."""
        book, driver = self.book, self.driver
        dispatch = driver.dispatch
        waiting, book.placed_queue = book.placed_queue, []
        for n, spec in enumerate(waiting):
            if spec.cancelled:
                continue
            try:
                if not self.acquire(spec):
                    book.placed_queue.append(spec)
                    continue
            except ValueError as err:
                dispatch.fail_task(spec, err)
                continue
            if not book.idle:
                driver._spawn_pool_workers()
            if not dispatch.send_task(spec):
                self.release(spec, False)
                book.placed_queue.append(spec)
                book.placed_queue.extend(waiting[n + 1:])
                return

    def freed(self):
        """Resources were freed: start what waits for them."""
        book = self.book
        if book.queue or book.nested_queue:
            self.driver.dispatch.dispatch_queued()
        if book.placed_queue:
            self.dispatch_placed()
        while book.res_waiters:
            # Again while one settles: a placement group created may be
            # what an actor's start waited for.
            waiters, book.res_waiters = book.res_waiters, []
            settled = False
            for w in waiters:
                if w():
                    settled = True
                else:
                    book.res_waiters.append(w)
            if not settled:
                break
        # A thread waiting in poll for what these freed (a placement group
        # removed by another thread) gets no message that would wake it.
        self.driver.wake_poll()

    # ----------------------------------------------------------- actors
    def actor_fits(self, demand):
        """True when the actor can start now (or is to be refused now)."""
        if demand is None:
            return True
        if demand.pg is not None:
            pg = self.driver.placement.groups.get(demand.pg)
            if pg is None or pg.state != "CREATED":
                # Pending: it waits for its group; gone: refused by hold_for_actor.
                return pg is None or pg.state == "REMOVED"
            if not demand.explicit:
                return True
            items = self._items(demand)
            indices = range(len(pg.free)) if demand.bundle < 0 else (demand.bundle,)
            return any(_fits(pg.free[i], items) for i in indices)
        if not demand.explicit:
            return True
        book = self.book
        return (book.cpu_cap - book.busy + _EPS >= demand.cpus
                and _fits(self.free_custom, demand.custom))

    def hold_for_actor(self, aid, demand):
        """Take what actor ``aid`` holds for its lifetime (``actor_fits`` said yes)."""
        if demand is None:
            return
        if demand.pg is not None:
            pg = self.driver.placement.groups.get(demand.pg)
            if pg is None or pg.state == "REMOVED":
                raise ValueError("the actor's placement group was removed")
            pg.actors.add(aid)
            if demand.capture:
                self.captured[aid] = demand.pg
            if not demand.explicit:
                self.actor_demands[aid] = (demand, None)
                return
            items = self._items(demand)
            indices = range(len(pg.free)) if demand.bundle < 0 else (demand.bundle,)
            for i in indices:
                if _fits(pg.free[i], items):
                    _take(pg.free[i], items, 1)
                    self.actor_demands[aid] = (demand, (pg, i))
                    return
            raise ValueError("no bundle of the placement group has room for the actor")
        if demand.explicit:
            book = self.book
            book.cpu_cap = round(book.cpu_cap - demand.cpus, 4)
            _take(self.free_custom, demand.custom, 1)
            self.actor_demands[aid] = (demand, None)

    def start_when_free(self, aid, demand):
        """Start actor ``aid`` (created while its resources were taken: its
        process waits for ``START``) if they are free now; True once settled."""
        driver = self.driver
        if aid not in driver.actors:
            return True           # killed or dead meanwhile
        if not self.actor_fits(demand):
            return False
        try:
            self.hold_for_actor(aid, demand)
        except ValueError as err:     # its placement group was removed meanwhile
            driver.kill_actor(aid, cause=f"The actor could not start: {err}.")
            return True
        driver.send(aid, (START,))
        return True

    def release_actor(self, aid):
        self.captured.pop(aid, None)
        held = self.actor_demands.pop(aid, None)
        if held is None:
            return
        demand, where = held
        if demand.pg is not None:
            pg = self.driver.placement.groups.get(demand.pg)
            if pg is not None:
                pg.actors.discard(aid)
            if where is not None and where[0].state != "REMOVED":
                _take(where[0].free[where[1]], self._items(demand), -1)
        elif demand.explicit:
            book = self.book
            book.cpu_cap = round(book.cpu_cap + demand.cpus, 4)
            _take(self.free_custom, demand.custom, -1)
        self.freed()

    def check_actor_feasible(self, demand, what):
        if demand is None:
            if self.total.get(CPU, 0) < 1:
                raise ValueError(f"{what}: an actor needs 1 CPU to be scheduled")
            return
        if demand.explicit or demand.pg is not None:
            self.check_feasible(demand, what)


def check_retry_exceptions(value):
    """``retry_exceptions``: False, True, or a list of exception classes."""
    if value is None or isinstance(value, bool):
        return value or None
    if isinstance(value, (list, tuple)) and value and all(
            isinstance(c, type) and issubclass(c, BaseException) for c in value):
        return tuple(value)
    raise ValueError(f"retry_exceptions must be a bool or a list of exception classes, "
                     f"got {value!r}")


def matches_retry(retry_on, error):
    """True when a task that failed with ``error`` is to be retried."""
    from ray_lite.exceptions import RayTaskError, TaskCancelledError
    if isinstance(error, TaskCancelledError) or not isinstance(error, RayTaskError):
        return False        # not an exception of the task's own code
    if retry_on is True:
        return True
    cause = getattr(error, "cause", None)
    return isinstance(error, retry_on) or isinstance(cause, retry_on)
