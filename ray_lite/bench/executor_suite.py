"""The ``executor`` suite: ``MultiprocExecutor`` and the broadcast
``MessageQueue`` beside the anchors measured in the same run (figures B5
and B6 of the manual's benchmarks page, docs/benchmarks.md).

- B6: ``collective_rpc`` round trip, no-op method, small args, 2 workers (and
  1 for comparison), p50/p99, with the CPU the round trips burn; beside a
  ``multiprocessing.Pipe`` executor (one duplex pipe per worker, what
  vLLM's anchor measured) and vLLM's own ``MessageQueue`` when ``vllm`` is
  importable (the recorded anchor figures are in
  ``shared/anchors/vllm_mq_results.md``).
- B5 for the broadcast queue: CPU of a reader blocked in ``dequeue`` on an
  empty queue, and the wake-up latency (enqueue to dequeue's return) out of
  that idle state, per twin.
- One-way broadcast throughput (messages/s) to 1 and 2 readers, per twin,
  beside ``multiprocessing.Pipe`` fan-out.

Children are forked (``multiprocessing`` "fork" context: no resource-tracker
or server process is left behind); the executor starts its own workers.
"""
import importlib
import multiprocessing
import os
import time

from ._children import timed_block
from ._harness import TWIN_LABEL, TWINS, UNAVAILABLE, Figure, guard, load_twin, missing
from ._harness import idle_plan, idle_waiter_figures, per_twin, settle, summarize_samples

DESCRIPTION = ("executor: collective_rpc round trip (B6), broadcast queue idle reader (B5), "
               "one-way broadcast throughput")

TIMEOUT_S = 60.0  # any single wait on a child: a benchmark must fail, not hang

B6_NAME = "collective_rpc round trip, no-op, small args, {n} worker{s}"
B5_CPU_NAME = "MessageQueue reader idle in dequeue: CPU"
B5_WAKE_NAME = "MessageQueue wake-up out of idle (enqueue -> dequeue returns)"
TPUT_NAME = "one-way broadcast, small messages, {n} reader{s}"

_mono = time.clock_gettime_ns
_MONO = time.CLOCK_MONOTONIC


def _fork_ctx():
    return multiprocessing.get_context("fork")




_TICK = os.sysconf("SC_CLK_TCK")


def _machine_busy_s():
    """Non-idle CPU seconds of the whole machine (every process), from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return (sum(v) - v[3] - v[4]) / _TICK  # minus idle and iowait


def _cpu_s_of(pid):
    """user+system CPU seconds of a process (all threads), from /proc."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _vllm_reason():
    try:
        importlib.import_module("vllm.distributed.device_communicators.shm_broadcast")
    except Exception as exc:   # noqa: BLE001 - any failure means "cannot measure here"
        if isinstance(exc, ModuleNotFoundError) and (exc.name or "").startswith("vllm"):
            return "vllm not installed (recorded anchor: 44 µs p50 / 96 µs p99, 2 workers)"
        return f"vllm does not import: {type(exc).__name__}: {exc}"
    return ("vllm is importable: run shared/anchors/vllm_mq_bench.py with this Python "
            "for its figures (not re-implemented here)")


def run(ctx):
    figures = []
    for step in (bench_b6, bench_b5, bench_throughput):
        figures.extend(step(ctx))
    return figures


# -- B6: collective_rpc round trip ---------------------------------------------------

class NoopWorker:
    """The benchmark's worker class (imported by module path in the workers)."""

    def __init__(self, rank=0, world_size=1):
        self.rank = rank

    def noop(self, *args):
        return None


def _round_trips(call, rounds, warmup, pids):
    for _ in range(warmup):
        call()
    settle()
    lat = [0] * rounds
    clock = time.perf_counter_ns
    cpu0 = [_cpu_s_of(p) for p in pids]
    busy0 = _machine_busy_s()
    w0 = clock()
    for i in range(rounds):
        t0 = clock()
        call()
        lat[i] = clock() - t0
    wall = (clock() - w0) / 1e9
    cpu = sum(_cpu_s_of(p) for p in pids) - sum(cpu0)
    # What other processes on the machine used meanwhile: on 2 cores, one
    # busy neighbour changes every figure here (see the anchors' caveats).
    foreign = max(0.0, _machine_busy_s() - busy0 - cpu) / wall
    return [x / 1000.0 for x in lat], cpu, wall, foreign


