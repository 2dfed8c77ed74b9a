"""Token streaming: an async actor yields tokens; a caller consumes several
streams at once, the way a serving front end consumes model outputs.

    python examples/token_streaming.py [num_streams] [tokens_per_stream]
"""
import asyncio
import sys
import time

import ray_lite as ray


@ray.remote
class Model:
    """Stands in for a language model: yields one token at a time."""

    async def generate(self, prompt, n):
        for i in range(n):
            yield f"{prompt}-tok{i}"
            await asyncio.sleep(0)   # a real model would await its next step here


@ray.remote
class Frontend:
    def __init__(self, model):
        self.model = model

    async def _one(self, prompt, n):
        tokens = []
        async for ref in self.model.generate.remote(prompt, n):
            tokens.append(await ref)
        return tokens

    async def serve(self, prompts, n):
        return await asyncio.gather(*[self._one(p, n) for p in prompts])


def main(num_streams=4, tokens=100):
    ray.init(num_cpus=2)
    try:
        frontend = Frontend.remote(Model.remote())
        prompts = [f"p{i}" for i in range(num_streams)]
        t0 = time.perf_counter()
        results = ray.get(frontend.serve.remote(prompts, tokens), timeout=120)
        dt = time.perf_counter() - t0
        for prompt, toks in zip(prompts, results):
            assert toks == [f"{prompt}-tok{i}" for i in range(tokens)], prompt
            print(f"{prompt}: {len(toks)} tokens, first {toks[0]!r}, last {toks[-1]!r}")
        print(f"{num_streams * tokens} tokens in {dt * 1000:.1f} ms "
              f"({num_streams * tokens / dt:,.0f} tokens/s)")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
