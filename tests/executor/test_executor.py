"""MultiprocExecutor: N worker processes behind one broadcast queue."""
import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from ray_lite._fast import shm
from ray_lite.exceptions import RayTaskError
from ray_lite.executor import ExecutorShutdownError, MultiprocExecutor, RpcFuture, WorkerDiedError

from procs import wait_dead

WAIT = 30  # seconds: bound on every wait that should end much sooner


class CustomError(Exception):
    pass


class Worker:
    """Built in each worker process as Worker(rank=r, world_size=n, **kw)."""

    def __init__(self, rank, world_size, tag="t", fail_rank=None):
        if rank == fail_rank:
            raise CustomError(f"rank {rank} refuses to start")
        self.rank = rank
        self.world_size = world_size
        self.tag = tag
        self.log = []

    def noop(self):
        return None

    def echo(self, *args, **kwargs):
        self.log.append(args[0] if args else None)
        return (self.rank, args, kwargs)

    def get_log(self):
        return list(self.log)

    def whoami(self):
        return {"rank": self.rank, "world_size": self.world_size, "tag": self.tag, "pid": os.getpid()}

    def fail_on(self, rank):
        if self.rank == rank:
            raise CustomError(f"failure on rank {self.rank}")
        return self.rank

    def wait_for_file(self, path, limit=WAIT):
        # Blocks the call until the test releases it (bounded).
        end = time.monotonic() + limit
        while not os.path.exists(path):
            if time.monotonic() > end:
                raise TimeoutError(f"{path} never appeared")
            time.sleep(0.001)
        return self.rank

    def size_of(self, blob):
        return len(blob) if not isinstance(blob, np.ndarray) else int(blob.sum())

    def make_array(self, n):
        return np.full(n, self.rank, dtype=np.int32)

    def unpicklable(self):
        return threading.Lock()

    def exit_now(self, code):
        os._exit(code)


def add_rank(worker, x):
    return worker.rank + x


@pytest.fixture
def ex():
    executor = MultiprocExecutor(Worker, world_size=2, worker_kwargs={"tag": "fx"})
    try:
        yield executor
    finally:
        executor.shutdown()


@pytest.fixture
def release(tmp_path):
    """A path whose creation releases the workers' ``wait_for_file`` calls."""
    path = tmp_path / "release"
    yield str(path)
    path.touch()  # never leave a worker blocked


def _alive(pid):
    return not wait_dead(pid, 0)


# --------------------------------------------------------------- calls

def test_workers_are_built_with_rank_world_size_and_kwargs(ex):
    infos = ex.collective_rpc("whoami")
    assert [i["rank"] for i in infos] == [0, 1]
    assert all(i["world_size"] == 2 and i["tag"] == "fx" for i in infos)
    assert [i["pid"] for i in infos] == ex.worker_pids
    assert len(set(ex.worker_pids)) == 2 and os.getpid() not in ex.worker_pids


def test_args_kwargs_and_results_in_rank_order(ex):
    out = ex.collective_rpc("echo", args=(1, "two", (3,)), kwargs={"k": [4]})
    assert out == [(0, (1, "two", (3,)), {"k": [4]}), (1, (1, "two", (3,)), {"k": [4]})]


def test_array_results_stay_writable(ex):
    # vLLM's executor pickles its replies: arrays come back writable (the
    # core's read-only arrays, Ray's semantics, are not the executor's).
    for n in (10, 100_000):
        arrays = ex.collective_rpc("make_array", args=(n,))
        assert [int(a[0]) for a in arrays] == [0, 1]
        assert all(a.flags.writeable for a in arrays)
        arrays[0][0] = 5


def test_unique_reply_rank(ex):
    assert ex.collective_rpc("whoami", unique_reply_rank=1)["rank"] == 1
    assert ex.collective_rpc("echo", args=(5,), unique_reply_rank=0) == (0, (5,), {})
    fut = ex.collective_rpc("whoami", unique_reply_rank=1, non_block=True)
    assert fut.result(WAIT)["rank"] == 1
    with pytest.raises(ValueError):
        ex.collective_rpc("noop", unique_reply_rank=2)


def test_callables_run_with_the_worker_as_first_argument(ex):
    assert ex.collective_rpc(add_rank, args=(10,)) == [10, 11]
    offset = 100
    assert ex.collective_rpc(lambda w, y: (w.rank, w.tag, y + offset), args=(1,)) == [
        (0, "fx", 101), (1, "fx", 101)]
    with pytest.raises(TypeError):
        ex.collective_rpc(42)


