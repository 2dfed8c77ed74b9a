"""``MultiprocExecutor``: N worker processes driven by one shared-memory
broadcast queue, replies on one SPSC ring per worker.

No helper thread: whoever waits for a reply (``collective_rpc``,
``Future.result``, the asyncio pump of ``collective_rpc_async``) reads the
reply rings itself, on its own thread, with the same bounded spin → yield →
sleep strategy as the rings.  The sleep is a ``poll()`` on the rings'
descriptors *and* the workers' pidfds, so a worker that dies is noticed at
once, not at the next time slice.
"""
import asyncio
import atexit
import concurrent.futures
import os
import signal
import subprocess
import threading
import time
import weakref
from collections import deque

import cloudpickle

from ray_lite._fast import shm
from ray_lite._fast.broadcast import MessageQueue
from ray_lite._fast.errors import ChannelClosedError, PeerDiedError, RingEmpty
from ray_lite._fast.ring import ShmRing, wait_rings_or_fds
from ray_lite._fast.wait_policy import BROADCAST_YIELD_NS, MULTI_SPIN_NS, SLICE_NS, ns_to_s
from ray_lite._private.process.boot import python_argv
from ray_lite.exceptions import ExecutorShutdownError, RayTaskError, WorkerDiedError

from . import _worker as proto
from ._async_pump import AsyncPump, LoopWaiter

__all__ = ["ExecutorCore", "MultiprocExecutor", "RpcFuture", "WorkerDiedError", "ExecutorShutdownError"]

# A waiting caller spins, then yields, before it sleeps in poll(), with the
# budget its workers have on the queue: the yield phase keeps a round trip in
# microseconds on a 2-core machine without burning a core while idle.
_SPIN_S = ns_to_s(MULTI_SPIN_NS)
_YIELD_S = ns_to_s(BROADCAST_YIELD_NS)
_SLICE_S = ns_to_s(SLICE_NS)


class RpcFuture(concurrent.futures.Future):
    """The result of ``collective_rpc(..., non_block=True)``.

    A ``concurrent.futures.Future`` whose ``result()``/``exception()`` drive
    the executor's reply rings on the calling thread until it is done: no
    helper thread ever resolves it.  It cannot be cancelled (the call is
    already broadcast).
    """

    def __init__(self, executor):
        super().__init__()
        self._executor = executor
        self.set_running_or_notify_cancel()

    def cancel(self):
        return False

    def result(self, timeout=None):
        if not self.done():
            self._executor._drive(self.done, timeout)
        return super().result(0)

    def exception(self, timeout=None):
        if not self.done():
            self._executor._drive(self.done, timeout)
        return super().exception(0)


class _Call:
    __slots__ = ("call_id", "method_name", "unique_reply_rank", "results", "missing", "error",
                 "error_rank", "future", "done")

    def __init__(self, call_id, method_name, unique_reply_rank, world_size, future):
        self.call_id = call_id
        self.method_name = method_name
        self.unique_reply_rank = unique_reply_rank
        self.results = [None] * world_size
        self.missing = world_size
        self.error = None
        self.error_rank = -1
        self.future = future
        self.done = False


