"""Remote functions and actor classes: ``f.remote(...)``, ``C.remote(...)``."""
import functools
import os

from ray_lite._fast.pool_book import plain_call
from ray_lite._lazy import lazy_module
from ray_lite.exceptions import ActorClassInheritanceException, NotOnThisMachineError

from ..actors.concurrency_groups import check_groups, check_method_groups
from ..job.runtime_env import EnvTask, env_vars_of
from ..links import protocol as P
from ..links.protocol import TaskSpec
from ..objects.refs import ObjectRef, _Entry
from ..objects.shipping import ship
from ..process import backend as _backend
from ..process import state
from ..scheduling.scheduler import check_retry_exceptions, demand_of
from . import plugins
from .actor_handle import ActorHandle, actor_lease
from .call_options import (_by_value, _check_args_serialisable,  # noqa: F401
                           _check_method_options, _check_options, _driver_pid,
                           _make_call_result, _stream_opts,
                           warn_dynamic)
from .method_options import declared_options
from .signatures import arity_of, check_call, constructor_arity, method_arity

inspect = lazy_module("inspect", globals())


class _TaskPlan:
    """What a set of options means for a call, worked out once per options.

    ``special``: the task has a Demand, a retry policy, ``max_calls`` or
    env_vars (it takes ``_remote_special``, the common task does not)."""

    __slots__ = ("name", "nret", "stream", "single", "bp", "retries", "special", "demand",
                 "retry_on", "max_calls", "env_fn_id", "env_function", "env_blob", "arity")

    def __init__(self, function, opts, is_gen, arity):
        self.name = opts.get("name") or function.__qualname__
        self.arity = arity
        self.nret, self.stream, self.bp = _stream_opts(opts, is_gen)
        self.single = self.nret == 1 and not self.stream    # one return, no stream
        retries = opts.get("max_retries")
        self.retries = 3 if retries is None else retries      # None: Ray's default
        self.demand = demand_of(opts, "task", _driver_pid())
        self.retry_on = check_retry_exceptions(opts.get("retry_exceptions"))
        self.max_calls = opts.get("max_calls") or 0     # 0 (and None): no limit
        env = env_vars_of(opts.get("runtime_env"))
        self.env_function = None if env is None else EnvTask(function, env)
        self.env_fn_id = None if env is None else os.urandom(8).hex()
        self.env_blob = None
        self.special = (self.demand is not None or self.retry_on is not None
                        or self.max_calls or env is not None)


class _RefusedHere:
    """The plan of a function whose options ray_lite refuses on one machine
    (``num_gpus=1``...) while the program is to run on Ray, where they mean
    what Ray says, or that Ray would accept where it is declared (its task
    would wait for a GPU node): the refusal is raised only if the function
    is used on the local backend after all.  Options Ray refuses too are
    refused at once."""

    __slots__ = ("error",)

    def __init__(self, error):
        if _backend.current() != _backend.RAY_NAME and \
                not isinstance(error, NotOnThisMachineError):
            raise error
        self.error = error

    def __getattr__(self, name):
        raise self.error


# ``.options(...)`` is often called per call (``f.options(name=...).remote()``):
# what it returns is made once per set of options and kept, up to this many.
_MAX_BOUND = 64


def _cached_bound(cache, opts):
    """``(bound, key)``: what ``options(**opts)`` returned before (or None) and
    the key to keep a new one under (None: the options cannot be a key)."""
    # The type too: 1, 1.0 and True are equal keys, not equally valid options.
    key = tuple((k, type(v), v) for k, v in opts.items())
    try:
        return cache.get(key), key
    except TypeError:       # an unhashable value (a dict, a list)
        return None, None


def _cache_bound(cache, key, bound):
    if key is not None:
        if len(cache) >= _MAX_BOUND:
            cache.clear()
        cache[key] = bound


class _Bound:
    """``f.options(...)`` or ``C.options(...)``: the function or actor class with
    other options (``how``: what its ``_call`` takes for them)."""

    __slots__ = ("_target", "_how")

    def __init__(self, target, how):
        self._target = target
        self._how = how

    def remote(self, *args, **kwargs):
        return self._target._call(self._how, args, kwargs)

    def bind(self, *args, **kwargs):
        """A node of Ray's DAG API with these options (see ``ray_lite.dag``)."""
        return _dag_node(self._target, self, args, kwargs)


