"""Remote functions, actor classes, actor handles and their options."""
import functools
import inspect
import os

from ray_lite.exceptions import ActorDiedError

from ray_lite import _ray

from . import backend as _backend
from . import protocol as P
from .protocol import ACTOR_CALL, METHOD   # per call: a global, not an attribute
from .protocol import TaskSpec
from . import state
from .concurrency_groups import check_groups, check_method_groups
from .object_store import STORE_THRESHOLD
from .refs import (ObjectRef, ObjectRefGenerator, _Entry, probe_serialisable, stored_by_value,
                   travels_as_value)
from .restarts import reach, retained_calls
from .runtime_env import EnvTask, env_vars_of
from .scheduler import check_retry_exceptions, demand_of
from .method_options import declared_options
from .shipping import ship
from .signatures import arity_of, check_call, constructor_arity, method_arity
from .transport import LinkClosed

# Options Ray accepts that ray_lite honours.
_PLACEMENT = {"num_cpus", "resources", "scheduling_strategy", "runtime_env", "placement_group",
              "placement_group_bundle_index", "placement_group_capture_child_tasks"}
_TASK_HONOURED = {"num_returns", "max_retries", "name", "_generator_backpressure_num_objects",
                  "retry_exceptions"} | _PLACEMENT
_ACTOR_HONOURED = {"max_concurrency", "name", "namespace", "get_if_exists", "lifetime",
                   "max_restarts", "max_task_retries", "concurrency_groups"} | _PLACEMENT
# Options that make no sense on one machine but are harmless: accepted, listed
# in the README, and without effect.
HARMLESS = {"num_gpus", "memory", "accelerator_type", "label_selector", "_metadata",
            "enable_task_events", "object_store_memory", "max_calls", "_labels"}
# ...except for these values, which ray_lite cannot honour: refusing is
# better than silently doing something else.  (Per kind: an actor's option
# on a task, or the other way round, is accepted with its default only.)
_REFUSED_UNLESS_DEFAULT = {
    "task": {"num_gpus": (0, None), "max_calls": (0, None), "max_restarts": (0, None),
             "max_task_retries": (0, None), "concurrency_groups": (None,)},
    "actor": {"num_gpus": (0, None), "max_calls": (0, None), "retry_exceptions": (False, None)},
}
_SIMPLE_TYPES = frozenset((int, float, str, bytes, bool, type(None)))


def _driver_pid():
    node = state.node
    return os.getpid() if node is None else node.driver_pid


def _check_options(opts, kind):
    honoured = _TASK_HONOURED if kind == "task" else _ACTOR_HONOURED
    refused = _REFUSED_UNLESS_DEFAULT[kind]
    for key, value in opts.items():
        if key not in honoured and key not in HARMLESS and key not in refused:
            raise ValueError(f"Invalid option keyword {key} for {kind}s. Valid ones are "
                             f"{sorted(honoured | HARMLESS | set(refused))}.")
        allowed = refused.get(key)
        if allowed is not None and value not in allowed and not (
                isinstance(value, dict) and not value):
            raise ValueError(f"ray_lite does not support the option {key}={value!r} "
                             f"(single machine runtime; see the README's list of options)")
    if kind == "task":
        nr = opts.get("num_returns", 1)
        if nr == "dynamic":
            raise ValueError("ray_lite does not support num_returns='dynamic'; use a "
                             "streaming generator (num_returns='streaming')")
        if nr != "streaming" and (not isinstance(nr, int) or nr < 0):
            raise ValueError(f"num_returns must be a non-negative int or 'streaming', got {nr!r}")
        mr = opts.get("max_retries", 3)
        if not isinstance(mr, int) or mr < -1:
            raise ValueError(f"max_retries must be an int >= -1, got {mr!r}")
        check_retry_exceptions(opts.get("retry_exceptions"))
    else:
        for key in ("max_restarts", "max_task_retries"):
            v = opts.get(key, 0)
            if not isinstance(v, int) or isinstance(v, bool) or v < -1:
                raise ValueError(f"{key} must be an int >= -1, got {v!r}")
        check_groups(opts.get("concurrency_groups"))
        mc = opts.get("max_concurrency", None)
        if mc is not None and (not isinstance(mc, int) or mc < 1):
            raise ValueError(f"max_concurrency must be a positive int, got {mc!r}")
        if opts.get("lifetime") not in (None, "non_detached"):
            raise ValueError("ray_lite does not support lifetime='detached': actors end with "
                             "the driver (single machine runtime)")
    env_vars_of(opts.get("runtime_env"))
    demand_of(opts, kind, _driver_pid())
    bp = opts.get("_generator_backpressure_num_objects", -1)
    if bp is not None and (not isinstance(bp, int) or bp == 0 or bp < -1):
        raise ValueError(f"_generator_backpressure_num_objects must be a positive int or -1, "
                         f"got {bp!r}")


