"""``@serve.batch``: batches, their limits (changed at run time), one batch at a
time unless asked, streaming batch handlers, errors, cancelled callers, and
the same through a deployment."""
import asyncio

import pytest

from ray_lite import serve
from ray_lite.serve.exceptions import RayServeException

WAIT_S = 30      # bound of every wait below (a loaded machine is slow, never this slow)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, WAIT_S))


async def turns(n=20):
    """Let the loop run ``n`` rounds: what is ready to start has started."""
    for _ in range(n):
        await asyncio.sleep(0)


async def started(fn, inputs):
    """Calls of ``fn`` on each input, as tasks, once what can start has started."""
    calls = [asyncio.ensure_future(fn(x)) for x in inputs]
    await turns()
    return calls


def test_calls_are_grouped_up_to_max_batch_size_in_order():
    sizes = []

    @serve.batch(max_batch_size=3, batch_wait_timeout_s=1000)
    async def double(xs):
        sizes.append(len(xs))
        return [x * 2 for x in xs]

    async def main():
        return await asyncio.gather(*[double(i) for i in range(6)])
    assert run(main()) == [0, 2, 4, 6, 8, 10]
    assert sizes == [3, 3]          # full batches go at once: no 1000 s wait


def test_a_partial_batch_goes_after_the_timeout():
    @serve.batch(max_batch_size=10, batch_wait_timeout_s=0.01)
    async def ident(xs):
        return list(xs)

    async def main():
        return await asyncio.gather(ident(1), ident(2))
    assert run(main()) == [1, 2]


def test_several_arguments_and_keywords_become_lists():
    @serve.batch(max_batch_size=2, batch_wait_timeout_s=1000)
    async def add(xs, ys, *, scale):
        return [(x + y) * s for x, y, s in zip(xs, ys, scale)]

    async def main():
        return await asyncio.gather(add(1, 2, scale=10), add(3, 4, scale=100))
    assert run(main()) == [30, 700]


@pytest.mark.parametrize("max_concurrent", [1, 2])
def test_batches_run_one_at_a_time_unless_asked(max_concurrent):
    state = {"now": 0, "most": 0}
    gate = asyncio.Event()

    @serve.batch(max_batch_size=1, batch_wait_timeout_s=0, max_concurrent_batches=max_concurrent)
    async def work(xs):
        state["now"] += 1
        state["most"] = max(state["most"], state["now"])
        try:
            await gate.wait()
        finally:
            state["now"] -= 1
        return xs

    async def main():
        calls = await started(work, range(4))
        running = state["now"]
        gate.set()
        return running, await asyncio.gather(*calls)
    running, results = run(main())
    assert results == [0, 1, 2, 3]
    assert running == max_concurrent
    assert state["most"] == max_concurrent


def test_limits_change_at_run_time():
    @serve.batch(max_batch_size=5, batch_wait_timeout_s=1000)
    async def ident(xs):
        return list(xs)

    assert ident._get_max_batch_size() == 5 and ident._get_batch_wait_timeout_s() == 1000

    async def main():
        first = asyncio.ensure_future(ident("a"))
        await turns()
        assert not first.done()                     # waiting for 4 more, or 1000 s
        ident.set_batch_wait_timeout_s(0)           # the wait is over
        assert await first == "a"
        ident.set_batch_wait_timeout_s(1000)
        second = asyncio.ensure_future(ident("b"))
        await turns()
        assert not second.done()
        ident.set_max_batch_size(1)                 # the batch is full now
        assert await second == "b"
    run(main())
    assert ident._get_max_batch_size() == 1 and ident._get_batch_wait_timeout_s() == 1000
    with pytest.raises(ValueError, match="max_batch_size"):
        ident.set_max_batch_size(0)
    with pytest.raises(ValueError, match="batch_wait_timeout_s"):
        ident.set_batch_wait_timeout_s(-1)


def test_setters_work_on_the_bound_method():
    class Model:
        @serve.batch(max_batch_size=4, batch_wait_timeout_s=1000)
        async def handle(self, xs):
            return [(self.tag, x) for x in xs]

    m = Model()
    m.tag = "m"
    m.handle.set_max_batch_size(1)
    assert m.handle._get_max_batch_size() == 1
    assert run(m.handle(7)) == ("m", 7)


