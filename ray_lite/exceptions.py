"""Every error ray_lite raises, with Ray's names and meanings where Ray has them.

``RayTaskError`` is what ``get`` raises when user code failed remotely.  Like
Ray's, the instance ``get`` raises is *also* an instance of the user's
exception class (``except ValueError`` still catches a remote ``ValueError``)
and its message carries the remote traceback.

Besides Ray's classes, this module holds the errors of ray_lite's own public
modules (the channels of ``MessageQueue``, the executor, ``util``), so one
import reaches every error a program can get; Serve's are in
``ray_lite.serve.exceptions``.
"""
import builtins
import queue as _stdlib_queue

# The channels' errors, raised by both twins of the hot paths.
from ray_lite._fast.errors import (ChannelClosedError, DecodeError, MessageTooLargeError,
                                   PeerDiedError, SerializationError, SharedPathError)

__all__ = [
    "RayError", "RayTaskError", "RayActorError", "ActorDiedError", "WorkerCrashedError",
    "TaskCancelledError", "GetTimeoutError", "ObjectLostError", "RaySystemError",
    "AsyncioActorExit",
    "ObjectStoreFullError", "OwnerDiedError", "ObjectFreedError", "ObjectFetchTimedOutError",
    "ObjectReconstructionFailedError", "ActorUnavailableError", "ActorAlreadyExistsError",
    "ActorUnschedulableError", "TaskUnschedulableError", "OutOfMemoryError", "OutOfDiskError",
    "NodeDiedError", "RuntimeEnvSetupError", "PendingCallsLimitExceeded",
    "TaskPlacementGroupRemoved", "ActorPlacementGroupRemoved", "LocalRayletDiedError",
    "RpcError", "CrossLanguageError", "UserCodeException", "UnserializableException",
    "ObjectRefStreamEndOfStreamError", "ReferenceCountingAssertionError",
    "ActorHandleNotFoundError", "AuthenticationError", "PlasmaObjectNotAvailable",
    "RayChannelError", "RayChannelTimeoutError", "RayCgraphCapacityExceeded",
    "RayDirectTransportError", "StreamingGeneratorReplayInconsistentError",
    "OufOfBandObjectRefSerializationException", "RAY_EXCEPTION_TYPES",
    # Ray's, defined elsewhere in Ray (ray.actor, ray.util.annotations, ray.util.queue)
    "ActorClassInheritanceException", "RayDeprecationWarning", "Empty", "Full",
    # ray_lite's own
    "NotOnThisMachineError", "FunctionRaisedActorError", "WorkerDiedError",
    "ExecutorShutdownError", "SerializationError", "ChannelClosedError", "PeerDiedError",
    "MessageTooLargeError", "DecodeError", "SharedPathError", "DashboardError",
]


class RayError(Exception):
    """Base of every error raised by the runtime."""


class RaySystemError(RayError):
    """The runtime itself failed (not user code)."""


class RayTaskError(RayError):
    """User code raised ``cause`` in a task or actor method.

    ``traceback_str`` is the remote traceback, ``function_name`` what ran and
    ``pid`` the process it ran in.
    """

    def __init__(self, function_name="", traceback_str="", cause=None, pid=None):
        self.function_name = function_name
        self.traceback_str = traceback_str
        self.cause = cause
        self.pid = pid
        super().__init__(self._message())

    def _message(self):
        where = f" (pid={self.pid})" if self.pid is not None else ""
        head = f"{type(self.cause).__name__ if self.cause is not None else 'Error'}"
        text = f"ray_lite::{self.function_name}(){where}"
        tb = self.traceback_str.rstrip()
        if tb:
            return f"{text}\n{tb}"
        return f"{text}: {head}: {self.cause}"

    def __str__(self):
        return self._message()

    def __reduce__(self):
        # Rebuilt as a plain RayTaskError then re-wrapped by the receiver: the
        # dual class made by as_instanceof_cause() exists only in one process.
        return (_rebuild_task_error, (self.function_name, self.traceback_str, self.cause, self.pid))

    def as_instanceof_cause(self):
        """This error as an instance of both ``RayTaskError`` and the cause's class."""
        cause_cls = type(self.cause) if self.cause is not None else None
        if cause_cls is None or issubclass(RayTaskError, cause_cls) or \
                isinstance(self.cause, RayTaskError):
            return self
        dual = _dual_class(cause_cls)
        if dual is None:
            return self
        err = _blank_instance(dual, self.cause)
        err.function_name = self.function_name
        err.traceback_str = self.traceback_str
        err.cause = self.cause
        err.pid = self.pid
        err.args = self.cause.args if isinstance(self.cause.args, tuple) else (self._message(),)
        # Attributes the user's exception carries (errno, custom fields) stay readable.
        try:
            for k, v in vars(self.cause).items():
                if not hasattr(err, k):
                    setattr(err, k, v)
        except TypeError:
            pass
        return err


