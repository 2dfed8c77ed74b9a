"""The body stream between what produces a streamed HTTP answer in a replica
and the stream the proxy reads (serve/_body.py): bursts joined, bounds on
what is buffered, errors and closing.  In one event loop, no processes.

A take is one chunk (bytes) or, when several queued, the list of them: the
proxy frames each as its own HTTP chunk."""
import asyncio

import pytest

from ray_lite.serve import _body
from ray_lite.serve._body import AHEAD_CHUNKS, BATCH_BYTES, BodyStream, pumped
from ray_lite.serve.exceptions import ClientDisconnected


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


async def _let_the_loop_run():
    """Every task that can run does, until all wait (one loop, no clock)."""
    for _ in range(50):
        await asyncio.sleep(0)


async def _take_all(stream):
    return [item async for item in stream]


def _chunks(items):
    """The chunks the takes ``items`` carried, in order."""
    out = []
    for item in items:
        out.extend(item if type(item) is list else [item])
    return out


def _size(item):
    return sum(map(len, _chunks([item])))


async def _taken_before_error(stream, error, match):
    """The bytes taken from ``stream`` before it raised ``error`` (which it must)."""
    got = []
    with pytest.raises(error, match=match):
        async for item in stream:
            got.append(item)
    return b"".join(_chunks(got))


def test_a_burst_is_taken_together_in_order_each_chunk_kept():
    async def main():
        def gen():
            for i in range(100):
                yield f"e{i};"
        items = await _take_all(pumped(gen()))
        assert _chunks(items) == [f"e{i};".encode() for i in range(100)]
        # The producer never waits but when AHEAD_CHUNKS are queued: each
        # take holds what queued meanwhile.
        assert len(items) <= 100 // AHEAD_CHUNKS + 2, len(items)
    run(main())


def test_a_chunk_put_alone_is_taken_at_once_not_held_for_a_batch():
    async def main():
        go = asyncio.Event()

        async def gen():
            yield "first"
            await go.wait()         # the next one only after the first was taken
            yield "second"
        stream = pumped(gen())
        assert await stream.__anext__() == b"first"
        go.set()
        assert await stream.__anext__() == b"second"
        with pytest.raises(StopAsyncIteration):
            await stream.__anext__()
    run(main())


