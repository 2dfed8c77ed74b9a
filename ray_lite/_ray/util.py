"""``ray_lite.util`` on Ray: each name is Ray's ``ray.util`` object.

ray_lite's classes (``ActorPool``, ``Queue``, ``Pool``, the scheduling
strategies) return Ray's object from ``__new__`` while Ray is the backend;
the functions call Ray's.  The one wrapper is the queue's: Ray's ``Queue``
raises its own ``Empty``/``Full``, which ``except ray_lite.util.queue.Empty``
must catch (see ``exceptions.py`` for why errors are translated).
"""
import functools
import inspect

import ray
import ray.util
import ray.util.metrics
import ray.util.multiprocessing
import ray.util.queue
import ray.util.scheduling_strategies as ray_strategies

from .exceptions import translate

__all__ = ["ray_strategy", "RayQueue", "UTIL", "state_function", "CLASSES"]

# ray_lite.util's functions -> Ray's
UTIL = {name: getattr(ray.util, name) for name in (
    "as_completed", "map_unordered", "get_node_ip_address", "inspect_serializability",
    "placement_group", "remove_placement_group", "get_placement_group",
    "placement_group_table", "get_current_placement_group", "list_named_actors",
    "register_serializer", "deregister_serializer")}


def state_function(name):
    """``ray.util.state.<name>`` (imported on first use: it takes ~0.7 s)."""
    import ray.util.state
    return getattr(ray.util.state, name)


def ray_strategy(strategy):
    """Ray's scheduling strategy for one of ray_lite's (made before Ray was the backend)."""
    name = type(strategy).__name__
    if name == "PlacementGroupSchedulingStrategy":
        return ray_strategies.PlacementGroupSchedulingStrategy(
            strategy.placement_group, strategy.placement_group_bundle_index,
            strategy.placement_group_capture_child_tasks)
    if name == "NodeAffinitySchedulingStrategy":
        return ray_strategies.NodeAffinitySchedulingStrategy(
            strategy.node_id, strategy.soft, strategy._spill_on_unavailable,
            strategy._fail_on_unavailable)
    if name == "NodeLabelSchedulingStrategy":
        def op(o):
            cls = getattr(ray_strategies, type(o).__name__)
            return cls(*o.values) if hasattr(o, "values") else cls()
        return ray_strategies.NodeLabelSchedulingStrategy(
            {k: op(o) for k, o in strategy.hard.items()},
            soft={k: op(o) for k, o in strategy.soft.items()} or None)
    return strategy


def _translating(method):
    @functools.wraps(method)
    def call(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except (ray.util.queue.Empty, ray.util.queue.Full, ray.exceptions.RayError) as exc:
            raise translate(exc) from exc.__cause__

    @functools.wraps(method)
    async def call_async(*args, **kwargs):
        try:
            return await method(*args, **kwargs)
        except (ray.util.queue.Empty, ray.util.queue.Full, ray.exceptions.RayError) as exc:
            raise translate(exc) from exc.__cause__
    return call_async if inspect.iscoroutinefunction(method) else call


class RayQueue(ray.util.queue.Queue):
    """Ray's ``Queue`` whose ``Empty``/``Full`` are also ray_lite's."""

    put = _translating(ray.util.queue.Queue.put)
    put_async = _translating(ray.util.queue.Queue.put_async)
    put_nowait = _translating(ray.util.queue.Queue.put_nowait)
    put_nowait_batch = _translating(ray.util.queue.Queue.put_nowait_batch)
    get = _translating(ray.util.queue.Queue.get)
    get_async = _translating(ray.util.queue.Queue.get_async)
    get_nowait = _translating(ray.util.queue.Queue.get_nowait)
    get_nowait_batch = _translating(ray.util.queue.Queue.get_nowait_batch)


# ray_lite.util's classes -> Ray's (``backend.ray_counterpart``)
CLASSES = {"ActorPool": ray.util.ActorPool, "Queue": RayQueue,
           "Pool": ray.util.multiprocessing.Pool,
           "PlacementGroupSchedulingStrategy": ray_strategies.PlacementGroupSchedulingStrategy,
           "NodeAffinitySchedulingStrategy": ray_strategies.NodeAffinitySchedulingStrategy,
           "NodeLabelSchedulingStrategy": ray_strategies.NodeLabelSchedulingStrategy,
           "In": ray_strategies.In, "NotIn": ray_strategies.NotIn,
           "Exists": ray_strategies.Exists, "DoesNotExist": ray_strategies.DoesNotExist,
           "Counter": ray.util.metrics.Counter, "Gauge": ray.util.metrics.Gauge,
           "Histogram": ray.util.metrics.Histogram}
