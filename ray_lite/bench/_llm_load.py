"""B22's load and its floor: N concurrent streaming completions against an
OpenAI-compatible server (asyncio sockets, parsed after the run so the
client spends little CPU while it measures), and the same engine and model
in one process with no runtime and no HTTP.

Both give, per request, the time to its first token and the gaps between
the chunks that followed (the inter-token latency, as vLLM's benchmark
counts it), and the output tokens of the whole load over its wall time.
"""
import asyncio
import json
import os
import sys
import time

_perf = time.perf_counter


def prompt_of(i, length):
    """Client ``i``'s prompt: ``length`` ASCII bytes (one token each)."""
    head = f"request {i}: "
    return (head + "tell me a story " * (length // 16 + 1))[:length]


async def _one_stream(port, i, prompt_len, max_tokens):
    body = json.dumps({"prompt": prompt_of(i, prompt_len), "max_tokens": max_tokens,
                       "stream": True}).encode()
    head = (b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
            b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body))
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    reads = []
    t0 = _perf()
    writer.write(head + body)
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            reads.append((_perf(), data))
            if b"data: [DONE]" in data[-32:] or b"data: [DONE]" in data:
                break
    finally:
        writer.close()
    return t0, reads


def _parse(t0, reads):
    """``(ttft s, [gap s, ...], tokens)`` of one stream's reads."""
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
    if not times:
        raise RuntimeError(f"no token came back: {b''.join(d for _, d in reads)[:300]!r}")
    return times[0] - t0, [b - a for a, b in zip(times, times[1:])], tokens


async def _load(port, streams, prompt_len, max_tokens):
    t_start = _perf()
    raw = await asyncio.gather(*[_one_stream(port, i, prompt_len, max_tokens)
                                 for i in range(streams)])
    wall = _perf() - t_start
    return wall, [_parse(t0, reads) for t0, reads in raw]


def summary(wall, per_request):
    """The figures of one load: TTFTs, gaps, tokens/s."""
    ttft = sorted(r[0] for r in per_request)
    gaps = sorted(g for r in per_request for g in r[1])
    tokens = sum(r[2] for r in per_request)
    return {"ttft_s": ttft, "itl_s": gaps, "tokens": tokens, "wall_s": wall,
            "tokens_per_s": tokens / wall}


def http_load(port, streams, prompt_len, max_tokens):
    """One load against the server on ``port``: :func:`summary`'s dict."""
    wall, per_request = asyncio.run(_load(port, streams, prompt_len, max_tokens))
    return summary(wall, per_request)


# -- the floor ----------------------------------------------------------------------

async def _floor(engine, streams, prompt_len, max_tokens):
    from llm_server.model import encode

    async def one(i):
        t0 = _perf()
        times, tokens = [], 0
        async for batch in engine.generate(encode(prompt_of(i, prompt_len)), max_tokens):
            times.append(_perf())
            tokens += len(batch)
        return times[0] - t0, [b - a for a, b in zip(times, times[1:])], tokens
    t_start = _perf()
    per_request = await asyncio.gather(*[one(i) for i in range(streams)])
    return summary(_perf() - t_start, per_request)


def floor_main():
    """In a child process (``argv``: size, streams, prompt_len, max_tokens,
    loads): the engine loop and model in this process; prints ``RESULT
    {json}`` with every load's summary and the steps' wall and compute."""
    size, streams, prompt_len, max_tokens, loads = sys.argv[1:6]
    from llm_server.engine import AsyncEngine, LocalBackend
    from llm_server.model import config_for
    streams, loads = int(streams), int(loads)
    results = []

    async def main():
        engine = AsyncEngine(LocalBackend(config_for(size), max(streams, 1)),
                             max_running=max(streams, 1), record_steps=True)
        await _floor(engine, streams, int(prompt_len), 4)      # warm-up
        for _ in range(loads):
            engine.step_log = []
            out = await _floor(engine, streams, int(prompt_len), int(max_tokens))
            # Decode steps with every stream running: the steady state.
            steady = [s for s in engine.step_log if s[2] == streams] or engine.step_log
            out["step_s"] = sorted(s[0] for s in steady)
            out["shard_s"] = sorted(max(s[1]) for s in steady)
            results.append(out)
    asyncio.run(main())
    print("RESULT " + json.dumps(results), flush=True)


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    floor_main()
