"""The public core API (Ray's names and semantics, for one machine)."""
import atexit
import os
import sys
import threading
from collections.abc import Mapping

from ray_lite._lazy import lazy_module
from ray_lite.exceptions import GetTimeoutError, ObjectStoreFullError, TaskCancelledError

from ..process import backend as _backend, interrupts, state

from ..job.job_setup import JobSetup
from ..links import protocol as P
from ..objects import entries as entries_mod
from ..objects import object_store, spill
from ..objects.dynamic_generator import DynamicEntry
from ..objects.refs import ObjectRef, ObjectRefGenerator, frozen_entry, raisable
from ..process.errors import KILLED, actor_died_message
from ..scheduling.scheduler import check_resource_dict
from . import observability, plugins
from .actor_handle import ActorHandle
from .remote import ActorClass, RemoteFunction, _Bound

inspect = lazy_module("inspect", globals())
uuid = lazy_module("uuid", globals())

__all__ = ["init", "shutdown", "is_initialized", "remote", "get", "wait", "put", "kill",
           "cancel", "get_actor", "ObjectRef", "ObjectRefGenerator", "ActorHandle"]

_init_lock = threading.Lock()
_atexit_registered = False

# init() keywords of Ray that are harmless here (accepted, no effect).
_HARMLESS_INIT = {"include_dashboard", "dashboard_host", "dashboard_port", "logging_level",
                  "configure_logging", "log_to_driver",
                  "_system_config", "num_gpus", "_temp_dir", "logging_format",
                  "_memory"}
# What init refuses, and what to do instead.
_REFUSED_INIT = {
    "local_mode": "tasks and actors always run in worker processes here; leave local_mode "
                  "out (to step through a task in this process, call the function itself, "
                  "without .remote())",
    "storage": "ray_lite has no cluster storage; leave storage out and write files "
               "where the program chooses",
    "_node_ip_address": "ray_lite runs on this machine only; leave _node_ip_address out",
}


class RayContext(Mapping):
    """What ``init`` returns, as Ray's: ``address_info``, the versions, and a
    context manager that shuts the runtime down on exit
    (``with ray_lite.init(): ...``).  ``dashboard_url``: the dashboard's
    "host:port" while this driver serves it (``include_dashboard=True``),
    else None."""

    def __init__(self, node):
        from ray_lite._version import __version__
        self.dashboard_url = state.dashboard_url
        self.python_version = ".".join(map(str, sys.version_info[:3]))
        self.ray_version = __version__
        self.ray_commit = None
        self._driver_pid = node.driver_pid
        self._address_info = None

    @property
    def address_info(self):
        # Made on first use: finding the node's address opens a socket.
        if self._address_info is None:
            from ..process.ids import node_id_hex
            from ..scheduling.cluster import node_ip_address
            self._address_info = {
                "node_ip_address": node_ip_address(), "address": "local",
                "node_id": node_id_hex(self._driver_pid), "webui_url": self.dashboard_url,
                "session_dir": None, "gcs_address": None}
        return self._address_info

    def __getitem__(self, key):
        return self.address_info[key]

    def __iter__(self):
        return iter(self.address_info)

    def __len__(self):
        return len(self.address_info)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        shutdown()

    def disconnect(self):
        """Ray's name for ending the runtime this context describes."""
        shutdown()

    def __repr__(self):
        return f"RayContext(address_info={self.address_info!r})"


