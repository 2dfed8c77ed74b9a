"""B22's load and its floor: N concurrent streaming completions against an
OpenAI-compatible server (one protocol object a connection, on uvloop where
it is installed, the chunks parsed after the run: the client spends little
CPU while it measures), and the same engine and model in one process with no
runtime and no HTTP.

Both give, per request, the time to its first token and the gaps between
the chunks that followed (the inter-token latency, as vLLM's benchmark
counts it), and the output tokens of the whole load over its wall time.

A timed load asks the server for each chunk's timestamps (the example's
``ray_lite_timing``) and adds the client's read; :func:`stages` turns them
into the microseconds of each stage of a token's way.
"""
import asyncio
import json
import statistics
import sys
import time

_ns = time.perf_counter_ns

#: A token's way from the engine's step to the client, as (stage, from
#: stamp, to stamp): the stamps of the example's engine and API, and the
#: client's ``read``.
STAGES = (
    ("executor: step to the workers", "send", "work_start"),
    ("model: the workers' compute", "work_start", "work_end"),
    ("executor: replies to the engine", "work_end", "replies"),
    ("engine: sample, hand to the stream", "replies", "pushed"),
    ("generator: engine's generate yields", "pushed", "gen"),
    ("handle: engine to ingress", "gen", "recv"),
    ("ingress: SSE chunk", "recv", "sse"),
    ("proxy: ASGI send to client's read", "sse", "read"),
    ("engine step end to client's read", "replies", "read"),
)

#: A request's way to its first token: the same stamps, from the client's
#: send (``t0``) through the app's route (``enter``) and the engine's
#: ``add`` to the prefill step and back.
FIRST_STAGES = (
    ("request: client's send to the app's route", "t0", "enter"),
    ("request: route to the engine's add", "enter", "add"),
    ("engine: add to its step's send", "add", "send"),
    ("the prefill step, to the engine's replies", "send", "replies"),
    ("engine, generator: to the stream's yield", "replies", "gen"),
    ("handle: engine to ingress", "gen", "recv"),
    ("ingress: response start and SSE chunk", "recv", "sse"),
    ("proxy: ASGI send to client's read", "sse", "read"),
    ("client's send to its read (TTFT)", "t0", "read"),
)


