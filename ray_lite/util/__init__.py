"""Ray's ``ray.util`` for ray_lite: utilities built on the public core API.

``ActorPool``, ``as_completed``, ``map_unordered``, ``get_node_ip_address``,
``list_named_actors``, ``inspect_serializability``,
``register_serializer``/``deregister_serializer`` and the placement-group
functions are here;
``ray_lite.util.queue`` (``Queue``), ``ray_lite.util.multiprocessing``
(``Pool``), ``ray_lite.util.metrics`` (``Counter``, ``Gauge``,
``Histogram``), ``ray_lite.util.state``,
``ray_lite.util.scheduling_strategies``, ``ray_lite.util.annotations``
(``PublicAPI``...), ``ray_lite.util.accelerators`` and ``ray_lite.util.debug``
are imported on first use, as in Ray, where they are submodules too;
``log_once``, ``disable_log_once_globally`` and ``enable_periodic_logging``
(from ``debug``) are here too, as in Ray.
"""
import importlib
import os

from ray_lite import _ray
from ray_lite._private.process import backend as _backend
from ray_lite._private.scheduling.cluster import node_ip_address

from ray_lite.util.actor_pool import ActorPool
from ray_lite.util.check_serialize import inspect_serializability
from ray_lite.util.debug import disable_log_once_globally, enable_periodic_logging, log_once
from ray_lite.util.helpers import as_completed, map_unordered
from ray_lite.util.placement_group import (PlacementGroup, get_current_placement_group,
                                           get_placement_group, placement_group,
                                           placement_group_table, remove_placement_group)
from ray_lite.util.serialization import deregister_serializer, register_serializer

__all__ = ["ActorPool", "as_completed", "map_unordered", "get_node_ip_address",
           "get_node_instance_id",
           "list_named_actors", "register_serializer", "deregister_serializer",
           "inspect_serializability", "PlacementGroup", "placement_group",
           "remove_placement_group", "get_placement_group", "placement_group_table",
           "get_current_placement_group", "queue", "multiprocessing", "metrics", "state",
           "scheduling_strategies", "annotations", "accelerators", "debug", "log_once",
           "disable_log_once_globally", "enable_periodic_logging"]

_LAZY_SUBMODULES = ("queue", "multiprocessing", "metrics", "state", "scheduling_strategies",
                    "annotations", "accelerators", "debug")


def __getattr__(name):
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get_node_instance_id():
    """The node's cloud instance id: ``RAY_CLOUD_INSTANCE_ID``, "" if unset (Ray's)."""
    return os.environ.get("RAY_CLOUD_INSTANCE_ID", "")


def list_named_actors(all_namespaces=False):
    """The names of the live named actors in this job's namespace; with
    ``all_namespaces``, ``{"name", "namespace"}`` of every one (Ray's)."""
    if _backend.RAY:
        return _ray.util.UTIL["list_named_actors"](all_namespaces)
    import ray_lite
    from ray_lite.util.state import list_actors
    named = [a for a in list_actors(limit=1 << 62) if a["name"]]
    if all_namespaces:
        return [{"name": a["name"], "namespace": a["ray_namespace"]} for a in named]
    namespace = ray_lite.get_runtime_context().namespace
    return [a["name"] for a in named if a["ray_namespace"] == namespace]


def get_node_ip_address(address="8.8.8.8:53"):
    """The address this machine uses to reach ``address`` (the one node's IP).

    A UDP ``connect`` sends nothing; it only asks the kernel which local
    address routes there.  Without a route (an offline machine) the node is
    reached at the loopback address, ``127.0.0.1``.
    """
    if _backend.RAY:
        return _ray.util.UTIL["get_node_ip_address"](address)
    return node_ip_address(address)
