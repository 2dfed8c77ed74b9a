"""The fast paths that Serve's HTTP throughput relies on keep their behaviour:
the async actors' concurrency slots, an event loop collecting many answers
from many links (each drained and re-armed on its own), and the proxy's
header checks done as headers arrive."""
import asyncio
import importlib.util
import socket
import time

import pytest
from starlette.requests import Request

import ray_lite as ray
from ray_lite import serve
from ray_lite._private.node.worker import AsyncSlots

from serve_helpers import http

T = 60


# ------------------------------------------------------------------ slots
def _run(coro):
    return asyncio.run(asyncio.wait_for(coro, T))


async def _take(slots):
    if slots.free > 0 and not slots.waiters:
        slots.free -= 1
    else:
        await slots.wait()


def test_slots_admit_in_arrival_order():
    async def main():
        slots = AsyncSlots(1)
        order = []

        async def user(i):
            await _take(slots)
            order.append(i)
            await asyncio.sleep(0)
            slots.release()
        await asyncio.gather(*[user(i) for i in range(6)])
        return order, slots.free
    order, free = _run(main())
    assert order == list(range(6))
    assert free == 1


def test_slot_of_a_cancelled_waiter_is_not_lost():
    async def main():
        slots = AsyncSlots(1)
        await _take(slots)                      # held
        waiter = asyncio.ensure_future(_take(slots))
        await asyncio.sleep(0)
        waiter.cancel()                         # cancelled while waiting
        with pytest.raises(asyncio.CancelledError):
            await waiter
        slots.release()
        assert slots.free == 1
        # Handed the slot, then cancelled before it ran: the slot moves on.
        await _take(slots)
        second = asyncio.ensure_future(_take(slots))
        third = asyncio.ensure_future(_take(slots))
        await asyncio.sleep(0)
        slots.release()                         # to `second`...
        second.cancel()                         # ...which never gets to use it
        with pytest.raises(asyncio.CancelledError):
            await second
        await third                             # so `third` has it
        assert slots.free == 0 and not slots.waiters
        slots.release()
        return slots.free
    assert _run(main()) == 1


def test_async_actor_max_concurrency_is_a_limit(rt):
    @ray.remote(max_concurrency=3)
    class Gate:
        def __init__(self):
            self.now = 0
            self.peak = 0

        async def enter(self):
            self.now += 1
            self.peak = max(self.peak, self.now)
            await asyncio.sleep(0.01)
            self.now -= 1
            return True

        async def peak_seen(self):
            return self.peak
    g = Gate.remote()
    assert all(ray.get([g.enter.remote() for _ in range(12)], timeout=T))
    assert ray.get(g.peak_seen.remote(), timeout=T) == 3


# ------------------------------------------------------- many links, one loop
@ray.remote
class Square:
    def sq(self, x):
        return x * x


@ray.remote
class FanOut:
    def __init__(self, workers):
        self.workers = workers

    async def run(self, n):
        # Many calls in flight over many links at once, answered in bursts.
        refs = [self.workers[i % len(self.workers)].sq.remote(i) for i in range(n)]
        return sum(await asyncio.gather(*refs))

    async def run_with_blocking_get(self, n):
        # A blocking get drives the links from inside the loop's thread (and
        # disarms them on its way out); the loop must still hear later answers.
        first = ray.get(self.workers[0].sq.remote(3), timeout=T)
        rest = await self.run(n)
        return first + rest


def test_loop_collects_answers_from_many_links(rt):
    workers = [Square.remote() for _ in range(6)]
    fan = FanOut.remote(workers)
    n = 3000
    expected = sum(i * i for i in range(n))
    for _ in range(3):
        assert ray.get(fan.run.remote(n), timeout=T) == expected
    assert ray.get(fan.run_with_blocking_get.remote(200), timeout=T) == \
        9 + sum(i * i for i in range(200))


@ray.remote(max_concurrency=4)
class Gate:
    def __init__(self):
        import threading
        self.opened = threading.Event()

    def pass_(self):
        return self.opened.wait(T)

    def open(self):
        self.opened.set()

    def sq(self, x):
        return x * x


