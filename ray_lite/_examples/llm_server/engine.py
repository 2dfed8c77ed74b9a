"""Continuous batching over a tensor-parallel model.

:class:`Scheduler` decides each step's batch: every running sequence
advances by one token; waiting requests join at a step boundary (their
prompt is prefilled in that step, which gives their first token), as many as
there are free slots; finished and aborted sequences leave and their KV
cache slots are freed with the next step.  At most ``max_running``
sequences run; up to ``max_waiting`` more wait behind them; beyond that a
request is refused with :class:`EngineOverloaded` (backpressure).

:class:`AsyncEngine` runs the scheduler's steps on a *backend* in an
asyncio task: ``LocalBackend`` computes every shard in this process (the
floor of ``ray-lite bench llm``), ``ExecutorBackend`` drives a
``ray_lite.executor.MultiprocExecutor`` with one worker per shard, a step
being one ``collective_rpc`` whose replies are the shards' partial logits.
The engine sends the next step before it gives the event loop back, so the
consumers of a step's tokens run while the workers compute the next one.

A sequence added with ``timed=True`` carries the ``time.perf_counter_ns()``
stamps of the step that produced the first of its tokens not yet taken
(CLOCK_MONOTONIC, shared by every process of the machine): ``add`` (the
sequence was added to the engine), ``send`` (the step sent), ``work_start``
and ``work_end`` (the first worker started, the last one finished),
``replies`` (the engine has every reply), ``pushed`` (the token is in the
sequence's stream) and, from ``generate``, ``gen`` (the generator yields
it).  ``ray-lite bench llm`` follows a token to the client with them.
"""
import asyncio
import collections
import heapq
import itertools
import time

from .model import ShardWorker, config_for, make_plan, sample

_ns = time.perf_counter_ns

_ids = itertools.count()


class EngineOverloaded(Exception):
    """Every running slot is taken and the waiting queue is full."""


class EngineDeadError(RuntimeError):
    """The engine's workers failed while the request ran; the engine restarts them."""


class RequestAborted(Exception):
    pass


class TokenStream:
    """The tokens of one sequence, as the engine produces them: ``await
    stream.next_tokens()`` returns every token produced since the last call
    (at least one), or None once the sequence has ended, or raises the
    engine's error."""

    __slots__ = ("tokens", "taken", "done", "error", "_waiter", "stamps")

    def __init__(self, timed=False):
        self.tokens = []
        self.taken = 0
        self.done = False
        self.error = None
        self._waiter = None
        self.stamps = {} if timed else None    # the latest step's, when timed

    def _wake(self):
        w = self._waiter
        if w is not None:
            self._waiter = None
            if not w.done():
                w.set_result(None)

    def push(self, token):
        self.tokens.append(token)
        self._wake()

    def finish(self, error=None):
        self.done = True
        self.error = error
        self._wake()

    async def next_tokens(self):
        while self.taken == len(self.tokens):
            if self.done:
                if self.error is not None:
                    raise self.error
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        new = self.tokens[self.taken:]
        self.taken = len(self.tokens)
        return new


class Sequence:
    __slots__ = ("id", "prompt", "max_tokens", "slot", "out", "stream", "t_added", "add_ns")

    def __init__(self, prompt, max_tokens, timed=False):
        self.id = next(_ids)
        self.prompt = list(prompt)
        self.max_tokens = max_tokens
        self.slot = None
        self.out = []
        self.stream = TokenStream(timed)
        self.t_added = time.monotonic()
        self.add_ns = _ns() if timed else 0


