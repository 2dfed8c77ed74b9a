"""B22: the LLM-style server of ``examples/llm_server`` end to end
(``ray-lite bench llm [--compare-ray PYTHON]``).

N concurrent streaming clients (1, 16, 64), each one completion of a
32-token prompt and 128 output tokens, on two model sizes (``small``, a step
of about 1 ms, and ``medium``, about 10 ms): time to first token (TTFT)
p50/p99, inter-token latency (ITL, the gap between two chunks of a stream)
p50/p99, and output tokens/s of the whole load.  Beside ray_lite's server
(``python -m llm_server serve``), in interleaved rounds:

- the floor: the same engine loop and model in one process, no runtime and
  no HTTP (its shards computed one after the other), with the step's wall
  time and the compute of the slower shard, which is what each step of the
  two parallel workers costs at least;
- the hand-written server: the same FastAPI app on one uvicorn process, the
  two shards in ``multiprocessing`` processes over pipes;
- with ``--compare-ray``, Ray Serve running the same application (the Ray
  backend, ``RAY_LITE_BACKEND=ray``).

Where one token's time goes: with the first model size, each HTTP server
also serves one stream whose chunks carry the timestamps of its tokens'
way (the example's ``ray_lite_timing``, all ``perf_counter_ns`` of one
machine), and the suite reports the median microseconds of each stage, from
the engine's step to the client's read.

The example ships in the package (``ray_lite._examples.llm_server``; the
checkout's ``examples/llm_server`` imports it), so the suite runs from an
installed wheel as from the checkout.
"""
import importlib.util
import os
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from .._private.process.boot import python_argv
from ._harness import ERROR, UNAVAILABLE, Figure, missing, percentile
from ._procs import kill_survivors, tree_cpu_s, tree_snapshot
from ._servers import free_port

DESCRIPTION = ("LLM server end to end (B22): TTFT, ITL, tokens/s at 1/16/64 streams, "
               "beside the one-process floor, a hand-written server and Ray Serve")

#: The example's package: the servers run ``python -m`` it.
APP = "ray_lite._examples.llm_server"
#: Model sizes measured (``llm_server.model.SIZES``) and the step they stand for.
STEP_OF = {"small": "~1 ms step", "medium": "~10 ms step", "tiny": "~0.1 ms step"}
FLOOR = "floor: one process, no runtime"
HANDWRITTEN = "hand-written: uvicorn + pipes"
RAY = "Ray Serve"


def _sizes(ctx):
    return {"models": ctx.pick(("small", "medium"), ("tiny",), ("tiny",)),
            "streams": ctx.pick((1, 16, 64), (1, 8), (2,)),
            "prompt": ctx.pick(32, 32, 8), "tokens": ctx.pick(128, 32, 24),
            "rounds": ctx.pick(3, 1, 1), "loads": ctx.pick(2, 1, 1),
            # The timed stream is long enough that some of its tokens come
            # after its first chunk even when a busy machine holds the ingress
            # back and the engine hands the rest over as one batch (beside
            # two CPU hogs: 2 streams of 30 in one chunk with 8 tokens; none
            # of 30 with 32).
            "timed_tokens": ctx.pick(128, 64, 32), "first_timed": ctx.pick(8, 4, 2)}


#: Streams of the warm-up load of each HTTP server.
WARM_UP_STREAMS = 8


def _loads(sz, n):
    """Loads of ``n`` streams a round: more of one stream, whose one
    request a load is the only sample of its time to first token."""
    return sz["loads"] * (4 if n == 1 else 1)