def test_a_handler_error_reaches_every_caller_of_its_batch():
    @serve.batch(max_batch_size=3, batch_wait_timeout_s=1000)
    async def broken(xs):
        raise KeyError("model failed")

    async def main():
        return await asyncio.gather(*[broken(i) for i in range(3)], return_exceptions=True)
    errors = run(main())
    assert len(errors) == 3
    assert all(isinstance(e, KeyError) and "model failed" in str(e) for e in errors)


def test_wrong_number_of_results_names_both_sizes():
    @serve.batch(max_batch_size=2, batch_wait_timeout_s=1000)
    async def short(xs):
        return xs[:1]

    async def main():
        return await asyncio.gather(short(1), short(2), return_exceptions=True)
    for e in run(main()):
        assert isinstance(e, RayServeException)
        assert "batch of 2 inputs" in str(e) and "returned 1 results" in str(e)


def test_not_a_list_is_refused():
    @serve.batch(max_batch_size=1, batch_wait_timeout_s=0)
    async def scalar(xs):
        return 5

    with pytest.raises(TypeError, match="must return a list"):
        run(scalar(1))


def test_a_cancelled_caller_does_not_break_its_batch():
    seen = []
    gate = asyncio.Event()

    @serve.batch(max_batch_size=3, batch_wait_timeout_s=1000)
    async def slow(xs):
        seen.append(list(xs))
        await gate.wait()
        return [x * 10 for x in xs]

    async def main():
        calls = await started(slow, range(3))
        assert seen == [[0, 1, 2]]             # the batch is running
        calls[1].cancel()
        await turns()
        gate.set()
        return await asyncio.gather(*calls, return_exceptions=True)
    a, b, c = run(main())
    assert (a, c) == (0, 20)
    assert isinstance(b, asyncio.CancelledError)


def test_a_caller_cancelled_while_waiting_is_left_out_of_the_batch():
    seen = []

    @serve.batch(max_batch_size=3, batch_wait_timeout_s=1000)
    async def ident(xs):
        seen.append(list(xs))
        return list(xs)

    async def main():
        first = asyncio.ensure_future(ident("gone"))
        await turns()
        first.cancel()
        await turns()
        return await asyncio.gather(*[ident(i) for i in range(3)])
    assert run(main()) == [0, 1, 2]
    assert seen == [[0, 1, 2]]


def test_the_arguments_are_checked():
    with pytest.raises(ValueError, match="max_batch_size"):
        serve.batch(max_batch_size=0)
    with pytest.raises(ValueError, match="batch_wait_timeout_s"):
        serve.batch(batch_wait_timeout_s=-0.5)
    # Not a whole number, not a number: TypeError, as Ray's (2.0 is taken as 2).
    with pytest.raises(TypeError, match="max_batch_size"):
        serve.batch(max_batch_size=1.1)
    with pytest.raises(TypeError, match="batch_wait_timeout_s"):
        serve.batch(batch_wait_timeout_s="a")

    @serve.batch(max_batch_size=2.0)
    async def two(xs):
        return xs
    assert two._get_max_batch_size() == 2 and type(two._get_max_batch_size()) is int


def test_a_streaming_call_joins_its_batch_when_made_not_when_first_read():
    # As Ray: a caller that makes two calls, then reads one after the other,
    # gets one batch at once (not a wait of batch_wait_timeout_s for each).
    seen = []

    @serve.batch(max_batch_size=2, batch_wait_timeout_s=1000)
    async def tagged(keys):
        seen.append(list(keys))
        for i in range(2):
            yield [(i, k) for k in keys]

    async def main():
        calls = [tagged("a"), tagged("b")]
        out = []
        for call in calls:      # (an async comprehension in a comprehension needs 3.11)
            out.append([item async for item in call])
        return out
    assert run(main()) == [[(0, "a"), (1, "a")], [(0, "b"), (1, "b")]]
    assert seen == [["a", "b"]]
    with pytest.raises(ValueError, match="max_concurrent_batches"):
        serve.batch(max_concurrent_batches=0)
    with pytest.raises(TypeError, match="batch_size_fn"):
        serve.batch(batch_size_fn=3)
    with pytest.raises(TypeError, match="async"):
        @serve.batch
        def not_async(xs):
            return xs


