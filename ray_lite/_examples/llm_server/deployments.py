"""The server on Serve: an engine deployment and a FastAPI ingress.

    ray-lite serve run ray_lite._examples.llm_server.deployments:build size=small

The engine deployment (one replica) runs continuous batching
(:class:`~llm_server.engine.AsyncEngine`) over a ``MultiprocExecutor`` of two
workers, one shard of the model each.  Each request is a streaming call of
its ``generate`` method: the tokens come back to the ingress through the
handle's streaming generator, a batch at a time.  A request the ingress
stops (its client went away) is cancelled in the engine, which aborts the
sequence at the next step and frees its KV cache.  The ingress runs as two
replicas (``INGRESS_REPLICAS``), which take the HTTP connections themselves.

With ``RAY_LITE_BACKEND=ray`` the same code runs on Ray Serve.  Given
``model=<name>`` (and ``transformers`` installed), the engine serves that
causal LM (:mod:`.hf`) in place of the toy model.
"""
import time

from ray_lite import serve

from . import api
from .engine import AsyncEngine, ExecutorBackend
from .model import config_for

MODEL_NAME = "ray-lite-toy-{size}"


@serve.deployment(max_ongoing_requests=4096, ray_actor_options={"num_cpus": 0})
class LLMEngine:
    def __init__(self, size="small", max_running=64, max_waiting=256, model=None,
                 max_len=None):
        if model:
            from .hf import engine_parts
            config, worker, sampler, eos = engine_parts(model, max_len)
            backend = ExecutorBackend(config, max_running, worker=worker)
        else:
            backend, sampler, eos = ExecutorBackend(config_for(size), max_running), None, None
        self.engine = AsyncEngine(backend, max_running=max_running, max_waiting=max_waiting,
                                  **({"sampler": sampler, "eos": eos} if model else {}))

    async def generate(self, prompt, max_tokens, timed=False):
        """The tokens of one request, a batch at a time; ``timed``: each
        batch as ``(tokens, stamps)`` (see ``engine``'s docstring)."""
        seq = self.engine.add(prompt, max_tokens, timed)
        try:
            while True:
                tokens = await seq.stream.next_tokens()
                if tokens is None:
                    return
                yield (tokens, dict(seq.stream.stamps, gen=time.perf_counter_ns())) \
                    if timed else tokens
        finally:
            if not seq.stream.done:       # the caller went away: stop computing it
                self.engine.abort(seq.id)

    async def stats(self):
        return await self.engine.stats()

    def __del__(self):
        # Serve calls it as the replica stops: end the workers, free their rings.
        self.engine.backend.shutdown()


class HandleEngine:
    """The engine deployment as the API's engine client."""

    def __init__(self, handle):
        self._handle = handle
        self._generate = handle.options(stream=True).generate

    async def generate(self, prompt, max_tokens, timed=False):
        stream = self._generate.remote(prompt, max_tokens, timed) if timed else \
            self._generate.remote(prompt, max_tokens)
        finished = False
        try:
            async for tokens in stream:
                yield tokens
            finished = True
        finally:
            if not finished:
                stream.cancel()

    async def stats(self):
        return await self._handle.stats.remote()


@serve.deployment(max_ongoing_requests=4096, ray_actor_options={"num_cpus": 0})
@serve.ingress(api.app)
class OpenAIServer:
    def __init__(self, engine, model_name, max_len, tokenizer=None):
        if tokenizer is not None:
            from .hf import Tokenizer
            tokenizer = Tokenizer(tokenizer)
        api.bind(HandleEngine(engine), model_name, max_len, tokenizer)


#: Replicas of the ingress: two, so that with direct ingress (Serve's
#: default) both take the connections themselves and the proxy steps aside
#: (it keeps listening while fewer than two replicas do, and each connection
#: it takes pays its hop); and so that one replica's SSE work does not bound
#: the whole server.
INGRESS_REPLICAS = 2


def build(args=None):
    """The application: ``args`` may give ``size`` (a name of
    ``model.SIZES``), ``max_running``, ``max_waiting`` and
    ``ingress_replicas``; or ``model``, the name or folder of a
    ``transformers`` causal LM, and its ``max_len``."""
    args = dict(args or {})
    size = args.get("size", "small")
    max_running = int(args.get("max_running", 64))
    max_waiting = int(args.get("max_waiting", 256))
    ingress = OpenAIServer.options(
        num_replicas=int(args.get("ingress_replicas") or INGRESS_REPLICAS))
    model = args.get("model")
    if model:
        from .hf import DEFAULT_MAX_LEN, require
        require()
        max_len = int(args.get("max_len") or DEFAULT_MAX_LEN)
        engine = LLMEngine.bind(size, max_running, max_waiting, model, max_len)
        return ingress.bind(engine, model, max_len, model)
    engine = LLMEngine.bind(size, max_running, max_waiting)
    return ingress.bind(engine, MODEL_NAME.format(size=size), config_for(size).max_len)