def prompt_of(i, length):
    """Client ``i``'s prompt: ``length`` ASCII bytes (one token each)."""
    head = f"request {i}: "
    return (head + "tell me a story " * (length // 16 + 1))[:length]


class _StreamReads(asyncio.Protocol):
    """One streaming request on its own connection: sends it, then keeps
    each read with the time it arrived (a callback a read, no task woken:
    the client's CPU is not the server's to pay for on a shared machine)."""

    def __init__(self, request, done):
        self.request = request
        self.done = done        # a future: set once the stream ends
        self.reads = []
        self.t0 = 0
        self.tail = b""
        self.transport = None

    def connection_made(self, transport):
        self.transport = transport
        self.t0 = _ns()
        transport.write(self.request)

    def data_received(self, data):
        self.reads.append((_ns(), data))
        seen = self.tail + data     # (the marker may come split over two reads)
        self.tail = data[-16:]
        if b"data: [DONE]" in seen:
            self.transport.close()
            self._end()

    def connection_lost(self, exc):
        self._end()

    def _end(self):
        if not self.done.done():
            self.done.set_result(None)


async def _one_stream(port, i, prompt_len, max_tokens, timed=False):
    request = {"prompt": prompt_of(i, prompt_len), "max_tokens": max_tokens, "stream": True}
    if timed:
        request["ray_lite_timing"] = True
    body = json.dumps(request).encode()
    head = (b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
            b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body))
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    transport, reads = await loop.create_connection(lambda: _StreamReads(head + body, done),
                                                    "127.0.0.1", port)
    try:
        await done
    finally:
        transport.close()
    return reads.t0, reads.reads


def _parse(t0, reads, stamps=None, first=None):
    """``(ttft s, [gap s, ...], tokens)`` of one stream's reads (times in
    ns); each chunk's timestamps, with its ``read``, go to ``stamps``, but
    the first chunk's, which go to ``first`` with the send (``t0``)."""
    buf = b""
    times = []
    events = []
    for t, data in reads:
        buf += data
        while True:
            start = buf.find(b"data: ")
            if start < 0:
                break
            end = buf.find(b"\n\n", start)
            if end < 0:
                break
            events.append((t, buf[start + 6:end]))
            buf = buf[end + 2:]
    tokens = 0
    for t, payload in events:
        if payload == b"[DONE]":
            break
        obj = json.loads(payload)
        if "error" in obj:
            raise RuntimeError(f"the server sent an error: {obj['error']['message']}")
        choices = obj.get("choices") or []
        if choices and choices[0].get("text"):
            tokens += len(choices[0]["text"])
            times.append(t)
            if stamps is not None and "ray_lite_timing" in obj:
                if len(times) > 1:
                    stamps.append(dict(obj["ray_lite_timing"], read=t))
                elif first is not None:
                    first.append(dict(obj["ray_lite_timing"], t0=t0, read=t))
    if not times:
        raise RuntimeError(f"no token came back: {b''.join(d for _, d in reads)[:300]!r}")
    return ((times[0] - t0) / 1e9, [(b - a) / 1e9 for a, b in zip(times, times[1:])],
            tokens)


async def _load(port, streams, prompt_len, max_tokens, stamps=None, first=None):
    t_start = _ns()
    raw = await asyncio.gather(*[_one_stream(port, i, prompt_len, max_tokens,
                                             stamps is not None)
                                 for i in range(streams)])
    wall = (_ns() - t_start) / 1e9
    return wall, [_parse(t0, reads, stamps, first) for t0, reads in raw]


def summary(wall, per_request):
    """The figures of one load: TTFTs, gaps, tokens/s."""
    ttft = sorted(r[0] for r in per_request)
    gaps = sorted(g for r in per_request for g in r[1])
    tokens = sum(r[2] for r in per_request)
    return {"ttft_s": ttft, "itl_s": gaps, "tokens": tokens, "wall_s": wall,
            "tokens_per_s": tokens / wall}


def _client_loop():
    """The client's event loop: uvloop's where it is installed (Serve's
    extra brings it), the lighter of the two on the machine it shares."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def http_load(port, streams, prompt_len, max_tokens, timed=False):
    """One load against the server on ``port``: :func:`summary`'s dict; a
    ``timed`` one adds ``stamps``, every chunk's but each stream's first
    (whose way starts the stream), and ``first_stamps``, those first ones."""
    stamps = [] if timed else None
    first = [] if timed else None
    loop = _client_loop()
    try:
        wall, per_request = loop.run_until_complete(
            _load(port, streams, prompt_len, max_tokens, stamps, first))
    finally:
        loop.close()
    out = summary(wall, per_request)
    if timed:
        out["stamps"] = stamps
        out["first_stamps"] = first
    return out


def stages(stamps, table=STAGES):
    """``{stage: [µs, ...]}`` over ``stamps`` (the chunks that have both
    ends of the stage; a chunk of several tokens counts once), for the
    stages of ``table`` (``STAGES`` or ``FIRST_STAGES``)."""
    out = {}
    for name, start, end in table:
        values = [(s[end] - s[start]) / 1e3 for s in stamps if start in s and end in s]
        if values:
            out[name] = values
    return out


def stage_medians(stamps):
    return {name: statistics.median(v) for name, v in stages(stamps).items()}


# -- the floor ----------------------------------------------------------------------

async def _floor(engine, streams, prompt_len, max_tokens):
    from .._examples.llm_server.model import encode
    perf = time.perf_counter

    async def one(i):
        t0 = perf()
        times, tokens = [], 0
        async for batch in engine.generate(encode(prompt_of(i, prompt_len)), max_tokens):
            times.append(perf())
            tokens += len(batch)
        return times[0] - t0, [b - a for a, b in zip(times, times[1:])], tokens
    t_start = perf()
    per_request = await asyncio.gather(*[one(i) for i in range(streams)])
    return summary(perf() - t_start, per_request)


def floor_main():
    """In a child process (``argv``: size, streams, prompt_len, max_tokens,
    loads): the engine loop and model in this process; prints ``RESULT
    {json}`` with every load's summary and the steps' wall and compute."""
    size, streams, prompt_len, max_tokens, loads = sys.argv[1:6]
    from .._examples.llm_server.engine import AsyncEngine, LocalBackend
    from .._examples.llm_server.model import config_for
    streams, loads = int(streams), int(loads)
    results = []

    async def main():
        engine = AsyncEngine(LocalBackend(config_for(size), max(streams, 1)),
                             max_running=max(streams, 1), record_steps=True)
        # Warm-up: one whole load, as the HTTP servers get (llm_suite).
        await _floor(engine, streams, int(prompt_len), int(max_tokens))
        for _ in range(loads):
            engine.step_log = []
            cpu = time.process_time()
            out = await _floor(engine, streams, int(prompt_len), int(max_tokens))
            out["cpu_s"] = time.process_time() - cpu
            # Decode steps with every stream running: the steady state.
            steady = [s for s in engine.step_log if s[2] == streams] or engine.step_log
            out["step_s"] = sorted(s[0] for s in steady)
            out["shard_s"] = sorted(max(s[1]) for s in steady)
            results.append(out)
    asyncio.run(main())
    print("RESULT " + json.dumps(results), flush=True)

