"""The ``micro`` suite: the three hot paths on their own, each twin beside
the anchors measured in the same run (figures B3, B4, B5, B12 of the
manual's benchmarks page, docs/benchmarks.md, which explains each row).

The twins are imported directly (``ray_lite._fast._x_c`` / ``_x_py``), not
through ``ray_lite._fast.x``, so both are measured whatever the selector
picked; a compiled twin that is not built shows as a "not built" row.
"""
import gc
import importlib
import statistics
import struct
import time
import timeit

from . import _children
from ._harness import (
    ERROR,
    NOT_BUILT,
    OK,
    TWIN_LABEL,
    TWINS,
    UNAVAILABLE,
    ChildProcess,
    Figure,
    guard,
    idle_plan,
    idle_waiter_figures,
    load_twin,
    missing,
    ns_per_call,
    per_twin,
    settle,
    summarize_samples,
    summarize_trials,
)

DESCRIPTION = "hot paths alone: stream table (B3), ring round trip (B4), idle waiter (B5), codec (B12)"

# Generous bounds on any single wait on a child: a benchmark must fail, not hang.
STARTUP_TIMEOUT_S = 60.0     # a spawned interpreter importing ray_lite on a loaded machine
MESSAGE_TIMEOUT_S = 30.0


def run(ctx):
    figures = []
    for bench_id, step in (("B3", bench_b3), ("B4", bench_b4), ("B5", bench_b5),
                           ("B12", bench_b12)):
        if ctx.only is None or bench_id in ctx.only:
            figures.extend(step(ctx))
    return figures


# -- B3: stream-table ready-check ---------------------------------------------------

# The stream table alone: B3's goal is judged on the workload it states,
# next(gen) + get(ref) through the API (the core suite); these rows have none.
B3_NAME = "try_next() of a reported item"
B3_FILL = """
t = StreamTable()
for i in range(N):
    t.report(i, i)
tn = t.try_next
"""


def bench_b3(ctx):
    # The table holds N reported items (a few hundred KiB at most: in cache,
    # as a stream being consumed is); each timed call takes one.
    n = ctx.pick(20000, 10000, 1000)
    trials = ctx.pick(15, 7, 2)
    ctx.log(f"B3: stream table, {trials} trials x {n} calls per twin")
    figures = []
    for twin in TWINS:
        mod, why = load_twin("stream_table", twin)
        if mod is None:
            figures.append(missing("B3", B3_NAME, twin, TWIN_LABEL[twin], "ns", *why))
            figures.append(missing("B3", "report(i, payload), in order", twin, TWIN_LABEL[twin],
                                   "ns", *why))
            continue
        g = {"StreamTable": mod.StreamTable, "N": n}
        settle()
        per_call = ns_per_call("tn()", B3_FILL, globals=g, number=n, trials=trials)
        value, spread = summarize_trials(per_call)
        figures.append(Figure("B3", B3_NAME, twin, TWIN_LABEL[twin], "ns", value, spread=spread,
                              trials=trials, samples=trials * n))
        per_report = ns_per_call("rep(i, None); i += 1",
                                 "t = StreamTable(); rep = t.report; i = 0",
                                 globals=g, number=n, trials=trials)
        value, spread = summarize_trials(per_report)
        figures.append(Figure("B3", "report(i, payload), in order", twin, TWIN_LABEL[twin], "ns",
                              value, spread=spread, trials=trials, samples=trials * n))
    # How much of the figure is the Python call itself: a builtin method that
    # does nothing, called the same way.
    per_call = ns_per_call("f()", "f = (1).bit_length", number=n, trials=trials)
    value, spread = summarize_trials(per_call)
    figures.append(Figure("B3", "a no-op builtin method call, same loop", "anchor",
                          "int.bit_length()", "ns", value, spread=spread, trials=trials,
                          samples=trials * n))
    return figures


# -- B4: ring round trip ---------------------------------------------------------

B4_NAME = "round trip, 1-byte message, 2 processes"
B4_MESSAGE = b"x"


