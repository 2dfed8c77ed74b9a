"""The OpenAI-compatible HTTP API, as a FastAPI app over any *engine client*.

An engine client has ``generate(prompt_tokens, max_tokens, timed=False)``,
an async iterator of token batches (lists of token ids, at least one each;
with ``timed``, ``(tokens, stamps)`` pairs), and ``async stats()``.  On Serve the client is a handle to the engine deployment
(``deployments.py``); in the hand-written server it is the engine itself
(``handwritten.py``).  :func:`bind` gives the app its client, model name and
context length.

    GET  /v1/models
    POST /v1/completions          stream: true -> server-sent events, data: [DONE] last
    POST /v1/chat/completions
    GET  /engine/stats            the engine's running/waiting sequences and KV slots

Request bodies are checked by pydantic; an invalid one gets 400 with vLLM's
error body (``{"error": {"message", "type", "param", "code"}}``), as do an
unknown model (404) and a request longer than the context (400).  A full
engine answers 503.  An error after the stream has started is sent as a
``data: {"error": ...}`` event before ``data: [DONE]``.

A streaming request with ``"ray_lite_timing": true`` (what ``ray-lite bench
llm`` sends; other clients never see it) gets in each chunk the
``time.perf_counter_ns()`` stamps its tokens collected on their way (see
``engine``), plus ``recv`` (this app got the batch from its engine client)
and ``sse`` (its chunk is about to be written); the first chunk also has
``enter`` (the request, validated, reached this app's route).
"""
import json
import time
import types

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse

from .engine import EngineOverloaded
from . import model as toy
from .protocol import (ChatCompletionRequest, CompletionRequest, chat_prompt, error_body,
                       new_id, now, usage)

app = FastAPI(title="llm_server: an OpenAI-compatible toy LLM server")

# What the routes serve, set by bind().  A module global, not app.state: on
# Serve the replica's app is a copy of this one (the ingress class carries it
# by value), while the routes' functions are this module's.
_state = types.SimpleNamespace(engine=None, model_name=None, max_len=None,
                               encode=toy.encode, decode=toy.decode)


def bind(engine, model_name, max_len, tokenizer=None):
    """Serve ``engine`` (an engine client) as model ``model_name``;
    ``tokenizer`` (with ``encode(text)`` and ``decode(tokens)``) in place of
    the toy model's bytes."""
    _state.engine = engine
    _state.model_name = model_name
    _state.max_len = max_len
    _state.encode = tokenizer.encode if tokenizer is not None else toy.encode
    _state.decode = tokenizer.decode if tokenizer is not None else toy.decode
    return app


def _error(message, status, param=None):
    return JSONResponse(error_body(message, status, param), status_code=status)


@app.exception_handler(RequestValidationError)
async def _invalid(request: Request, exc: RequestValidationError):
    errors = exc.errors()
    param = None
    if errors:
        param = ".".join(str(p) for p in errors[0].get("loc", ()) if p != "body") or None
    lines = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in errors]
    message = f"{len(errors)} validation error{'s' if len(errors) != 1 else ''}: " + \
        "; ".join(lines)
    return _error(message, 400, param)


@app.get("/v1/models")
async def models(request: Request):
    state = _state
    return {"object": "list",
            "data": [{"id": state.model_name, "object": "model", "created": now(),
                      "owned_by": "ray_lite", "root": state.model_name,
                      "max_model_len": state.max_len}]}


@app.get("/engine/stats")
async def stats(request: Request):
    return await _state.engine.stats()


def _check(request, body, prompt, max_tokens):
    state = _state
    if body.model is not None and body.model != state.model_name:
        return _error(f"The model `{body.model}` does not exist.", 404, "model")
    if len(prompt) + max_tokens > state.max_len:
        return _error(f"The context of this model is {state.max_len} tokens; this request "
                      f"asks for {len(prompt) + max_tokens} ({len(prompt)} of prompt, "
                      f"{max_tokens} to generate).", 400, "max_tokens")
    if not prompt:
        return _error("The prompt is empty.", 400, "prompt")
    return None


def _is(exc, cls):
    """Whether ``exc`` is ``cls`` raised in the engine (over a handle it
    arrives wrapped, and is also an instance of it)."""
    return isinstance(exc, cls) or cls.__name__ in type(exc).__name__ or \
        type(getattr(exc, "cause", None)).__name__ == cls.__name__