def init(num_cpus=None, *, ignore_reinit_error=False, namespace=None, address=None,
         resources=None, runtime_env=None, object_store_memory=None, backend=None,
         job_config=None, logging_config=None, **kwargs):
    """Start the runtime: a zygote and ``num_cpus`` worker processes (default: CPU count).

    ``object_store_memory``: bytes that large objects may take in shared
    memory (default: 30 % of the machine's memory); see ``object_store.py``.

    ``backend="ray"``, an ``address`` of a Ray cluster (``"auto"``,
    ``"host:6379"``, ``"ray://host:10001"``) or ``RAY_LITE_BACKEND=ray`` run
    the program on Ray instead (see ``_private/process/backend.py``).

    ``job_config`` (``ray_lite.job_config.JobConfig``) and ``logging_config``
    (``ray_lite.LoggingConfig``): as in Ray; see ``_private/job/job_setup.py``.
    """
    global _atexit_registered
    engine = _backend.choose(backend, address)
    if engine == _backend.RAY_NAME:
        if state.node is not None:
            raise RuntimeError("ray_lite is already running on the local backend: "
                               "call ray_lite.shutdown() before init(backend='ray')")
        from ..job.job_setup import ray_init_kwargs
        if job_config is not None:
            kwargs["job_config"] = job_config
        if logging_config is not None:
            kwargs["logging_config"] = logging_config
        runtime_env, kwargs = ray_init_kwargs(runtime_env, kwargs)
        context = _backend.ENGINE.init(address=address, num_cpus=num_cpus, namespace=namespace,
                            resources=resources, runtime_env=runtime_env,
                            object_store_memory=object_store_memory,
                            ignore_reinit_error=ignore_reinit_error, **kwargs)
        if not _atexit_registered:
            atexit.register(_shutdown_at_exit)
            _atexit_registered = True
        return context
    if _backend.RAY:
        raise RuntimeError("ray_lite is already running on Ray: call ray_lite.shutdown() "
                           "before init(backend='local')")
    resources = check_resource_dict(resources, "init(resources=...)")
    job = JobSetup(namespace, runtime_env, job_config, logging_config)
    namespace = job.namespace
    for key, value in kwargs.items():
        if key in _REFUSED_INIT and value not in (None, False, {}):
            raise ValueError(f"init({key}={value!r}): {_REFUSED_INIT[key]}")
        if key not in _HARMLESS_INIT and key not in _REFUSED_INIT:
            raise TypeError(f"init() got an unexpected keyword argument '{key}'")
    with _init_lock:
        if state.node is not None:
            if ignore_reinit_error:
                return RayContext(state.node)
            raise RuntimeError("Maybe you called ray.init twice by accident? This error can be "
                               "suppressed by passing in 'ignore_reinit_error=True' or by "
                               "calling 'ray.shutdown()' prior to 'ray.init()'.")
        if num_cpus is None:
            num_cpus = os.cpu_count() or 1
        if isinstance(num_cpus, bool) or not isinstance(num_cpus, int) or num_cpus < 0:
            # 0 as in Ray: a node for tasks and actors that ask for no CPU.
            raise ValueError(f"num_cpus must be an int >= 0, got {num_cpus!r}")
        if namespace is None:
            # Ray's anonymous namespace: the job's own, a fresh UUID.
            namespace = str(uuid.uuid4())
        capacity = object_store.check_capacity(object_store_memory)
        spilling = object_store.spilling_enabled(kwargs.get("_system_config"))
        spill.cleanup_stale_spill_dirs()
        from ..node.driver import DriverNode
        node = DriverNode(num_cpus, namespace, resources, job.env_vars, job.for_workers)
        node.job = job.record()
        try:
            object_store.configure(node, capacity, spilling)
        except BaseException:
            node.shutdown()
            raise
        state.node = node
        if job.logging_config is not None:
            job.logging_config._apply()      # the driver's own records too, as in Ray
        interrupts.install()
        if not _atexit_registered:
            atexit.register(_shutdown_at_exit)
            _atexit_registered = True
        try:
            observability.on_init(kwargs)
        except BaseException:
            _shutdown_locked(node)
            raise
        return RayContext(node)


state.auto_start = init


def preload(modules):
    """Import ``modules`` into the zygote so that workers started afterwards
    have them loaded already (Serve does this for its replica and proxy code).
    Only the driver has a zygote; elsewhere, or before ``init``, a no-op."""
    node = state.node
    if node is not None and node.id == 0 and not _backend.RAY:
        node.zygote.preload(modules)