def _env():
    # The children import the ray_lite this process runs.
    env = dict(os.environ, RAY_AUTH_MODE="disabled")
    env.pop("RAY_LITE_BACKEND", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return env


def _ray_env(python, shim_dir):
    """The environment of the Ray server: this ray_lite (and cloudpickle) on
    its path when ``python`` lacks them, and the Ray backend."""
    probe = subprocess.run([python, "-c", "import ray_lite, cloudpickle"],
                           capture_output=True, timeout=120)
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_LITE_BACKEND="ray",
               OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    path = []
    if probe.returncode != 0:
        import cloudpickle

        import ray_lite
        for mod in (ray_lite, cloudpickle):
            pkg = os.path.dirname(mod.__file__)
            link = os.path.join(shim_dir, os.path.basename(pkg))
            if not os.path.exists(link):
                os.symlink(pkg, link)
        path.append(shim_dir)
    if path:
        env["PYTHONPATH"] = os.pathsep.join(path)
    else:
        env.pop("PYTHONPATH", None)
    return env


class _Server:
    """``python -m ray_lite._examples.llm_server MODE`` in a session of its
    own, until stopped."""

    def __init__(self, python, mode, size, streams, env, cwd):
        self.port = free_port()
        self.err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [python, "-m", APP, mode, "--port", str(self.port), "--size", size,
             "--max-running", str(max(streams)), "--max-waiting", "256"],
            cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=self.err,
            stdin=subprocess.DEVNULL, start_new_session=True)

    def wait_ready(self, timeout):
        deadline = time.monotonic() + timeout
        line = b""
        while not line.startswith(b"READY"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.err.seek(0)
                raise RuntimeError(f"the server did not start: "
                                   f"{self.err.read().decode(errors='replace')[-600:]}")
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.5)
            if ready:
                line = self.proc.stdout.readline()

    def stop(self):
        tree = tree_snapshot(self.proc.pid)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        kill_survivors(tree)
        self.proc.stdout.close()
        self.err.close()


def _measured_load(srv, n, sz):
    """One load of ``n`` streams, with ``cpu_s``: the CPU time that every
    process of the server took meanwhile (the client is not one of them)."""
    from ._llm_load import http_load
    cpu = tree_cpu_s(srv.proc.pid)
    load = http_load(srv.port, n, sz["prompt"], sz["tokens"])
    load["cpu_s"] = tree_cpu_s(srv.proc.pid) - cpu
    return load


def _http_contender(python, mode, env, sz, size, cwd):
    """Every load of ``sz`` on a fresh server: {streams: [summary, ...]},
    and with the first model size "timed": one timed stream's summary, with
    the first tokens' stamps of ``first_timed`` requests."""
    from ._llm_load import http_load
    srv = _Server(python, mode, size, sz["streams"], env, cwd)
    try:
        srv.wait_ready(600)
        # Warm-up: enough connections that every process taking them (each
        # ingress replica of ray_lite's) has served one and opened its links.
        http_load(srv.port, WARM_UP_STREAMS, sz["prompt"], 4)
        out = {}
        warmed = False
        for n in sz["streams"]:
            if n > 1 and not warmed:
                warmed = True
                # Before the first load of several streams, one whole load of
                # the most, unmeasured, so that each is measured in the steady
                # state: the model's first batches of a new size take more CPU
                # (the C allocator's mmap threshold and the pages of the KV
                # cache and of its temporaries settle as they first come).  The
                # one-stream loads come first: their one request, the time to
                # first token of a lone client, is not measured in the wake
                # of a burst.
                http_load(srv.port, max(sz["streams"]), sz["prompt"], sz["tokens"])
            out[n] = [_measured_load(srv, n, sz) for _ in range(_loads(sz, n))]
        if size == sz["models"][0]:
            timed = out["timed"] = http_load(srv.port, 1, sz["prompt"], sz["timed_tokens"],
                                             timed=True)
            for _ in range(sz["first_timed"] - 1):     # more first tokens (one a request)
                timed["first_stamps"] += http_load(srv.port, 1, sz["prompt"], 2,
                                                   timed=True)["first_stamps"]
        return out
    finally:
        srv.stop()


