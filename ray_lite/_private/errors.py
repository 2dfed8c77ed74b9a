"""Errors that cross a process boundary: what user code raised, made sendable."""
import os
import traceback

from ray_lite._fast import codec
from ray_lite.exceptions import RayError, RayTaskError


def make_task_error(name, exc, tb=None):
    """The error sent for a failure of user code: a RayTaskError with the traceback."""
    if isinstance(exc, RayError):       # RayTaskError included: already what we send
        return exc
    if tb is None:
        tb = traceback.format_exc()
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