_BaseExceptionGroup = getattr(builtins, "BaseExceptionGroup", None)    # Python 3.11+


def _blank_instance(dual, cause):
    """An instance of ``dual`` with no ``__init__`` run, made by the first
    built-in ``__new__`` among its bases: ``OSError``'s instances (``TimeoutError``,
    ``FileNotFoundError``, ...) have a layout only ``OSError.__new__`` makes,
    and an exception group's needs its message and exceptions.  A built-in
    ``__new__`` that refuses the dual class (``MemoryError``'s, which keeps a
    free list of its own instances) gives way to the next one."""
    args = ()
    if _BaseExceptionGroup is not None and isinstance(cause, _BaseExceptionGroup):
        args = (cause.message, cause.exceptions)
    refused = None
    for base in dual.__mro__:
        if "__new__" in base.__dict__ and base.__module__ == "builtins":
            try:
                return base.__new__(dual, *args)
            except TypeError as e:      # "X.__new__(dual) is not safe"
                refused = refused or e
    raise refused


def _rebuild_task_error(function_name, traceback_str, cause, pid):
    return RayTaskError(function_name, traceback_str, cause, pid).as_instanceof_cause()


_DUAL_CLASSES = {}


def _subclassable(cls):
    if not issubclass(cls, BaseException):
        return False
    try:
        type("_probe", (RayTaskError, cls), {})
    except TypeError:  # e.g. a final class or an incompatible layout
        return False
    return True


def _dual_class(cause_cls):
    """``RayTaskError(cause_cls)``, made once per class; None if it cannot be."""
    dual = _DUAL_CLASSES.get(cause_cls, False)
    if dual is False:
        if not _subclassable(cause_cls):
            _DUAL_CLASSES[cause_cls] = None
            return None

        def __str__(self):
            return RayTaskError._message(self)

        def __init__(self, *args, **kwargs):  # constructed only through as_instanceof_cause
            Exception.__init__(self, *args)

        dual = type(f"RayTaskError({cause_cls.__name__})", (RayTaskError, cause_cls),
                    {"__str__": __str__, "__init__": __init__, "__module__": __name__})
        _DUAL_CLASSES[cause_cls] = dual
    return dual


class RayActorError(RayError):
    """The actor died or could not be reached; its calls cannot complete."""

    def __init__(self, message="The actor died unexpectedly before finishing this task.",
                 actor_id=None):
        self.actor_id = actor_id
        super().__init__(message)


class ActorDiedError(RayActorError):
    """The actor's process is dead (killed, crashed, or ``ray.kill``)."""


class WorkerCrashedError(RayError):
    """The worker process running the task died before it finished."""

    def __init__(self, message="The worker died unexpectedly while executing this task."):
        super().__init__(message)


class TaskCancelledError(RayError):
    """The task was cancelled with ``cancel`` before it finished."""

    def __init__(self, message="This task or its dependency was cancelled."):
        super().__init__(message)


class GetTimeoutError(RayError, TimeoutError):
    """``get`` (or ``next`` with a timeout) ran out of time."""


class ObjectLostError(RayError):
    """The object is gone: its owner died or it was freed."""

    def __init__(self, message="The object was lost.", object_id=None):
        self.object_id = object_id
        super().__init__(message)


class AsyncioActorExit(RayError):
    """Raised by ``exit_actor()`` in an async actor: the actor ends gracefully."""


class ObjectStoreFullError(RayError):
    """The object store has no room for an object (``init(object_store_memory=...)``)."""