def test_a_take_joins_at_most_batch_bytes_and_a_big_chunk_goes_alone():
    async def main():
        big = b"x" * (BATCH_BYTES + 10)
        small = b"y" * (BATCH_BYTES // 4)
        stream = BodyStream()
        await stream.put(big)
        async def producer():
            for _ in range(8):
                await stream.put(small)
            stream.end()
        task = asyncio.ensure_future(producer())
        items = await _take_all(stream)
        await task
        assert items[0] == big
        assert _chunks(items[1:]) == [small] * 8
        # Each later take stops once it holds BATCH_BYTES (four smalls).
        assert all(_size(item) <= BATCH_BYTES for item in items[1:])
        assert len(items) >= 3
    run(main())


@pytest.mark.parametrize("size", [1, BATCH_BYTES])
def test_a_producer_waits_while_its_chunks_are_not_taken(size):
    """Bounded by count (small chunks) or by bytes (large ones): a client
    that reads slowly does not make the replica buffer the whole answer."""
    async def main():
        put = 0

        async def gen():
            nonlocal put
            for _ in range(10 * AHEAD_CHUNKS):
                put += 1
                yield b"z" * size
        stream = pumped(gen())
        await _let_the_loop_run()     # the producer runs until it must wait
        held = put
        assert held <= AHEAD_CHUNKS + 1, held
        await _let_the_loop_run()
        assert put == held          # still waiting: nothing was taken
        first = await stream.__anext__()
        assert _size(first) >= size
        await _let_the_loop_run()
        assert put > held           # a take lets it go on
        await stream.aclose()
    run(main())


def test_the_producers_error_comes_after_the_chunks_before_it():
    async def main():
        async def gen():
            yield "a"
            yield "b"
            raise ValueError("model failed mid-stream")
        assert await _taken_before_error(pumped(gen()), ValueError,
                                         "model failed mid-stream") == b"ab"
    run(main())


def test_an_item_that_is_no_body_fails_the_stream_naming_it():
    async def main():
        def gen():
            yield {"ok": 1}             # JSON, as Serve sends a dict
            yield object()
        assert await _taken_before_error(pumped(gen()), TypeError,
                                         "not JSON serializable") == b'{"ok":1}'
    run(main())


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_closing_the_stream_closes_the_users_generator_at_once(kind):
    async def main():
        closed = []

        async def agen():
            try:
                while True:
                    yield "tick"
            finally:
                closed.append(True)

        def sgen():
            try:
                while True:
                    yield "tick"
            finally:
                closed.append(True)
        stream = pumped(agen() if kind == "async" else sgen())
        assert _chunks([await stream.__anext__()])[0] == b"tick"
        await stream.aclose()
        with pytest.raises(asyncio.CancelledError):
            await stream.task
        assert closed == [True]
        with pytest.raises(StopAsyncIteration):
            await stream.__anext__()
    run(main())


def test_an_asgi_failure_without_an_exception_says_the_app_failed():
    async def main():
        stream = BodyStream()
        await stream.put(b"head")
        stream.end(_body.FAILED)
        assert await stream.__anext__() == b"head"
        with pytest.raises(RuntimeError, match="ASGI app failed"):
            await stream.__anext__()
    run(main())


def test_an_iterator_that_fails_while_closing_is_reported_not_raised(capfd):
    """A client that left closes the user's generator; its cleanup raising is
    printed, and the producer's task ends as cancelled (nothing unretrieved)."""
    async def main():
        async def gen():
            try:
                while True:
                    yield "tick"
            finally:
                raise RuntimeError("cleanup failed")
        stream = pumped(gen())
        assert _chunks([await stream.__anext__()])[0] == b"tick"
        await stream.aclose()
        with pytest.raises(asyncio.CancelledError):
            await stream.task
    run(main())
    assert "cleanup failed" in capfd.readouterr().err


def test_a_put_after_the_reader_closed_the_stream_raises_an_oserror():
    """The client left and the reader closed the stream: the producer's put
    raises ``ClientDisconnected``, an ``OSError``, as ``send`` does on a
    closed connection in an ASGI server of spec version 2.4; a put that was
    waiting for room raises it too."""
    async def main():
        stream = BodyStream()
        await stream.aclose()
        with pytest.raises(ClientDisconnected) as caught:
            await stream.put(b"late")
        assert isinstance(caught.value, OSError)

        full = BodyStream()
        for _ in range(AHEAD_CHUNKS):
            await full.put(b"x")
        waiting = asyncio.ensure_future(full.put(b"one too many"))
        await _let_the_loop_run()
        assert not waiting.done()
        await full.aclose()
        with pytest.raises(ClientDisconnected):
            await waiting
    run(main())


def test_an_asgi_send_after_the_client_left_raises_an_oserror():
    """An ingress app streams; the client leaves (the stream is closed):
    its next ``send`` raises an ``OSError`` (what a framework of ASGI 2.4,
    Starlette's ``StreamingResponse``, turns into its own disconnect),
    and the scope says 2.4."""
    from ray_lite.serve._asgi import _Reply
    from ray_lite.serve._asgi_scope import http_scope

    scope = http_scope("GET", "/", b"", b"", "127.0.0.1:1", "", "1.1", "127.0.0.1:2")
    assert scope["asgi"]["spec_version"] == "2.4"

    async def main():
        reply = _Reply()
        await reply.send({"type": "http.response.start", "status": 200, "headers": []})
        await reply.send({"type": "http.response.body", "body": b"one", "more_body": True})
        assert reply.head.done() and reply.stream is not None
        await reply.stream.aclose()
        with pytest.raises(OSError):
            await reply.send({"type": "http.response.body", "body": b"two", "more_body": True})
    run(main())