class Scheduler:
    """The batch of each step (no I/O: the engine loop calls it)."""

    def __init__(self, max_running, max_waiting, eos=None):
        self.max_running = max_running
        self.max_waiting = max_waiting
        self.eos = frozenset(eos or ())              # tokens that end a sequence
        self.waiting = collections.OrderedDict()    # id -> Sequence
        self.running = {}                            # id -> Sequence
        # A heap: a sequence gets the lowest free slot, so that sequences
        # that join together hold neighbouring slots in their batch's order,
        # which the model reads as one slice of its cache.  Any other order
        # (a stack's, say, which hands a finished batch's slots back
        # reversed) makes every decode step copy the batch's cache rows.
        self.free_slots = list(range(max_running))
        self.to_free = []                            # slots to free in the next step

    def add(self, seq):
        if len(self.waiting) >= self.max_waiting + len(self.free_slots):
            raise EngineOverloaded(f"{len(self.running)} requests running and "
                                   f"{len(self.waiting)} waiting: the engine is full")
        self.waiting[seq.id] = seq

    def abort(self, seq_id):
        """Drop a sequence wherever it is; its slot is freed with the next step."""
        seq = self.waiting.pop(seq_id, None)
        if seq is None:
            seq = self.running.pop(seq_id, None)
            if seq is not None:
                self._release(seq)
        return seq

    def has_work(self):
        return bool(self.waiting or self.running or self.to_free)

    def schedule(self):
        """The next step: ``(plan, prefill sequences, decode sequences)``."""
        joining = []
        while self.waiting and self.free_slots:
            _, seq = self.waiting.popitem(last=False)
            seq.slot = heapq.heappop(self.free_slots)
            self.running[seq.id] = seq
            joining.append(seq)
        decoding = [s for s in self.running.values() if s.out]   # the joining have none
        frees, self.to_free = self.to_free, []
        plan = make_plan([(s.slot, s.prompt) for s in joining],
                         [s.slot for s in decoding], [s.out[-1] for s in decoding],
                         [len(s.prompt) + len(s.out) - 1 for s in decoding], frees)
        return plan, joining + decoding

    def commit(self, seqs, tokens):
        """Give each sequence of the step its token; returns ``(seq, token,
        finished)`` for each that got one (its stream still to be told)."""
        given = []
        running = self.running
        eos = self.eos
        for seq, token in zip(seqs, tokens):
            if seq.id not in running:           # aborted while the step ran
                continue
            seq.out.append(token)
            done = len(seq.out) >= seq.max_tokens or token in eos
            if done:
                del running[seq.id]
                self._release(seq)
            given.append((seq, token, done))
        return given

    def fail_all(self, error):
        seqs = list(self.waiting.values()) + list(self.running.values())
        self.waiting.clear()
        self.running.clear()
        self.free_slots = list(range(self.max_running))
        self.to_free = []
        for seq in seqs:
            seq.slot = None
        return seqs

    def _release(self, seq):
        if seq.slot is not None:
            self.to_free.append(seq.slot)
            heapq.heappush(self.free_slots, seq.slot)
            seq.slot = None


# -- backends -----------------------------------------------------------------

def _config(config, worker):
    return config_for(config) if worker is ShardWorker else config


class LocalBackend:
    """Every shard in this process, one after the other: no runtime at all.
    ``worker`` is the model's worker class (:class:`~.model.ShardWorker` or
    :class:`~.hf.HFWorker`) and ``config`` its configuration."""

    def __init__(self, config, max_seqs, worker=ShardWorker):
        cfg = _config(config, worker)
        self.workers = [worker(r, cfg.world_size, cfg, max_seqs)
                        for r in range(cfg.world_size)]

    async def step(self, plan):
        # The consumers of the last step's tokens run first, as they would
        # while remote workers computed.
        await asyncio.sleep(0)
        return [w.step(plan) for w in self.workers]

    async def cache_slots(self):
        return [w.cache_slots() for w in self.workers]

    def worker_pids(self):
        return []

    async def restart(self):
        pass

    def shutdown(self):
        pass


#: numpy in each worker uses one thread: the shards are the parallelism.
ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


class ExecutorBackend:
    """One ``MultiprocExecutor`` worker per shard; a step is one ``collective_rpc``."""

    def __init__(self, config, max_seqs, worker=ShardWorker):
        self.cfg = _config(config, worker)
        self.max_seqs = max_seqs
        self.worker = worker
        self.ex = self._start()

    def _start(self):
        from ray_lite.executor import MultiprocExecutor
        return MultiprocExecutor(self.worker, world_size=self.cfg.world_size,
                                 worker_kwargs={"config": self.cfg, "max_seqs": self.max_seqs},
                                 env=ONE_THREAD, reply_ring_bytes=4 << 20)

    async def step(self, plan):
        return await self.ex.collective_rpc_async("step", args=(plan,))

    async def cache_slots(self):
        return await self.ex.collective_rpc_async("cache_slots", timeout=60)

    def worker_pids(self):
        return list(self.ex.worker_pids)

    async def restart(self):
        self.ex.shutdown(grace=1.0)
        self.ex = await asyncio.get_running_loop().run_in_executor(None, self._start)

    def shutdown(self):
        self.ex.shutdown()