# ---------------------------------------------------------------------------
# The rest of Ray's exception classes, with Ray's bases, so that a program's
# ``except`` clauses port unchanged.  On one machine ray_lite raises
# ``OwnerDiedError`` (the process that owns an object died) and
# ``ActorAlreadyExistsError`` (a second actor with a taken name); the others
# name failures that need a cluster, a raylet or a feature ray_lite refuses
# up front, and are never raised here.


class OwnerDiedError(ObjectLostError):
    """The process that owned the object died, so the object is gone."""


class ObjectFreedError(ObjectLostError):
    """The object was freed explicitly (``ray._private.internal_api.free`` in Ray)."""


class ObjectFetchTimedOutError(ObjectLostError):
    """Fetching the object from another node timed out (a cluster's error)."""


class ObjectReconstructionFailedError(ObjectLostError):
    """Lineage reconstruction of a lost object failed (a cluster's error)."""


class ActorUnavailableError(RayActorError):
    """The actor is temporarily unreachable (a cluster's network error)."""


class ActorAlreadyExistsError(ValueError, RayError):
    """An actor with this name exists already in the namespace."""


class ActorUnschedulableError(RayError):
    """The actor can never be scheduled (a cluster's error)."""


class TaskUnschedulableError(RayError):
    """The task can never be scheduled (a cluster's error)."""


class OutOfMemoryError(RayError):
    """Ray's memory monitor killed the task's worker (not done by ray_lite)."""


class OutOfDiskError(RayError):
    """The node's disk is full (a cluster's error)."""


class NodeDiedError(RayError):
    """The node running the task died (a cluster's error)."""


class RuntimeEnvSetupError(RayError):
    """A runtime environment could not be set up: the job's
    ``worker_process_setup_hook`` failed in the process a task went to
    (ray_lite refuses the kinds it cannot set up when the task is declared)."""

    def __init__(self, error_message=None):
        super().__init__(error_message)
        self.error_message = error_message

    def __str__(self):
        return self.error_message or "The runtime_env could not be set up."


class PendingCallsLimitExceeded(RayError):
    """An actor's ``max_pending_calls`` was reached."""


class TaskPlacementGroupRemoved(RayError):
    """The placement group the task was to run in was removed."""


class ActorPlacementGroupRemoved(RayError):
    """The placement group the actor was to run in was removed."""


class LocalRayletDiedError(RayError):
    """The local raylet died (Ray's daemon; ray_lite has none)."""


class RpcError(RayError):
    """A remote procedure call to a Ray daemon failed."""


class CrossLanguageError(RayError):
    """An error raised in another language's worker."""


class UserCodeException(RayError):
    """Ray's wrapper of an exception raised in user code (in its own internals)."""


class UnserializableException(RayError):
    """An exception raised by user code could not be serialised."""


class ObjectRefStreamEndOfStreamError(RayError):
    """A streaming generator has no more items (Ray's internal signal)."""


class ReferenceCountingAssertionError(ObjectLostError, AssertionError):
    """An object was deleted while a reference to it was still held (Ray's
    reference counting caught a bug in itself)."""


class ActorHandleNotFoundError(ValueError, RayError):
    """An actor handle that does not exist was asked for (``kill`` in Ray)."""


class AuthenticationError(RayError):
    """A cluster refused the connection's credentials."""


class PlasmaObjectNotAvailable(RayError):
    """An object was not available in the object store in time (Ray's internal)."""


class RayChannelError(RaySystemError):
    """A Compiled Graph channel failed (Ray's accelerated DAGs)."""


class RayChannelTimeoutError(RayChannelError, TimeoutError):
    """A Compiled Graph channel operation timed out."""


class RayCgraphCapacityExceeded(RaySystemError):
    """A Compiled Graph channel's buffer is full."""


class RayDirectTransportError(RaySystemError):
    """A direct transfer between accelerators failed."""


class StreamingGeneratorReplayInconsistentError(RaySystemError):
    """A retried streaming generator yielded other items than its first run."""


class OufOfBandObjectRefSerializationException(RayError):
    """An ObjectRef was pickled outside Ray's serialisation (Ray's spelling)."""


