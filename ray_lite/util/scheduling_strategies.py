"""Scheduling strategies (Ray's names), for the one node of ray_lite (Ray's own on Ray)."""
from ray_lite._private import backend as _backend



@_backend.ray_counterpart("PlacementGroupSchedulingStrategy")
class PlacementGroupSchedulingStrategy:
    """Run a task or actor in ``placement_group``, taking its resources from
    bundle ``placement_group_bundle_index`` (-1: any bundle with room)."""

    def __init__(self, placement_group, placement_group_bundle_index=-1,
                 placement_group_capture_child_tasks=None):
        self.placement_group = placement_group
        self.placement_group_bundle_index = placement_group_bundle_index
        self.placement_group_capture_child_tasks = placement_group_capture_child_tasks

    def __repr__(self):
        return (f"PlacementGroupSchedulingStrategy({self.placement_group!r}, "
                f"{self.placement_group_bundle_index})")


@_backend.ray_counterpart("NodeAffinitySchedulingStrategy")
class NodeAffinitySchedulingStrategy:
    """Run on node ``node_id``.  ray_lite has one node: its own id runs there;
    another id is refused unless ``soft=True`` (then it runs here, as Ray runs
    a soft affinity elsewhere when the node is gone)."""

    def __init__(self, node_id, soft, _spill_on_unavailable=False, _fail_on_unavailable=False):
        self.node_id = node_id
        self.soft = soft
        self._spill_on_unavailable = _spill_on_unavailable
        self._fail_on_unavailable = _fail_on_unavailable

    def __repr__(self):
        return f"NodeAffinitySchedulingStrategy({self.node_id!r}, soft={self.soft})"


__all__ = ["PlacementGroupSchedulingStrategy", "NodeAffinitySchedulingStrategy"]
