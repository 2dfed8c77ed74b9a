"""The LLM server example (ray_lite._examples.llm_server, run from the
checkout's examples/llm_server) end to end: the OpenAI API over Serve with
streaming and without, vLLM's error bodies, [DONE], a disconnect aborting
its sequence and freeing its KV cache, backpressure, a dead worker failing
the running requests and the engine recovering, the timestamps a timed
stream carries; the engine's continuous batching on its own; the
hand-written server; the transformers model when it is installed."""
import asyncio
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from serve_helpers import free_port, wait_until

pytest.importorskip("fastapi")
pytest.importorskip("numpy")

from ray_lite._examples.llm_server.engine import (AsyncEngine, EngineOverloaded,  # noqa: E402
                                                  LocalBackend, Scheduler, Sequence)
from ray_lite._examples.llm_server.model import config_for, decode, encode  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
#: A token's stamps in the order they are taken (engine.py, api.py).
STAMPS = ("add", "send", "work_start", "work_end", "replies", "pushed", "gen", "recv", "sse")


def _post(port, path, payload, timeout=60):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, body=json.dumps(payload),
                     headers={"content-type": "application/json"})
        r = conn.getresponse()
        return r.status, r.getheader("content-type", ""), r.read()
    finally:
        conn.close()


def _get(port, path):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, json.loads(r.read())
    finally:
        conn.close()


def _events(body):
    """The ``data:`` payloads of a server-sent event stream."""
    return [line[len(b"data: "):].decode() for line in body.split(b"\n\n")
            if line.startswith(b"data: ")]


def _stats(port):
    return _get(port, "/engine/stats")[1]


def _run(port, **args):
    from ray_lite._examples.llm_server.deployments import build

    from ray_lite import serve
    serve.run(build(dict({"size": "tiny"}, **args)), route_prefix="/")
    return port


class _Stream:
    """A streaming completion on a raw socket: read its events one at a
    time, or hang up in the middle."""

    def __init__(self, port, prompt="hello", max_tokens=200, **extra):
        body = json.dumps(dict({"prompt": prompt, "max_tokens": max_tokens, "stream": True},
                               **extra)).encode()
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n"
                          b"content-type: application/json\r\n"
                          b"content-length: %d\r\n\r\n%s" % (len(body), body))
        self.buf = b""

    def read_until(self, marker):
        while marker not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise AssertionError(f"closed before {marker!r}: {self.buf[-300:]!r}")
            self.buf += chunk
        return self.buf

    def read_to_end(self):
        """The body (chunked transfer decoded) up to ``data: [DONE]``."""
        self.read_until(b"data: [DONE]")
        head, rest = self.buf.split(b"\r\n\r\n", 1)
        assert b"chunked" in head.lower(), head
        body = b""
        while rest:
            size, rest = rest.split(b"\r\n", 1)
            n = int(size, 16)
            body, rest = body + rest[:n], rest[n + 2:]
        return body

    def close(self):
        self.sock.close()


# -- the API over Serve ---------------------------------------------------------------