def _exit_description(code):
    if code is None:
        return "exited"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class ExecutorCore:
    """What every executor shares: the calls in flight and their replies,
    futures resolved in submission order, failure and its callbacks.

    A subclass sends a call with ``_enqueue(msg)``, reads replies on the
    caller's thread in ``_drive(done, timeout)`` (handing each to
    ``_on_reply``, then calling ``_resolve_ready``), notices a dead worker in
    ``_look_for_failure()`` and names a rank's process with ``_pid_of(rank)``.
    """

    def _init_calls(self, world_size):
        self.world_size = world_size
        self._lock = threading.RLock()
        self._pending = deque()        # _Call, in submission order
        self._calls = {}               # call_id -> _Call
        self._next_call_id = 0
        self._failure = None           # the error every call raises once failed
        self._failure_callbacks = []
        self._is_shutdown = False

    def collective_rpc(self, method, args=(), kwargs=None, timeout=None, non_block=False,
                       unique_reply_rank=None):
        """Run ``method`` on every worker.

        ``method`` is a method name of the worker class or a callable taking
        the worker as first argument (sent with cloudpickle).  Returns the
        results in rank order, the result of ``unique_reply_rank`` alone
        when given (the others send back nothing but completion), or with
        ``non_block=True`` an :class:`RpcFuture` for that.  A worker
        exception raises ``RayTaskError`` (also an instance of the remote
        exception's class, with the remote traceback); a dead worker
        :class:`WorkerDiedError`; ``timeout`` ``TimeoutError`` (the call
        still completes in the background and the executor stays usable).
        """
        call = self._submit(method, args, kwargs, unique_reply_rank,
                            RpcFuture(self) if non_block else None)
        if non_block:
            return call.future
        if not call.done:
            self._drive(lambda: call.done, timeout)
        return self._outcome(call)

    def _submit(self, method, args, kwargs, unique_reply_rank, future):
        # ``future``: None (the caller waits on the call itself), an
        # RpcFuture or a LoopWaiter, resolved in submission order.
        if isinstance(method, str):
            name = method
        elif callable(method):
            name = getattr(method, "__qualname__", None) or repr(method)
        else:
            raise TypeError(f"method must be a method name or a callable, got {type(method).__name__}")
        if unique_reply_rank is not None and not 0 <= unique_reply_rank < self.world_size:
            raise ValueError(f"unique_reply_rank must be in 0..{self.world_size - 1}")
        with self._lock:
            if self._failure is not None:
                raise self._failure
            if self._is_shutdown:
                raise ExecutorShutdownError("the executor was shut down")
            call_id = self._next_call_id
            self._next_call_id = call_id + 1
            call = _Call(call_id, name, unique_reply_rank, self.world_size, future)
            msg = (proto.CALL, call_id, method, tuple(args), kwargs or None, unique_reply_rank)
            # Register first: a reply can only come after the broadcast.
            self._pending.append(call)
            self._calls[call_id] = call
            try:
                self._enqueue(msg)
            except BaseException:
                # Not sent (or the executor failed meanwhile, which already
                # emptied the queue of calls).
                if self._pending and self._pending[-1] is call:
                    self._pending.pop()
                self._calls.pop(call_id, None)
                raise
        return call

    def _outcome(self, call):
        if call.error is not None:
            raise call.error
        if call.unique_reply_rank is not None:
            return call.results[call.unique_reply_rank]
        return call.results

    def _on_reply(self, rank, reply):
        call = self._calls.get(reply[0])
        if call is None:
            return  # a call failed or abandoned already
        status, payload = reply[1], reply[2]
        if status == proto.OK:
            call.results[rank] = payload
        elif call.error is None or rank < call.error_rank:
            exc, tb = payload
            call.error = RayTaskError(f"{call.method_name} on rank {rank}", tb, exc,
                                      self._pid_of(rank)).as_instanceof_cause()
            call.error_rank = rank
        call.missing -= 1
        if call.missing == 0:
            call.done = True
            del self._calls[call.call_id]

    def _resolve_ready(self):
        # Futures resolve in submission order (replies complete calls in
        # that order anyway: each worker runs them in order).
        pending = self._pending
        while pending and pending[0].done:
            call = pending.popleft()
            fut = call.future
            if fut is not None:
                if call.error is not None:
                    fut.set_exception(call.error)
                elif call.unique_reply_rank is not None:
                    fut.set_result(call.results[call.unique_reply_rank])
                else:
                    fut.set_result(call.results)

    def _check_failed(self, done):
        if not done():
            raise self._failure or ExecutorShutdownError("the executor was shut down")

    def _fail_all(self, err):
        self._failure = err
        pending, self._pending = self._pending, deque()
        self._calls.clear()
        for call in pending:
            call.error = err
            call.done = True
            if call.future is not None:
                call.future.set_exception(err)

    # ------------------------------------------------------------ health

    @property
    def is_failed(self):
        return self._failure is not None

    def register_failure_callback(self, callback):
        """Call ``callback()`` (no arguments) once, when a worker dies.  Runs at
        once if the executor has failed already."""
        with self._lock:
            if self._failure is None:
                self._failure_callbacks.append(callback)
                return
        callback()

    def check_health(self):
        """Raise ``WorkerDiedError`` if a worker died (or had died), and
        ``ExecutorShutdownError`` after shutdown; otherwise return None."""
        if self._failure is None and not self._is_shutdown:
            self._look_for_failure()
        if self._failure is not None:
            raise self._failure
        if self._is_shutdown:
            raise ExecutorShutdownError("the executor was shut down")

    def _fail_with(self, err):
        """Fail every call with ``err`` (unless failed or shut down already),
        then run the failure callbacks once."""
        with self._lock:
            if self._failure is not None or self._is_shutdown:
                return
            self._fail_all(err)
            callbacks, self._failure_callbacks = self._failure_callbacks, []
        for cb in callbacks:
            try:
                cb()
            except Exception:  # a failing callback must not hide the failure
                import traceback
                traceback.print_exc()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()