def test_interleaved_blocking_and_non_blocking_calls_keep_submission_order(ex):
    fired = []
    futs = []
    for i in range(5):
        fut = ex.collective_rpc("echo", args=(f"nb{i}",), non_block=True)
        fut.add_done_callback(lambda f, i=i: fired.append(f"nb{i}"))
        futs.append(fut)
        if i % 2 == 1:
            # A blocking call first drains the earlier non-blocking ones.
            out = ex.collective_rpc("echo", args=(f"b{i}",))
            fired.append(f"b{i}")
            assert out[0][1] == (f"b{i}",)
            assert all(f.done() for f in futs)
    last = futs[-1].result(WAIT)
    assert last[1][1] == ("nb4",)
    assert fired == ["nb0", "nb1", "b1", "nb2", "nb3", "b3", "nb4"]
    # Every worker ran them in submission order.
    want = ["nb0", "nb1", "b1", "nb2", "nb3", "b3", "nb4"]
    assert ex.collective_rpc("get_log") == [want, want]
    assert all(isinstance(f, RpcFuture) for f in futs)


def test_callbacks_fire_when_another_call_drains_the_rings(ex):
    fired = threading.Event()
    fut = ex.collective_rpc("noop", non_block=True)
    fut.add_done_callback(lambda f: fired.set())
    # Nobody waits on fut; the next blocking call reads its replies first.
    ex.collective_rpc("noop")
    assert fut.done() and fired.is_set()
    # A callback added to a finished future runs at once.
    late = []
    fut.add_done_callback(late.append)
    assert late == [fut]
    assert fut.cancel() is False


def test_futures_resolve_in_submission_order_when_waited_out_of_order(ex):
    futs = [ex.collective_rpc("echo", args=(i,), non_block=True) for i in range(20)]
    order = []
    for i, f in enumerate(futs):
        f.add_done_callback(lambda _f, i=i: order.append(i))
    assert futs[-1].result(WAIT)[1][1] == (19,)
    assert order == list(range(20))
    assert [f.result(0)[0][1] for f in futs] == [(i,) for i in range(20)]


# --------------------------------------------------------------- timeouts, errors

def test_timeout_leaves_the_executor_usable(ex, release):
    with pytest.raises(TimeoutError):
        ex.collective_rpc("wait_for_file", args=(release,), timeout=0.05)
    fut = ex.collective_rpc("wait_for_file", args=(release,), non_block=True)
    with pytest.raises(TimeoutError):
        fut.result(timeout=0.05)
    assert not fut.done()
    open(release, "w").close()
    assert fut.result(WAIT) == [0, 1]
    assert ex.collective_rpc("echo", args=("after",)) == [(0, ("after",), {}), (1, ("after",), {})]
    ex.check_health()


def test_ctrl_c_interrupts_a_blocked_call_and_the_executor_stays_usable(ex, release):
    timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            ex.collective_rpc("wait_for_file", args=(release,), timeout=WAIT)
    finally:
        timer.cancel()
        timer.join(WAIT)
    open(release, "w").close()
    # The interrupted call still completes (its replies are read and dropped).
    assert ex.collective_rpc("echo", args=("next",), timeout=WAIT)[1] == (1, ("next",), {})
    ex.check_health()


def test_worker_exception_carries_the_remote_traceback_and_executor_stays_usable(ex):
    with pytest.raises(CustomError) as info:
        ex.collective_rpc("fail_on", args=(1,))
    err = info.value
    assert isinstance(err, RayTaskError)
    assert "failure on rank 1" in str(err) and "fail_on" in err.traceback_str
    assert "rank 1" in str(err)
    # Non-blocking: the future holds the error.
    fut = ex.collective_rpc("fail_on", args=(0,), non_block=True)
    assert isinstance(fut.exception(WAIT), CustomError)
    # The executor carries on.
    assert ex.collective_rpc("fail_on", args=(-1,)) == [0, 1]
    with pytest.raises(AttributeError):
        ex.collective_rpc("no_such_method")
    with pytest.raises(RayTaskError):
        ex.collective_rpc("unpicklable")  # a result nothing can serialise
    ex.check_health()
    assert not ex.is_failed