# -- the engine loop ------------------------------------------------------------

class AsyncEngine:
    """Continuous batching on ``backend`` in an asyncio task of the running loop.

    ``add(prompt_tokens, max_tokens)`` returns a :class:`Sequence` whose
    ``stream`` yields its tokens; ``abort(seq.id)`` ends it at the next step
    (its cache slot is freed in the workers with that step).  ``sampler``
    turns the workers' replies' logits into one token per sequence; a
    sequence also ends at a token of ``eos`` (a collection of token ids).
    """

    def __init__(self, backend, max_running=64, max_waiting=256, record_steps=False,
                 sampler=sample, eos=None):
        self.backend = backend
        self.scheduler = Scheduler(max_running, max_waiting, eos)
        self.sampler = sampler
        self._task = None
        self._wakeup = None
        self.steps = 0
        self.restarts = 0
        self.finished = 0
        self.aborted = 0
        self.record_steps = record_steps
        self.step_log = []          # (wall s, [shard compute s], batch) per step when recorded

    def add(self, prompt, max_tokens, timed=False):
        seq = Sequence(prompt, max_tokens, timed)
        self.scheduler.add(seq)
        self._kick()
        return seq

    def abort(self, seq_id):
        seq = self.scheduler.abort(seq_id)
        if seq is not None:
            self.aborted += 1
            seq.stream.finish(RequestAborted())
            self._kick()

    async def generate(self, prompt, max_tokens, timed=False):
        """The tokens of one request, in batches, as they come; aborts the
        sequence when the consumer stops early.  ``timed``: each batch comes
        as ``(tokens, stamps)`` (see the module's docstring)."""
        seq = self.add(prompt, max_tokens, timed)
        try:
            while True:
                tokens = await seq.stream.next_tokens()
                if tokens is None:
                    return
                yield (tokens, dict(seq.stream.stamps, gen=_ns())) if timed else tokens
        finally:
            if not seq.stream.done:
                self.abort(seq.id)

    def _kick(self):
        if self._task is None or self._task.done():
            loop = asyncio.get_running_loop()
            self._wakeup = asyncio.Event()
            self._task = loop.create_task(self._run())
        self._wakeup.set()

    async def _run(self):
        sched = self.scheduler
        while True:
            if not sched.has_work():
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            plan, seqs = sched.schedule()
            t_send = _ns()
            try:
                replies = await self.backend.step(plan)
            except Exception as exc:   # noqa: BLE001 - a failed step fails its requests
                await self._recover(exc)
                continue
            t_replies = _ns()
            self.steps += 1
            if self.record_steps:
                self.step_log.append(((t_replies - t_send) / 1e9, [r[1] for r in replies],
                                      len(seqs)))
            if not seqs:
                continue
            tokens = self.sampler([r[0] for r in replies])
            for seq, token, done in sched.commit(seqs, tokens):
                stream = seq.stream
                stream.push(token)
                if stream.stamps is not None and len(stream.tokens) - stream.taken == 1:
                    # The stamps of a batch are its first token's: a first
                    # batch of two tokens still shows the prefill's way.
                    stream.stamps = {"add": seq.add_ns, "send": t_send,
                                     "work_start": min(r[2] for r in replies),
                                     "work_end": max(r[3] for r in replies),
                                     "replies": t_replies, "pushed": _ns()}
                if done:
                    self.finished += 1
                    seq.stream.finish()

    async def _recover(self, exc):
        error = EngineDeadError(f"the engine's workers failed ({type(exc).__name__}: {exc}); "
                                f"the request was stopped and the engine restarts them")
        for seq in self.scheduler.fail_all(error):
            seq.stream.finish(error)
        self.restarts += 1
        await self.backend.restart()

    async def stats(self):
        sched = self.scheduler
        try:
            slots = await self.backend.cache_slots()
        except Exception:   # noqa: BLE001 - failed workers, being restarted
            slots = None
        return {"running": len(sched.running), "waiting": len(sched.waiting),
                "free_slots": len(sched.free_slots), "max_running": sched.max_running,
                "worker_cache_slots": slots,
                "worker_pids": self.backend.worker_pids(),
                "steps": self.steps, "restarts": self.restarts,
                "finished": self.finished, "aborted": self.aborted}