def _floor(sz, size, cwd):
    import json
    out = {}
    for n in sz["streams"]:
        cmd = python_argv("from ray_lite.bench._llm_load import floor_main; floor_main()",
                          "B22 floor", sys_path=sys.path) + [
            size, str(n), str(sz["prompt"]), str(sz["tokens"]), str(_loads(sz, n))]
        run = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=1200,
                             cwd=cwd)
        line = next((ln for ln in run.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            raise RuntimeError(f"the floor failed ({run.returncode}): {run.stderr[-600:]}")
        out[n] = json.loads(line[7:])
    return out


def _contenders(ctx, shim_dir):
    """(key, impl, label, measure(sz, size))."""
    # The children run in a directory of their own: what they import comes
    # from the installed package (or this process's path), never the cwd.
    rows = [("floor", "ceiling", FLOOR, lambda sz, size: _floor(sz, size, shim_dir)),
            ("ray_lite", "ray_lite", "ray_lite", lambda sz, size: _http_contender(
                sys.executable, "serve", _env(), sz, size, shim_dir)),
            ("handwritten", "anchor", HANDWRITTEN, lambda sz, size: _http_contender(
                sys.executable, "handwritten", _env(), sz, size, shim_dir))]
    if ctx.compare_ray:
        rows.append(("ray", "anchor", RAY, lambda sz, size: _http_contender(
            ctx.compare_ray, "serve", _ray_env(ctx.compare_ray, shim_dir), sz, size,
            shim_dir)))
    return rows


def _name(size, n, what):
    streams = "1 stream" if n == 1 else f"{n} streams"
    return f"LLM server, {size} model ({STEP_OF.get(size, size)}), {streams}: {what}"


def _figures(size, n, impl, label, loads, goal_ids):
    """The tokens/s, TTFT and ITL rows of one contender, from every round's loads."""
    rates = [load["tokens_per_s"] for load in loads]
    ttft = sorted(1000 * t for load in loads for t in load["ttft_s"])
    itl = sorted(1000 * g for load in loads for g in load["itl_s"])
    figs = [Figure("B22", _name(size, n, "output tokens/s"), impl, label, "tokens/s",
                   statistics.median(rates), spread={"min": min(rates), "max": max(rates)},
                   trials=len(rates), samples=sum(load["tokens"] for load in loads)),
            Figure("B22", _name(size, n, "time to first token"), impl, label, "ms",
                   percentile(ttft, 50), stat="p50", spread={"p99": percentile(ttft, 99)},
                   trials=len(loads), samples=len(ttft)),
            Figure("B22", _name(size, n, "inter-token latency"), impl, label, "ms",
                   percentile(itl, 50) if itl else None, stat="p50",
                   spread={"p99": percentile(itl, 99)} if itl else {},
                   trials=len(loads), samples=len(itl))]
    if n > 1 and all("cpu_s" in load for load in loads):
        # What a token costs in CPU on all cores together: on a machine whose
        # cores are all busy, tokens/s is the cores' CPU seconds over it.
        per_token = [1e6 * load["cpu_s"] / load["tokens"] for load in loads]
        figs.append(Figure("B22", _name(size, n, "CPU per output token, all the server's "
                                                   "processes"), impl, label, "us",
                           statistics.median(per_token),
                           spread={"min": min(per_token), "max": max(per_token)},
                           trials=len(per_token), samples=sum(load["tokens"] for load in loads)))
    if "step_s" in loads[0]:
        steps = sorted(1000 * s for load in loads for s in load["step_s"])
        shards = sorted(1000 * s for load in loads for s in load["shard_s"])
        figs[0].detail = {"step_ms_p50": percentile(steps, 50),
                          "slower_shard_compute_ms_p50": percentile(shards, 50)}
        figs.append(Figure("B22", _name(size, n, "engine step (all shards) and one shard's "
                                                   "compute"), impl, label, "ms",
                           percentile(steps, 50), stat="p50",
                           spread={"p99": percentile(steps, 99),
                                   "shard p50": percentile(shards, 50)},
                           trials=len(loads), samples=len(steps)))
    if impl == "ray_lite":
        # One row per goal: each goal is a factor over another row.
        base = figs[0]
        for goal_id, what in goal_ids:
            figs.append(Figure("B22", base.name, impl, f"ray_lite ({what})", base.unit,
                               base.value, spread=base.spread, trials=base.trials,
                               samples=base.samples, goal_id=goal_id))
    return figs


def _breakdown_rows(size, per_round, contenders):
    """One row per stage of a token's way and per HTTP server: the median
    µs over the timed stream's tokens of every round; then the same for
    the way of a request to its first token."""
    from ._llm_load import FIRST_STAGES, STAGES, stages
    figs = []
    for what, key_of_stamps, table, none in (
            ("one token's way", "stamps", STAGES,
             "every token of the timed stream came in its first chunk: no token's way to time"),
            ("first token's way", "first_stamps", FIRST_STAGES,
             "no first chunk carried its timestamps")):
        timed = {key: [s for r in rounds if "timed" in r for s in r["timed"][key_of_stamps]]
                 for key, rounds in per_round.items()}
        for key, impl, label, _ in contenders:
            if any("timed" in r for r in per_round[key]) and not stages(timed[key], table):
                figs.append(missing("B22", f"{what}, {size} model, 1 stream", impl, label,
                                    "us", ERROR, none))
        for stage, _, _ in table:
            for key, impl, label, _ in contenders:
                values = sorted(stages(timed.get(key) or [], table).get(stage, ()))
                if not values:
                    continue
                figs.append(Figure("B22", f"{what}, {size} model, 1 stream: {stage}",
                                   impl, label, "us", percentile(values, 50), stat="p50",
                                   spread={"p90": percentile(values, 90)},
                                   trials=sum("timed" in r for r in per_round[key]),
                                   samples=len(values)))
    return figs


def _latency_goal_rows(size, results, sz, contenders):
    """ITL p99 and TTFT p50 of ray_lite over the floor's step and TTFT, and
    the same of every other contender (the floor's own included: what the
    model alone gives against the same mark)."""
    figs = []
    floor = results.get("floor")
    if not floor or not results.get("ray_lite"):
        return figs
    top, low = max(sz["streams"]), min(sz["streams"])
    step = percentile(sorted(1000 * s for load in floor[top] for s in load["step_s"]), 50)
    f_ttft = percentile(sorted(1000 * t for load in floor[low] for t in load["ttft_s"]), 50)
    for key, impl, label, _ in contenders:
        loads = results.get(key)
        if not loads:
            continue
        goal = "B22 itl" if key == "ray_lite" else None
        itl = sorted(1000 * g for load in loads[top] for g in load["itl_s"])
        name = _name(size, top, "ITL p99 less the floor's step")
        if itl:
            figs.append(Figure("B22", name, impl, label, "ms", percentile(itl, 99) - step,
                               stat="p99", goal_id=goal, detail={"floor_step_ms": step}))
        else:
            figs.append(missing("B22", name, impl, label, "ms", ERROR,
                                "no inter-token gap: each stream's tokens came in one chunk",
                                goal_id=goal))
        if key == "floor":
            continue
        ttft = percentile(sorted(1000 * t for load in loads[low] for t in load["ttft_s"]), 50)
        figs.append(Figure("B22", _name(size, low, "TTFT p50 less the floor's"), impl, label,
                           "ms", ttft - f_ttft, stat="p50",
                           goal_id="B22 ttft" if key == "ray_lite" else None,
                           detail={"floor_ttft_ms": f_ttft}))
    return figs


def run(ctx):
    absent = [m for m in ("numpy", "fastapi", "uvicorn") if importlib.util.find_spec(m) is None]
    if absent:
        return [missing("B22", "LLM server end to end", "ray_lite", "ray_lite", "tokens/s",
                        UNAVAILABLE, f"needs {', '.join(absent)} (pip install "
                        f"{' '.join(absent)})")]
    sz = _sizes(ctx)
    figs = []
    with tempfile.TemporaryDirectory(prefix="ray_lite_b22_") as shim_dir:
        contenders = _contenders(ctx, shim_dir)
        for size in sz["models"]:
            per_round = {key: [] for key, *_ in contenders}
            errors = {}
            for i in range(sz["rounds"]):
                for key, impl, label, measure in contenders:
                    if key in errors:
                        continue
                    ctx.log(f"llm: {size} model, round {i + 1}/{sz['rounds']}: {label}")
                    try:
                        per_round[key].append(measure(sz, size))
                    except Exception as exc:   # noqa: BLE001 - a row, not a crash
                        errors[key] = f"{type(exc).__name__}: {exc}"
            results = {key: {n: [load for r in rounds for load in r[n]] for n in sz["streams"]}
                       for key, rounds in per_round.items() if rounds}
            goals_here = size == sz["models"][0]
            goal_ids = [("B22 floor", "vs the floor"), ("B22 hand-written", "vs hand-written")]
            if ctx.compare_ray:
                goal_ids.append(("B22 ray", "vs Ray"))
            for n in sz["streams"]:
                for key, impl, label, _ in contenders:
                    if key in results:
                        top = goals_here and n == max(sz["streams"])
                        figs += _figures(size, n, impl, label, results[key][n],
                                         goal_ids if top else ())
                    else:
                        figs.append(missing("B22", _name(size, n, "output tokens/s"), impl,
                                            label, "tokens/s", ERROR,
                                            errors.get(key, "not measured")))
            if goals_here:
                figs += _latency_goal_rows(size, results, sz, contenders)
                figs += _breakdown_rows(size, per_round, contenders)
    return figs


def compare_ray(ctx, python):
    """Nothing apart: with ``--compare-ray`` Ray Serve serves the same
    application in ``run``'s own rounds."""
    return []
