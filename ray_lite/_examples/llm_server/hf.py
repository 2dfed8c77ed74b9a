"""A causal LM from ``transformers`` behind the same engine, in place of the
toy model (when ``transformers`` and ``torch`` are installed):

    python -m ray_lite._examples.llm_server serve --model gpt2 --max-len 1024

One worker (``world_size`` 1) holds the whole model.  Each engine step runs
the prompt of every sequence that joins and one token of every running one,
each sequence with its own ``past_key_values`` (its KV cache, kept under its
slot and dropped when the engine frees the slot); the token is the greedy
one over the whole vocabulary, and a sequence ends at the model's
end-of-sequence token or at its ``max_tokens``.  The sequences of a step run
one after the other (a batched forward over ragged caches would need
padding and attention masks; the engine's contract does not change with it).
The API encodes and decodes with the model's tokenizer.
"""
import dataclasses
import importlib.util
import time

import numpy as np

#: The context, tokens, when none is given.
DEFAULT_MAX_LEN = 1024


@dataclasses.dataclass(frozen=True)
class HFConfig:
    model: str                      # a name on the Hugging Face Hub, or a local folder
    max_len: int = DEFAULT_MAX_LEN
    world_size: int = 1


def available():
    """Whether ``transformers`` and ``torch`` can be imported."""
    return all(importlib.util.find_spec(m) is not None for m in ("transformers", "torch"))


def require():
    if not available():
        raise ImportError("serving a transformers model needs transformers and torch "
                          "(pip install transformers torch); without --model the server "
                          "runs the toy model")


class HFWorker:
    """The engine's worker for a causal LM: ``step(plan)`` and
    ``cache_slots()``, as :class:`~.model.ShardWorker` has them."""

    def __init__(self, rank, world_size, config, max_seqs):
        import torch
        from transformers import AutoModelForCausalLM
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(config.model)
        self.model.eval()
        self.vocab = self.model.config.vocab_size
        self.past = {}              # slot -> that sequence's past_key_values

    def step(self, plan):
        t0 = time.perf_counter_ns()
        prefills, slots, tokens, _positions, frees = plan
        for slot in frees:
            self.past.pop(slot, None)
        rows = []
        with self.torch.inference_mode():
            for slot, prompt in prefills:
                rows.append(self._forward(slot, list(prompt), None))
            for slot, token in zip(slots, tokens):
                rows.append(self._forward(slot, [token], self.past[slot]))
        logits = np.stack(rows) if rows else np.zeros((0, self.vocab), dtype=np.float32)
        t1 = time.perf_counter_ns()
        return logits, (t1 - t0) / 1e9, t0, t1

    def _forward(self, slot, ids, past):
        out = self.model(input_ids=self.torch.tensor([ids]), past_key_values=past,
                         use_cache=True)
        self.past[slot] = out.past_key_values
        return out.logits[0, -1].float().numpy()

    def cache_slots(self):
        return sorted(self.past)

    def pid(self):
        import os
        return os.getpid()


def greedy(partial_logits):
    """The most likely token of each row (the replies' logits summed)."""
    total = partial_logits[0]
    for part in partial_logits[1:]:
        total = total + part
    return total.argmax(axis=1).tolist()


def end_tokens(model):
    """The model's end-of-sequence token ids, from its configuration."""
    from transformers import AutoConfig
    eos = AutoConfig.from_pretrained(model).eos_token_id
    if eos is None:
        return frozenset()
    return frozenset(eos if isinstance(eos, (list, tuple)) else [eos])


def engine_parts(model, max_len=None):
    """``(config, worker class, sampler, end tokens)`` of the engine for ``model``."""
    require()
    return (HFConfig(model, int(max_len or DEFAULT_MAX_LEN)), HFWorker, greedy,
            end_tokens(model))


class Tokenizer:
    """The model's tokenizer as the API's ``encode`` and ``decode``."""

    def __init__(self, model):
        from transformers import AutoTokenizer
        self._tok = AutoTokenizer.from_pretrained(model)

    def encode(self, text):
        return list(self._tok.encode(text))

    def decode(self, tokens):
        return self._tok.decode(tokens, skip_special_tokens=True)