def test_completions_stream_and_not_give_the_same_greedy_text(serve_port):
    port = _run(serve_port)
    status, models = _get(port, "/v1/models")
    assert status == 200 and models["object"] == "list"
    assert [m["id"] for m in models["data"]] == ["ray-lite-toy-tiny"]

    status, ctype, body = _post(port, "/v1/completions", {"prompt": "hello", "max_tokens": 12})
    assert status == 200 and ctype.startswith("application/json")
    whole = json.loads(body)
    assert whole["object"] == "text_completion" and whole["id"].startswith("cmpl-")
    choice = whole["choices"][0]
    assert len(choice["text"]) == 12 and choice["finish_reason"] == "length"
    assert whole["usage"] == {"prompt_tokens": 5, "completion_tokens": 12, "total_tokens": 17}

    status, ctype, body = _post(port, "/v1/completions",
                                {"prompt": list(b"hello"), "max_tokens": 12, "stream": True,
                                 "stream_options": {"include_usage": True}})
    assert status == 200 and ctype.startswith("text/event-stream")
    events = _events(body)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert {c["id"] for c in chunks} == {chunks[0]["id"]}
    assert all(c["object"] == "text_completion" for c in chunks)
    # Greedy: the streamed text is the one-body text, token for token.
    assert "".join(c["choices"][0]["text"] for c in chunks[:-1]) == choice["text"]
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]][-1] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 12

    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    status, _, body = _post(port, "/v1/chat/completions", chat)
    reply = json.loads(body)
    assert status == 200 and reply["object"] == "chat.completion"
    assert reply["choices"][0]["message"]["role"] == "assistant"
    text = reply["choices"][0]["message"]["content"]
    assert len(text) == 5
    status, _, body = _post(port, "/v1/chat/completions", dict(chat, stream=True))
    events = _events(body)
    assert status == 200 and events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert "".join(c["choices"][0]["delta"]["content"] for c in chunks) == text
    stats = _stats(port)
    assert stats["running"] == 0 and stats["worker_cache_slots"] == [[], []]
    assert stats["finished"] == 4 and stats["aborted"] == 0


def test_a_timed_stream_carries_each_tokens_stamps_in_the_order_they_were_taken(serve_port):
    port = _run(serve_port)
    stream = _Stream(port, max_tokens=6, ray_lite_timing=True)
    try:
        chunks = [json.loads(e) for e in _events(stream.read_to_end())[:-1]]
    finally:
        stream.close()
    assert "".join(c["choices"][0]["text"] for c in chunks) == \
        json.loads(_post(port, "/v1/completions", {"prompt": "hello", "max_tokens": 6})[2])[
            "choices"][0]["text"]
    for chunk in chunks:
        stamps = chunk["ray_lite_timing"]
        # One clock (CLOCK_MONOTONIC) across the engine, its workers and the ingress.
        assert [stamps[k] for k in STAMPS] == sorted(stamps[k] for k in STAMPS), stamps
    # The first chunk's also starts where the request reached the app's route.
    first = chunks[0]["ray_lite_timing"]
    assert first["enter"] <= first["add"]
    assert all("enter" not in c["ray_lite_timing"] for c in chunks[1:])
    _, _, body = _post(port, "/v1/completions", {"prompt": "hi", "max_tokens": 3,
                                                 "stream": True})
    assert all("ray_lite_timing" not in json.loads(e) for e in _events(body)[:-1])