def _check_method_options(opts, info=None):
    """Refuse what an actor method's options cannot be, naming it (``info``:
    the actor's, to check a concurrency group against the actor's groups)."""
    for k in opts:
        if k not in ("num_returns", "name", "_generator_backpressure_num_objects",
                     "max_task_retries", "retry_exceptions", "concurrency_group",
                     "enable_task_events"):
            raise ValueError(f"Invalid option keyword {k} for actor methods.")
    group = opts.get("concurrency_group")
    if group is not None:
        if not isinstance(group, str):
            raise TypeError(f"concurrency_group must be a str, got {type(group).__name__}")
        groups = None if info is None else info.groups
        if info is not None and (groups is None or group not in groups):
            raise ValueError(f"Invalid concurrency group {group!r}: the actor has "
                             f"{list(groups or ())}")
    mtr = opts.get("max_task_retries")
    if mtr is not None and (not isinstance(mtr, int) or isinstance(mtr, bool) or mtr < -1):
        raise ValueError(f"max_task_retries must be an int >= -1, got {mtr!r}")
    if opts.get("retry_exceptions") not in (None, False):
        raise ValueError("ray_lite does not support retry_exceptions on actor methods "
                         "(an actor's calls are retried only when it restarts: "
                         "max_task_retries)")
    _check_options({k: v for k, v in opts.items()
                    if k not in ("concurrency_group", "max_task_retries", "retry_exceptions")},
                   "task")


def _check_args_serialisable(args, kwargs, what):
    """True when the arguments carry large buffers (see ``_by_value``).

    A value the codec cannot carry fails here, at the call site, and not
    later when the scheduler sends the task."""
    for a in args:
        if type(a) not in _SIMPLE_TYPES:
            break
    else:
        if not kwargs:
            return
        for a in kwargs.values():
            if type(a) not in _SIMPLE_TYPES:
                break
        else:
            return
    try:
        return probe_serialisable((args, kwargs)) >= STORE_THRESHOLD
    except Exception as exc:
        raise TypeError(f"Could not serialize the arguments of {what}: {exc}") from exc


def _by_value(node, args, kwargs):
    """The arguments with the large ones stored (``refs.stored_by_value``)."""
    args = stored_by_value(node, args)
    if kwargs:
        kwargs = dict(zip(kwargs, stored_by_value(node, kwargs.values())))
    return args, kwargs


def _prepare_args(args, kwargs, name, node=None):
    if _check_args_serialisable(args, kwargs, name) and node is not None:
        args, kwargs = _by_value(node, args, kwargs)
    # Ready refs travel as their values; the others are resolved by the actor
    # (which fetches them from their owner).
    args = [a._e.value if type(a) is ObjectRef and a._e.ready and a._e.error is None
            and travels_as_value(a) else a for a in args]
    if kwargs:
        kwargs = {k: (a._e.value if type(a) is ObjectRef and a._e.ready
                      and a._e.error is None and travels_as_value(a) else a)
                  for k, a in kwargs.items()}
    return args, kwargs


def _make_call_result(node, nret, stream, bp, name, peer):
    """Allocate the ids and the refs (or the generator) for a call's results."""
    n = 1 if stream else max(nret, 1)
    oid = node.new_oids(n)
    if stream:
        s = node.new_stream(oid, peer, bp, name)
        return oid, s, ObjectRefGenerator(s)
    if nret == 1:
        e = _Entry(peer)
        return oid, e, ObjectRef(oid, node.id, e)
    entries = [_Entry(peer) for _ in range(nret)]
    refs = [ObjectRef(oid + i, node.id, e) for i, e in enumerate(entries)]
    return oid, entries, (refs if nret else None)


