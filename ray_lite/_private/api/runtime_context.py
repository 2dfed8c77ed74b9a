"""``get_runtime_context()`` and ``exit_actor()``: what the current process and call are.

A pool worker's running task is in its fields (``current_oid``,
``current_fn``, ``current_name``, kept by the task runner: its frame is
compiled, with no locals to read).  An actor's running call is not recorded per call (that
would cost every call a store): the lookup walks the calling thread's frames
up to the worker's frame that runs the call, whose ``oid`` local is the
call's id.  The same walk works on the main thread of a sync actor, on each
thread of a threaded actor and inside each coroutine of an async actor (a
running coroutine's frame links to the frame awaiting it).  Unlike Ray (which sets a context
variable per call), an asyncio task that a call spawns itself
(``asyncio.create_task``, ``gather`` of coroutines) is not linked to the
call: there ``get_task_id()`` is None.
"""
import os
import sys
import threading
import warnings

from ray_lite.exceptions import RayDeprecationWarning

from ..actors.actor_exit import SCRIPT_MODE, WORKER_MODE, _is_actor, exit_actor  # noqa: F401
from ..links import protocol as P
from ..process import backend as _backend, state
from ..process.ids import (JOB_ID_HEX, ActorID, JobID, NodeID, TaskID, actor_id_hex, node_id_hex,
                           session_name, task_id_hex, worker_id_hex)
from .actor_handle import ActorHandle

_call_codes = None


def _frames_running_calls(node):
    """The code of an actor's methods that run a call (their ``oid`` local is its id)."""
    global _call_codes
    if _call_codes is None:
        cls, aio = type(node), type(node.async_actor)
        _call_codes = frozenset(f.__code__ for f in (
            cls._run_method, aio._run_method_async, aio._run_method_now))
    return _call_codes


def current_call_oid():
    """The id of the call this thread (or coroutine) runs; None outside one."""
    node = state.node
    if node is None or node.id == 0:
        return None
    call = _call_locals(node)
    return call.get("oid") if call is not None else None


def _call_locals(node):
    """The running call's ``oid``, ``fn`` and ``name`` (an actor call's
    ``method`` too), or None outside a call."""
    if node.current_oid is not None and threading.get_ident() == node._task_thread:
        # A pool task (the runner's frame is compiled: no locals to read).
        return {"oid": node.current_oid, "fn": node.current_fn, "name": node.current_name}
    codes = _frames_running_calls(node)
    f = sys._getframe(2)
    while f is not None:
        if f.f_code in codes:
            return f.f_locals
        f = f.f_back
    return None


def current_placement(node):
    """(pg id, bundles, whether its children go there too) of the group this
    worker's task or actor was placed in, asked of the driver (no call pays
    for it); None in the driver and outside a group."""
    if node.id == 0:
        return None
    return node.request(P.OP_INTROSPECT, "placement")


