"""Placement groups on one node (Ray's API): reserve bundles of resources, then
schedule tasks and actors into them.  The driver keeps them
(``ray_lite/_private/scheduling/placement.py``)."""
from ray_lite import _ray
from ray_lite._private.process import backend as _backend
from ray_lite._private.links import protocol as P
from ray_lite._private.process import state
from ray_lite._private.process.ids import PlacementGroupID
from ray_lite._private.scheduling.labels import check_bundle_label_selector, check_bundles_match
from ray_lite._private.scheduling.scheduler import _node_labels

from .scheduling_strategies import PlacementGroupSchedulingStrategy

_reservation_check = None


def _bundle_reservation_check(placement_group):
    return placement_group


def _ready_task():
    # A task taking nothing from the group: it runs once the group is created.
    global _reservation_check
    if _reservation_check is None:
        from ray_lite._private.api.core import remote
        _reservation_check = remote(num_cpus=0)(_bundle_reservation_check)
    return _reservation_check


class PlacementGroup:
    """A handle to a placement group (picklable: pass it to tasks and actors)."""

    def __init__(self, id, bundle_cache=None):
        # The id travels as its hex string (what the driver keys groups by).
        self._hex = id.hex() if isinstance(id, PlacementGroupID) else id
        self.bundle_cache = bundle_cache

    @property
    def id(self):
        """Ray's ``PlacementGroupID`` (``.hex()``, ``.binary()``)."""
        return PlacementGroupID.from_hex(self._hex) if self._hex else PlacementGroupID.nil()

    @staticmethod
    def empty():
        return PlacementGroup("")

    @property
    def is_empty(self):
        return not self._hex

    @property
    def bundle_specs(self):
        """The bundles of this group: a list of {resource: amount}."""
        if self.bundle_cache is None:
            self.bundle_cache = placement_group_table(self).get("bundles", {})
            self.bundle_cache = [self.bundle_cache[i] for i in sorted(self.bundle_cache)]
        return [dict(b) for b in self.bundle_cache]

    @property
    def bundle_count(self):
        return len(self.bundle_specs)

    def ready(self):
        """An ObjectRef that resolves (to this group) once the group is created."""
        return _ready_task().options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(self)).remote(self)

    def wait(self, timeout_seconds=30):
        """True if the group is created within ``timeout_seconds``."""
        from ray_lite._private.api.core import wait
        ready, _ = wait([self.ready()], timeout=timeout_seconds)
        return bool(ready)

    def __eq__(self, other):
        return isinstance(other, PlacementGroup) and other._hex == self._hex

    def __hash__(self):
        return hash(self._hex)

    def __repr__(self):
        return f"PlacementGroup(id={self.id})"

    def __reduce__(self):
        return (PlacementGroup, (self._hex, self.bundle_cache))


def placement_group(bundles, strategy="PACK", name="", lifetime=None,
                    _soft_target_node_id=None, bundle_label_selector=None):
    """Create a placement group of ``bundles`` (a list of {resource: amount}).

    Asynchronous, as in Ray: the group is PENDING until its resources are
    free (``ready()``, ``wait()``).  A group this machine could never hold
    (more than its resources, or STRICT_SPREAD over several bundles) raises
    ``ValueError`` here, where Ray would leave it pending for ever; so does
    one whose ``bundle_label_selector`` (a selector per bundle, as
    ``label_selector``) the node's labels do not match.
    """
    if _backend.RAY:
        return _ray.util.UTIL["placement_group"](
            bundles, strategy=strategy, name=name, lifetime=lifetime,
            _soft_target_node_id=_soft_target_node_id, bundle_label_selector=bundle_label_selector)
    if bundle_label_selector is not None and isinstance(bundles, list):
        # Ray's checks (after the bundles': the driver's, below, for a non-list);
        # then each bundle's selector must match the one node.
        check_bundle_label_selector(bundles, bundle_label_selector)
        check_bundles_match(bundle_label_selector, _node_labels(state.get_node().driver_pid))
    if _soft_target_node_id is not None and not isinstance(_soft_target_node_id, str):
        raise ValueError(f"_soft_target_node_id must be a hex node id, got "
                         f"{_soft_target_node_id!r}")
    node = state.get_node()
    pg_id, specs = node.request(P.OP_PG_CREATE, bundles, strategy, name, lifetime)
    return PlacementGroup(pg_id, specs)


def remove_placement_group(placement_group):
    """Remove ``placement_group``: its resources are free again, its actors die."""
    if _backend.RAY:
        return _ray.util.UTIL["remove_placement_group"](placement_group)
    if not isinstance(placement_group, PlacementGroup):
        raise TypeError(f"remove_placement_group expects a PlacementGroup, got "
                        f"{placement_group!r}")
    state.get_node().request(P.OP_PG_REMOVE, placement_group._hex)


def get_placement_group(placement_group_name):
    """The live placement group named ``placement_group_name``."""
    if _backend.RAY:
        return _ray.util.UTIL["get_placement_group"](placement_group_name)
    if not isinstance(placement_group_name, str) or not placement_group_name:
        raise ValueError("Please supply a non-empty value to get_placement_group")
    pg_id, specs = state.get_node().request(P.OP_PG_GET, placement_group_name)
    return PlacementGroup(pg_id, specs)


def placement_group_table(placement_group=None):
    """The state of one group (a dict), or of every group ({id: dict})."""
    if _backend.RAY:
        return _ray.util.UTIL["placement_group_table"](placement_group)
    pg_id = None if placement_group is None else placement_group._hex
    return state.get_node().request(P.OP_PG_TABLE, pg_id)


def get_current_placement_group():
    """The placement group the running task or actor was scheduled into, as
    Ray's; None in the driver and outside a group."""
    if _backend.RAY:
        return _ray.util.UTIL["get_current_placement_group"]()
    from ray_lite._private.api.runtime_context import current_placement
    found = current_placement(state.get_node())
    if found is None:
        return None
    pg_id, bundles, _ = found
    return PlacementGroup(pg_id, [dict(b) for b in bundles])


__all__ = ["PlacementGroup", "placement_group", "remove_placement_group",
           "get_placement_group", "placement_group_table", "get_current_placement_group"]
