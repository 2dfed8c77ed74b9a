"""A vLLM-style multiprocess executor: N worker processes driven by one
shared-memory broadcast queue (:class:`ray_lite.MessageQueue`), replies on
one shared-memory ring per worker, futures driven on the caller's thread.

    from ray_lite.executor import MultiprocExecutor
    ex = MultiprocExecutor(Worker, world_size=2, worker_kwargs={...})
    ex.collective_rpc("step", args=(batch,))              # [rank 0's, rank 1's]
    fut = ex.collective_rpc("step", non_block=True); fut.result(timeout=5)
    ex.check_health(); ex.shutdown()
"""
from .multiproc import ExecutorShutdownError, MultiprocExecutor, RpcFuture, WorkerDiedError

__all__ = ["MultiprocExecutor", "RpcFuture", "WorkerDiedError", "ExecutorShutdownError"]