class RuntimeContext:
    """What the current driver, task or actor is (Ray's ``RuntimeContext``).

    One object for the process, as in Ray: each method looks at the runtime
    running when it is called, and fails (``AssertionError``, as Ray's) when
    none is.
    """

    @property
    def _node(self):
        node = state.node
        if node is None:
            raise AssertionError("This is not available because ray_lite has not been "
                                 "initialized (call ray_lite.init()).")
        return node

    @property
    def _mode(self):
        return SCRIPT_MODE if self._node.id == 0 else WORKER_MODE

    def _worker_only(self):
        if self._mode != WORKER_MODE:
            import logging      # once, on a misuse: not with every import ray_lite
            logging.getLogger(__name__).warning(
                "This method is only available when the process is a worker. "
                "Current mode: %s", self._mode)
            return False
        return True

    def get_job_id(self):
        self._node      # noqa: B018 - asserts that the runtime runs, as Ray does
        return JOB_ID_HEX

    def get_node_id(self):
        return node_id_hex(self._node.driver_pid)

    def get_worker_id(self):
        node = self._node
        return worker_id_hex(node_id_hex(node.driver_pid), node.id)

    def get_task_id(self):
        """The running task's or actor call's id (hex); None in the driver."""
        if not self._worker_only():
            return None
        oid = current_call_oid()
        return task_id_hex(oid) if oid is not None else None

    # Ray's older properties, id objects where the methods above give hex;
    # deprecated (each read warns), as in Ray.
    @property
    def node_id(self):
        _deprecated("node_id", "get_node_id()")
        return self._node_id()

    @property
    def job_id(self):
        _deprecated("job_id", "get_job_id()")
        return self._job_id()

    @property
    def task_id(self):
        """The running call's ``TaskID`` (nil outside one); workers only."""
        _deprecated("task_id", "get_task_id()")
        return self._task_id()

    @property
    def actor_id(self):
        """This actor's ``ActorID``, None in a task; workers only."""
        _deprecated("actor_id", "get_actor_id()")
        return self._actor_id()

    def _node_id(self):
        return NodeID.from_hex(self.get_node_id())

    def _job_id(self):
        return JobID.from_hex(self.get_job_id())

    def _task_id(self):
        self._assert_worker()
        task_id = self.get_task_id()
        return TaskID.nil() if task_id is None else TaskID.from_hex(task_id)

    def _actor_id(self):
        self._assert_worker()
        actor_id = self.get_actor_id()
        return None if actor_id is None else ActorID.from_hex(actor_id)

    def _assert_worker(self):
        if self._mode != WORKER_MODE:
            raise AssertionError(f"This method is only available when the process is a "
                                 f"worker. Current mode: {self._mode}")

    def get_task_function_name(self):
        """The running call's function as ``module.name`` (an actor's method:
        ``module.Class.method``, its constructor ``module.Class.__init__``;
        an async actor's method: ``module.`` and the method's qualified name,
        ``<locals>`` included for a class defined in a function); None in the
        driver.  A function of the script run as ``__main__`` is named after
        the script's file, as in Ray."""
        node = self._node
        if node.id == 0:
            return None
        loc = _call_locals(node)
        if loc is not None:
            if "method" in loc and node.actor is not None:
                cls = type(node.actor)
                method = loc["method"]
                fn = getattr(cls, method, None)
                qualname = f"{cls.__qualname__}.{method}"
                if node.loop is not None:
                    # Ray names an async actor's calls by the function's
                    # qualified name (its sync actors' by the class's name).
                    own = getattr(fn, "__qualname__", "")
                    if own.endswith("." + qualname) or own == qualname:
                        qualname = own
                return f"{_module_of(cls, fn)}.{qualname}"
            fn = loc.get("fn")
            if fn is None:
                return None
            # Ray's: the function's __name__ (a nested one's too, not its qualname).
            return f"{_module_of(fn, fn)}.{getattr(fn, '__name__', repr(fn))}"
        cls = _class_being_constructed(node)
        if cls is not None:
            return f"{_module_of(cls, cls.__init__)}.{cls.__qualname__}.__init__"
        return None

    def get_task_name(self):
        if not self._worker_only():
            return None
        return _current_call_name(self._node)

    def get_actor_id(self):
        """This actor's id (hex); None in the driver or a task."""
        return actor_id_hex(self._node.id) if _is_actor(self._node) else None

    def get_actor_name(self):
        """This actor's name ("" if unnamed); None in the driver or a task."""
        if not self._worker_only():
            return None
        if not _is_actor(self._node):
            return None
        return self._node.actor_name or ""

    @property
    def namespace(self):
        return self._node.namespace

    @property
    def current_actor(self):
        """A handle to this actor (inside an actor only)."""
        node = self._node
        if not _is_actor(node):
            raise RuntimeError("This method is only available in an actor.")
        return ActorHandle(node.request(P.OP_INTROSPECT, "actor_info", node.id))

    @property
    def was_current_actor_reconstructed(self):
        """Whether this actor was restarted (after its process died)."""
        node = self._node
        if not _is_actor(node):
            raise AssertionError("This method should't be called inside Ray tasks.")
        return bool(node.request(P.OP_INTROSPECT, "restarted", node.id))

    def get_assigned_resources(self):
        """The resources this worker holds: ``{"CPU": 1.0}`` in a task by default,
        ``{}`` in an actor that asked for none."""
        self._assert_worker()
        return self._node.request(P.OP_INTROSPECT, "assigned")

    def get_accelerator_ids(self):
        return {"GPU": []}

    def get_resource_ids(self):
        """Ray's older name of ``get_accelerator_ids`` (deprecated: warns)."""
        _deprecated("get_resource_ids()", "get_accelerator_ids()")
        return self.get_accelerator_ids()

    def get_dashboard_url(self):
        """The dashboard's address (``host:port``) while one is served, ""
        otherwise, as Ray's; Ray's ``RAY_OVERRIDE_DASHBOARD_URL``, when set,
        is returned instead (without its scheme)."""
        override = os.environ.get("RAY_OVERRIDE_DASHBOARD_URL")
        if override:
            return override.partition("://")[2] if "://" in override else override
        if state.node is None:
            return ""
        return state.dashboard_url or ""

    def get_node_labels(self):
        """The node's labels (what ``label_selector`` and label strategies match)."""
        from ..scheduling.cluster import node_labels
        return node_labels(self.get_node_id())

    def get_session_name(self):
        """The runtime's session name, the same in every one of its processes."""
        if state.node is None:
            raise RuntimeError("Session name is not available because ray_lite has not "
                               "been initialized.")
        return session_name(state.node.driver_pid)

    def get_temp_dir(self):
        """Where ray_lite's files on disk go (spilled objects, metrics): the
        system's temp directory."""
        self._node      # noqa: B018 - asserts that the runtime runs, as Ray does
        import tempfile
        return tempfile.gettempdir()

    def is_canceled(self):
        """Whether ``cancel`` was called on the running task or actor call:
        for code that checks now and then and stops cleanly (a sync actor's
        running call is not interrupted by a cancel)."""
        if self._mode != WORKER_MODE:
            raise RuntimeError(f"This method is only available when the process is a "
                               f"worker. Current mode: {self._mode}")
        node = self._node
        if node.loop is not None:
            raise RuntimeError("This method is not supported in an async actor.")
        oid = current_call_oid()
        if oid is None:
            return False
        # A sync call's process reads no message while the call runs: read
        # now (a cancel is one), unless another thread is reading already.
        node.drive_nowait()
        return oid in node.cancelled

    def get_placement_group_id(self):
        """The id (hex) of the placement group the running task or actor was
        scheduled into; None in the driver and outside a group."""
        found = current_placement(self._node)
        return None if found is None else found[0]

    @property
    def current_placement_group_id(self):
        """``get_placement_group_id()`` as a ``PlacementGroupID`` (nil if none),
        as Ray's (deprecated: warns)."""
        _deprecated("current_placement_group_id", "get_placement_group_id()")
        from ..process.ids import PlacementGroupID
        pg_id = self.get_placement_group_id()
        return PlacementGroupID.nil() if pg_id is None else PlacementGroupID.from_hex(pg_id)

    @property
    def should_capture_child_tasks_in_placement_group(self):
        """Whether the running task's or actor's children go into its
        placement group (``placement_group_capture_child_tasks``)."""
        found = current_placement(self._node)
        return bool(found and found[2])

    def get_runtime_env_string(self):
        """The runtime_env this code runs with, as JSON: the job's (``init``),
        an actor's own env_vars in an actor, a task's own in a task."""
        from ..job.runtime_env import runtime_env_string
        node = self._node
        if node.id == 0:
            base = (getattr(node, "job", None) or {}).get("runtime_env")
        else:
            base = node.runtime_env
        return runtime_env_string(base or {})

    @property
    def runtime_env(self):
        """``get_runtime_env_string()`` as a ``ray_lite.runtime_env.RuntimeEnv``."""
        from ..job.runtime_env_spec import RuntimeEnv
        return RuntimeEnv.deserialize(self.get_runtime_env_string())

    @property
    def gcs_address(self):
        return "127.0.0.1:0"

    def get(self):
        """A dict of the context (deprecated, as in Ray: warns): Ray's id
        objects (``JobID``, ``NodeID``, ``TaskID``, ``ActorID``), not hex."""
        _deprecated("get()", "the get_xxx_id() methods")
        out = {"job_id": self._job_id(), "node_id": self._node_id(),
               "namespace": self.namespace}
        if self._mode == WORKER_MODE:
            task_id = self.get_task_id()
            if task_id is not None:
                out["task_id"] = TaskID.from_hex(task_id)
            actor_id = self.get_actor_id()
            if actor_id is not None:
                out["actor_id"] = ActorID.from_hex(actor_id)
        return out


