"""ray_lite's core API on Ray: each public function's ``if backend.RAY:`` branch.

What a program gets back is Ray's own object (``ObjectRef``,
``ObjectRefGenerator``, ``ActorHandle``, ``RuntimeContext``), so it behaves
exactly as on Ray and costs nothing on top of Ray; ``isinstance`` against
ray_lite's classes holds (``backend.AlsoRay``).  Ray's errors are translated
where they reach the program (``exceptions.translate``).

A ``@ray_lite.remote`` function or class, decorated at import time before the
backend was chosen, becomes Ray's remote function or actor class on its first
use on Ray, once (kept on the ray_lite object).  Its options are Ray's names
and keep Ray's meaning; options ray_lite accepts without effect on one
machine (``num_gpus``, ``memory``, ``lifetime="detached"``...) act on Ray.
"""
import ray

from .exceptions import translate

__all__ = ["remote_function", "actor_class", "function_options", "actor_options", "get",
           "put", "wait", "kill", "cancel", "get_actor", "create_actors", "ray_options"]

_RayError = ray.exceptions.RayError


def ray_options(options):
    """ray_lite's options as Ray's: the same names and values, except the
    objects ray_lite made itself (a scheduling strategy built before Ray was
    the backend), rebuilt as Ray's."""
    strategy = options.get("scheduling_strategy")
    if strategy is None or isinstance(strategy, str) or \
            type(strategy).__module__.startswith("ray."):
        return options
    from .util import ray_strategy
    return {**options, "scheduling_strategy": ray_strategy(strategy)}


def _made_on_ray(obj, target):
    """Ray's remote function or actor class for ``obj`` (ray_lite's
    ``RemoteFunction`` or ``ActorClass`` of ``target``), made on first use and
    kept on ``obj``.  Options declared with ``ray_lite.method`` are already
    under Ray's attribute names."""
    made = obj.__dict__.get("_ray_remote")
    if made is None:
        opts = ray_options(obj._options)
        made = ray.remote(**opts)(target) if opts else ray.remote(target)
        obj._ray_remote = made
    return made


def remote_function(rf):
    return _made_on_ray(rf, rf._function)


class _Optioned:
    """``f.options(...)`` or ``C.options(...)`` on Ray: Ray's, but for ``bind``,
    which makes ray_lite's DAG node (``ray_lite.dag`` runs a graph with
    ``.remote``: one graph, whichever backend, with one ``InputNode``)."""

    def __init__(self, on_ray, node_class):
        self._on_ray = on_ray
        self._node_class = node_class

    def remote(self, *args, **kwargs):
        return self._on_ray.remote(*args, **kwargs)

    def bind(self, *args, **kwargs):
        from ray_lite._private.api.plugins import dag
        return getattr(dag(), self._node_class)(self, args, kwargs)

    def __getattr__(self, name):
        return getattr(self._on_ray, name)


def function_options(rf, opts):
    return _Optioned(remote_function(rf).options(**ray_options(opts)), "FunctionNode")


def actor_class(ac):
    return _made_on_ray(ac, ac._cls)


def actor_options(ac, opts):
    return _Optioned(actor_class(ac).options(**ray_options(opts)), "ClassNode")


def is_class_with_options(obj):
    """Whether ``obj`` is ``C.options(...)`` of an actor class, on Ray."""
    return type(obj) is _Optioned and obj._node_class == "ClassNode"


def create_actors(ac, calls):
    """``ray_lite.create_actors`` on Ray: one ``.remote`` per call (Ray creates
    actors asynchronously already); an error in place of an actor that could
    not be requested.  ``ac``: ray_lite's actor class, or its ``.options(...)``."""
    cls = ac if is_class_with_options(ac) else actor_class(ac)
    handles = []
    for args, kwargs in calls:
        try:
            handles.append(cls.remote(*args, **kwargs))
        except Exception as exc:        # noqa: BLE001 - reported in its place, as locally
            handles.append(exc)
    return handles


def get(object_refs, timeout):
    try:
        return ray.get(object_refs, timeout=timeout)
    except _RayError as exc:
        raise translate(exc) from exc.__cause__


def put(value):
    return ray.put(value)


def wait(object_refs, num_returns, timeout, fetch_local):
    if type(object_refs) is not list and not isinstance(
            object_refs, (ray.ObjectRef, ray.ObjectRefGenerator)):
        object_refs = list(object_refs)     # ray_lite takes any iterable; Ray, a list
    try:
        return ray.wait(object_refs, num_returns=num_returns, timeout=timeout,
                        fetch_local=fetch_local)
    except _RayError as exc:
        raise translate(exc) from exc.__cause__


def kill(actor, no_restart):
    ray.kill(actor, no_restart=no_restart)


def cancel(ref, force, recursive):
    ray.cancel(ref, force=force, recursive=recursive)


def get_actor(name, namespace):
    return ray.get_actor(name, namespace=namespace)
