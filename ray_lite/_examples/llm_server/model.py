"""A small transformer-shaped model in numpy, split tensor-parallel into shards.

Byte-level tokens (vocabulary 256), seeded random weights (nothing to
download), greedy sampling over printable ASCII.  Each shard holds its share
of every layer: a slice of the attention heads (their Q/K/V columns and the
matching rows of the output projection) and a slice of the MLP (columns of
the first matrix, rows of the second), plus a slice of the output head.  A
shard keeps its own residual stream (there is no all-reduce between layers:
the shards only meet at the end), and the logits are the sum of the shards'
partial logits, which the engine's driver adds up.  The work per token is
what a real decoder's is (matrix products, attention over a KV cache), only
the numbers mean nothing.

A shard keeps the KV cache of every running sequence in a pool of slots;
the engine assigns a sequence its slot when it starts and frees it when the
sequence ends.
"""
import dataclasses
import time

import numpy as np

VOCAB = 256
#: Tokens the sampler may pick: printable ASCII, so every completion is text.
PRINTABLE = np.zeros(VOCAB, dtype=bool)
PRINTABLE[32:127] = True


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 512
    max_len: int = 256          # prompt + completion, tokens
    world_size: int = 2         # shards (tensor-parallel workers)
    seed: int = 0

    @property
    def d_head(self):
        return self.d_model // self.n_heads

    def check(self):
        if self.d_model % self.n_heads or self.n_heads % self.world_size \
                or self.d_ff % self.world_size:
            raise ValueError(f"{self}: n_heads must divide d_model, and world_size must divide "
                             f"n_heads and d_ff")
        return self


#: Model sizes by name.  The times are roughly those of one shard's decode
#: step for 64 running sequences on a 2-core x86-64 VM; ``ray-lite bench llm``
#: measures the step on the machine it runs on.
SIZES = {
    "tiny": ModelConfig(d_model=32, n_layers=1, n_heads=2, d_ff=64),        # ~0.1 ms
    "small": ModelConfig(d_model=64, n_layers=2, n_heads=4, d_ff=256),      # ~1 ms
    "medium": ModelConfig(d_model=256, n_layers=3, n_heads=8, d_ff=1024),   # ~10 ms
    "large": ModelConfig(d_model=384, n_layers=4, n_heads=8, d_ff=1536),    # ~20 ms
}


def config_for(size):
    """A :class:`ModelConfig` from a size name or a dict of its fields."""
    if isinstance(size, ModelConfig):
        return size.check()
    if isinstance(size, str):
        try:
            return SIZES[size]
        except KeyError:
            raise ValueError(f"unknown model size {size!r}; known: {', '.join(SIZES)}") from None
    return ModelConfig(**size).check()


def encode(text):
    return list(text.encode("utf-8"))


def decode(tokens):
    return bytes(tokens).decode("utf-8", errors="replace")


def _rms(x):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6)


def _positions(max_len, d):
    pos = np.arange(max_len)[:, None]
    freq = np.exp(-np.log(10000.0) * (np.arange(0, d, 2) / d))
    table = np.zeros((max_len, d), dtype=np.float32)
    table[:, 0::2] = np.sin(pos * freq)
    table[:, 1::2] = np.cos(pos * freq)
    return table