def _stream_opts(opts, is_gen):
    nr = opts.get("num_returns", "streaming" if is_gen else 1)
    stream = nr == "streaming"
    bp = opts.get("_generator_backpressure_num_objects", -1) or -1
    return (1 if stream else nr), stream, (bp if stream else -1)


class _TaskPlan:
    """What a set of options means for a call, worked out once per options.

    ``special``: the task has a Demand, a retry policy or env_vars (it takes
    ``_remote_special``, the common task does not)."""

    __slots__ = ("name", "nret", "stream", "bp", "retries", "special", "demand", "retry_on",
                 "env_fn_id", "env_function", "env_blob", "arity")

    def __init__(self, function, opts, is_gen, arity):
        self.name = opts.get("name") or function.__qualname__
        self.arity = arity
        self.nret, self.stream, self.bp = _stream_opts(opts, is_gen)
        self.retries = opts.get("max_retries", 3)
        self.demand = demand_of(opts, "task", _driver_pid())
        self.retry_on = check_retry_exceptions(opts.get("retry_exceptions"))
        env = env_vars_of(opts.get("runtime_env"))
        self.env_function = None if env is None else EnvTask(function, env)
        self.env_fn_id = None if env is None else os.urandom(8).hex()
        self.env_blob = None
        self.special = (self.demand is not None or self.retry_on is not None
                        or env is not None)


