"""What a call's options and arguments are checked and turned into, shared by
remote functions (remote.py) and actor handles (actor_handle.py)."""
import os
import sys
import warnings

from ray_lite._fast.pool_book import PLAIN_TYPES
from ray_lite.exceptions import NotOnThisMachineError, RayDeprecationWarning

from ..actors.concurrency_groups import check_groups
from ..job.runtime_env import env_vars_of
from ..objects.dynamic_generator import DYNAMIC, dynamic_result
from ..objects.object_store import STORE_THRESHOLD
from ..objects.refs import (ObjectRef, ObjectRefGenerator, _Entry, probe_serialisable,
                            stored_by_value, travels_as_value)
from ..process import state
from ..scheduling.scheduler import check_retry_exceptions, demand_of

# Options Ray accepts that ray_lite honours.
_PLACEMENT = {"num_cpus", "resources", "scheduling_strategy", "runtime_env", "placement_group",
              "placement_group_bundle_index", "placement_group_capture_child_tasks",
              "label_selector", "fallback_strategy"}
_TASK_HONOURED = {"num_returns", "max_retries", "name", "_generator_backpressure_num_objects",
                  "retry_exceptions", "max_calls"} | _PLACEMENT
_ACTOR_HONOURED = {"max_concurrency", "name", "namespace", "get_if_exists", "lifetime",
                   "max_restarts", "max_task_retries", "concurrency_groups"} | _PLACEMENT
# Options that make no sense on one machine but are harmless: accepted, listed
# in the manual's compatibility page, and without effect.
HARMLESS = {"num_gpus", "memory", "accelerator_type", "_metadata",
            "enable_task_events", "object_store_memory", "_labels"}
# ...except for these values, which ray_lite cannot honour: refusing is
# better than silently doing something else.  (Per kind: an actor's option
# on a task, or the other way round, is accepted with its default only.)
_REFUSED_UNLESS_DEFAULT = {
    # accelerator_type: this machine's CPUs are all there is (on Ray the call
    # would wait for a node that has one).
    "task": {"num_gpus": (0, None), "accelerator_type": (None,), "max_restarts": (0, None),
             "max_task_retries": (0, None), "concurrency_groups": (None,)},
    "actor": {"num_gpus": (0, None), "accelerator_type": (None,),
              "retry_exceptions": (False, None)},
}
_SIMPLE_TYPES = PLAIN_TYPES     # arguments that need no look before they travel
# Of those, what Ray accepts (its task would wait for a GPU node): refused
# at the call, not where the function or class is declared, so that a
# module declaring a GPU task it does not call here still imports.
_VALID_ON_RAY = ("num_gpus", "accelerator_type")


def _driver_pid():
    node = state.node
    return os.getpid() if node is None else node.driver_pid


_INT_OR_NONE = (int, type(None))


def _check_count(opts, name, infinite=True):
    """Ray's check of a counting option: TypeError for a value of another
    type, ValueError below -1 (``infinite``: -1 means no limit) or 0."""
    if name not in opts:
        return
    value = opts[name]
    if not isinstance(value, _INT_OR_NONE):
        raise TypeError(f"The type of keyword '{name}' must be {_INT_OR_NONE}, but received "
                        f"type {type(value)}")
    if value is not None and value < (-1 if infinite else 0):
        raise ValueError(
            f"The keyword '{name}' only accepts None, 0, -1 or a positive integer, where -1 "
            f"represents infinity." if infinite else
            f"The keyword '{name}' only accepts None, 0 or a positive integer.")


def _check_num_returns(nr):
    if not isinstance(nr, (int, str, type(None))):
        raise TypeError(f"The type of keyword 'num_returns' must be {(int, str, type(None))}, "
                        f"but received type {type(nr)}")
    if not (nr is None or nr in ("streaming", "dynamic") or (isinstance(nr, int) and nr >= 0)):
        raise ValueError("The keyword 'num_returns' only accepts None, a non-negative integer, "
                         "'streaming' (for generators), or 'dynamic'.")


def warn_dynamic():
    """Ray's warning where ``num_returns="dynamic"`` is declared or set."""
    warnings.warn("num_returns='dynamic' is deprecated and will be removed in a future Ray "
                  "release. Use num_returns='streaming' instead.", RayDeprecationWarning,
                  stacklevel=_user_stacklevel())


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
            if key in _VALID_ON_RAY:
                raise NotOnThisMachineError.for_option(key, value, f"the {kind}'s options")
            other = "actor" if kind == "task" else "task"
            raise ValueError(f"{key}={value!r}: {key} is an option of {other}s, not of "
                             f"{kind}s; leave it out of the {kind}'s options")
    if kind == "task":
        _check_num_returns(opts.get("num_returns", 1))
        _check_count(opts, "max_retries")
        _check_count(opts, "max_calls", infinite=False)
        check_retry_exceptions(opts.get("retry_exceptions"))
    else:
        _check_count(opts, "max_restarts")
        _check_count(opts, "max_task_retries")
        check_groups(opts.get("concurrency_groups"))
        _check_count(opts, "max_concurrency", infinite=False)
        mc = opts.get("max_concurrency", None)
        if mc is not None and mc < 1:
            raise ValueError(f"max_concurrency must be a positive int, got {mc!r}")
        lifetime = opts.get("lifetime")
        if lifetime not in (None, "non_detached", "detached"):
            raise ValueError(f"actor `lifetime` argument must be one of 'detached', "
                             f"'non_detached' and 'None', got {lifetime!r}")    # Ray's check
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
    check_retry_exceptions(opts.get("retry_exceptions"))
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
        s = node.streams.new_stream(oid, peer, bp, name)
        if nret == DYNAMIC:
            return oid, s, dynamic_result(node, s, ObjectRefGenerator(s))
        return oid, s, ObjectRefGenerator(s)
    if nret == 1:
        e = _Entry(peer)
        return oid, e, ObjectRef(oid, node.id, e)
    entries = [_Entry(peer) for _ in range(nret)]
    refs = [ObjectRef(oid + i, node.id, e) for i, e in enumerate(entries)]
    return oid, entries, (refs if nret else None)


def _stream_opts(opts, is_gen):
    """(nret, stream, bp) of a call: ``num_returns="dynamic"`` is a stream
    without back-pressure whose ``nret`` is ``DYNAMIC`` (see dynamic_result)."""
    nr = opts.get("num_returns")
    if nr is None:      # Ray's default
        nr = "streaming" if is_gen else 1
    if nr == "dynamic":
        if not is_gen:
            raise ValueError("num_returns='dynamic' can only be used with generator functions "
                             "(functions that use 'yield'). The decorated function is not a "
                             "generator function.")
        return DYNAMIC, True, -1
    stream = nr == "streaming"
    bp = opts.get("_generator_backpressure_num_objects", -1) or -1
    return (1 if stream else nr), stream, (bp if stream else -1)


def _user_stacklevel():
    """The ``stacklevel`` of a warning given by its caller that names the
    first frame outside ray_lite: the user's line, whichever path led here."""
    frame, level = sys._getframe(2), 2
    while frame is not None and frame.f_globals.get("__name__", "").startswith("ray_lite."):
        frame, level = frame.f_back, level + 1
    return level