def create_actors(actor_class, calls):
    """One actor of ``actor_class`` (an unnamed ``@remote`` class) per
    ``(args, kwargs)`` in ``calls``, all requested at once: a single request to
    the driver and a single round trip to the zygote, where ``.remote()`` in a
    loop would make one of each per actor.  A list of ``ActorHandle``, with
    the exception in place of each actor that could not be started."""
    if _backend.RAY:
        # (There C.options(...) is Ray's own optioned class.)
        if isinstance(actor_class, ActorClass) or _backend.ENGINE.core.is_class_with_options(actor_class):
            return _backend.ENGINE.core.create_actors(actor_class, calls)
    elif type(actor_class) is _Bound and isinstance(actor_class._target, ActorClass):
        actor_class, opts = actor_class._target, actor_class._how       # C.options(...)
    elif isinstance(actor_class, ActorClass):
        opts = actor_class._options
    if _backend.RAY or not isinstance(actor_class, ActorClass):
        raise TypeError(f"create_actors expects a @remote class, got {actor_class!r}")
    if opts.get("name") is not None:
        raise ValueError("create_actors creates unnamed actors")
    node = state.get_node()
    reqs = [actor_class._creation_request(node, opts, args, kwargs) for args, kwargs in calls]
    infos = node.request(P.OP_CREATE_ACTORS, reqs)
    return [info if isinstance(info, Exception) else ActorHandle(info) for info in infos]


def _shutdown_at_exit():
    try:
        shutdown()
    except Exception:
        pass


def shutdown():
    """Stop every worker and actor and free the runtime's shared memory."""
    if _backend.RAY:
        _backend.ENGINE.shutdown()
        return
    with _init_lock:
        node = state.node
        if node is None:
            return
        if node.id != 0:
            raise RuntimeError("shutdown() can only be called by the driver")
        _shutdown_locked(node)


def _shutdown_locked(node):
    try:
        observability.on_shutdown()
        node.shutdown()
    finally:
        state.node = None
        interrupts.uninstall()
        spill.remove_spill_dir(node)
        object_store.clear_pool()


def is_initialized():
    if _backend.RAY:
        return _backend.ENGINE.is_initialized()
    return state.node is not None


def remote(*args, **options):
    """``@remote`` or ``@remote(**options)`` on a function or a class."""
    if len(args) == 1 and not options and (inspect.isfunction(args[0]) or inspect.isclass(args[0])
                                           or callable(args[0])):
        return _make_remote(args[0], {})
    if args:
        raise TypeError("The @ray.remote decorator must be applied either with no arguments "
                        "and no parentheses, or with keyword arguments only.")
    if not options:
        # ``@remote()``: Ray refuses it (so would the program, moved to Ray).
        raise AssertionError("The @ray.remote decorator must be applied either with no "
                             "arguments and no parentheses, for example '@ray.remote', or it "
                             "must be applied using some of its options, for example "
                             "'@ray.remote(num_returns=2, resources={\"CustomResource\": 1})'.")

    def decorator(obj):
        return _make_remote(obj, options)
    return decorator


def _make_remote(obj, options):
    if inspect.isclass(obj):
        return ActorClass(obj, options)
    if callable(obj):
        return RemoteFunction(obj, options)
    raise TypeError("The @ray.remote decorator must be applied to either a function or a class.")


def _is_compiled_ref(r):
    """Whether ``r`` is a Compiled Graph's result (``ray.get`` reads it)."""
    return isinstance(r, plugins.COMPILED_REFS)


def _check_ref(r):
    if type(r) is not ObjectRef:
        if isinstance(r, ObjectRefGenerator):
            raise TypeError("get() does not take an ObjectRefGenerator: iterate it "
                            "(for ref in gen: get(ref)) instead")
        raise TypeError(f"get() expects an ObjectRef or a list of ObjectRefs, got "
                        f"{type(r).__name__}")