def test_batch_size_fn_weighs_the_inputs():
    sizes = []

    @serve.batch(max_batch_size=10, batch_wait_timeout_s=1000, batch_size_fn=lambda xs: sum(map(len, xs)))
    async def lengths(xs):
        sizes.append([len(x) for x in xs])
        return [len(x) for x in xs]

    async def main():
        return await asyncio.gather(lengths("aaaa"), lengths("bbbbbb"), lengths("cc"), lengths("d" * 8))
    assert run(main()) == [4, 6, 2, 8]
    assert sizes == [[4, 6], [2, 8]]      # 10 "tokens" make a batch full


# ------------------------------------------------------------ streaming
def test_each_caller_streams_its_own_items_and_an_early_end_finishes_only_it():
    @serve.batch(max_batch_size=3, batch_wait_timeout_s=1000)
    async def count(ns):
        for i in range(max(ns)):
            yield [i if i < n else StopIteration for n in ns]

    async def consume(n):
        return [x async for x in count(n)]

    async def main():
        return await asyncio.gather(consume(1), consume(3), consume(2))
    assert run(main()) == [[0], [0, 1, 2], [0, 1]]


def test_a_streaming_handler_error_reaches_the_open_callers():
    @serve.batch(max_batch_size=2, batch_wait_timeout_s=1000)
    async def fails(ns):
        yield ["a0", "b0"]
        yield [StopIteration, "b1"]
        raise ValueError("stream broke")

    async def consume(n):
        got = []
        try:
            async for x in fails(n):
                got.append(x)
        except ValueError as exc:
            got.append(str(exc))
        return got

    async def main():
        return await asyncio.gather(consume(0), consume(1))
    assert run(main()) == [["a0"], ["b0", "b1", "stream broke"]]


def test_a_streaming_batch_of_wrong_size_names_both_sizes():
    @serve.batch(max_batch_size=2, batch_wait_timeout_s=1000)
    async def wrong(ns):
        yield [1]

    async def consume(n):
        with pytest.raises(RayServeException, match="batch of 2 inputs and yielded 1 items"):
            async for _ in wrong(n):
                pass

    async def main():
        await asyncio.gather(consume(0), consume(1))
    run(main())


def test_a_stream_closed_early_leaves_the_others_going():
    gate = asyncio.Event()

    @serve.batch(max_batch_size=2, batch_wait_timeout_s=1000)
    async def tokens(ns):
        yield ["x0", "y0"]
        await gate.wait()
        yield ["x1", "y1"]
        yield [StopIteration, "y2"]

    async def main():
        left = tokens(0)
        other = asyncio.ensure_future(_collect(tokens(1)))
        assert await left.__anext__() == "x0"
        await left.aclose()                      # this caller goes away
        gate.set()
        return await other
    assert run(main()) == ["y0", "y1", "y2"]


async def _collect(agen):
    return [x async for x in agen]


# --------------------------------------------------------- in a deployment
@serve.deployment(max_ongoing_requests=20)
class Tokenizer:
    def __init__(self):
        self.batches = []

    @serve.batch(max_batch_size=4, batch_wait_timeout_s=0.5)
    async def stream(self, prompts):
        self.batches.append(len(prompts))
        for i in range(max(len(p) for p in prompts)):
            yield [p[i] if i < len(p) else StopIteration for p in prompts]

    def batch_sizes(self):
        return self.batches


def test_streaming_batches_through_a_handle(serve_runtime):
    h = serve.run(Tokenizer.bind(), name="tok", route_prefix=None)
    sh = h.options(stream=True)
    words = ["ab", "cde", "f", "ghij"]
    gens = [sh.stream.remote(w) for w in words]
    assert ["".join(g) for g in gens] == words
    sizes = h.batch_sizes.remote().result(timeout_s=WAIT_S)
    assert sum(sizes) == 4 and max(sizes) > 1


def test_a_cancelled_batch_cancels_its_callers():
    gate = asyncio.Event()
    running = []

    @serve.batch(max_batch_size=2, batch_wait_timeout_s=1000)
    async def stuck(xs):
        running.append(asyncio.current_task())
        await gate.wait()
        return xs

    async def main():
        calls = await started(stuck, range(2))
        running[0].cancel()          # the batch itself, as when its loop shuts down
        return await asyncio.gather(*calls, return_exceptions=True)
    assert all(isinstance(r, asyncio.CancelledError) for r in run(main()))