def test_invalid_requests_get_vllm_error_bodies(serve_port):
    port = _run(serve_port)
    for payload, param in (({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
                           ({"max_tokens": 3}, "prompt"),
                           ({"prompt": [300]}, "prompt"),
                           ({"prompt": "hi", "n": 2}, "n")):
        status, ctype, body = _post(port, "/v1/completions", payload)
        err = json.loads(body)["error"]
        assert status == 400 and ctype.startswith("application/json"), (payload, body)
        assert err["code"] == 400 and err["type"] == "Bad Request", err
        assert err["param"].startswith(param) and "validation error" in err["message"], err
    status, _, body = _post(port, "/v1/chat/completions", {"messages": []})
    assert status == 400 and json.loads(body)["error"]["param"] == "messages"
    status, _, body = _post(port, "/v1/completions", {"prompt": "hi", "model": "gpt-9"})
    assert status == 404
    assert json.loads(body)["error"] == {"message": "The model `gpt-9` does not exist.",
                                         "type": "Not Found", "param": "model", "code": 404}
    status, _, body = _post(port, "/v1/completions", {"prompt": "x" * 200, "max_tokens": 100})
    err = json.loads(body)["error"]
    assert status == 400 and err["param"] == "max_tokens" and "256 tokens" in err["message"]
    assert _stats(port)["steps"] == 0          # nothing reached the engine


def _hang_up_mid_stream(port):
    """Hang up a stream of 240 tokens after its first; True once its
    sequence was aborted and its cache freed, None when it had ended before
    the hang-up (the tiny model: ~30 ms, which a busy machine may let pass)."""
    before = _stats(port)
    stream = _Stream(port, max_tokens=240)
    try:
        stream.read_until(b'"text"')          # it runs
        stats = _stats(port)
        if stats["finished"] > before["finished"]:
            return None
        assert stats["running"] == 1 and all(len(s) == 1 for s in stats["worker_cache_slots"])
    finally:
        stream.close()
    wait_until(lambda: _stats(port)["running"] == 0, "the sequence to stop")
    stats = _stats(port)
    if stats["finished"] > before["finished"]:
        return None                             # it ended before the hang-up reached it
    assert stats["aborted"] == before["aborted"] + 1
    wait_until(lambda: _stats(port)["worker_cache_slots"] == [[], []],
               "the workers to free its KV cache")
    steps = _stats(port)["steps"]
    assert steps - before["steps"] < 240 and _stats(port)["steps"] == steps  # nothing runs now
    return True


def test_a_client_that_hangs_up_aborts_its_sequence_and_frees_its_cache(serve_port):
    port = _run(serve_port)
    assert any(_hang_up_mid_stream(port) for _ in range(5))


def _full_engine_refuses(port):
    """A request to an engine with one sequence running and one waiting is
    refused with 503, and the waiting one runs once the running one goes.
    None when the running one (240 tokens of the tiny model: ~30 ms) ended
    before the scene was set, as a busy machine may make it."""
    finished = _stats(port)["finished"]
    running = _Stream(port, prompt="first", max_tokens=240)
    waiting = None
    try:
        running.read_until(b'"text"')
        waiting = _Stream(port, prompt="second", max_tokens=3)

        def second_waits_or_first_ended():
            stats = _stats(port)
            return stats["waiting"] == 1 or stats["finished"] > finished
        wait_until(second_waits_or_first_ended, "the second request to wait")
        if _stats(port)["finished"] > finished:
            return None
        status, _, body = _post(port, "/v1/completions", {"prompt": "third"})
        if status == 200 and _stats(port)["finished"] > finished:
            return None                         # the first ended before the third came
        err = json.loads(body)["error"]
        assert status == 503 and err["code"] == 503 and "full" in err["message"]
        stats = _stats(port)
        assert stats["running"] == 1 or stats["finished"] > finished   # (or it just ended)
        running.close()                       # a slot frees: the waiting one runs
        events = _events(waiting.read_to_end())
        assert events[-1] == "[DONE]"
        assert sum(len(json.loads(e)["choices"][0]["text"]) for e in events[:-1]) == 3
        return True
    finally:
        running.close()
        if waiting is not None:
            waiting.close()


def test_a_full_engine_queues_then_refuses_with_503(serve_port):
    port = _run(serve_port, max_running=1, max_waiting=1)
    assert any(_full_engine_refuses(port) for _ in range(5))


def test_a_dead_worker_fails_the_running_requests_and_the_engine_recovers(serve_port):
    port = _run(serve_port)
    pids = _stats(port)["worker_pids"]
    stream = _Stream(port, max_tokens=240)
    try:
        stream.read_until(b'"text"')
        os.kill(pids[1], signal.SIGKILL)      # a worker the server started, by PID
        body = stream.read_to_end()
    finally:
        stream.close()
    events = _events(body)
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    if "error" in last:
        error = last["error"]               # the engine met the death mid-stream
    else:
        # All 240 tokens came before the kill took effect (a busy machine
        # delayed it): the next request's first step meets the dead worker,
        # and fails before its stream starts.
        assert _stats(port)["finished"] == 1
        status, _, body = _post(port, "/v1/completions", {"prompt": "next", "max_tokens": 4})
        error = json.loads(body)["error"]
        assert status == 500
    assert error["code"] == 500 and "workers failed" in error["message"]
    assert "WorkerDiedError" in error["message"] and "restarts them" in error["message"]
    wait_until(lambda: _stats(port)["restarts"] == 1, "the engine to restart its workers")
    status, _, body = _post(port, "/v1/completions", {"prompt": "again", "max_tokens": 4})
    assert status == 200 and len(json.loads(body)["choices"][0]["text"]) == 4
    stats = _stats(port)
    assert set(stats["worker_pids"]).isdisjoint(pids) and stats["running"] == 0


# -- the engine on its own --------------------------------------------------------------

def test_the_scheduler_admits_at_step_boundaries_up_to_its_bounds():
    sched = Scheduler(max_running=2, max_waiting=1)
    a, b, c = (Sequence(encode(p), 2) for p in ("a", "bb", "ccc"))
    for seq in (a, b, c):
        sched.add(seq)                        # 2 slots free + 1 waiting
    with pytest.raises(EngineOverloaded):
        sched.add(Sequence(encode("d"), 2))
    plan, seqs = sched.schedule()
    assert seqs == [a, b] and [len(p) for _, p in plan[0]] == [1, 2] and len(plan[1]) == 0
    assert list(sched.waiting.values()) == [c]
    sched.commit(seqs, [65, 66])
    plan, seqs = sched.schedule()             # both decode; c still waits
    assert seqs == [a, b] and plan[0] == [] and plan[2] == [65, 66]
    given = sched.commit(seqs, [67, 68])
    assert [(s, done) for s, _, done in given] == [(a, True), (b, True)]
    plan, seqs = sched.schedule()             # c joins as the others' slots are freed
    assert seqs == [c] and sorted(plan[4]) == [0, 1]
    sched.abort(c.id)
    assert not sched.running and sorted(sched.free_slots) == [0, 1] and sched.to_free


def test_sequences_that_join_together_get_neighbouring_slots_in_order_every_time():
    # The model reads neighbouring slots in order as one slice of its cache
    # (a list of slots is a copy): a batch that ended and gave its slots back
    # must not come back in another order.
    sched = Scheduler(max_running=4, max_waiting=0)
    for _ in range(3):
        seqs = [Sequence(encode("p"), 1) for _ in range(4)]
        for seq in seqs:
            sched.add(seq)
        plan, running = sched.schedule()
        assert [slot for slot, _ in plan[0]] == [0, 1, 2, 3]
        sched.commit(running, [65] * 4)         # each ends after its one token
    seqs = [Sequence(encode("p"), 3) for _ in range(4)]
    for seq in seqs:
        sched.add(seq)
    running = sched.schedule()[1]
    sched.commit(running, [65] * 4)
    assert sched.schedule()[0][1] == [0, 1, 2, 3]        # their decode step's slots


def test_a_sequence_ends_at_an_end_token_before_its_max_tokens():
    sched = Scheduler(max_running=2, max_waiting=0, eos=[0])
    a, b = Sequence(encode("a"), 5), Sequence(encode("b"), 5)
    sched.add(a)
    sched.add(b)
    _, seqs = sched.schedule()
    given = sched.commit(seqs, [0, 7])
    assert [(s, done) for s, _, done in given] == [(a, True), (b, False)]
    assert list(sched.running.values()) == [b] and a.out == [0]


def test_a_sequence_gets_the_same_tokens_alone_or_batched():
    async def main():
        engine = AsyncEngine(LocalBackend(config_for("tiny"), 8), max_running=8)

        async def one(prompt, n):
            return decode([t async for batch in engine.generate(encode(prompt), n)
                           for t in batch])
        alone = await one("the same prompt", 20)
        together = await asyncio.gather(*[one(p, 20 + i) for i, p in enumerate(
            ["other", "the same prompt", "and another one", "x"])])
        stats = await engine.stats()
        return alone, together, stats
    alone, together, stats = asyncio.run(main())
    assert len(alone) == 20 and together[1][:20] == alone
    assert [len(t) for t in together] == [20, 21, 22, 23]
    assert stats["finished"] == 5 and stats["worker_cache_slots"] == [[], []]


def test_a_timed_generate_yields_each_batch_with_its_steps_stamps():
    async def main():
        engine = AsyncEngine(LocalBackend(config_for("tiny"), 2), max_running=2)
        timed = [b async for b in engine.generate(encode("abc"), 5, timed=True)]
        plain = [b async for b in engine.generate(encode("abc"), 5)]
        return timed, plain
    timed, plain = asyncio.run(main())
    assert [t for tokens, _ in timed for t in tokens] == [t for b in plain for t in b]
    order = STAMPS[:STAMPS.index("gen") + 1]
    for _, stamps in timed:
        assert [stamps[k] for k in order] == sorted(stamps[k] for k in order), stamps


# -- the hand-written server ----------------------------------------------------------------

def test_the_handwritten_server_serves_the_same_api():
    # Started as a user starts it: the checkout's examples/llm_server entry point.
    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in [str(EXAMPLES)] + sys.path
                                                      if p))
    proc = subprocess.Popen([sys.executable, "-m", "llm_server", "handwritten", "--port",
                             str(port), "--size", "tiny"], env=env, cwd=str(EXAMPLES),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().strip()
        if not line:        # it ended before it was ready: say why
            proc.wait(timeout=60)
            pytest.fail(f"the hand-written server did not start: {proc.stderr.read()[-2000:]}")
        assert line == f"READY {port}"
        status, _, body = _post(port, "/v1/completions",
                                {"prompt": "hello", "max_tokens": 12, "stream": True})
        events = _events(body)
        assert status == 200 and events[-1] == "[DONE]"
        text = "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1])
        assert len(text) == 12
        assert _get(port, "/v1/models")[1]["data"][0]["id"] == "ray-lite-toy-tiny"
        status, _, body = _post(port, "/v1/completions", {"prompt": "hi", "max_tokens": 0})
        assert status == 400 and json.loads(body)["error"]["param"] == "max_tokens"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        proc.stdout.close()
        proc.stderr.close()


_PIPE_STEPS_ON_UVLOOP = """
import os, uvloop
from ray_lite._examples.llm_server.handwritten import PipeBackend
backend = PipeBackend("tiny", 4)
async def main():
    return [await backend.cache_slots() for _ in range(3)]
try:
    print(uvloop.run(main()), all(os.get_blocking(c.fileno()) for c in backend.conns))
finally:
    backend.shutdown()
"""


def test_the_pipe_workers_stay_usable_after_a_step_under_uvloop():
    # uvloop leaves a descriptor it watched non-blocking: a later large
    # batch then failed half-written (BlockingIOError) and the engine
    # restarted its workers.  uvicorn runs the hand-written server on uvloop.
    # (In a process of its own: multiprocessing leaves its resource tracker.)
    pytest.importorskip("uvloop")
    out = subprocess.run([sys.executable, "-c", _PIPE_STEPS_ON_UVLOOP], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[0] == "[[[], []], [[], []], [[], []]] True"


# -- a transformers model -------------------------------------------------------------------

def test_a_transformers_causal_lm_gives_the_greedy_tokens_of_its_generate(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from ray_lite._examples.llm_server.hf import HFConfig, HFWorker, greedy
    config = transformers.GPT2Config(vocab_size=64, n_positions=64, n_embd=16, n_layer=1,
                                     n_head=2)
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path)     # random weights
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]

    async def main():
        engine = AsyncEngine(LocalBackend(HFConfig(str(tmp_path), 64), 4, worker=HFWorker),
                             max_running=4, sampler=greedy)
        outs = await asyncio.gather(*[
            _collect(engine.generate(p, 6 + i)) for i, p in enumerate(prompts)])
        return outs, await engine.stats()

    outs, stats = asyncio.run(main())
    for i, (prompt, out) in enumerate(zip(prompts, outs)):
        expected = model.generate(torch.tensor([prompt]), max_new_tokens=6 + i,
                                  do_sample=False, pad_token_id=0)[0, len(prompt):].tolist()
        assert out == expected, i
    assert stats["finished"] == 3 and stats["worker_cache_slots"] == [[]]


async def _collect(batches):
    return [t async for b in batches for t in b]