async def _first(tokens):
    """The first batch of ``tokens`` and None, or None and the error answer."""
    try:
        return await tokens.__anext__(), None
    except StopAsyncIteration:
        return [], None
    except Exception as exc:   # noqa: BLE001 - the engine's refusal becomes the answer
        await _close(tokens)
        if _is(exc, EngineOverloaded):
            return None, _error(f"The engine is full; try again later. ({exc})", 503)
        return None, _error(f"The engine failed: {exc}", 500)


async def _close(tokens):
    try:
        await tokens.aclose()
    except Exception:   # noqa: BLE001 - closing a stream that already failed
        pass


# One encoder for every chunk: json.dumps with its own separators builds a
# new JSONEncoder each call, a cost paid once a token.
_compact = json.JSONEncoder(separators=(",", ":")).encode


def _sse(obj):
    return f"data: {_compact(obj)}\n\n"


async def _serve(request, body, prompt, max_tokens, chat):
    t_enter = time.perf_counter_ns()
    invalid = _check(request, body, prompt, max_tokens)
    if invalid is not None:
        return invalid
    state = _state
    decode = state.decode
    timed = bool(body.stream and getattr(body, "ray_lite_timing", False))
    tokens = state.engine.generate(prompt, max_tokens, timed=True) if timed else \
        state.engine.generate(prompt, max_tokens)
    first, failed = await _first(tokens)
    t_first = time.perf_counter_ns()
    if failed is not None:
        return failed
    rid = new_id("chatcmpl" if chat else "cmpl")
    created = now()
    model = state.model_name
    obj = "chat.completion" if chat else "text_completion"
    if not body.stream:
        out = list(first)
        try:
            async for batch in tokens:
                out.extend(batch)
        except Exception as exc:   # noqa: BLE001
            return _error(f"The engine failed: {exc}", 500)
        text = decode(out)
        if getattr(body, "echo", False):
            text = decode(prompt) + text
        reason = "length" if len(out) >= max_tokens else "stop"
        choice = ({"index": 0, "message": {"role": "assistant", "content": text},
                   "finish_reason": reason} if chat else
                  {"index": 0, "text": text, "logprobs": None, "finish_reason": reason})
        return {"id": rid, "object": obj, "created": created, "model": model,
                "choices": [choice], "usage": usage(len(prompt), len(out))}
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    chunk_obj = "chat.completion.chunk" if chat else "text_completion"

    def chunk(text, reason, stamps=None):
        choice = ({"index": 0, "delta": {"content": text}, "logprobs": None,
                   "finish_reason": reason} if chat else
                  {"index": 0, "text": text, "logprobs": None, "finish_reason": reason})
        out = {"id": rid, "object": chunk_obj, "created": created, "model": model,
               "choices": [choice]}
        if stamps is not None:
            stamps["sse"] = time.perf_counter_ns()
            out["ray_lite_timing"] = stamps
        return _sse(out)

    async def events():
        count = 0
        try:
            if chat:
                yield _sse({"id": rid, "object": chunk_obj, "created": created, "model": model,
                            "choices": [{"index": 0, "delta": {"role": "assistant",
                                                               "content": ""},
                                         "logprobs": None, "finish_reason": None}]})
            batch = first
            if timed and batch:
                batch[1]["recv"] = t_first
                batch[1]["enter"] = t_enter
            while batch:
                stamps = None
                if timed:
                    batch, stamps = batch
                count += len(batch)
                yield chunk(decode(batch), "length" if count >= max_tokens else None, stamps)
                try:
                    batch = await tokens.__anext__()
                except StopAsyncIteration:
                    break
                if timed:
                    batch[1]["recv"] = time.perf_counter_ns()
            if include_usage:
                yield _sse({"id": rid, "object": chunk_obj, "created": created, "model": model,
                            "choices": [], "usage": usage(len(prompt), count)})
        except Exception as exc:   # noqa: BLE001 - the status is sent: the error is an event
            yield _sse(error_body(f"The engine failed: {exc}", 500))
        finally:
            # A client gone: this closes the engine's stream, which aborts the sequence.
            await _close(tokens)
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


@app.post("/v1/completions")
async def completions(request: Request, body: CompletionRequest):
    prompt = _state.encode(body.prompt) if isinstance(body.prompt, str) else list(body.prompt)
    return await _serve(request, body, prompt, body.max_tokens or 16, chat=False)


@app.post("/v1/chat/completions")
async def chat_completions(request: Request, body: ChatCompletionRequest):
    prompt = _state.encode(chat_prompt(body.messages))
    max_tokens = body.max_completion_tokens or body.max_tokens
    if max_tokens is None:
        max_tokens = max(1, _state.max_len - len(prompt))
    return await _serve(request, body, prompt, max_tokens, chat=True)
