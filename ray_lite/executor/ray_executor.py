"""``RayExecutor``: the executor's ``collective_rpc`` contract over Ray actors.

The workers are Ray actors placed with a placement group (one bundle per
rank: ``STRICT_PACK`` when the cluster has one node, ``PACK`` across nodes
unless ``placement_strategy`` says otherwise).  Calls go out as in
:class:`MultiprocExecutor`, on one broadcast :class:`ray_lite.MessageQueue`:
workers on the driver's node read it from shared memory, workers on other
nodes over TCP (the queue's network transport, as vLLM does for readers on
other nodes).  Each worker answers on a queue of its own (it writes, the
driver reads: shared memory on the driver's node, TCP otherwise).  The
workers run the very loop of the multiprocess executor's workers
(``_worker._serve``), so a method behaves the same on both.

A worker that dies (its actor, its process, its node) fails the executor
with :class:`WorkerDiedError`, as on one machine.
"""
import asyncio
import os
import time
import types

import cloudpickle

from ray_lite._fast.errors import ChannelClosedError, PeerDiedError
from ray_lite._private.process import backend
from ray_lite.message_queue import MessageQueue

from . import _worker as proto
from .multiproc import ExecutorCore, ExecutorShutdownError, RpcFuture, WorkerDiedError

__all__ = ["RayExecutor"]

# How often a caller waiting for replies looks at the workers' actors.
_HEALTH_SLICE_S = 0.05


class _RayWorker:
    """The actor of one rank: builds the worker object, then serves calls."""

    def __init__(self, cls_blob, rank, world_size, worker_kwargs, cwd):
        if cwd:
            try:
                os.chdir(cwd)
            except OSError:
                pass
        self.rank = rank
        self.worker = cloudpickle.loads(cls_blob)(rank=rank, world_size=world_size,
                                                  **worker_kwargs)
        self.replies = None

    def where(self):
        import ray
        return ray.get_runtime_context().get_node_id(), os.getpid()

    def open_replies(self, local, connect_ip):
        """The queue this worker answers on (the driver is its one reader)."""
        self.replies = MessageQueue(1, local_reader_ranks=[0] if local else [],
                                    connect_ip=connect_ip)
        return self.replies.export_handle()

    def run(self, mq_handle, connect_timeout):
        mq = MessageQueue.create_from_handle(mq_handle, self.rank,
                                             connect_timeout=connect_timeout)
        try:
            mq.wait_until_ready(timeout=connect_timeout)
            proto._serve(self.worker, self.rank, mq, types.SimpleNamespace(put=self.replies.enqueue))
        except (ChannelClosedError, PeerDiedError):
            pass  # the driver closed the queue or went away
        finally:
            mq.close()
            self.replies.close()


