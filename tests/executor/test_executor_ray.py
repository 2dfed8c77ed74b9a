"""RayExecutor: the executor's collective_rpc contract over Ray actors on a
local Ray; one worker is made "remote" so that the network transport of the
queues is exercised beside shared memory."""
import os

import cloudpickle
import pytest

from ray_helpers import ship_by_value, start_local_ray

ray = pytest.importorskip("ray")

from ray_lite.exceptions import RayTaskError  # noqa: E402
from ray_lite.executor import (  # noqa: E402
    MultiprocExecutor, RayExecutor, WorkerDiedError, create_executor, executor_class)

pytestmark = pytest.mark.ray


class Boom(Exception):
    pass


class Worker:
    def __init__(self, rank, world_size, tag="t"):
        self.rank = rank
        self.world_size = world_size
        self.tag = tag

    def whoami(self):
        return (self.rank, self.world_size, self.tag)

    def echo(self, *args, **kwargs):
        return (self.rank, args, kwargs)

    def blob(self, n):
        return bytes([self.rank]) * n

    def fail_on(self, rank):
        if self.rank == rank:
            raise Boom(f"rank {rank} fails")
        return "ok"

    def pid(self):
        return os.getpid()

    def exit_now(self, rank):
        if self.rank == rank:
            os._exit(3)
        return "alive"


@pytest.fixture(scope="module")
def local_ray():
    start_local_ray(lambda: ray.init(num_cpus=2, include_dashboard=False))
    # The worker class travels with ray_lite's cloudpickle, the rest with Ray's.
    undo = ship_by_value(__name__, (cloudpickle, ray.cloudpickle))
    try:
        yield
    finally:
        undo()
        ray.shutdown()


@pytest.fixture
def ray_ex(local_ray):
    ex = create_executor(Worker, 2, {"tag": "x"}, distributed_executor_backend="ray",
                         connect_ip="127.0.0.1", network_ranks=(1,), start_timeout=120)
    try:
        yield ex
    finally:
        ex.shutdown()


def test_backend_selection():
    assert executor_class("mp") is MultiprocExecutor
    assert executor_class("ray") is RayExecutor
    assert executor_class(None) is MultiprocExecutor   # the local backend: one machine
    with pytest.raises(ValueError):
        executor_class("slurm")


def test_collective_rpc_contract_over_shared_memory_and_network(ray_ex):
    assert isinstance(ray_ex, RayExecutor)
    # Rank 0 reads the broadcast queue from shared memory, rank 1 over TCP.
    assert ray_ex._mq.export_handle().local_reader_ranks == [0]
    assert ray_ex.collective_rpc("whoami", timeout=60) == [(0, 2, "x"), (1, 2, "x")]
    assert ray_ex.collective_rpc("echo", args=(1,), kwargs={"k": "v"}, timeout=60) == [
        (0, (1,), {"k": "v"}), (1, (1,), {"k": "v"})]
    assert ray_ex.collective_rpc("whoami", unique_reply_rank=1, timeout=60) == (1, 2, "x")
    assert ray_ex.collective_rpc(lambda w, k: w.rank * k, args=(10,), timeout=60) == [0, 10]
    big = ray_ex.collective_rpc("blob", args=(3 << 20,), timeout=60)   # beyond a chunk
    assert big == [b"\x00" * (3 << 20), b"\x01" * (3 << 20)]
    futures = [ray_ex.collective_rpc("echo", args=(i,), non_block=True) for i in range(3)]
    assert [f.result(timeout=60)[1][1] for f in reversed(futures)] == [(2,), (1,), (0,)]
    pids = ray_ex.collective_rpc("pid", timeout=60)
    assert pids == ray_ex.worker_pids and os.getpid() not in pids
    ray_ex.check_health()


def test_worker_exception_is_a_ray_task_error_and_the_executor_stays_usable(ray_ex):
    with pytest.raises(Boom) as info:
        ray_ex.collective_rpc("fail_on", args=(1,), timeout=60)
    assert isinstance(info.value, RayTaskError)
    assert "rank 1 fails" in str(info.value)
    assert ray_ex.collective_rpc("fail_on", args=(5,), timeout=60) == ["ok", "ok"]


@pytest.mark.parametrize("dying_rank", [0, 1], ids=["shared-memory", "network"])
def test_a_dead_worker_fails_the_executor_with_worker_died_error(ray_ex, dying_rank):
    failed = []
    ray_ex.register_failure_callback(lambda: failed.append(True))
    with pytest.raises(WorkerDiedError) as info:
        ray_ex.collective_rpc("exit_now", args=(dying_rank,), timeout=120)
    assert info.value.rank == dying_rank
    assert ray_ex.is_failed and failed == [True]
    with pytest.raises(WorkerDiedError):
        ray_ex.collective_rpc("whoami", timeout=60)
    with pytest.raises(WorkerDiedError):
        ray_ex.check_health()