def _wait_entries(node, refs, entries, timeout):
    for r in refs:
        if not r._e.ready:
            node.objects.ensure_fetch(r)
    n = len(entries)
    pos = [0]
    failures_seen = [None]

    def all_ready():
        """True once every entry is ready, or one of them failed."""
        i = pos[0]
        while i < n and entries[i].ready:
            if entries[i].error is not None:
                return True
            i += 1
        pos[0] = i
        if i == n:
            return True
        failures = entries_mod.failures[0]
        if failures != failures_seen[0]:
            failures_seen[0] = failures
            for k in range(i + 1, n):
                e = entries[k]
                if e.ready and e.error is not None:
                    return True
        return False
    node.block_begin()
    try:
        return node.wait_until(all_ready, timeout)
    finally:
        node.block_end()


def get(object_refs, *, timeout=None):
    """The value(s) of ``object_refs`` (one ref or a list), waiting for them.

    Raises the task's error (a ``RayTaskError`` that is also the user's
    exception class), or ``GetTimeoutError`` after ``timeout`` seconds.
    """
    if _backend.RAY:
        return _backend.ENGINE.core.get(object_refs, timeout)
    if type(object_refs) is ObjectRef:
        e = object_refs._e
        if not e.ready:
            if timeout is not None and timeout < 0:
                raise ValueError("timeout must be >= 0 or None")
            node = state.node
            if node is None:
                node = state.get_node()
            if (timeout is None and object_refs._owner == node.id and not node.lends_slot
                    and node._drive_lock.acquire(False)):
                # wait_ref's common case, one call fewer: a call's result (B11).
                node._wait_entry_driving(e)
            elif not node.wait_ref(object_refs, timeout):
                raise GetTimeoutError(f"Get timed out: some object(s) not ready after "
                                      f"{timeout} s.")
        if e.error is None:
            return e.value
        raise raisable(e.error)
    else:
        if not isinstance(object_refs, (list, tuple)):
            if isinstance(object_refs, ObjectRefGenerator):
                return object_refs      # as Ray does
            if _is_compiled_ref(object_refs):
                return object_refs.get(timeout)
            _check_ref(object_refs)
        refs = list(object_refs)
        if refs and type(refs[0]) is not ObjectRef and _is_compiled_ref(refs[0]):
            if not all(_is_compiled_ref(r) for r in refs):
                raise ValueError("get() takes a list of CompiledDAGRefs or of ObjectRefs, "
                                 "not both")
            return [r.get(timeout) for r in refs]
        for r in refs:
            _check_ref(r)
    if timeout is not None and timeout < 0:
        raise ValueError("timeout must be >= 0 or None")
    entries = [r._e for r in refs]
    if not all(e.ready for e in entries):
        node = state.get_node()
        if not _wait_entries(node, refs, entries, timeout):
            raise GetTimeoutError(f"Get timed out: some object(s) not ready after {timeout} s.")
    values = []
    for e in entries:     # (not all may be ready when one failed: that one raises)
        if e.error is not None:
            raise raisable(e.error)
        values.append(e.value)
    return values


def put(value):
    """Store a copy of ``value`` and return a ref to it (owned by this process).

    As in Ray, what ``get`` returns does not change if ``value`` is mutated
    afterwards; each ``get`` returns a fresh copy (numpy arrays: read-only,
    zero-copy views of the stored copy).  Immutable values are not copied.
    Large values (``object_store.STORE_THRESHOLD`` bytes of buffers and more)
    are copied once into shared memory, which every process that gets them
    maps; past ``init(object_store_memory=...)`` they spill to disk, and
    ``ObjectStoreFullError`` is raised when even that has no room.
    """
    if _backend.RAY:
        return _backend.ENGINE.core.put(value)
    if type(value) is ObjectRef:
        raise TypeError("Calling 'put' on an ObjectRef is not allowed. If you really want to "
                        "do this, you can wrap the ObjectRef in a list and call 'put' on it.")
    node = state.get_node()
    try:
        entry = frozen_entry(value)
    except ObjectStoreFullError:
        raise
    except Exception as exc:
        raise TypeError(f"Could not serialize the value passed to put(): {exc}") from exc
    return ObjectRef(node.new_oid(), node.id, entry)