class RayExecutor(ExecutorCore):
    """Run ``worker_cls(rank=r, world_size=n, **worker_kwargs)`` in ``world_size``
    Ray actors and call methods on all of them at once (the contract of
    :class:`MultiprocExecutor`).

    ``num_cpus_per_worker`` sizes each placement-group bundle;
    ``placement_strategy`` overrides the bundles' strategy; ``connect_ip`` is
    the address the TCP side of the queues binds (this node's address by
    default); ``network_ranks`` names ranks that use the network transport
    even on the driver's node.  ``env`` adds variables to the workers'
    environment.  Options of :class:`MultiprocExecutor` that mean nothing
    here (``reply_ring_bytes``) are accepted and ignored, so one call makes
    either executor.
    """

    def __init__(self, worker_cls, world_size, worker_kwargs=None, *,
                 max_chunk_bytes=1 << 20, max_chunks=16, start_timeout=60.0,
                 shutdown_grace=5.0, env=None, num_cpus_per_worker=1,
                 placement_strategy=None, connect_ip=None, network_ranks=(), **_mp_only):
        world_size = int(world_size)
        if world_size < 1:
            raise ValueError(f"world_size must be at least 1, got {world_size}")
        self._init_calls(world_size)
        self.shutdown_grace = shutdown_grace
        self._actors = []
        self._run_refs = []
        self._replies = []
        self._pids = []
        self._mq = None
        self._pg = None
        try:
            self._start(worker_cls, worker_kwargs or {}, max_chunk_bytes, max_chunks,
                        start_timeout, env, num_cpus_per_worker, placement_strategy,
                        connect_ip, set(network_ranks))
        except BaseException:
            self._teardown(graceful=False)
            raise

    # ------------------------------------------------------------ start-up

    def _start(self, worker_cls, worker_kwargs, max_chunk_bytes, max_chunks, start_timeout,
               env, num_cpus, strategy, connect_ip, network_ranks):
        ray = backend.require_ray()
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        if not ray.is_initialized():
            raise RuntimeError("RayExecutor needs Ray: call ray_lite.init(backend='ray') "
                               "(or ray.init()) first")
        n = self.world_size
        if strategy is None:
            alive = [node for node in ray.nodes() if node.get("Alive")]
            strategy = "STRICT_PACK" if len(alive) <= 1 else "PACK"
        self._pg = placement_group([{"CPU": num_cpus}] * n, strategy=strategy)
        try:
            ray.get(self._pg.ready(), timeout=start_timeout)
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(f"the placement group of {n} x {num_cpus} CPU ({strategy}) was "
                               f"not placed within {start_timeout} s") from None
        actor_cls = ray.remote(_RayWorker)
        runtime_env = {"env_vars": {str(k): str(v) for k, v in env.items()}} if env else None
        cls_blob = cloudpickle.dumps(worker_cls)
        for rank in range(n):
            options = {"num_cpus": num_cpus, "max_concurrency": 1, "scheduling_strategy":
                       PlacementGroupSchedulingStrategy(self._pg, placement_group_bundle_index=rank)}
            if runtime_env:
                options["runtime_env"] = runtime_env
            self._actors.append(actor_cls.options(**options).remote(
                cls_blob, rank, n, worker_kwargs, os.getcwd()))
        places = self._started(ray, [a.where.remote() for a in self._actors], start_timeout)
        driver_node = ray.get_runtime_context().get_node_id()
        local = [rank for rank, (node, _) in enumerate(places)
                 if node == driver_node and rank not in network_ranks]
        self._pids = [pid for _, pid in places]
        if connect_ip is None:
            connect_ip = ray.util.get_node_ip_address()
        self._mq = MessageQueue(n, max_chunk_bytes, max_chunks, local_reader_ranks=local,
                                connect_ip=connect_ip)
        handles = self._started(ray, [a.open_replies.remote(rank in local, connect_ip)
                                      for rank, a in enumerate(self._actors)], start_timeout)
        for handle in handles:
            self._replies.append(MessageQueue.create_from_handle(handle, 0,
                                                                 connect_timeout=start_timeout))
        mq_handle = self._mq.export_handle()
        self._run_refs = [a.run.remote(mq_handle, start_timeout) for a in self._actors]
        self._mq.wait_until_ready(timeout=start_timeout)

    def _started(self, ray, refs, timeout):
        try:
            return ray.get(refs, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(f"the workers did not start within {timeout} s") from None
        except ray.exceptions.RayActorError as exc:
            raise RuntimeError(f"a worker failed to start: {exc}") from exc

    # ------------------------------------------------------------ calls

    async def collective_rpc_async(self, method, args=(), kwargs=None, timeout=None,
                                   unique_reply_rank=None):
        """``collective_rpc`` for asyncio callers (replies read on a thread of
        the loop's default executor: the loop is never blocked)."""
        fut = self._submit(method, args, kwargs, unique_reply_rank, RpcFuture(self)).future
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, fut.result, timeout)

    def _enqueue(self, msg):
        while True:
            try:
                self._mq.enqueue(msg, timeout=_HEALTH_SLICE_S)
                return
            except TimeoutError:
                self._check_workers()   # a full queue: a worker lags, or died
                if self._failure is not None:
                    raise self._failure
            except (ChannelClosedError, PeerDiedError):
                self._check_workers(wait_s=5.0)
                raise self._failure or ExecutorShutdownError("the executor was shut down")

    def _drive(self, done, timeout):
        """Read replies on this thread until ``done()``; TimeoutError after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while not done():
                if self._failure is not None or self._is_shutdown:
                    self._check_failed(done)
                    return
                # Each worker answers in call order: reading every rank's
                # queue completes earlier calls first.
                progressed = False
                for rank in range(self.world_size):
                    progressed = self._read_reply(rank) or progressed
                if progressed:
                    self._resolve_ready()
                elif not done():
                    self._check_workers()
                    if deadline is not None and time.monotonic() >= deadline:
                        raise TimeoutError(f"the executor's call did not complete within {timeout} s")

    def _read_reply(self, rank):
        """Take one reply of ``rank`` if it comes within a short slice."""
        try:
            reply = self._replies[rank].dequeue(timeout=_HEALTH_SLICE_S / self.world_size)
        except TimeoutError:
            return False
        except (ChannelClosedError, PeerDiedError):
            self._check_workers(wait_s=5.0)
            self._worker_lost(rank, "broke its reply channel")
            return False
        self._on_reply(rank, reply)
        return True

    # ------------------------------------------------------------ health

    def _check_workers(self, wait_s=0.0):
        """Fail the executor if a worker's actor ended (it serves until shutdown)."""
        import ray
        if self._failure is not None or self._is_shutdown or not self._run_refs:
            return
        ended, _ = ray.wait(list(self._run_refs), num_returns=1, timeout=wait_s)
        for ref in ended:
            rank = self._run_refs.index(ref)
            try:
                ray.get(ref, timeout=0)
                why = "stopped serving"
            except Exception as exc:   # noqa: BLE001 - the actor's death, as Ray says it
                why = f"died ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
            self._worker_lost(rank, why)
            return

    def _worker_lost(self, rank, why):
        pid = self._pids[rank] if rank < len(self._pids) else None
        self._fail_with(WorkerDiedError(f"worker rank {rank} (pid {pid}) {why}; the executor "
                                        f"has failed", rank=rank, pid=pid, exitcode=None))

    def _look_for_failure(self):
        self._check_workers()

    def _pid_of(self, rank):
        return self._pids[rank]

    @property
    def worker_pids(self):
        return list(self._pids)

    # ------------------------------------------------------------ shutdown

    def shutdown(self, grace=None):
        """Ask the workers to exit, wait up to ``grace`` seconds, then kill
        their actors and remove the placement group.  Idempotent."""
        with self._lock:
            if self._is_shutdown:
                return
        self._teardown(graceful=True, grace=self.shutdown_grace if grace is None else grace)

    def _teardown(self, graceful, grace=0.0):
        self._is_shutdown = True
        try:
            import ray
        except ImportError:
            return
        if self._mq is not None:
            if graceful and self._failure is None:
                try:
                    self._mq.enqueue((proto.SHUTDOWN,), timeout=min(grace, 1.0))
                except Exception:   # noqa: BLE001 - a dead or stuck worker: killed below
                    pass
            self._mq.close()
        if graceful and self._run_refs:
            ray.wait(list(self._run_refs), num_returns=len(self._run_refs), timeout=grace)
        for actor in self._actors:
            try:
                ray.kill(actor)
            except Exception:   # noqa: BLE001 - already gone
                pass
        for q in self._replies:
            q.close()
        if self._pg is not None:
            try:
                from ray.util.placement_group import remove_placement_group
                remove_placement_group(self._pg)
            except Exception:   # noqa: BLE001
                pass
        with self._lock:
            if self._pending:
                self._fail_all(self._failure or ExecutorShutdownError(
                    "the executor was shut down before this call completed"))

    def __repr__(self):
        state = "failed" if self._failure else "shut down" if self._is_shutdown else "running"
        return f"<RayExecutor world_size={self.world_size} {state}>"