class _RefusedHere:
    """The plan of a function whose options ray_lite refuses on one machine
    (``num_gpus=1``, ``lifetime="detached"``...) while the program is to run
    on Ray, where they mean what Ray says: the refusal is raised only if the
    function is used on the local backend after all."""

    __slots__ = ("error",)

    def __init__(self, error):
        if _backend.current() != _backend.RAY_NAME:
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
    other options (``how``: what its ``_remote`` takes for them)."""

    __slots__ = ("_target", "_how")

    def __init__(self, target, how):
        self._target = target
        self._how = how

    def remote(self, *args, **kwargs):
        return self._target._remote(self._how, args, kwargs)


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
            return _ray.core.remote_function(self).remote(*args, **kwargs)
        return self._remote(self._plan, args, kwargs)

    def options(self, **opts):
        if _backend.RAY:
            return _ray.core.function_options(self, opts)
        bound, key = _cached_bound(self._bound, opts)
        if bound is None:
            merged = {**self._options, **opts}
            _check_options(merged, "task")
            bound = _Bound(self, _TaskPlan(self._function, merged, self._is_gen, self._arity))
            _cache_bound(self._bound, key, bound)
        return bound

    def _remote(self, plan, args, kwargs):
        if plan.special:
            return self._remote_special(plan, args, kwargs)
        arity = plan.arity      # checked as Ray does, at the call (two comparisons)
        if arity is not None and (kwargs or not arity[0] <= len(args) <= arity[1]):
            check_call(arity, args, kwargs)
        node = state.node
        if node is None:
            node = state.get_node()
        name = plan.name
        simple = not kwargs
        if simple:
            for a in args:      # plain values only (the common case): nothing to probe
                if type(a) not in _SIMPLE_TYPES:
                    simple = False
                    break
        if not simple and _check_args_serialisable(args, kwargs, name):
            args, kwargs = _by_value(node, args, kwargs)
        blob = self._blob
        if blob is None:
            blob = self._blob = ship(self._function)
        nret, stream, bp = plan.nret, plan.stream, plan.bp
        if nret == 1 and not stream:
            oid = node._oid_base | next(node._seq)      # node.new_oid(), inline: per call
            # A worker's nested task is answered through the driver.
            target = _Entry(None if node.id == 0 else 0)
            result = ObjectRef(oid, node.id, target)
        else:
            oid, target, result = _make_call_result(node, nret, stream, bp, name, None)
        if not stream:
            node.pending[oid] = target
        node.submit_task(TaskSpec(oid, self._fn_id, blob, list(args), kwargs, nret, stream, bp,
                                  plan.retries, name, node.id, not simple))
        return result

    def _remote_special(self, plan, args, kwargs):
        """``_remote`` of a task with a Demand, a retry policy or env_vars."""
        if plan.arity is not None:
            check_call(plan.arity, args, kwargs)
        node = state.get_node()
        name = plan.name
        if plan.demand is not None and node.id == 0:
            with node._sched:
                node.check_feasible(plan.demand, name)   # refused here, at the call
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
        node.submit_task_placed(plan.demand, plan.retry_on, oid, fn_id, blob, list(args),
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
    """A class whose instances live in their own process: ``C.remote(...)`` -> handle."""

    def __init__(self, cls, options):
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

    def __call__(self, *args, **kwargs):
        name = self._cls.__name__
        raise TypeError(f"Actors cannot be instantiated directly. Instead of '{name}()', "
                        f"use '{name}.remote()'.")

    def remote(self, *args, **kwargs):
        if _backend.RAY:
            return _ray.core.actor_class(self).remote(*args, **kwargs)
        return self._remote(self._options, args, kwargs)

    def options(self, **opts):
        if _backend.RAY:
            return _ray.core.actor_options(self, opts)
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

    def _remote(self, opts, args, kwargs):
        if self._refused is not None and opts is self._options:
            raise self._refused
        node = state.get_node()
        req = self._creation_request(node, opts, args, kwargs)
        return ActorHandle(node.request(P.OP_CREATE_ACTOR, *req))

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
             "concurrency_groups": groups}
    return extra if any(extra.values()) else None


def _rebuild_actor_class(cls, options):
    return ActorClass(cls, options)


class ActorHandle(metaclass=_backend.AlsoRay):
    """A handle to an actor; picklable, so it can be passed to tasks and actors."""

    # The methods made so far live in the instance's __dict__: the next
    # ``handle.method`` is a plain attribute hit (``__getattr__`` runs once).
    __slots__ = ("_info", "__dict__", "__weakref__")

    def __init__(self, info):
        self._info = info

    def __getattr__(self, name):
        if name.startswith("__") and name != "__call__":
            raise AttributeError(name)
        info = self._info
        entry = info.methods.get(name)
        if entry is None:
            raise AttributeError(f"'ActorHandle' object has no attribute '{name}' "
                                 f"(actor class {info.class_name} has no method {name!r})")
        is_gen, declared, arity = entry
        declared = declared or {}
        m = self.__dict__[name] = _method_type(info, declared)(self, name, is_gen, declared,
                                                               arity)
        return m

    def __reduce__(self):
        return (ActorHandle, (self._info,))

    def __repr__(self):
        return f"Actor({self._info.class_name}, {self._info.actor_id:08x})"

    def __hash__(self):
        return hash(self._info.actor_id)

    def __eq__(self, other):
        return isinstance(other, ActorHandle) and other._info.actor_id == self._info.actor_id


class ActorMethod:
    __slots__ = ("_handle", "_name", "_is_gen", "_options", "_nret", "_stream", "_bp",
                 "_qualname", "_arity")

    def __init__(self, handle, name, is_gen, options, arity=None):
        self._handle = handle
        self._name = name
        self._is_gen = is_gen
        self._arity = arity
        self._options = options
        self._nret, self._stream, self._bp = _stream_opts(options, is_gen)
        self._qualname = f"{handle._info.class_name}.{name}"

    def __call__(self, *args, **kwargs):
        raise TypeError(f"Actor methods cannot be called directly. Instead of running "
                        f"'object.{self._name}()', try 'object.{self._name}.remote()'.")

    def options(self, **opts):
        merged = {**self._options, **opts}
        info = self._handle._info
        _check_method_options(merged, info)
        return _method_type(info, merged)(self._handle, self._name, self._is_gen, merged,
                                          self._arity)

    def remote(self, *args, **kwargs):
        node = state.node
        if node is None:
            node = state.get_node()
        info = self._handle._info
        aid = info.actor_id
        nret, stream, bp = self._nret, self._stream, self._bp
        name = self._qualname
        method = self._name
        arity = self._arity     # checked as Ray does, at the call (two comparisons)
        if arity is not None and (kwargs or not arity[0] <= len(args) <= arity[1]):
            check_call(arity, args, kwargs)
        if kwargs:
            args, kwargs = _prepare_args(args, kwargs, name, node)
        elif args:
            for a in args:
                if type(a) not in _SIMPLE_TYPES:
                    args, kwargs = _prepare_args(args, kwargs, name, node)
                    break
            else:
                args = list(args)     # plain values only (the common case)
        if node.id != 0:
            node.known_pids.setdefault(aid, info.pid)
        if nret == 1 and not stream:
            oid = node._oid_base | next(node._seq)      # node.new_oid(), inline: per call
            target = _Entry(aid)
            result = ObjectRef(oid, node.id, target)
        else:
            oid, target, result = _make_call_result(node, nret, stream, bp, name, aid)
        if not stream:
            node.pending[oid] = target
            fl = node.inflight.get(aid)
            if fl is None:
                fl = node.inflight[aid] = {}
            fl[oid] = ACTOR_CALL
        link = node.links.get(aid)
        if link is not None:
            try:
                link.send((METHOD, oid, method, args, kwargs, nret, stream, bp))
                return result
            except (LinkClosed, OSError):
                pass
            except BaseException:
                if not stream:
                    node.pending.pop(oid, None)
                    node.inflight.get(aid, {}).pop(oid, None)
                raise
        if aid in node.dead_peers or not node.connect(aid) or not node.send(
                aid, P.method_msg(oid, self._name, args, kwargs, nret, stream, bp)):
            err = ActorDiedError(node.death_causes.get(aid) or f"The actor {info.class_name} "
                                 f"is dead: {name} cannot run.", actor_id=aid)
            err.never_sent = True     # certain: the actor never saw this call (Serve retries it)
            if stream:
                node.fail_stream(target, err)
            else:
                node.pending.pop(oid, None)
                node.inflight.get(aid, {}).pop(oid, None)
                for e in (target if type(target) is list else [target]):
                    e.set_error(err)
        return result



class _GroupedActorMethod(ActorMethod):
    """A method called with ``.options(concurrency_group=...)``: its calls carry
    the group (``(method, group)`` in place of the method's name)."""

    __slots__ = ()

    def __init__(self, handle, name, is_gen, options, arity=None):
        ActorMethod.__init__(self, handle, name, is_gen, options, arity)
        self._name = (name, options["concurrency_group"])

    def options(self, **opts):
        return ActorMethod(self._handle, self._name[0], self._is_gen, {}, self._arity).options(
            **{**self._options, **opts})


class _RetryingActorMethod(ActorMethod):
    """A method of a restartable actor whose calls are retried on a restart
    (``max_task_retries``): see restarts.py."""

    __slots__ = ("_retries",)

    def __init__(self, handle, name, is_gen, options, arity=None):
        ActorMethod.__init__(self, handle, name, is_gen, options, arity)
        r = options.get("max_task_retries")
        self._retries = handle._info.max_task_retries if r is None else r

    def remote(self, *args, **kwargs):
        if self._stream:
            return ActorMethod.remote(self, *args, **kwargs)
        node = state.get_node()
        info = self._handle._info
        aid = info.actor_id
        name = self._qualname
        if self._arity is not None:
            check_call(self._arity, args, kwargs)
        args, kwargs = _prepare_args(args, kwargs, name, node)
        oid, target, result = _make_call_result(node, self._nret, False, self._bp, name, aid)
        node.pending[oid] = target
        group = self._options.get("concurrency_group")
        msg = P.method_msg(oid, self._name if group is None else (self._name, group), args,
                           kwargs, self._nret, False, self._bp)
        retained_calls(node, aid)[oid] = [msg, self._retries]
        if not (reach(node, aid, info.pid) and node.send(aid, msg)) and node.id == 0 \
                and aid not in node.restartable:
            # Dead for good.  (Dying, it is resent by the restart: RESTARTED.)
            node.retry_calls.get(aid, {}).pop(oid, None)
            node.pending.pop(oid, None)
            err = ActorDiedError(f"The actor {info.class_name} is dead: {name} cannot run.",
                                 actor_id=aid)
            for e in (target if type(target) is list else [target]):
                e.set_error(err)
        return result


def _method_type(info, options):
    """The ActorMethod class for calls of ``info``'s actor with ``options``."""
    retries = options.get("max_task_retries", info.max_task_retries)
    if retries and info.max_task_retries is not None:
        return _RetryingActorMethod
    if options.get("concurrency_group") is not None:
        return _GroupedActorMethod
    return ActorMethod