def _dag_node(remote_object, target, args, kwargs):
    dag = plugins.dag()
    cls = dag.ClassNode if isinstance(remote_object, ActorClass) else dag.FunctionNode
    return cls(target, args, kwargs)


class RemoteFunction:
    """A function run as a task on the worker pool: ``f.remote(...)`` -> ``ObjectRef``."""

    def __init__(self, function, options):
        if inspect.iscoroutinefunction(function):
            raise ValueError("'async def' should not be used for remote tasks. You can wrap "
                             "the async function with `asyncio.run(f())`. See more at:"
                             "https://docs.ray.io/en/latest/ray-core/actors/async_api.html ")
        self._function = function
        self._options = options
        self._fn_id = os.urandom(8).hex()
        self._blob = None
        self._is_gen = inspect.isgeneratorfunction(function) or inspect.isasyncgenfunction(function)
        self._arity = arity_of(function)
        try:
            _check_options(options, "task")
            if options.get("num_returns") == "dynamic":
                warn_dynamic()
            self._plan = _TaskPlan(function, options, self._is_gen, self._arity)
        except ValueError as exc:
            self._plan = _RefusedHere(exc)
        self._bound = {}        # options -> _Bound (see _cached_bound)
        functools.update_wrapper(self, function)

    def __call__(self, *args, **kwargs):
        name = self._function.__name__
        raise TypeError(f"Remote functions cannot be called directly. Instead of running "
                        f"'{name}()', try '{name}.remote()'.")

    def remote(self, *args, **kwargs):
        if _backend.RAY:
            return _backend.ENGINE.core.remote_function(self).remote(*args, **kwargs)
        return self._call(self._plan, args, kwargs)

    def options(self, **opts):
        if _backend.RAY:
            return _backend.ENGINE.core.function_options(self, opts)
        if "max_calls" in opts:
            # As Ray: the limit belongs to the function (its workers count
            # its calls, whatever the options of each).
            raise ValueError("Setting 'max_calls' is not supported in '.options()'.")
        bound, key = _cached_bound(self._bound, opts)
        if bound is None:
            merged = {**self._options, **opts}
            _check_options(merged, "task")
            if opts.get("num_returns") == "dynamic":
                warn_dynamic()
            bound = _Bound(self, _TaskPlan(self._function, merged, self._is_gen, self._arity))
            _cache_bound(self._bound, key, bound)
        return bound

    def bind(self, *args, **kwargs):
        """A node of Ray's DAG API: a task when the graph is executed (see ``ray_lite.dag``)."""
        return _dag_node(self, self, args, kwargs)

    def _remote(self, args=None, kwargs=None, **options):
        """Ray's older form, which libraries still call:
        ``f._remote(args=[...], kwargs={...}, num_cpus=...)``."""
        target = self.options(**options) if options else self
        return target.remote(*(args or ()), **(kwargs or {}))

    def _call(self, plan, args, kwargs):
        if plan.special:
            return self._remote_special(plan, args, kwargs)
        if plan.single and plain_call(args, kwargs, plan.arity):
            # The driver's common task (B11): plain arguments that fit, one return.
            node = state.node
            if node is None:
                node = state.get_node()
            if node.id == 0:
                blob = self._blob
                if blob is None:
                    blob = self._blob = ship(self._function)
                oid = node._oid_base | next(node._seq)      # node.new_oid(), inline: per call
                target = node.pending[oid] = _Entry()
                node.submit_plain(oid, self._fn_id, blob, list(args), kwargs, plan.bp,
                                  plan.retries, plan.name, target)
                # The ref is made after the submit: the task runs meanwhile.
                return ObjectRef(oid, 0, target)
        return self._call_any(plan, args, kwargs)

    def _call_any(self, plan, args, kwargs):
        """``_call`` of any task that is not special: arguments that are refs
        or need a look, several returns, a stream, a worker's nested task."""
        arity = plan.arity      # checked as Ray does, at the call
        if arity is not None and (kwargs or not arity[0] <= len(args) <= arity[1]):
            check_call(arity, args, kwargs)
        node = state.get_node()
        name = plan.name
        simple = plain_call(args, kwargs, None)      # plain values only: nothing to probe
        if not simple and _check_args_serialisable(args, kwargs, name):
            args, kwargs = _by_value(node, args, kwargs)
        blob = self._blob
        if blob is None:
            blob = self._blob = ship(self._function)
        nret, stream, bp = plan.nret, plan.stream, plan.bp
        if nret == 1 and not stream:
            oid = node._oid_base | next(node._seq)
            node_id = node.id
            # A worker's nested task is answered through the driver.
            target = node.pending[oid] = _Entry(None if node_id == 0 else 0)
            node.submit_task(TaskSpec(oid, self._fn_id, blob, list(args), kwargs, 1, False,
                                      bp, plan.retries, name, node_id, not simple))
            return ObjectRef(oid, node_id, target)
        oid, target, result = _make_call_result(node, nret, stream, bp, name, None)
        if not stream:
            node.pending[oid] = target
        node.submit_task(TaskSpec(oid, self._fn_id, blob, list(args), kwargs, nret, stream, bp,
                                  plan.retries, name, node.id, not simple))
        return result

    def _remote_special(self, plan, args, kwargs):
        """``_call`` of a task with a Demand, a retry policy or env_vars."""
        if plan.arity is not None:
            check_call(plan.arity, args, kwargs)
        node = state.get_node()
        name = plan.name
        if plan.demand is not None and node.id == 0:
            with node._sched:
                node.resources.check_feasible(plan.demand, name)   # refused here, at the call
        if _check_args_serialisable(args, kwargs, name):
            args, kwargs = _by_value(node, args, kwargs)
        if plan.env_function is None:
            fn_id, blob = self._fn_id, self._blob
            if blob is None:
                blob = self._blob = ship(self._function)
        else:
            fn_id, blob = plan.env_fn_id, plan.env_blob
            if blob is None:
                blob = plan.env_blob = ship(plan.env_function)
        nret, stream, bp = plan.nret, plan.stream, plan.bp
        oid, target, result = _make_call_result(node, nret, stream, bp, name,
                                                None if node.id == 0 else 0)
        if not stream:
            node.pending[oid] = target
        node.submit_task_placed(plan.demand, plan.retry_on, plan.max_calls, oid, fn_id, blob,
                                list(args),
                                kwargs, nret, stream, bp, plan.retries, name)
        return result

    def __reduce__(self):
        return (_rebuild_function, (self._function, self._options, self._fn_id))