@ray.remote
class BriefWaiter:
    async def run(self, gate):
        from ray_lite._private.process import state
        node = state.get_node()
        await gate.sq.remote(2)
        for _ in range(3):
            await asyncio.sleep(0)          # the loop's turns: the link is re-armed
        # Answered within the budget: ready when the spin returns.  (A spin
        # also ends early when this process lost its CPU for long, on a busy
        # machine: then it tries again, until a deadline.)
        fast = gate.sq.remote(7)
        deadline = time.monotonic() + 30
        caught = False
        while not caught and time.monotonic() < deadline:
            caught = node.bridges.wait_briefly(fast, 0.1)
        # Not answered within it (the gate is shut): gives up, and the loop
        # must still hear the answer later (the link is re-armed).
        slow = gate.pass_.remote()
        missed = node.bridges.wait_briefly(slow, 0.005)
        await gate.open.remote()
        return caught, await fast, missed, await slow, await gate.sq.remote(3)


@ray.remote
class Relay:
    async def call_back(self, target):
        return await target.ping.remote()


@ray.remote
class CallSpinner:
    """Spins on its loop's thread for the next message (a replica between requests)."""
    def __init__(self, relay):
        self.relay = relay
        self.pings = 0

    async def spin_for_relay(self, me):
        from ray_lite._private.process import state
        node = state.get_node()
        answer = self.relay.call_back.remote(me)     # messages come back while it spins
        caught = False
        # A spin also ends early when this process lost its CPU for long: it
        # then tries again, until a deadline (not a count: on a busy machine
        # a hundred such spins may end before the relay has even called).
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if node.bridges.spin_for_messages(0.1):
                caught = True
                break
        return caught, await answer, self.pings

    async def spin(self, budget):
        from ray_lite._private.process import state
        for _ in range(3):
            await asyncio.sleep(0)      # the loop's turns: its links are armed again
        return state.get_node().bridges.spin_for_messages(budget)

    async def ping(self):
        self.pings += 1
        return "pong"


def test_a_loop_spinning_for_messages_takes_them_and_still_hears_later_ones(rt):
    a = CallSpinner.remote(Relay.remote())
    assert ray.get(a.spin_for_relay.remote(a), timeout=T) == (True, "pong", 1)
    # Nothing comes: it gives up; its links are re-armed, so it hears the next call.
    assert ray.get(a.spin.remote(0.005), timeout=T) is False
    assert ray.get(a.ping.remote(), timeout=T) == "pong"


def test_a_brief_wait_on_the_loop_thread_catches_an_answer_or_gives_up(rt):
    """The proxy's spin for a replica's answer (``LoopBridges.wait_briefly``)."""
    gate = Gate.remote()
    assert ray.get(BriefWaiter.remote().run.remote(gate), timeout=T) == \
        (True, 49, False, True, 9)


def test_async_actors_run_on_uvloop_when_installed(rt):
    """uvloop when it is importable, asyncio's own loop without it or under
    RAY_LITE_NO_EXTENSIONS=1 (CI runs both)."""
    from ray_lite._fast import NO_EXTENSIONS

    @ray.remote
    class LoopKind:
        async def kind(self):
            return type(asyncio.get_running_loop()).__module__

    kind = ray.get(LoopKind.remote().kind.remote(), timeout=T)
    if importlib.util.find_spec("uvloop") is not None and not NO_EXTENSIONS:
        assert kind.startswith("uvloop"), kind
    else:
        assert kind.startswith("asyncio"), kind


# ------------------------------------------------------------------- proxy
@serve.deployment
class Body:
    async def __call__(self, request: Request):
        return {"body": (await request.body()).decode(), "ct": request.headers.get("x-a")}


def _recv_until(s, marker):
    buf = b""
    while marker not in buf:
        chunk = s.recv(65536)
        assert chunk, f"closed before {marker!r}: {buf!r}"
        buf += chunk
    return buf


def test_expect_100_continue_then_body(serve_port):
    serve.run(Body.bind())
    s = socket.create_connection(("127.0.0.1", serve_port), timeout=T)
    try:
        s.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nX-A: 1\r\n"
                  b"Content-Length: 5\r\n\r\n")
        assert _recv_until(s, b"\r\n\r\n").startswith(b"HTTP/1.1 100 Continue")
        s.sendall(b"hello")
        out = _recv_until(s, b"}")
        assert out.startswith(b"HTTP/1.1 200") and b'"body":"hello"' in out
    finally:
        s.close()