class RingPair:
    """Two rings to a spawned child (``to_child``: we produce; ``to_parent``:
    we consume), made by this process, so they are unlinked when we close
    them whatever the child did."""

    def __init__(self, ring_module, target, extra_args=(), capacity=1 << 16):
        mod = importlib.import_module(ring_module)
        self.mod = mod
        self.to_child = mod.ShmRing.create(capacity, side="producer")
        self.to_parent = None
        self.child = None
        try:
            self.to_parent = mod.ShmRing.create(capacity, side="consumer")
            self.child = ChildProcess(target, (ring_module, self.to_child.name,
                                               self.to_parent.name) + tuple(extra_args))
            self.child.start()
            ready = self._first_message()
            if ready != _children.READY:
                raise RuntimeError(f"unexpected first message from the child: {ready!r}")
        except BaseException:
            self.close(graceful=False)
            raise

    def _first_message(self):
        # Until the child attaches, the ring cannot know it died: wait in
        # slices and look at the process between them.
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            try:
                return self.to_parent.get(timeout=0.05)
            except TimeoutError:
                if not self.child.is_alive():
                    raise RuntimeError(
                        f"the benchmark child exited with code {self.child.process.exitcode} "
                        "before attaching its rings") from None
                if time.monotonic() > deadline:
                    raise

    def close(self, graceful=True):
        if graceful and self.child is not None and self.child.is_alive():
            try:
                self.to_child.put_bytes(_children.STOP, timeout=1.0)
            except Exception:   # noqa: BLE001 - closing below ends it anyway
                pass
        for ring in (self.to_child, self.to_parent):
            if ring is not None:
                ring.close()
        if self.child is not None:
            self.child.stop(timeout=10.0 if graceful else 2.0)


def _trials(trials, one_trial):
    """``(samples of every trial, each trial's p50)``; ``one_trial()``
    returns one trial's samples.  The collector runs between trials."""
    samples, p50s = [], []
    for _ in range(trials):
        settle()
        trial = one_trial()
        p50s.append(statistics.median(trial))
        samples.extend(trial)
    return samples, p50s


def ring_round_trips(ring_module, n, trials, warmup):
    """Per-round-trip ns samples (and per-trial p50s) through a ring pair."""
    pair = RingPair(ring_module, _children.ring_echo)
    try:
        put, get = pair.to_child.put_bytes, pair.to_parent.get
        timeout = MESSAGE_TIMEOUT_S
        for _ in range(warmup):
            put(B4_MESSAGE, timeout)
            get(timeout)

        # Everything the loop touches is a local (default arguments), as fast
        # to reach as in a loop written inline.
        def one_trial(put=put, get=get, msg=B4_MESSAGE, timeout=timeout,
                      clock=time.perf_counter_ns, n=n):
            trial = []
            for _ in range(n):
                t0 = clock()
                put(msg, timeout)
                get(timeout)
                trial.append(clock() - t0)
            return trial
        return _trials(trials, one_trial)
    finally:
        pair.close()


def pipe_round_trips(n, trials, warmup):
    import multiprocessing
    parent_end, child_end = multiprocessing.get_context("spawn").Pipe()
    child = ChildProcess(_children.pipe_echo, (child_end,))
    try:
        child.start()
        child_end.close()
        send, recv = parent_end.send_bytes, parent_end.recv_bytes
        send(B4_MESSAGE)
        # The first answer waits for the child to start; later ones cannot
        # hang: a dead child makes recv raise EOFError.
        if not parent_end.poll(STARTUP_TIMEOUT_S):
            raise TimeoutError("the Pipe echo child did not answer")
        recv()
        for _ in range(warmup):
            send(B4_MESSAGE)
            recv()

        def one_trial(send=send, recv=recv, msg=B4_MESSAGE, clock=time.perf_counter_ns, n=n):
            trial = []
            for _ in range(n):
                t0 = clock()
                send(msg)
                recv()
                trial.append(clock() - t0)
            return trial
        result = _trials(trials, one_trial)
        send(_children.STOP)
        return result
    finally:
        parent_end.close()
        child.stop(timeout=10.0)


