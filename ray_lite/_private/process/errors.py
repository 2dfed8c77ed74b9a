"""Errors that cross a process boundary: what user code raised, made sendable."""
import os

from ray_lite._fast import codec
from ray_lite._lazy import lazy_module
from ray_lite.exceptions import RayTaskError, TaskCancelledError

from .ids import NODE_IP, actor_id_hex, task_id_hex

# For a failure's traceback (with linecache, tokenize, textwrap): not at import.
traceback = lazy_module("traceback", globals())


# Where the runtime's own frames come from: its package folder, and the
# relative names Cython gives the frames of compiled modules.
# (This file is ray_lite/_private/process/errors.py: three levels up.)
_RUNTIME_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
_RUNTIME_PYX = "ray_lite" + os.sep


def _user_traceback(exc):
    """``exc``'s traceback, formatted, from the first frame of user code.

    The frames above it are the runtime calling the task (a task runner, an
    actor's loop): Ray leaves its own out too, so the user sees their code."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        filename = tb.tb_frame.f_code.co_filename
        if not (filename.startswith(_RUNTIME_DIR) or filename.startswith(_RUNTIME_PYX)):
            break
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def make_task_error(name, exc, tb=None):
    """The error sent for a failure of user code: a RayTaskError with the traceback.

    As in Ray, one of the runtime's errors that the task let through (an
    actor's death seen by its ``get``, a failed argument) becomes
    ``RayTaskError(ActorDiedError)`` and the like: both classes catch it."""
    if isinstance(exc, RayTaskError):       # already what we send
        return exc
    if tb is None:
        tb = _user_traceback(exc)
    return RayTaskError(name, tb, exc, os.getpid())


def sendable_error(err, replacement):
    """``err`` if it survives the trip to another process, else ``replacement(err)``.

    The trip is the codec's (pickle underneath for exceptions): an exception
    class whose ``__init__`` does not match its ``args`` pickles but fails to
    unpickle, and the receiver must never get such a message.
    """
    try:
        codec.loads(codec.dumps(err))
        return err
    except Exception:
        return replacement(err)


def unpicklable_task_error(name):
    """A ``replacement`` for ``sendable_error``: a RayTaskError keeping the text."""
    def replace(err):
        tb = getattr(err, "traceback_str", "") or repr(err)
        return RayTaskError(name, tb, RuntimeError(f"(unpicklable) {err!r}"), os.getpid())
    return replace


def running_task_cancelled(name, oid, pid=None):
    """What a call cancelled while it ran fails with: as in Ray, a
    ``RayTaskError`` that is also a ``TaskCancelledError``."""
    cause = TaskCancelledError(f"Task: {task_id_hex(oid)} was cancelled.")
    return RayTaskError(name, "", cause, pid or os.getpid()).as_instanceof_cause()


# Why an actor died, for the error its callers get (Ray's words).
KILLED = "The actor is dead because it was killed by `ray.kill`."
EXITED = ("The actor is dead because its worker process has died. Worker exit type: "
          "INTENDED_USER_EXIT Worker exit detail: Worker exits by an user request. "
          "exit_actor() is called.")


def actor_died_message(info, reason):
    """Ray's text of an ``ActorDiedError`` for the actor ``info`` (an ``ActorInfo``)."""
    lines = ["The actor died unexpectedly before finishing this task.",
             f"\tclass_name: {info.class_name}", f"\tactor_id: {actor_id_hex(info.actor_id)}"]
    if info.pid:
        lines.append(f"\tpid: {info.pid}")
    if info.name:
        lines.append(f"\tname: {info.name}")
    if info.namespace:
        lines.append(f"\tnamespace: {info.namespace}")
    lines += [f"\tip: {NODE_IP}", reason]
    return "\n".join(lines)


class ActorExit(SystemExit):
    """What ``exit_actor()`` raises in a sync or threaded actor (a ``SystemExit``,
    as in Ray); the worker ends the actor gracefully on it."""