def test_unserialisable_arguments_are_refused_before_anything_is_sent(ex):
    from ray_lite._fast.errors import SerializationError
    with pytest.raises(SerializationError):
        ex.collective_rpc("echo", args=(threading.Lock(),))
    assert ex.collective_rpc("echo", args=("ok",)) == [(0, ("ok",), {}), (1, ("ok",), {})]


def test_start_failure_raises_and_leaves_nothing_behind():
    with pytest.raises(RuntimeError, match="worker 1 failed to start") as info:
        MultiprocExecutor(Worker, world_size=2, worker_kwargs={"fail_rank": 1})
    assert "refuses to start" in str(info.value)


# --------------------------------------------------------------- big messages

def test_messages_above_the_chunk_size(tmp_path):
    ex = MultiprocExecutor(Worker, world_size=2, max_chunk_bytes=4096, max_chunks=4,
                           reply_ring_bytes=1 << 16)
    try:
        blob = os.urandom(200_000)
        assert ex.collective_rpc("size_of", args=(blob,)) == [200_000, 200_000]
        arr = np.arange(50_000, dtype=np.int64)
        assert ex.collective_rpc("size_of", args=(arr,)) == [int(arr.sum())] * 2
        big = ex.collective_rpc("make_array", args=(300_000,))  # replies above the ring's inline limit
        assert [int(a.sum()) for a in big] == [0, 300_000]
        for _ in range(20):  # many in a row: chunks and out-of-band segments recycled
            assert ex.collective_rpc("size_of", args=(b"x" * 10_000,)) == [10_000, 10_000]
    finally:
        ex.shutdown()


# --------------------------------------------------------------- dead workers

def test_sigkill_during_a_call_fails_pending_futures_naming_the_rank(ex, release):
    failures = []
    ex.register_failure_callback(lambda: failures.append("failed"))
    fut = ex.collective_rpc("wait_for_file", args=(release,), non_block=True)
    fut2 = ex.collective_rpc("noop", non_block=True)
    victim = ex.worker_pids[1]
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(WorkerDiedError) as info:
        fut.result(WAIT)
    err = info.value
    assert err.rank == 1 and err.pid == victim and err.exitcode == -signal.SIGKILL
    assert "rank 1" in str(err) and "SIGKILL" in str(err)
    assert isinstance(fut2.exception(0), WorkerDiedError)
    assert ex.is_failed and failures == ["failed"]
    with pytest.raises(WorkerDiedError):
        ex.collective_rpc("noop")
    with pytest.raises(WorkerDiedError):
        ex.check_health()
    late = []
    ex.register_failure_callback(lambda: late.append(1))
    assert late == [1]


def test_sigkill_while_idle_is_detected(ex):
    failures = []
    ex.register_failure_callback(lambda: failures.append(1))
    ex.check_health()
    victim = ex.worker_pids[0]
    os.kill(victim, signal.SIGKILL)
    assert wait_dead(victim, WAIT)
    with pytest.raises(WorkerDiedError, match="rank 0"):
        ex.check_health()
    assert failures == [1]
    with pytest.raises(WorkerDiedError, match="rank 0"):
        ex.collective_rpc("noop", timeout=WAIT)


def test_a_worker_that_exits_mid_call_is_detected(ex):
    with pytest.raises(WorkerDiedError, match=r"rank \d+ .*exited with code 3"):
        ex.collective_rpc("exit_now", args=(3,), timeout=WAIT)


def test_blocking_call_sees_a_death_at_once_while_sleeping(ex, release):
    # The caller sleeps in poll() on the rings and the process sentinels.
    def kill_soon():
        os.kill(ex.worker_pids[0], signal.SIGKILL)

    timer = threading.Timer(0.2, kill_soon)
    timer.start()
    try:
        with pytest.raises(WorkerDiedError, match="rank 0"):
            ex.collective_rpc("wait_for_file", args=(release,), timeout=WAIT)
    finally:
        timer.cancel()
        timer.join(WAIT)


# --------------------------------------------------------------- shutdown

def test_shutdown_is_graceful_when_workers_are_idle():
    ex = MultiprocExecutor(Worker, world_size=3)
    procs = list(ex._procs)
    assert ex.collective_rpc("noop") == [None] * 3
    ex.shutdown()
    assert [p.returncode for p in procs] == [0, 0, 0]
    with pytest.raises(ExecutorShutdownError):
        ex.collective_rpc("noop")
    with pytest.raises(ExecutorShutdownError):
        ex.check_health()
    ex.shutdown()  # idempotent


