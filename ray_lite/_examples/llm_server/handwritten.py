"""The server a user would write without a runtime: the same FastAPI app on
one uvicorn process, the engine in it, and one ``multiprocessing`` process
per shard talking over a pipe each.

    python -m ray_lite._examples.llm_server handwritten --port 8000 --size small
"""
import asyncio
import multiprocessing
import os

from . import api
from .engine import ONE_THREAD, AsyncEngine
from .model import ShardWorker, config_for


def _serve_shard(conn, rank, config, max_seqs, worker_cls):
    worker = worker_cls(rank, config.world_size, config, max_seqs)
    while True:
        try:
            method, args = conn.recv()
        except EOFError:
            return
        if method is None:
            return
        try:
            conn.send((True, getattr(worker, method)(*args)))
        except Exception as exc:   # noqa: BLE001 - the engine raises it
            conn.send((False, exc))


class PipeBackend:
    """One process per shard; a step is a message down each pipe and the
    replies read as the event loop sees them arrive."""

    def __init__(self, config, max_seqs, worker=ShardWorker):
        self.cfg = config_for(config) if worker is ShardWorker else config
        self.max_seqs = max_seqs
        self.worker = worker
        self._start()

    def _start(self):
        ctx = multiprocessing.get_context("spawn")
        saved = {k: os.environ.get(k) for k in ONE_THREAD}
        os.environ.update(ONE_THREAD)            # the children's numpy: one thread each
        try:
            self.conns, self.procs = [], []
            for rank in range(self.cfg.world_size):
                ours, theirs = ctx.Pipe()
                proc = ctx.Process(target=_serve_shard, daemon=True,
                                   args=(theirs, rank, self.cfg, self.max_seqs, self.worker))
                proc.start()
                theirs.close()
                self.conns.append(ours)
                self.procs.append(proc)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    async def _call(self, method, *args):
        loop = asyncio.get_running_loop()
        for conn in self.conns:
            conn.send((method, args))
        results = []
        for conn in self.conns:
            if not conn.poll():
                ready = loop.create_future()
                loop.add_reader(conn.fileno(), lambda f=ready: f.done() or f.set_result(None))
                try:
                    await ready
                finally:
                    loop.remove_reader(conn.fileno())
                    # uvloop leaves a descriptor it watched non-blocking; the
                    # pipe's send and recv expect it blocking (a large batch
                    # would fail with BlockingIOError half-written).
                    os.set_blocking(conn.fileno(), True)
            try:
                ok, value = conn.recv()
            except (EOFError, OSError) as exc:
                raise RuntimeError(f"a shard process died ({exc!r})") from None
            if not ok:
                raise value
            results.append(value)
        return results

    async def step(self, plan):
        return await self._call("step", plan)

    async def cache_slots(self):
        return await self._call("cache_slots")

    def worker_pids(self):
        return [p.pid for p in self.procs]

    async def restart(self):
        self.shutdown()
        self._start()

    def shutdown(self):
        for conn in self.conns:
            try:
                conn.send((None, ()))
            except OSError:
                pass
            conn.close()
        for proc in self.procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join(5)


def make_app(size="small", max_running=64, max_waiting=256, model=None, max_len=None):
    """The API bound to an engine over pipe workers (started now): the toy
    model of ``size``, or the ``transformers`` causal LM ``model``."""
    if model:
        from .hf import Tokenizer, engine_parts
        cfg, worker, sampler, eos = engine_parts(model, max_len)
        engine = AsyncEngine(PipeBackend(cfg, max_running, worker), max_running=max_running,
                             max_waiting=max_waiting, sampler=sampler, eos=eos)
        api.bind(engine, model, cfg.max_len, Tokenizer(model))
        return api.app, engine
    cfg = config_for(size)
    engine = AsyncEngine(PipeBackend(cfg, max_running), max_running=max_running,
                         max_waiting=max_waiting)
    api.bind(engine, f"ray-lite-toy-{size}", cfg.max_len)
    return api.app, engine


def run(port, size="small", host="127.0.0.1", ready=None, max_running=64, max_waiting=256,
        model=None, max_len=None):
    import uvicorn
    app, engine = make_app(size, max_running, max_waiting, model, max_len)
    config = uvicorn.Config(app, host=host, port=port, loop="uvloop", http="httptools",
                            access_log=False, log_level="warning")
    server = uvicorn.Server(config)
    if ready is not None:
        orig = server.startup

        async def startup(*a, **kw):
            await orig(*a, **kw)
            ready()
        server.startup = startup
    try:
        server.run()
    finally:
        engine.backend.shutdown()