def _latency_figure(bench, name, impl, label, samples_ns, p50s_ns, trials, goal_id=None):
    us = [s / 1000.0 for s in samples_ns]
    value, spread = summarize_samples(us, [p / 1000.0 for p in p50s_ns])
    fig = Figure(bench, name, impl, label, "us", value, stat="p50", spread=spread,
                 trials=trials, samples=len(us), goal_id=goal_id)
    fig.detail["mean"] = statistics.fmean(us)
    return fig


def bench_b4(ctx):
    n = ctx.pick(20000, 4000, 300)
    trials = ctx.pick(5, 3, 2)
    warmup = ctx.pick(2000, 500, 50)
    ctx.log(f"B4: ring round trip, {trials} trials x {n} round trips per twin, and anchors")

    def measure(mod, twin, label):
        samples, p50s = ring_round_trips(mod.__name__, n, trials, warmup)
        return [_latency_figure("B4", B4_NAME, twin, label, samples, p50s, trials,
                                goal_id="B4")]
    figures = per_twin("ring", lambda twin, label: [Figure("B4", B4_NAME, twin, label, "us",
                                                           goal_id="B4")], measure)

    row = Figure("B4", B4_NAME, "anchor", "multiprocessing.Pipe send_bytes/recv_bytes", "us")

    def measure_pipe():
        samples, p50s = pipe_round_trips(n, trials, warmup)
        return [_latency_figure("B4", B4_NAME, "anchor", row.label, samples, p50s, trials)]
    figures.extend(guard(measure_pipe, row))
    figures.extend(_ring_c_level(ctx))
    figures.extend(_spin_floor(ctx))
    return figures


def _ring_c_level(ctx):
    """The compiled ring's round trip driven from C (the ring helper's
    ``_ringbench_c``), no Python in the loop."""
    name = "ray_lite.bench._ringbench_c"
    label = "compiled ring driven from C (no Python in the loop)"
    try:
        rb = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:
            return [missing("B4", B4_NAME, "C", label, "us", ERROR, f"{type(exc).__name__}: {exc}")]
        return [missing("B4", B4_NAME, "C", label, "us", NOT_BUILT, f"{name} is not built")]
    except Exception as exc:   # noqa: BLE001
        return [missing("B4", B4_NAME, "C", label, "us", ERROR, f"{type(exc).__name__}: {exc}")]
    measure = getattr(rb, "c_round_trips", None)
    if measure is None:
        return [missing("B4", B4_NAME, "C", label, "us", UNAVAILABLE,
                        f"{name} has no c_round_trips()")]
    n = ctx.pick(200000, 50000, 2000)
    trials = ctx.pick(5, 3, 1)     # each trial starts a child interpreter
    row = Figure("B4", B4_NAME, "C", label, "us")

    def run_c():
        samples, p50s = _trials(trials, lambda: list(
            measure(n, size=len(B4_MESSAGE), timeout=MESSAGE_TIMEOUT_S)))
        return [_latency_figure("B4", B4_NAME, "C", label, samples, p50s, trials)]
    return guard(run_c, row)