def test_shutdown_kills_busy_workers_after_the_grace_period(release):
    ex = MultiprocExecutor(Worker, world_size=2, shutdown_grace=0.2)
    procs = list(ex._procs)
    fut = ex.collective_rpc("wait_for_file", args=(release,), non_block=True)
    ex.shutdown()
    assert all(p.returncode == -signal.SIGKILL for p in procs)
    assert isinstance(fut.exception(0), ExecutorShutdownError)


def test_context_manager_and_no_leftovers():
    before = set(shm.list_segments())
    with MultiprocExecutor(Worker, world_size=2) as ex:
        assert ex.collective_rpc("noop") == [None, None]
        pids = ex.worker_pids
    assert not any(_alive(p) for p in pids)
    assert set(shm.list_segments()) - before == set()


DRIVER_CODE = r'''
import json, sys, os
sys.path[:] = json.loads(sys.argv[1])
from ray_lite.executor import MultiprocExecutor
from test_executor import Worker
ex = MultiprocExecutor(Worker, world_size=2)
print(json.dumps(ex.worker_pids), flush=True)
sys.stdin.readline()  # until the test kills us
'''


def test_workers_exit_when_the_driver_dies():
    driver = subprocess.Popen([sys.executable, "-c", DRIVER_CODE, json.dumps(sys.path)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        pids = json.loads(driver.stdout.readline())
        assert all(_alive(p) for p in pids)
        driver.kill()
        driver.wait(WAIT)
        assert all(wait_dead(p, WAIT) for p in pids)
    finally:
        if driver.poll() is None:
            driver.kill()
        driver.wait(WAIT)
        driver.stdin.close()
        driver.stdout.close()
        # The killed driver could not unlink its reply rings.
        shm.cleanup_stale_segments()


# --------------------------------------------------------------- asyncio

def test_collective_rpc_async(ex, release):
    async def main():
        out = await ex.collective_rpc_async("echo", args=(1,))
        assert out == [(0, (1,), {}), (1, (1,), {})]
        many = await asyncio.gather(*[ex.collective_rpc_async("echo", args=(i,), unique_reply_rank=1)
                                      for i in range(10)])
        assert many == [(1, (i,), {}) for i in range(10)]
        with pytest.raises(CustomError):
            await ex.collective_rpc_async("fail_on", args=(0,))
        with pytest.raises(TimeoutError):
            await ex.collective_rpc_async("wait_for_file", args=(release,), timeout=0.05)
        open(release, "w").close()
        return await ex.collective_rpc_async(add_rank, args=(5,))

    assert asyncio.run(main()) == [5, 6]
    ex.check_health()


def test_collective_rpc_async_sees_a_worker_death(ex, release):
    async def main():
        call = asyncio.ensure_future(ex.collective_rpc_async("wait_for_file", args=(release,)))
        await asyncio.sleep(0)
        os.kill(ex.worker_pids[1], signal.SIGKILL)
        with pytest.raises(WorkerDiedError, match="rank 1"):
            await asyncio.wait_for(call, WAIT)

    asyncio.run(main())
    assert ex.is_failed


# --------------------------------------------------------------- the benchmark suite

def test_executor_benchmark_suite_runs_at_smoke_size():
    # Not a timing assertion: every figure of `ray-lite bench executor` is
    # measured (or says why it cannot be), and nothing is left behind.
    from ray_lite.bench import executor_suite
    from ray_lite.bench._harness import Context
    from ray_lite._fast import NO_EXTENSIONS
    figures = executor_suite.run(Context(scale="smoke"))
    by_status = {}
    for f in figures:
        by_status.setdefault(f.status, []).append((f.bench, f.label, f.reason))
    assert "error" not in by_status, by_status["error"]
    measured = {(f.bench, f.impl) for f in figures if f.status == "ok"}
    assert {("B6", "anchor"), ("B5", "python"), ("tput", "python"), ("tput", "anchor")} <= measured
    assert ("B6", "python" if NO_EXTENSIONS else "compiled") in measured
    for f in figures:
        if f.status == "ok":
            assert f.value is not None and f.value > 0
