"""collective_rpc_async: the loop's readers, and how replies reach the awaiting task."""
import asyncio
import os
import select
import signal
import threading
import time

import pytest

from ray_lite.executor import MultiprocExecutor, WorkerDiedError

WAIT = 30  # seconds: bound on every wait that should end much sooner


class Worker:
    def __init__(self, rank, world_size):
        self.rank = rank

    def echo(self, x):
        return (self.rank, x)

    def wait_for_file(self, path, limit=WAIT):
        end = time.monotonic() + limit
        while not os.path.exists(path):
            if time.monotonic() > end:
                raise TimeoutError(f"{path} never appeared")
            time.sleep(0.001)
        return self.rank


@pytest.fixture
def ex():
    executor = MultiprocExecutor(Worker, world_size=2)
    try:
        yield executor
    finally:
        executor.shutdown()


@pytest.fixture
def release(tmp_path):
    path = tmp_path / "release"
    yield str(path)
    path.touch()  # never leave a worker blocked


def _watched(loop):
    return set(loop._selector.get_map())


def _descriptors(ex):
    return {ring.fileno() for ring in ex._rings} | set(ex._pidfds)


async def _nothing_readable(fds, turns=1000):
    """The loop's turns (not time) until none of ``fds`` is readable.

    A worker that saw the ring armed just before the reply was read sends
    its wake-up a moment later: the loop's next turn drains it.  A
    descriptor that stays readable would wake an idle loop again and again:
    that fails here, after ``turns`` turns."""
    for _ in range(turns):
        if not select.select(list(fds), [], [], 0)[0]:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"still readable after {turns} turns of the loop: "
                         f"{select.select(list(fds), [], [], 0)[0]}")


def test_the_loop_keeps_watching_between_calls_and_nothing_is_readable_while_idle(ex):
    async def main():
        loop = asyncio.get_running_loop()
        fds = _descriptors(ex)
        for i in range(3):
            assert await ex.collective_rpc_async("echo", args=(i,)) == [(0, i), (1, i)]
            # Still registered after the call: the next one pays nothing.
            assert fds <= _watched(loop)
            # ...and none of them stays readable: an idle loop sleeps.
            await _nothing_readable(fds)
        ex.shutdown()
        assert not fds & _watched(loop)

    asyncio.run(main())


def test_a_late_wake_up_is_drained_by_the_loop(ex):
    """A wake-up that lands after its reply was read (the worker was
    between seeing the ring armed and writing its descriptor) is read off
    by the loop's next turn, not left to wake it forever."""
    async def main():
        fds = _descriptors(ex)
        assert await ex.collective_rpc_async("echo", args=(1,)) == [(0, 1), (1, 1)]
        await _nothing_readable(fds)
        ring = ex._rings[0]
        os.write(ring.fileno(), b"\1")   # the FIFO is open for both ends: as the worker writes
        assert select.select([ring.fileno()], [], [], 0)[0] == [ring.fileno()]
        await _nothing_readable(fds)
        assert await ex.collective_rpc_async("echo", args=(2,)) == [(0, 2), (1, 2)]

    asyncio.run(main())


def test_shutdown_from_another_thread_takes_the_descriptors_off_a_running_loop(ex):
    async def main():
        loop = asyncio.get_running_loop()
        fds = _descriptors(ex)
        assert await ex.collective_rpc_async("echo", args=(1,)) == [(0, 1), (1, 1)]
        assert fds <= _watched(loop)
        await asyncio.wait_for(loop.run_in_executor(None, ex.shutdown), WAIT)
        assert not fds & _watched(loop)

    asyncio.run(main())


def test_a_worker_dying_between_calls_fails_the_executor_and_frees_the_loop(ex):
    async def main():
        loop = asyncio.get_running_loop()
        fds = _descriptors(ex)
        assert await ex.collective_rpc_async("echo", args=(1,)) == [(0, 1), (1, 1)]
        failed = asyncio.Event()
        ex.register_failure_callback(lambda: loop.call_soon_threadsafe(failed.set))
        os.kill(ex.worker_pids[0], signal.SIGKILL)   # our own child, by PID
        await asyncio.wait_for(failed.wait(), WAIT)  # noticed by the loop, no call pending
        assert not fds & _watched(loop)
        with pytest.raises(WorkerDiedError, match="rank 0"):
            await ex.collective_rpc_async("echo", args=(2,))

    asyncio.run(main())


def test_a_reply_read_on_another_thread_still_reaches_the_awaiting_task(ex, release):
    def release_then_call():
        open(release, "w").close()
        # Reads the replies of the async call too (they come first).
        return ex.collective_rpc("echo", args=(7,), timeout=WAIT)

    async def main():
        loop = asyncio.get_running_loop()
        call = asyncio.ensure_future(ex.collective_rpc_async("wait_for_file", args=(release,)))
        await asyncio.sleep(0)
        sync = await asyncio.wait_for(loop.run_in_executor(None, release_then_call), WAIT)
        assert sync == [(0, 7), (1, 7)]
        assert await asyncio.wait_for(call, WAIT) == [0, 1]

    asyncio.run(main())


def test_an_abandoned_call_leaves_the_next_calls_their_own_replies(ex, release):
    async def main():
        call = asyncio.ensure_future(ex.collective_rpc_async("wait_for_file", args=(release,)))
        await asyncio.sleep(0)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        open(release, "w").close()
        # The cancelled call's replies come first and are dropped.
        assert await asyncio.wait_for(ex.collective_rpc_async("echo", args=(3,)), WAIT) == [(0, 3), (1, 3)]
        results = await asyncio.gather(*[ex.collective_rpc_async("echo", args=(i,), unique_reply_rank=1)
                                         for i in range(5)])
        assert results == [(1, i) for i in range(5)]

    asyncio.run(main())
    ex.check_health()


def test_calls_from_two_loops_on_two_threads(ex):
    def run_loop(base, out):
        async def main():
            return [await ex.collective_rpc_async("echo", args=(base + i,)) for i in range(20)]
        out.append(asyncio.run(main()))

    outs = [[], []]
    threads = [threading.Thread(target=run_loop, args=(100 * k, outs[k])) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert not any(t.is_alive() for t in threads)
    for k in range(2):
        assert outs[k] == [[[(0, 100 * k + i), (1, 100 * k + i)] for i in range(20)]]