class MultiprocExecutor(ExecutorCore):
    """Run ``worker_cls(rank=r, world_size=n, **worker_kwargs)`` in ``world_size``
    processes and call methods on all of them at once.

    ``max_chunk_bytes``/``max_chunks`` size the broadcast queue (larger
    requests travel out of band); ``reply_ring_bytes`` each reply ring.
    ``start_timeout`` bounds the start-up, ``shutdown_grace`` the graceful
    part of ``shutdown()``.  ``env`` adds variables to the workers'
    environment.
    """

    def __init__(self, worker_cls, world_size, worker_kwargs=None, *,
                 max_chunk_bytes=1 << 20, max_chunks=16, reply_ring_bytes=1 << 20,
                 start_timeout=60.0, shutdown_grace=5.0, env=None):
        world_size = int(world_size)
        if world_size < 1:
            raise ValueError(f"world_size must be at least 1, got {world_size}")
        self._init_calls(world_size)
        self.shutdown_grace = shutdown_grace
        self._procs = []
        self._pidfds = []
        self._rings = []
        self._mq = None
        self._async_pumps = {}         # event loop -> _AsyncPump
        try:
            self._start(worker_cls, worker_kwargs or {}, max_chunk_bytes, max_chunks,
                        reply_ring_bytes, start_timeout, env)
        except BaseException:
            self._teardown(graceful=False)
            raise
        _live_executors.add(self)

    # ------------------------------------------------------------ start-up

    def _start(self, worker_cls, worker_kwargs, max_chunk_bytes, max_chunks, reply_ring_bytes,
               start_timeout, env):
        # A driver killed earlier could not unlink its segments.
        shm.cleanup_stale_segments()
        n = self.world_size
        self._mq = MessageQueue(n, max_chunk_bytes=max_chunk_bytes, max_chunks=max_chunks)
        cls_blob = cloudpickle.dumps(worker_cls)
        # PR_SET_PDEATHSIG fires when the *thread* that forked exits: only
        # ask for it when that thread is the main one.  Otherwise workers
        # notice a dead driver through the queue (pidfd checks).
        die_with_parent = threading.current_thread() is threading.main_thread()
        child_env = None
        if env:
            child_env = dict(os.environ)
            child_env.update({str(k): str(v) for k, v in env.items()})
        deadline = time.monotonic() + start_timeout
        for rank in range(n):
            ring = ShmRing.create(reply_ring_bytes, side="consumer")
            self._rings.append(ring)
            boot = cloudpickle.dumps({
                "worker_cls": cls_blob, "rank": rank, "world_size": n,
                "worker_kwargs": worker_kwargs, "mq_handle": self._mq.export_handle(),
                "ring_name": ring.name, "driver_pid": os.getpid(),
                "die_with_parent": die_with_parent, "cwd": os.getcwd(),
            })
            r_fd, w_fd = os.pipe()
            argv = python_argv("from ray_lite.executor._worker import main; sys.exit(main(%d))"
                               % r_fd, f"executor worker {rank}")
            try:
                proc = subprocess.Popen(argv, pass_fds=(r_fd,),
                                        stdin=subprocess.DEVNULL, env=child_env)
            finally:
                os.close(r_fd)
            self._procs.append(proc)
            self._pidfds.append(os.pidfd_open(proc.pid))
            try:
                with open(w_fd, "wb", closefd=True) as pipe:
                    pipe.write(boot)  # the worker reads it at once
            except BrokenPipeError:
                pass  # it died already: the READY loop below says how
        # Every worker says READY (or why it could not start) on its ring.
        for rank, ring in enumerate(self._rings):
            while True:
                try:
                    msg = ring.get(timeout=0.05)
                    break
                except TimeoutError:
                    pass
                except (ChannelClosedError, PeerDiedError):
                    msg = None
                    break
                code = self._procs[rank].poll()
                if code is not None:
                    msg = None
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"worker {rank} did not start within {start_timeout} s")
            if msg is None:
                code = self._procs[rank].wait(5)
                raise RuntimeError(f"worker {rank} (pid {self._procs[rank].pid}) "
                                   f"{_exit_description(code)} during start-up")
            if msg[0] == proto.START_FAILED:
                _, exc, tb = msg
                raise RuntimeError(f"worker {rank} failed to start:\n{tb}") from exc
            if msg[0] != proto.READY:
                raise RuntimeError(f"worker {rank} sent {msg!r} instead of READY")

    # ------------------------------------------------------------ calls

    async def collective_rpc_async(self, method, args=(), kwargs=None, timeout=None,
                                   unique_reply_rank=None):
        """``collective_rpc`` for asyncio callers: the running loop watches the
        reply rings and the workers' pidfds; nothing blocks the loop."""
        loop = asyncio.get_running_loop()
        waiter = LoopWaiter(loop)
        self._submit(method, args, kwargs, unique_reply_rank, waiter)
        future = waiter.future
        if not future.done():
            pump = self._async_pumps.get(loop)
            if pump is None:
                with self._lock:
                    pump = self._async_pumps.get(loop)
                    if pump is None:
                        for old in [lp for lp in self._async_pumps if lp.is_closed()]:
                            del self._async_pumps[old]
                        pump = self._async_pumps[loop] = AsyncPump(self, loop)
            pump.start()
            if timeout is not None:
                try:
                    return await asyncio.wait_for(future, timeout)
                except asyncio.TimeoutError:
                    raise TimeoutError(f"collective_rpc_async timed out after {timeout} s") from None
        return await future

    def _enqueue(self, msg):
        # A full queue means a worker lags behind; wait for it while
        # draining replies (a worker blocked on its full reply ring would
        # otherwise never read), and notice a worker death.
        try:
            self._mq.enqueue(msg, timeout=0)
            return
        except TimeoutError:
            pass
        while True:
            self._poll_rings()
            self._check_sentinels()
            if self._failure is not None:
                raise self._failure
            try:
                self._mq.enqueue(msg, timeout=0.01)
                return
            except TimeoutError:
                pass

    # ------------------------------------------------------------ replies

    def _poll_rings(self):
        """Read every reply available now; resolve what completed.  No waiting."""
        with self._lock:
            got = False
            for rank, ring in enumerate(self._rings):
                while ring.poll():
                    try:
                        reply = ring.get_nowait()
                    except RingEmpty:
                        break
                    except (ChannelClosedError, PeerDiedError):
                        self._worker_lost(rank)
                        break
                    got = True
                    self._on_reply(rank, reply)
            if got:
                self._resolve_ready()
            return got

    def _drive(self, done, timeout):
        """Read replies on this thread until ``done()``; TimeoutError after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self._poll_rings()
        if done():
            return
        rings = self._rings
        pidfds = self._pidfds
        # Replies usually come within microseconds: spin, then yield, before
        # the first sleep, and again after each wake-up that brought one.
        spin_s, yield_s = _SPIN_S, _YIELD_S
        while True:
            if self._failure is not None or self._is_shutdown:
                self._check_failed(done)
                return
            # Sliced: another thread waiting on the same rings may clear an
            # armed descriptor; a slice bounds what that costs.
            wait_s = _SLICE_S
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"the executor's call did not complete within {timeout} s")
                wait_s = min(wait_s, left)
            fired = wait_rings_or_fds(rings, pidfds, wait_s, spin_s, yield_s)
            got = self._poll_rings()
            for fd in fired:
                # Replies sent before it died are read above and still count.
                self._worker_lost(pidfds.index(fd))
            if done():
                return
            if not got:
                spin_s = yield_s = 0.0

    def _check_sentinels(self):
        for rank, proc in enumerate(self._procs):
            if proc.poll() is not None:
                self._poll_rings()
                self._worker_lost(rank)
                return

    def _worker_lost(self, rank):
        """A worker's process ended (or its ring broke): fail everything."""
        with self._lock:
            if self._failure is not None or self._is_shutdown:
                return
            proc = self._procs[rank]
            try:
                code = proc.wait(1.0)
            except subprocess.TimeoutExpired:
                code = None  # its ring broke first; the process is on its way out
            err = WorkerDiedError(
                f"worker rank {rank} (pid {proc.pid}) {_exit_description(code)}; "
                f"the executor has failed", rank=rank, pid=proc.pid, exitcode=code)
        self._fail_with(err)

    def _look_for_failure(self):
        self._poll_rings()
        self._check_sentinels()

    @property
    def worker_pids(self):
        return [p.pid for p in self._procs]

    def _pid_of(self, rank):
        return self._procs[rank].pid

    # ------------------------------------------------------------ shutdown

    def shutdown(self, grace=None):
        """Stop the workers: ask them to exit (they finish the calls already
        sent), wait up to ``grace`` seconds (default ``shutdown_grace``), then
        kill what is left.  Unlinks every segment.  Idempotent."""
        with self._lock:
            if self._is_shutdown:
                return
            self._is_shutdown = True
        _live_executors.discard(self)
        self._teardown(graceful=True, grace=self.shutdown_grace if grace is None else grace)

    def _teardown(self, graceful, grace=0.0):
        self._is_shutdown = True
        deadline = time.monotonic() + grace
        if self._mq is not None:
            if graceful and self._failure is None:
                try:
                    self._mq.enqueue((proto.SHUTDOWN,), timeout=min(grace, 1.0))
                except Exception:
                    pass
            # Closing the queue wakes readers blocked in dequeue: they exit
            # after the messages already sent.
            self._mq.close()
        if graceful:
            for rank, proc in enumerate(self._procs):
                while proc.poll() is None and time.monotonic() < deadline:
                    # Keep reading replies: a worker blocked on a full reply
                    # ring could not finish otherwise.
                    try:
                        self._poll_rings()
                    except Exception:
                        pass
                    try:
                        proc.wait(0.02)
                    except subprocess.TimeoutExpired:
                        pass
            try:
                self._poll_rings()
            except Exception:
                pass
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()  # our own child, by PID
        for proc in self._procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:  # pragma: no cover (unkillable)
                pass
        with self._lock:
            if self._pending:
                self._fail_all(self._failure or ExecutorShutdownError(
                    "the executor was shut down before this call completed"))
        # Off the loops before the descriptors close (a closed number may be
        # reused by a new file while a loop still watches it).
        for pump in list(self._async_pumps.values()):
            pump.stop()
        self._async_pumps.clear()
        for ring in self._rings:
            ring.close()
        for fd in self._pidfds:
            os.close(fd)
        self._pidfds = []

    def __del__(self):
        # Dropped without shutdown(): do not leave workers and segments behind.
        try:
            if not self._is_shutdown:
                self._is_shutdown = True
                self._teardown(graceful=False)
        except Exception:
            pass

    def __repr__(self):
        state = "failed" if self._failure else "shut down" if self._is_shutdown else "running"
        return f"<MultiprocExecutor world_size={self.world_size} {state}>"


_live_executors = weakref.WeakSet()


@atexit.register
def _shutdown_all():
    for ex in list(_live_executors):
        try:
            ex.shutdown(grace=1.0)
        except Exception:
            pass