def _spin_floor(ctx):
    name = "ray_lite.bench._floor_c"
    label = "machine floor: 2 processes spinning on one cache line (C)"
    try:
        floor = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        status = NOT_BUILT if exc.name == name else ERROR
        return [missing("B4", B4_NAME, "C", label, "us", status,
                        f"{name} is not built" if status == NOT_BUILT else str(exc))]
    n = ctx.pick(1_000_000, 200_000, 10_000)
    trials = ctx.pick(5, 3, 1)
    row = Figure("B4", B4_NAME, "C", label, "us")

    def run_floor():
        floor.spin_round_trips(max(n // 10, 1000))          # warm-up
        samples, p50s = _trials(trials, lambda: list(
            floor.spin_round_trips(n, block=1000, timeout_s=30.0)))
        fig = _latency_figure("B4", B4_NAME, "C", label, samples, p50s, trials)
        fig.note = "samples are block means"
        return [fig]
    return guard(run_floor, row)


# -- B5: an idle waiter ------------------------------------------------------------

B5_CPU_NAME = "CPU of a consumer blocked in get() on an empty ring"
B5_WAKE_NAME = "wake-up from idle: put() to get() returning"
_WAKE = struct.Struct("<q")
_WAKE_REPLY = struct.Struct("<qqq")


def bench_b5(ctx):
    idle_s, short_idle_s, short_rounds = idle_plan(ctx, smoke_idle_s=0.1)
    ctx.log(f"B5: idle waiter, {idle_s:g} s idle then {short_rounds} x {short_idle_s:g} s, per twin")
    return per_twin("ring", b5_rows, lambda mod, twin, label: idle_waiter(
        mod.__name__, twin, label, idle_s, short_idle_s, short_rounds))


def b5_rows(twin, label):
    """The two rows of B5 (CPU while idle, wake-up) for one twin."""
    return [Figure("B5", B5_CPU_NAME, twin, label, "%", goal_id="B5 cpu"),
            Figure("B5", B5_WAKE_NAME, twin, label, "us", goal_id="B5 wake")]


def idle_waiter(ring_module, twin, label, idle_s, short_idle_s, short_rounds):
    rounds = 1 + short_rounds
    pair = RingPair(ring_module, _children.ring_idle_waiter, (rounds,))
    try:
        replies = []
        for k in range(rounds):
            # Sleeping, not polling: the parent must not steal the core the
            # waiter would need to show its own cost.
            time.sleep(idle_s if k == 0 else short_idle_s)
            pair.to_child.put_bytes(_WAKE.pack(time.clock_gettime_ns(time.CLOCK_MONOTONIC)),
                                    timeout=MESSAGE_TIMEOUT_S)
            reply = pair.to_parent.get(timeout=MESSAGE_TIMEOUT_S)
            replies.append(_WAKE_REPLY.unpack(reply))
    finally:
        pair.close()
    return idle_waiter_figures(replies, twin, label, B5_CPU_NAME, B5_WAKE_NAME)


# -- B12: codec -----------------------------------------------------------------------

B12_OBJECTS = {
    '"hello"': "hello",
    "small dict": {"token": "hello", "index": 17, "logprob": -0.25},
    "1 KiB bytes": b"x" * 1024,
}


class _CodecCase:
    """One implementation's encode and decode loops over one object."""

    def __init__(self, row, key, g, enc_stmt, dec_stmt, setup, number):
        self.row, self.key, self.number = row, key, number
        self.enc = timeit.Timer(enc_stmt, setup, timer=time.perf_counter_ns, globals=g)
        self.dec = timeit.Timer(dec_stmt, setup, timer=time.perf_counter_ns, globals=g)
        self.enc_ns, self.dec_ns = [], []

    def trial(self):
        self.enc_ns.append(self.enc.timeit(self.number) / self.number)
        self.dec_ns.append(self.dec.timeit(self.number) / self.number)


def _time_interleaved(cases, trials):
    """Time every case's trials in turn (case 1 trial 1, case 2 trial 1, ...),
    so that load from elsewhere on the machine falls on all of them alike and
    their ratios stay meaningful.  A case that raises becomes an error row."""
    live = []
    for case in cases:
        try:
            case.trial()                  # warm-up, untimed; also checks it runs
            case.enc_ns.clear()
            case.dec_ns.clear()
            live.append(case)
        except Exception as exc:   # noqa: BLE001 - reported in its row
            case.row.status = ERROR
            case.row.reason = f"{type(exc).__name__}: {exc}"
    gc_was_enabled = gc.isenabled()
    gc.disable()      # as timeit does, but across the whole interleaved run
    try:
        for _ in range(trials):
            for case in live:
                case.trial()
    finally:
        if gc_was_enabled:
            gc.enable()
    measured = {}
    for case in live:
        total = [e + d for e, d in zip(case.enc_ns, case.dec_ns)]
        row = case.row
        row.value, row.spread = summarize_trials(total)
        row.trials, row.samples = trials, trials * case.number
        enc, dec = statistics.median(case.enc_ns), statistics.median(case.dec_ns)
        row.detail = {"encode": enc, "decode": dec}
        row.note = f"enc {enc:.0f} + dec {dec:.0f}"
        measured[case.key] = (enc, dec)
    return measured


def bench_b12(ctx):
    number = ctx.pick(100000, 20000, 1000)
    trials = ctx.pick(7, 3, 2)
    ctx.log(f"B12: codec, {trials} interleaved trials x {number} calls per object and "
            f"implementation")
    import pickle

    import msgpack
    try:
        import msgspec
    except ImportError:
        msgspec = None

    # (impl, label, globals, encode statement, decode statement, setup); setup
    # makes `data` (what the decoder reads) outside the timed loop.
    anchors = [
        ("anchor", "msgpack packb/unpackb", {"packb": msgpack.packb, "unpackb": msgpack.unpackb},
         "packb(obj)", "unpackb(data)", "data = packb(obj)"),
        ("anchor", "pickle dumps/loads (protocol 5)",
         {"dumps": pickle.dumps, "loads": pickle.loads},
         "dumps(obj, 5)", "loads(data)", "data = dumps(obj, 5)"),
    ]
    if msgspec is not None:
        anchors.append(("anchor", "msgspec.msgpack encode/decode",
                        {"encode": msgspec.msgpack.encode, "decode": msgspec.msgpack.decode},
                        "encode(obj)", "decode(data)", "data = encode(obj)"))
    figures = []
    for obj_name, obj in B12_OBJECTS.items():
        name = f"encode+decode {obj_name}"
        rows, cases = [], []
        for twin in TWINS:
            mod, why = load_twin("codec", twin)
            label = TWIN_LABEL[twin] + " encode_into/decode"
            if mod is None:
                rows.append(missing("B12", name, twin, label, "ns", *why, goal_id="B12"))
                continue
            # Into and out of a preallocated buffer, as into a ring slot; the
            # decoder reads a memoryview of it.
            g = {"enc": mod.encode_into, "dec": mod.decode, "obj": obj, "buf": bytearray(4096)}
            setup = "end, bufs = enc(obj, buf, 0); data = memoryview(buf)[:end]"
            row = Figure("B12", name, twin, label, "ns", goal_id="B12")
            rows.append(row)
            # The pure twin is ~30x slower: fewer calls keep its trials short.
            n = number if twin == "compiled" else max(number // 20, 100)
            cases.append(_CodecCase(row, twin, g, "enc(obj, buf, 0)", "dec(data, bufs)", setup, n))
        for impl, label, g, enc_stmt, dec_stmt, setup in anchors:
            row = Figure("B12", name, impl, label, "ns")
            rows.append(row)
            cases.append(_CodecCase(row, label, dict(g, obj=obj), enc_stmt, dec_stmt, setup,
                                    number))
        measured = _time_interleaved(cases, trials)
        if msgspec is None:
            rows.append(missing("B12", name, "anchor", "msgspec.msgpack encode/decode", "ns",
                                UNAVAILABLE, "msgspec not installed (optional)"))
        _judge_b12(rows, measured)
        figures.extend(rows)
    return figures


def _judge_b12(rows, measured):
    """Each twin's encode and decode beside the anchors' (the verdict, over
    msgspec's encode+decode, is :mod:`._goals`'s)."""
    packb = measured.get("msgpack packb/unpackb")
    msgspec = measured.get("msgspec.msgpack encode/decode")
    for row in rows:
        if row.status != OK or row.impl not in TWINS:
            continue
        enc, dec = row.detail["encode"], row.detail["decode"]
        if packb is not None:
            row.detail["packb_over_encode"] = packb[0] / enc
        if msgspec is not None:
            row.detail["over_msgspec"] = (enc + dec) / (msgspec[0] + msgspec[1])