def _rebuild_function(function, options, fn_id):
    rf = RemoteFunction(function, options)
    rf._fn_id = fn_id
    return rf


def _methods_of(cls):
    """name -> (is_gen, the options declared with ``method(...)`` or None, arity)."""
    methods = {}
    for name, member in inspect.getmembers(cls):
        if name.startswith("__") and name not in ("__call__",):
            continue
        if callable(member):
            is_gen = inspect.isgeneratorfunction(member) or inspect.isasyncgenfunction(member)
            declared = declared_options(member)
            if declared:
                _check_method_options(declared)
            methods[name] = (is_gen, declared or None, method_arity(cls, name, member))
    return methods


def _is_async(cls):
    return any(inspect.iscoroutinefunction(m) or inspect.isasyncgenfunction(m)
               for _, m in inspect.getmembers(cls))


class ActorClass:
    """A class whose instances live in their own process: ``C.remote(...)`` -> handle.

    The class's own attributes (``C.X``, a staticmethod ``C.s()``) read through."""

    def __init__(self, cls, options, namespace=None):
        if namespace is not None and type(options) is tuple:
            # ``class B(A)``: Python calls A's type with (name, bases, namespace).
            base = next(b for b in options if isinstance(b, ActorClass))
            raise ActorClassInheritanceException(
                f"Attempted to define subclass '{cls}' of actor class '{base.__name__}'. "
                f"Inheriting from actor classes is not currently supported. You can instead "
                f"inherit from a non-actor base class and make the derived class an actor "
                f"class (with @ray.remote).")
        try:
            _check_options(options, "actor")
            self._refused = None
        except ValueError as exc:
            self._refused = _RefusedHere(exc).error
        self._cls = cls
        self._options = options
        self._blob = None
        # Looked at on first use, not here: see _creation_request.
        self._methods = None
        self._is_async = None
        self._arity = None
        self._bound = {}        # options -> _Bound (see _cached_bound)
        self.__name__ = cls.__name__
        self.__qualname__ = cls.__qualname__
        self.__doc__ = cls.__doc__
        self.__module__ = cls.__module__

    def __getattr__(self, name):
        cls = self.__dict__.get("_cls")
        if cls is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(cls, name)

    def __dir__(self):
        return sorted(set(object.__dir__(self)) | set(dir(self._cls)))

    def __call__(self, *args, **kwargs):
        name = self._cls.__name__
        raise TypeError(f"Actors cannot be instantiated directly. Instead of '{name}()', "
                        f"use '{name}.remote()'.")

    def remote(self, *args, **kwargs):
        if _backend.RAY:
            return _backend.ENGINE.core.actor_class(self).remote(*args, **kwargs)
        return self._call(self._options, args, kwargs)

    def options(self, **opts):
        if _backend.RAY:
            return _backend.ENGINE.core.actor_options(self, opts)
        bound, key = _cached_bound(self._bound, opts)
        if bound is None:
            merged = {**self._options, **opts}
            _check_options(merged, "actor")
            bound = _Bound(self, merged)
            _cache_bound(self._bound, key, bound)
        return bound

    def _creation_request(self, node, opts, args, kwargs):
        """What the driver needs to start one actor of this class.

        The class's methods are looked at here rather than in ``__init__``: a
        method that creates actors of its own class (``C.remote()`` inside
        ``C``) ships the class inside its own pickle, and when a worker
        unpickles it the class is rebuilt after this object, so at
        ``__init__`` time it had no methods yet.
        """
        cls = self._cls
        if self._methods is None:
            self._methods = _methods_of(cls)
            self._is_async = _is_async(cls)
            self._arity = constructor_arity(cls)
        if self._arity is not None:
            check_call(self._arity, args, kwargs)
        _check_args_serialisable(args, kwargs, f"{cls.__name__}.__init__")
        if self._blob is None:
            self._blob = ship(cls)
        namespace = opts.get("namespace") or getattr(node, "namespace", None)
        mc = opts.get("max_concurrency") or (1000 if self._is_async else 1)
        req = (self._blob, cls.__name__, self._methods, self._is_async, list(args), kwargs,
               mc, opts.get("name"), namespace, bool(opts.get("get_if_exists", False)))
        # Ray's defaults: the request of old, 10 fields; else the extras as an 11th.
        extra = _actor_extra(cls, opts)
        return req if extra is None else req + (extra,)

    def bind(self, *args, **kwargs):
        """A node of Ray's DAG API: an actor when the graph is executed (see ``ray_lite.dag``)."""
        return _dag_node(self, self, args, kwargs)

    def _remote(self, args=None, kwargs=None, **options):
        """Ray's older form, which libraries still call:
        ``C._remote(args=[...], kwargs={...}, num_cpus=...)``."""
        target = self.options(**options) if options else self
        return target.remote(*(args or ()), **(kwargs or {}))

    def _call(self, opts, args, kwargs):
        if self._refused is not None and opts is self._options:
            raise self._refused
        node = state.get_node()
        req = self._creation_request(node, opts, args, kwargs)
        info = node.request(P.OP_CREATE_ACTOR, *req)
        # The creator's handle and its copies keep the actor (see ActorHandle);
        # get_if_exists may have returned another creator's actor.
        return ActorHandle(info, None if opts.get("get_if_exists") or
                           opts.get("lifetime") == "detached"
                           else actor_lease(node, info.actor_id))

    def __reduce__(self):
        return (_rebuild_actor_class, (self._cls, self._options))


def _actor_extra(cls, opts):
    """The options of an actor that the driver's scheduler, restarts and the
    actor's process act on; None when all are Ray's defaults."""
    groups = check_groups(opts.get("concurrency_groups"))
    check_method_groups(cls, groups)
    extra = {"demand": demand_of(opts, "actor", _driver_pid()),
             "max_restarts": opts.get("max_restarts") or 0,
             "max_task_retries": opts.get("max_task_retries") or 0,
             "env_vars": env_vars_of(opts.get("runtime_env")),
             "concurrency_groups": groups,
             # Not ended with the process that created it, nor when its
             # handles are gone: it lives until killed or the runtime ends.
             "detached": opts.get("lifetime") == "detached"}
    return extra if any(extra.values()) else None


def _rebuild_actor_class(cls, options):
    return ActorClass(cls, options)