def _b6_goal(impl, n):
    """B6's goal is for 2 workers; 1 worker is measured for comparison."""
    return "B6" if n == 2 and impl != "anchor" else None


def _b6_figure(label, impl, n, lat_us, cpu_s, wall_s, foreign):
    value, spread = summarize_samples(lat_us)
    s = "s" if n > 1 else ""
    fig = Figure("B6", B6_NAME.format(n=n, s=s), impl, label, "us", value, stat="p50",
                 spread=spread, trials=1, samples=len(lat_us), goal_id=_b6_goal(impl, n))
    fig.note = f"{cpu_s / wall_s:.2f} cores busy, foreign load {foreign:.2f} cores"
    fig.detail = {"cores_busy": cpu_s / wall_s, "cpu_us_per_round": cpu_s / len(lat_us) * 1e6,
                  "foreign_load_cores": foreign}
    return fig


def bench_b6(ctx):
    rounds = ctx.pick(20000, 3000, 200)
    warmup = ctx.pick(1000, 300, 20)
    sizes = ctx.pick((2, 1), (2, 1), (2,))
    ctx.log(f"B6: collective_rpc, {rounds} round trips per executor, {sizes} workers")
    figures = []
    for n in sizes:
        s = "s" if n > 1 else ""
        from ray_lite._fast import broadcast, ring
        impl = "compiled" if broadcast.COMPILED and ring.COMPILED else "python"
        label = f"ray_lite MultiprocExecutor ({'compiled' if impl == 'compiled' else 'pure Python'})"
        row = Figure("B6", B6_NAME.format(n=n, s=s), impl, label, "us",
                     goal_id=_b6_goal(impl, n))

        def ours(n=n, label=label, impl=impl):
            from ray_lite.executor import MultiprocExecutor
            ex = MultiprocExecutor(NoopWorker, world_size=n)
            try:
                lat, cpu, wall, foreign = _round_trips(
                    lambda: ex.collective_rpc("noop", args=(1, "a")),
                    rounds, warmup, [os.getpid()] + ex.worker_pids)
            finally:
                ex.shutdown()
            return [_b6_figure(label, impl, n, lat, cpu, wall, foreign)]
        figures.extend(guard(ours, row))

        base = Figure("B6", B6_NAME.format(n=n, s=s), "anchor", "multiprocessing.Pipe executor", "us")

        def pipe(n=n):
            ex = _PipeExecutor(n)
            try:
                lat, cpu, wall, foreign = _round_trips(lambda: ex.collective_rpc("noop", (1, "a")),
                                                       rounds, warmup, [os.getpid()] + ex.pids)
            finally:
                ex.close()
            return [_b6_figure("multiprocessing.Pipe executor", "anchor", n, lat, cpu, wall,
                               foreign)]
        figures.extend(guard(pipe, base))
        figures.append(missing("B6", B6_NAME.format(n=n, s=s), "anchor", "vLLM MessageQueue executor",
                               "us", UNAVAILABLE, _vllm_reason()))
    return figures


def _pipe_worker(conn):
    worker = NoopWorker()
    try:
        while True:
            msg = conn.recv()
            if msg is None:
                break
            method, args = msg
            conn.send(getattr(worker, method)(*args))
    except EOFError:
        pass


class _PipeExecutor:
    """The baseline: one duplex ``multiprocessing.Pipe`` per worker; a
    broadcast is a send on each pipe, then a recv from each."""

    def __init__(self, n):
        ctx = _fork_ctx()
        self.conns, self.procs = [], []
        for _ in range(n):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_pipe_worker, args=(child,), daemon=True)
            p.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(p)

    @property
    def pids(self):
        return [p.pid for p in self.procs]

    def collective_rpc(self, method, args):
        msg = (method, args)
        for c in self.conns:
            c.send(msg)
        return [c.recv() for c in self.conns]

    def close(self):
        for c in self.conns:
            try:
                c.send(None)
            except OSError:
                pass
        _join_all(self.procs)
        for c in self.conns:
            c.close()