# Ray's list of its exception classes (for code that iterates over them).
RAY_EXCEPTION_TYPES = [
    PlasmaObjectNotAvailable, RayError, RayTaskError, WorkerCrashedError, RayActorError,
    ObjectStoreFullError, ObjectLostError, ObjectFetchTimedOutError,
    ReferenceCountingAssertionError, ObjectReconstructionFailedError, OwnerDiedError,
    GetTimeoutError, AsyncioActorExit, RuntimeEnvSetupError, TaskPlacementGroupRemoved,
    ActorPlacementGroupRemoved, PendingCallsLimitExceeded, LocalRayletDiedError,
    TaskUnschedulableError, ActorDiedError, ActorUnschedulableError, ActorUnavailableError,
    RayChannelError, RayChannelTimeoutError, OufOfBandObjectRefSerializationException,
    RayCgraphCapacityExceeded, UnserializableException, ActorAlreadyExistsError,
    ActorHandleNotFoundError, AuthenticationError,
]


# ---------------------------------------------------------------------------
# Ray's classes that Ray defines outside ray.exceptions, under the same names.

class ActorClassInheritanceException(TypeError):
    """``class B(A)`` where ``A`` is an actor class (``ray.actor``'s error):
    subclass the plain class, then decorate the subclass with ``remote``."""


class RayDeprecationWarning(DeprecationWarning):
    """A Ray API marked ``@Deprecated(warning=True)`` was used
    (``ray.util.annotations``)."""


class Empty(_stdlib_queue.Empty):
    """``ray_lite.util.queue.Queue.get`` found the queue empty (at once, or
    until its timeout).  A ``queue.Empty``."""


class Full(_stdlib_queue.Full):
    """``ray_lite.util.queue.Queue.put`` found the queue full (at once, or
    until its timeout).  A ``queue.Full``."""


# ---------------------------------------------------------------------------
# ray_lite's own.

class NotOnThisMachineError(ValueError, RayError):
    """An option Ray honours on a cluster that one machine cannot:
    ``num_gpus`` above 0 or an ``accelerator_type``, on a task, an actor or a
    Serve deployment's ``ray_actor_options``.  On Ray the call would wait for
    a node that has the accelerator; ray_lite refuses it when the function is
    called or the class instantiated (a module that only declares one still
    imports).  The message names the option and what to do instead: leave
    it out, or run the program on Ray (``RAY_LITE_BACKEND=ray``), where it
    means what Ray says.  A ``ValueError``."""

    @classmethod
    def for_option(cls, name, value, where=""):
        """The error for the option ``name=value``; ``where`` names whose
        option it is (``"ray_actor_options"``, ``"task"``)."""
        what = {"num_gpus": "schedules no GPUs",
                "accelerator_type": "has no accelerator types to match"}.get(
                    name, "cannot honour this option")
        place = f" in {where}" if where else ""
        return cls(f"{name}={value!r}{place}: ray_lite runs on one machine and {what}. "
                   f"Leave {name} out (a task or actor may still use this machine's "
                   f"devices, as any process can), or run the program on Ray "
                   f"(RAY_LITE_BACKEND=ray or ray_lite.init(backend=\"ray\")), where "
                   f"{name} is honoured.")


class FunctionRaisedActorError(RayActorError):
    """A ``RayActorError`` that the function of a
    ``ray_lite.util.multiprocessing.Pool`` raised itself (an actor it called
    died): unlike one the runtime raises for a dead worker, it does not make
    the pool replace the worker that ran the function."""


class WorkerDiedError(WorkerCrashedError):
    """A worker process of ``ray_lite.executor.MultiprocExecutor`` died; the
    executor is failed (make a new one).

    ``rank``, ``pid`` and ``exitcode`` (negative: killed by that signal) say
    which and how.
    """

    def __init__(self, message, rank=None, pid=None, exitcode=None):
        super().__init__(message)
        self.rank = rank
        self.pid = pid
        self.exitcode = exitcode

    def __reduce__(self):
        return (type(self), (str(self), self.rank, self.pid, self.exitcode))


class ExecutorShutdownError(RayError):
    """The executor was shut down before this call completed (or was made)."""


class DashboardError(RuntimeError):
    """The dashboard could not start: ``init(include_dashboard=True)`` or
    ``ray-lite dashboard`` found its port taken, or the host not one to
    listen on.  The message names the address."""