class Shard:
    """Rank ``rank``'s share of the model and of every sequence's KV cache.

    ``step(plan)`` runs one engine step on this shard: the prefill of the
    sequences that join (their whole prompt) and one decode position for
    every running one; it returns the shard's partial logits, one row per
    sequence (prefills first), the seconds it computed, and the
    ``time.perf_counter_ns()`` at which it started and ended.
    """

    def __init__(self, config, rank, max_seqs):
        cfg = config_for(config)
        self.cfg, self.rank, self.max_seqs = cfg, rank, max_seqs
        d, ws = cfg.d_model, cfg.world_size
        self.heads = cfg.n_heads // ws
        dh = cfg.d_head
        # float32 throughout: a float64 scalar would promote every product after it.
        self.scale = np.float32(1 / np.sqrt(dh))
        width = self.heads * dh
        ff = cfg.d_ff // ws
        shared = np.random.default_rng(cfg.seed)
        self.embed = (shared.standard_normal((VOCAB, d)) * 0.5).astype(np.float32)
        self.pos = _positions(cfg.max_len, d)
        rng = np.random.default_rng([cfg.seed, rank + 1])

        def w(rows, cols):
            return (rng.standard_normal((rows, cols)) / np.sqrt(rows)).astype(np.float32)

        self.layers = [(w(d, 3 * width), w(width, d), w(d, ff), w(ff, d))
                       for _ in range(cfg.n_layers)]
        self.head = w(d, VOCAB)
        shape = (cfg.n_layers, max_seqs, self.heads, cfg.max_len, dh)
        # Zeroed lazily by the kernel: untouched slots cost no memory.
        self.k_cache = np.zeros(shape, dtype=np.float32)
        self.v_cache = np.zeros(shape, dtype=np.float32)
        self.used = set()           # slots holding a live sequence's cache

    # -- the engine's calls ----------------------------------------------------

    def step(self, plan):
        """``plan``: ``(prefills, slots, tokens, positions, frees)``, see
        :func:`make_plan`.  Returns ``(partial_logits, compute_s, start_ns,
        end_ns)``."""
        t0 = time.perf_counter_ns()
        prefills, slots, tokens, positions, frees = plan
        for slot in frees:
            self.used.discard(slot)
        rows = [self._prefill(slot, prompt) for slot, prompt in prefills]
        if slots:
            rows.append(self._decode(np.asarray(slots, dtype=np.intp),
                                     np.asarray(tokens, dtype=np.intp),
                                     np.asarray(positions, dtype=np.intp)))
        logits = (np.concatenate(rows) if len(rows) > 1 else rows[0]) if rows else \
            np.zeros((0, VOCAB), dtype=np.float32)
        t1 = time.perf_counter_ns()
        return logits, (t1 - t0) / 1e9, t0, t1

    def cache_slots(self):
        """The slots whose KV cache is live."""
        return sorted(self.used)

    # -- the computation -------------------------------------------------------

    def _prefill(self, slot, prompt):
        cfg, dh, hs = self.cfg, self.cfg.d_head, self.heads
        n = len(prompt)
        self.used.add(slot)
        x = self.embed[np.asarray(prompt, dtype=np.intp)] + self.pos[:n]
        causal = np.triu(np.full((n, n), -np.inf, dtype=np.float32), 1)
        for li, (wqkv, wo, w1, w2) in enumerate(self.layers):
            qkv = (_rms(x) @ wqkv).reshape(n, 3, hs, dh).transpose(1, 2, 0, 3)  # 3,h,n,dh
            q, k, v = qkv[0], qkv[1], qkv[2]
            self.k_cache[li, slot, :, :n] = k
            self.v_cache[li, slot, :, :n] = v
            scores = q @ k.transpose(0, 2, 1) * self.scale + causal
            att = _softmax(scores) @ v                                          # h,n,dh
            x = x + att.transpose(1, 0, 2).reshape(n, hs * dh) @ wo
            x = x + np.maximum(_rms(x) @ w1, 0) @ w2
        return _rms(x[-1:]) @ self.head

    def _decode(self, slots, tokens, positions):
        dh, hs = self.cfg.d_head, self.heads
        b = len(slots)
        x = self.embed[tokens] + self.pos[positions]
        length = int(positions.max()) + 1
        first = int(slots[0])
        # Sequences that joined together hold neighbouring slots: a slice of
        # the cache is a view, where a list of slots copies it.
        rows = slice(first, first + b) if int(slots[-1]) == first + b - 1 and \
            np.array_equal(slots, np.arange(first, first + b)) else slots
        mask = np.where(np.arange(length)[None, :] <= positions[:, None], 0.0,
                        -np.inf).astype(np.float32)[:, None, None, :]          # b,1,1,t
        for li, (wqkv, wo, w1, w2) in enumerate(self.layers):
            qkv = (_rms(x) @ wqkv).reshape(b, 3, hs, dh)
            self.k_cache[li, slots, :, positions] = qkv[:, 1]
            self.v_cache[li, slots, :, positions] = qkv[:, 2]
            keys = self.k_cache[li, rows, :, :length]                          # b,h,t,dh
            values = self.v_cache[li, rows, :, :length]
            q = qkv[:, 0][:, :, None, :]                                       # b,h,1,dh
            scores = q @ keys.transpose(0, 1, 3, 2) * self.scale + mask        # b,h,1,t
            att = (_softmax(scores) @ values)[:, :, 0]                         # b,h,dh
            x = x + att.reshape(b, hs * dh) @ wo
            x = x + np.maximum(_rms(x) @ w1, 0) @ w2
        return _rms(x) @ self.head


def _softmax(scores):
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def make_plan(prefills, slots, tokens, positions, frees):
    """One step's work for every shard: ``prefills`` a list of ``(slot,
    prompt tokens)``, then the decode batch as three lists of ints (slot, last
    token, its position), and the slots to free first."""
    # Lists, not arrays: the plan is broadcast every step, and plain lists
    # encode in a few microseconds where each numpy array is pickled.
    return (prefills, list(slots), list(tokens), list(positions), list(frees))


_NOT_PRINTABLE = np.where(PRINTABLE, 0.0, -np.inf).astype(np.float32)


def sample(partial_logits):
    """Greedy tokens from the shards' partial logits (summed here)."""
    total = partial_logits[0]
    for part in partial_logits[1:]:
        total = total + part
    return (total + _NOT_PRINTABLE).argmax(axis=1).tolist()


class ShardWorker:
    """A shard as a ``MultiprocExecutor`` worker (or a pipe worker's)."""

    def __init__(self, rank, world_size, config, max_seqs):
        self.shard = Shard(config, rank, max_seqs)

    def step(self, plan):
        return self.shard.step(plan)

    def cache_slots(self):
        return self.shard.cache_slots()

    def pid(self):
        import os
        return os.getpid()