def _is_ready(x):
    if type(x) is ObjectRef:
        return x._e.ready
    # A generator is ready when next() would not wait: an item, or its end.
    s = x._s
    if s.table.is_next_ready():
        return True
    if s.bp > 0:
        state.node.streams.flush_stream_acks(s)     # what was taken, before waiting for more
    return False


def wait(object_refs, *, num_returns=1, timeout=None, fetch_local=True):
    """``(ready, not_ready)``: the first ``num_returns`` ready refs (or generators)."""
    if _backend.RAY:
        return _backend.ENGINE.core.wait(object_refs, num_returns, timeout, fetch_local)
    # Ray 2.60's checks, in its order and words; but any iterable of refs is
    # taken, as the Ray backend takes it (_ray/core.py).
    if type(object_refs) is not list and isinstance(object_refs,
                                                    (ObjectRef, ObjectRefGenerator)):
        raise TypeError("wait() expected a list of ray.ObjectRef or ray.ObjectRefGenerator, "
                        f"got a single ray.ObjectRef or ray.ObjectRefGenerator {object_refs}")
    if timeout is not None and timeout < 0:
        raise ValueError(f"The 'timeout' argument must be nonnegative. Received {timeout}")
    refs = list(object_refs)
    generators = False
    num_ready = 0       # of the refs (generators are looked at below)
    for r in refs:
        if type(r) is ObjectRef:
            if r._e.ready:
                num_ready += 1
        elif isinstance(r, ObjectRefGenerator):
            generators = True
        else:
            raise TypeError("wait() expected a list of ray.ObjectRef or "
                            f"ray.ObjectRefGenerator, got list containing {type(r)}")
    n = len(refs)
    if not n:
        return [], []       # as Ray, whatever num_returns says
    if n > 1 and _repeats(refs):
        raise ValueError("Wait requires a list of unique ray_waitables.")
    if not isinstance(num_returns, int) or num_returns <= 0:
        raise ValueError(f"Invalid number of objects to return {num_returns}.")
    if num_returns > n:
        raise ValueError("num_returns cannot be greater than the number of ray_waitables "
                         "provided to ray.wait.")
    if not generators and (num_ready >= num_returns or timeout == 0):
        # Refs only, and the answer is known now: the look was the entries'
        # flags (B3).
        if num_ready == n == num_returns:
            return refs, []
        ready, not_ready = [], []
        for r in refs:
            if len(ready) < num_returns and r._e.ready:
                ready.append(r)
            else:
                not_ready.append(r)
        return ready, not_ready

    def enough():
        c = 0
        for r in refs:
            if _is_ready(r):
                c += 1
                if c >= num_returns:
                    return True
        return c >= num_returns
    if not enough() and timeout != 0:
        node = state.get_node()
        for r in refs:
            if type(r) is ObjectRef and not r._e.ready:
                node.objects.ensure_fetch(r)
        node.block_begin()      # a pool worker lends its CPU slot while it waits
        try:
            node.wait_until(enough, timeout)
        finally:
            node.block_end()
    ready, not_ready = [], []
    for r in refs:
        if len(ready) < num_returns and _is_ready(r):
            ready.append(r)
        else:
            not_ready.append(r)
    return ready, not_ready


def _repeats(refs):
    """Whether a ref (or generator) is in ``refs`` twice: the same object, or
    two refs to the same object."""
    objects = {r._id for r in refs if type(r) is ObjectRef}      # (ObjectRef.__eq__'s key)
    generators = {id(r) for r in refs if type(r) is not ObjectRef}
    return len(objects) + len(generators) != len(refs)