def _deprecated(name, use):
    # stacklevel: the line that read the property or called the method.
    warnings.warn(f"RuntimeContext.{name} is deprecated and may be removed in a future "
                  f"release, as in Ray. Use {use} instead", RayDeprecationWarning,
                  stacklevel=3)


def _module_of(obj, fn):
    """``obj``'s module name; for the script run as ``__main__``, the script's
    name (from the file of ``fn``'s code), as Ray's function descriptors say."""
    module = getattr(obj, "__module__", None) or "__main__"
    if module == "__main__":
        code = getattr(fn, "__code__", None)
        if code is not None and code.co_filename[:1] != "<":
            return os.path.splitext(os.path.basename(code.co_filename))[0]
    return module


def _class_being_constructed(node):
    """The actor class whose ``__init__`` runs on this thread, or None."""
    if not _is_actor(node) or node.actor is not None:
        return None
    code = type(node).start_actor.__code__
    f = sys._getframe(2)
    while f is not None:
        if f.f_code is code:
            return f.f_locals.get("cls")
        f = f.f_back
    return None


def _current_call_name(node):
    loc = _call_locals(node)
    if loc is None:
        return None
    if "method" in loc and node.actor is not None:
        return f"{type(node.actor).__name__}.{loc['method']}"
    return loc.get("name")


_runtime_context = RuntimeContext()


def get_runtime_context():
    """The runtime context of this driver or worker (Ray's own on Ray).
    Like Ray, it starts the runtime if none runs yet."""
    if _backend.RAY:
        return _backend.ENGINE.core.ray.get_runtime_context()
    if state.node is None:
        state.get_node()
    return _runtime_context


# Read by log records' context (``job/logging_config.py``, a layer below).
state.runtime_context = get_runtime_context