def test_bad_content_length_is_400(serve_port):
    serve.run(Body.bind())
    s = socket.create_connection(("127.0.0.1", serve_port), timeout=T)
    try:
        s.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n")
        out = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
    finally:
        s.close()
    assert out.startswith(b"HTTP/1.1 400")


def test_many_keep_alive_requests_each_get_their_answer(serve_port):
    serve.run(Body.bind())
    s = socket.create_connection(("127.0.0.1", serve_port), timeout=T)
    try:
        for i in range(200):
            body = b"r%d" % i
            s.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nX-A: %d\r\nContent-Length: %d\r\n\r\n"
                      % (i, len(body)) + body)
            out = _recv_until(s, b"}")
            assert b'"body":"r%d"' % i in out and b'"ct":"%d"' % i in out
    finally:
        s.close()
    assert http(serve_port, "GET", "/")[0] == 200


@serve.deployment
class Priority:
    async def __call__(self, request: Request):
        import os
        return {"nice": os.getpriority(os.PRIO_PROCESS, 0)}


class _StubReplica:
    def __init__(self, inflight):
        self.inflight = inflight
        self.streams = None     # (no replica's count of open streams mapped)


def test_proxy_prefers_the_first_replica_while_idle_then_spreads_by_load():
    from ray_lite.serve._routing import first_idle_else_power_of_two as choose
    reps = [_StubReplica(0) for _ in range(4)]
    assert all(choose(reps, 2) is reps[0] for _ in range(20))     # low load: one warm replica
    reps[0].inflight = 1
    picks = [choose(reps, 2) for _ in range(400)]
    # Busy: the power of two choices between two different replicas, which
    # never takes it now that the others are idle; they share the load.
    assert picks.count(reps[0]) == 0
    assert all(picks.count(r) > 50 for r in reps[1:])
    for r in reps:
        r.inflight = 2                                            # all at max_ongoing
    assert choose(reps, 2) is None
    reps[3].inflight = 1
    assert choose(reps, 2) is reps[3]                             # the one under the limit
    assert choose([], 2) is None


def test_handles_spread_by_power_of_two_without_a_preferred_replica():
    from ray_lite.serve._routing import power_of_two
    reps = [_StubReplica(0) for _ in range(4)]
    picks = [power_of_two(reps, 2) for _ in range(400)]
    assert all(picks.count(r) > 50 for r in reps)                 # idle: all of them
    reps[0].inflight = reps[1].inflight = reps[2].inflight = 2
    assert all(power_of_two(reps, 2) is reps[3] for _ in range(20))
    reps[3].inflight = 2
    assert power_of_two(reps, 2) is None
    assert power_of_two([], 2) is None


def test_replicas_run_at_the_priority_configured(serve_port):
    """Replicas serve at the runtime's priority lowered by
    RAY_LITE_SERVE_REPLICA_NICE (see _replica._NICE), by default not at all."""
    import json
    import os
    from ray_lite.serve import _replica
    serve.run(Priority.bind())
    status, _, body = http(serve_port, "GET", "/")
    assert status == 200
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    assert json.loads(body)["nice"] == min(19, mine + _replica._NICE)
    if "RAY_LITE_SERVE_REPLICA_NICE" not in os.environ:
        assert _replica._NICE == 0


NICE_SCRIPT = """
import os
import ray_lite
from ray_lite import serve

@serve.deployment
class Nice:
    def nice(self):
        return os.getpriority(os.PRIO_PROCESS, 0)

ray_lite.init(num_cpus=1)
serve.start(http_options={"host": "127.0.0.1", "port": 0, "proxies": 1})
handle = serve.run(Nice.bind())
print(handle.nice.remote().result(timeout_s=60) - os.getpriority(os.PRIO_PROCESS, 0))
serve.shutdown()
ray_lite.shutdown()
"""