_RESTART_SEEN_WITHIN_S = 30


def kill(actor, *, no_restart=True):
    """Kill an actor's process at once; pending and later calls raise ``ActorDiedError``."""
    if _backend.RAY:
        return _backend.ENGINE.core.kill(actor, no_restart)
    if not isinstance(actor, ActorHandle):
        raise ValueError(f"kill() only supports actors; got {type(actor).__name__}")
    node = state.get_node()
    info = actor._info
    # The driver records why the actor died for its own calls; a worker, for its.
    if info.actor_id not in node.dead_peers:
        node.death_causes[info.actor_id] = actor_died_message(info, KILLED)
    node.request(P.OP_KILL, info.actor_id, bool(no_restart))
    aid = info.actor_id
    if not no_restart and node.id == 0 and aid in node.actor_restarts:
        # Ray holds the calls made after this for the restarted actor: here
        # they go to the new incarnation once the death is seen and the
        # restart started (bounded: a slow restart leaves them failing).
        old_pid = node.pids.get(aid)
        node.wait_until(lambda: aid not in node.actor_restarts or node.pids.get(aid) != old_pid,
                        _RESTART_SEEN_WITHIN_S)


def cancel(ref, *, force=False, recursive=True):
    """Cancel a task, actor call or streaming generator.

    A queued task never runs; a running one is interrupted (a
    ``KeyboardInterrupt`` raised in it, as in Ray); ``force=True`` kills the
    worker running it.  A cancelled ref raises ``TaskCancelledError`` from
    ``get``; a cancelled generator ends with that error at its next item.
    Actor calls: a queued call never runs, a running call of an async actor
    is cancelled (``asyncio.CancelledError`` in it), a running call of a sync
    or threaded actor runs on, and may look
    (``get_runtime_context().is_canceled()``): one that saw it ends with
    ``TaskCancelledError`` for its caller, as in Ray; ``force=True`` is refused.
    ``recursive`` (the default): the tasks a cancelled running task submitted,
    and theirs, are cancelled too, and so are the calls it made to actors
    (without force, even when the task was cancelled with ``force=True``, as
    in Ray).  A ref this process borrowed is cancelled through its owner.
    """
    if _backend.RAY:
        return _backend.ENGINE.core.cancel(ref, force, recursive)
    node = state.get_node()
    if isinstance(ref, ObjectRefGenerator):
        s = ref._s
        if s.done:
            return
        if node.inflight.get(s.peer, {}).get(s.sid) == P.STREAM:  # an actor's stream
            if force:
                raise ValueError("force=True is not supported for actor tasks.")
            node.streams.cancel_stream(s, force)
            return
        node.request(P.OP_CANCEL, s.sid, force, recursive)
        node.streams.fail_stream(s, TaskCancelledError())
        return
    if type(ref) is not ObjectRef:
        raise TypeError(f"cancel() expects an ObjectRef or ObjectRefGenerator, got "
                        f"{type(ref).__name__}")
    if ref._e.ready:
        return
    if type(ref._e) is DynamicEntry:       # num_returns="dynamic": its stream
        items = ref._e.items
        return None if items is None else cancel(items, force=force, recursive=recursive)
    oid = ref._id
    for peer, fl in list(node.inflight.items()):
        if fl.get(oid) == P.ACTOR_CALL:
            if force:
                raise ValueError("force=True is not supported for actor tasks.")
            node.send(peer, P.cancel_msg(oid, force))
            return
    node.request(P.OP_CANCEL, oid, force, recursive)


def get_actor(name, namespace=None):
    """The handle of the live actor registered under ``name``."""
    if _backend.RAY:
        return _backend.ENGINE.core.get_actor(name, namespace)
    if not isinstance(name, str) or not name:
        raise ValueError("Please supply a non-empty value to get_actor")
    node = state.get_node()
    ns = namespace if namespace is not None else node.namespace
    return ActorHandle(node.request(P.OP_GET_ACTOR, name, ns))
