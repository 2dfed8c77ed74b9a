"""A vLLM-style multiprocess executor: N worker processes driven by one
shared-memory broadcast queue (:class:`ray_lite.MessageQueue`), replies on
one shared-memory ring per worker, futures driven on the caller's thread.

    from ray_lite.executor import MultiprocExecutor
    ex = MultiprocExecutor(Worker, world_size=2, worker_kwargs={...})
    ex.collective_rpc("step", args=(batch,))              # [rank 0's, rank 1's]
    fut = ex.collective_rpc("step", non_block=True); fut.result(timeout=5)
    ex.check_health(); ex.shutdown()

On Ray, :class:`RayExecutor` keeps the same contract over Ray actors placed
with a placement group.  ``create_executor`` picks one as vLLM's
``distributed_executor_backend`` does: ``"mp"`` (this machine), ``"ray"``,
or by default ``"ray"`` when ``ray_lite.backend() == "ray"`` and ``"mp"``
otherwise.
"""
from .multiproc import ExecutorShutdownError, MultiprocExecutor, RpcFuture, WorkerDiedError
from .ray_executor import RayExecutor

__all__ = ["MultiprocExecutor", "RayExecutor", "RpcFuture", "WorkerDiedError",
           "ExecutorShutdownError", "create_executor", "executor_class"]

_BACKENDS = {"mp": MultiprocExecutor, "ray": RayExecutor}


def executor_class(distributed_executor_backend=None):
    """The executor class for ``distributed_executor_backend`` ("mp", "ray",
    an executor class, or None: the one of ``ray_lite.backend()``)."""
    if distributed_executor_backend is None:
        from ray_lite._private.process import backend
        distributed_executor_backend = "ray" if backend.current() == backend.RAY_NAME else "mp"
    if isinstance(distributed_executor_backend, type):
        return distributed_executor_backend
    try:
        return _BACKENDS[distributed_executor_backend]
    except KeyError:
        raise ValueError(f"distributed_executor_backend must be 'mp', 'ray' or an executor "
                         f"class, got {distributed_executor_backend!r}") from None


def create_executor(worker_cls, world_size, worker_kwargs=None, *,
                    distributed_executor_backend=None, **options):
    """``executor_class(distributed_executor_backend)(worker_cls, world_size, ...)``."""
    return executor_class(distributed_executor_backend)(worker_cls, world_size, worker_kwargs,
                                                        **options)