def test_replicas_lower_their_priority_when_configured():
    import os
    import subprocess
    import sys
    env = dict(os.environ, RAY_LITE_SERVE_REPLICA_NICE="3")
    proc = subprocess.run([sys.executable, "-c", NICE_SCRIPT], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    assert int(proc.stdout.split()[-1]) == min(19, mine + 3) - mine


# ------------------------------------------------- a handle's stream items
@serve.deployment
class Lists:
    def parts(self, n):
        for i in range(n):
            yield [i, i]


def test_a_handle_stream_takes_its_items_without_a_copy_for_later_readers(
        serve_runtime, monkeypatch):
    # An item's ref never leaves the stream, so reading a mutable item must
    # not encode a snapshot for reads that cannot come (as costly as the
    # decoding: a token server's ingress spent 7 % of its CPU on it).
    from ray_lite._private.objects import entries
    h = serve.run(Lists.bind(), name="lists", route_prefix=None)
    frozen = []
    real = entries.freeze

    def freeze(value):
        if type(value) is list and len(value) == 2 and value[0] == value[1]:
            frozen.append(value)        # one of the stream's items
        return real(value)
    monkeypatch.setattr(entries, "freeze", freeze)

    async def main():
        items = []
        async for item in h.options(stream=True).parts.remote(5):
            item.append("mine")         # the caller's to change
            items.append(item)
        return items
    assert _run(main()) == [[i, i, "mine"] for i in range(5)]
    assert frozen == []
    # A ref the caller holds still gives each read its own copy.
    ref = ray.put([1])
    first = ray.get(ref)
    first.append(2)
    assert ray.get(ref) == [1]


# ------------------------------------- a streamed answer's first chunks
_GATE = {}


def _two_events_app():
    from starlette.applications import Starlette
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    async def events():
        yield "data: first\n\n"
        await _GATE["second"].wait()
        yield "data: second\n\n"

    async def stream(request):
        return StreamingResponse(events(), media_type="text/event-stream")
    return Starlette(routes=[Route("/", stream)])


@serve.ingress(_two_events_app())
class TwoEvents:
    pass


def test_a_streamed_answer_brings_the_chunks_sent_with_its_head():
    # The first event of a stream (a model server's first token) reaches the
    # client with the head, not after the proxy's call for the stream.
    import cloudpickle

    from ray_lite.serve._replica import ServeReplica

    async def main():
        _GATE["second"] = asyncio.Event()
        rep = ServeReplica(None, "app", "TwoEvents", "TwoEvents#r0",
                           cloudpickle.dumps(TwoEvents), (), {}, {})
        await rep._init_task
        status, head, body, token, _ = await rep.handle_http(
            "GET", "/", b"", b"host:x", b"", "127.0.0.1:1", "", "1.1", "127.0.0.1:8000")
        assert (status, body) == (200, b"data: first\n\n")
        assert token and b"text/event-stream" in head
        _GATE["second"].set()
        rest = [item async for item in rep.http_stream(token)]
        assert rest == [b"data: second\n\n"]
        assert rep._open_streams == 0
    _run(main())


class ReturnsAStream:
    async def __call__(self, request):
        from starlette.responses import StreamingResponse

        async def events():
            yield "data: 1\n\n"
            yield "data: 2\n\n"
            await _GATE["second"].wait()
            yield "data: 3\n\n"
        return StreamingResponse(events(), media_type="text/event-stream")


def test_a_returned_stream_brings_what_it_yields_at_once_with_its_head():
    import cloudpickle

    from ray_lite.serve._replica import ServeReplica

    async def main():
        _GATE["second"] = asyncio.Event()
        rep = ServeReplica(None, "app", "ReturnsAStream", "ReturnsAStream#r0",
                           cloudpickle.dumps(ReturnsAStream), (), {}, {})
        status, head, body, token, _ = await rep.handle_http(
            "GET", "/", b"", b"host:x", b"", "127.0.0.1:1", "", "1.1", "127.0.0.1:8000")
        assert (status, body) == (200, [b"data: 1\n\n", b"data: 2\n\n"])
        assert token and b"text/event-stream" in head
        _GATE["second"].set()
        assert [item async for item in rep.http_stream(token)] == [b"data: 3\n\n"]
        assert rep._open_streams == 0
    _run(main())


def test_the_proxy_frames_a_stream_item_as_its_chunks():
    from ray_lite.serve._proxy import framed
    assert framed(b"abc", True) == b"3\r\nabc\r\n"
    assert framed(b"abc", False) == b"abc"
    assert framed([b"ab", b"", b"c" * 20], True) == b"2\r\nab\r\n14\r\n" + b"c" * 20 + b"\r\n"
    assert framed([b"ab", b"c"], False) == b"abc"
    assert framed([b""], True) == b""
