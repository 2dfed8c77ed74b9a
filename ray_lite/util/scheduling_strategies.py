"""Scheduling strategies (Ray's names), for the one node of ray_lite (Ray's own on Ray)."""
from ray_lite._private.process import backend as _backend



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
        # As Ray: a NodeID (``get_runtime_context().node_id``) stands for its hex.
        self.node_id = node_id if isinstance(node_id, str) or not hasattr(node_id, "hex") \
            else node_id.hex()
        self.soft = soft
        self._spill_on_unavailable = _spill_on_unavailable
        self._fail_on_unavailable = _fail_on_unavailable

    def __repr__(self):
        return f"NodeAffinitySchedulingStrategy({self.node_id!r}, soft={self.soft})"


def _check_values(values, operator):
    # Ray's checks and words.
    if not values:
        raise ValueError(f"The variadic parameter of the {operator} operator must be a "
                         f"non-empty tuple: e.g. {operator}(\"value1\", \"value2\").")
    for value in values:
        if not isinstance(value, str):
            raise ValueError(f"Type of value in position {values.index(value)} for the "
                             f"{operator} operator must be str (e.g. {operator}(\"value1\", "
                             f"\"value2\")) but got {value!r} of type {type(value)}.")


class _ValueList:
    def __init__(self, *values):
        _check_values(values, type(self).__name__)
        self.values = list(values)


@_backend.ray_counterpart("In")
class In(_ValueList):
    """A label whose value is one of ``values``."""

    def matches(self, labels, key):
        return labels.get(key) in self.values


@_backend.ray_counterpart("NotIn")
class NotIn(_ValueList):
    """A label that is absent or whose value is none of ``values``."""

    def matches(self, labels, key):
        return labels.get(key) not in self.values


@_backend.ray_counterpart("Exists")
class Exists:
    def matches(self, labels, key):
        return key in labels


@_backend.ray_counterpart("DoesNotExist")
class DoesNotExist:
    def matches(self, labels, key):
        return key not in labels


_OPERATORS = (In, NotIn, Exists, DoesNotExist)


def _expressions(mapping, param):
    if mapping is None:
        return {}
    if not isinstance(mapping, dict):
        raise ValueError(f"The {param} parameter must be a map (e.g. {{\"key1\": "
                         f"In(\"value1\")}}) but got type {type(mapping)}.")
    for key, value in mapping.items():
        if not isinstance(key, str):
            raise ValueError(f"The map key of the {param} parameter must be of type str "
                             f"but got {key!r} of type {type(key)}.")
        if not isinstance(value, _OPERATORS):
            raise ValueError(f"The map value for key {key} of the {param} parameter must be "
                             f"one of the `In`, `NotIn`, `Exists` or `DoesNotExist` operator "
                             f"but got {value!r} of type {type(value)}.")
    return dict(mapping)


@_backend.ray_counterpart("NodeLabelSchedulingStrategy")
class NodeLabelSchedulingStrategy:
    """Run on a node whose labels match ``hard`` (``{key: In(...)/NotIn(...)/
    Exists()/DoesNotExist()}``), preferring one that matches ``soft``.  The
    one node's labels are Ray's default ones (``ray.io/node-id``): a task or
    actor whose ``hard`` expressions it does not match is refused when
    declared (on Ray it would wait for such a node); ``soft`` only prefers."""

    def __init__(self, hard, *, soft=None):
        self.hard = _expressions(hard, "hard")
        self.soft = _expressions(soft, "soft")
        if not (self.hard or self.soft):
            raise ValueError("The `hard` and `soft` parameter of NodeLabelSchedulingStrategy "
                             "cannot both be empty.")

    def unmatched(self, labels):
        """The keys of ``hard`` that ``labels`` do not satisfy."""
        return [k for k, op in self.hard.items() if not op.matches(labels, k)]

    def __repr__(self):
        return f"NodeLabelSchedulingStrategy(hard={self.hard!r}, soft={self.soft!r})"


__all__ = ["PlacementGroupSchedulingStrategy", "NodeAffinitySchedulingStrategy",
           "NodeLabelSchedulingStrategy", "In", "NotIn", "Exists", "DoesNotExist"]