def _join_all(procs, timeout=10.0):
    for p in procs:
        p.join(timeout)
        if p.is_alive():
            p.kill()  # our own child, by PID
            p.join(5.0)


# -- B5: idle reader -------------------------------------------------------------------

def _idle_reader(module_name, handle, rounds, conn):
    mod = importlib.import_module(module_name)
    q = mod.MessageQueue.attach(handle, 0)
    try:
        conn.send("ready")
        for _ in range(rounds):
            put_at, cpu, wall, woke = timed_block(lambda: q.dequeue(timeout=TIMEOUT_S))
            conn.send((cpu, wall, woke - put_at))
    finally:
        q.close()
        conn.close()


def bench_b5(ctx):
    idle_s, short_idle_s, short_rounds = idle_plan(ctx, smoke_idle_s=0.2)
    ctx.log(f"B5: MessageQueue idle reader, {idle_s:g} s idle then {short_rounds} x {short_idle_s:g} s, per twin")
    return per_twin("broadcast", _b5_rows, lambda mod, twin, label: _idle(
        mod, twin, label, idle_s, short_idle_s, short_rounds))


def _b5_rows(twin, label):
    return [Figure("B5", B5_CPU_NAME, twin, label, "%", goal_id="B5 cpu"),
            Figure("B5", B5_WAKE_NAME, twin, label, "us", goal_id="B5 wake")]


def _idle(mod, twin, label, idle_s, short_idle_s, short_rounds):
    rounds = 1 + short_rounds
    q = mod.MessageQueue(1, max_chunk_bytes=4096, max_chunks=4)
    ctx = _fork_ctx()
    parent, child = ctx.Pipe()
    p = ctx.Process(target=_idle_reader, args=(mod.__name__, q.export_handle(), rounds, child),
                    daemon=True)
    p.start()
    child.close()
    replies = []
    try:
        if not parent.poll(TIMEOUT_S) or parent.recv() != "ready":
            raise RuntimeError("the reader did not start")
        for k in range(rounds):
            # Sleeping, not polling: the writer must not take the core the
            # reader would need to show its own cost.
            time.sleep(idle_s if k == 0 else short_idle_s)
            q.enqueue(_mono(_MONO))
            # recv(), not poll() then recv(): the writer must block at once,
            # or the reader (often woken onto the writer's core) waits for it
            # and the figure measures our Python instead of the wake-up.
            # Bounded all the same: the reader gives up after TIMEOUT_S and
            # its exit ends recv() with EOFError.
            replies.append(parent.recv())
    finally:
        q.close()
        _join_all([p])
        parent.close()
    return idle_waiter_figures(replies, twin, label, B5_CPU_NAME, B5_WAKE_NAME)


# -- one-way broadcast throughput ---------------------------------------------------------

def _tput_reader(module_name, handle, rank, n, conn):
    mod = importlib.import_module(module_name)
    q = mod.MessageQueue.attach(handle, rank)
    try:
        conn.send("ready")
        q.dequeue(timeout=TIMEOUT_S)  # warm-up message
        conn.send("warm")
        last = None
        for _ in range(n):
            last = q.dequeue(timeout=TIMEOUT_S)
        conn.send((_mono(_MONO), last))
    finally:
        q.close()
        conn.close()


def _pipe_tput_reader(conn, n):
    conn.recv()
    conn.send("warm")
    last = None
    for _ in range(n):
        last = conn.recv()
    conn.send((_mono(_MONO), last))
    conn.close()


def bench_throughput(ctx):
    n_c = ctx.pick(200_000, 20_000, 1000)
    n_py = ctx.pick(20_000, 4_000, 300)
    ctx.log(f"throughput: {n_c} (compiled) / {n_py} (pure Python) messages to 1 and 2 readers")
    figures = []
    for readers in (1, 2):
        s = "s" if readers > 1 else ""
        name = TPUT_NAME.format(n=readers, s=s)
        for twin in TWINS:
            mod, why = load_twin("broadcast", twin)
            label = TWIN_LABEL[twin]
            if mod is None:
                figures.append(missing("tput", name, twin, label, "msg/s", *why))
                continue
            n = n_c if twin == "compiled" else n_py
            row = Figure("tput", name, twin, label, "msg/s")
            figures.extend(guard(lambda mod=mod, twin=twin, label=label, n=n, readers=readers:
                                  _tput_mq(mod, twin, label, name, readers, n), row))
        row = Figure("tput", name, "anchor", "multiprocessing.Pipe fan-out", "msg/s")
        figures.extend(guard(lambda readers=readers: _tput_pipe(name, readers, n_c), row))
        figures.append(missing("tput", name, "anchor", "vLLM MessageQueue", "msg/s", UNAVAILABLE,
                               _vllm_reason().replace(
                                   "44 µs p50 / 96 µs p99, 2 workers", "128k msg/s, 1 reader")))
    return figures


def _tput_mq(mod, twin, label, name, readers, n):
    q = mod.MessageQueue(readers, max_chunk_bytes=4096, max_chunks=64)
    ctx = _fork_ctx()
    conns, procs = [], []
    try:
        for rank in range(readers):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_tput_reader, args=(mod.__name__, q.export_handle(), rank, n, child),
                            daemon=True)
            p.start()
            child.close()
            conns.append(parent)
            procs.append(p)
        for c in conns:
            if not c.poll(TIMEOUT_S) or c.recv() != "ready":
                raise RuntimeError("a reader did not start")
        q.enqueue(("warm", -1))
        for c in conns:
            if not c.poll(TIMEOUT_S) or c.recv() != "warm":
                raise RuntimeError("a reader did not warm up")
        settle()
        enqueue = q.enqueue
        t0 = _mono(_MONO)
        for i in range(n):
            enqueue(("ping", i), TIMEOUT_S)
        ends = []
        for c in conns:
            if not c.poll(TIMEOUT_S):
                raise RuntimeError("a reader did not finish")
            end, last = c.recv()
            if last != ("ping", n - 1):
                raise RuntimeError(f"a reader ended with {last!r}")
            ends.append(end)
    finally:
        q.close()
        _join_all(procs)
        for c in conns:
            c.close()
    seconds = (max(ends) - t0) / 1e9
    rate = n / seconds
    fig = Figure("tput", name, twin, label, "msg/s", rate, stat="rate", trials=1, samples=n)
    fig.note = f"{seconds / n * 1e6:.2f} µs/msg"
    fig.detail = {"seconds": seconds, "messages": n}
    return [fig]


def _tput_pipe(name, readers, n):
    ctx = _fork_ctx()
    conns, procs = [], []
    try:
        for _ in range(readers):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_pipe_tput_reader, args=(child, n), daemon=True)
            p.start()
            child.close()
            conns.append(parent)
            procs.append(p)
        for c in conns:
            c.send(("warm", -1))
        for c in conns:
            if not c.poll(TIMEOUT_S) or c.recv() != "warm":
                raise RuntimeError("a reader did not warm up")
        settle()
        t0 = _mono(_MONO)
        for i in range(n):
            msg = ("ping", i)
            for c in conns:
                c.send(msg)
        ends = []
        for c in conns:
            if not c.poll(TIMEOUT_S):
                raise RuntimeError("a reader did not finish")
            end, last = c.recv()
            ends.append(end)
    finally:
        _join_all(procs)
        for c in conns:
            c.close()
    seconds = (max(ends) - t0) / 1e9
    fig = Figure("tput", name, "anchor", "multiprocessing.Pipe fan-out", "msg/s", n / seconds,
                 stat="rate", trials=1, samples=n)
    fig.note = f"{seconds / n * 1e6:.2f} µs/msg"
    return [fig]
