"""`ray-lite bench`: the harness runs every workload and reports it in the
documented structure.  No timing is asserted: benchmarks measure, tests check
behaviour."""
import importlib
import json
import math
import os
import signal
import subprocess
import sys
import types

import pytest

import ray_lite.bench as bench
from ray_lite.bench import _harness

# The rows the micro suite must always have, measured or with a reason:
# (bench, figure name prefix, impl, label prefix).
TWIN_ROWS = [
    ("B3", "try_next()", "stream_table"),
    ("B3", "report(", "stream_table"),
    ("B4", "round trip", "ring"),
    ("B5", "CPU of a consumer", "ring"),
    ("B5", "wake-up", "ring"),
    ("B12", 'encode+decode "hello"', "codec"),
    ("B12", "encode+decode small dict", "codec"),
    ("B12", "encode+decode 1 KiB bytes", "codec"),
]
ANCHOR_ROWS = [
    ("B3", "a no-op builtin method call", "anchor", "int.bit_length"),
    ("B4", "round trip", "anchor", "multiprocessing.Pipe"),
    ("B4", "round trip", "C", "compiled ring driven from C"),
    ("B4", "round trip", "C", "machine floor"),
] + [
    ("B12", f"encode+decode {obj}", "anchor", lib)
    for obj in ('"hello"', "small dict", "1 KiB bytes")
    for lib in ("msgpack", "pickle", "msgspec")
]

MACHINE_KEYS = {"cpu", "cores", "kernel", "python", "ray_lite", "compiled", "date"}


def importable(module):
    try:
        importlib.import_module(module)
        return True
    except ImportError:
        return False


@pytest.fixture(scope="module")
def micro_result(tmp_path_factory):
    """One smoke-size run of the micro suite through the CLI entry point."""
    path = tmp_path_factory.mktemp("bench") / "micro.json"
    mp = pytest.MonkeyPatch()
    mp.setenv(bench.SMOKE_ENV, "1")
    try:
        rc = bench.main(["micro", "--quick", "--json", str(path)])
    finally:
        mp.undo()
    with open(path) as f:
        return rc, json.load(f)


def find(figures, bench_id, name_prefix, impl, label_prefix=""):
    return [f for f in figures if f["bench"] == bench_id and f["name"].startswith(name_prefix)
            and f["impl"] == impl and f["label"].startswith(label_prefix)]


def check_figure(fig):
    assert fig["status"] in ("ok", "not built", "unavailable"), fig
    if fig["status"] == "ok":
        assert isinstance(fig["value"], (int, float)) and math.isfinite(fig["value"]), fig
        assert fig["value"] >= 0, fig
        assert fig["unit"] in ("ns", "us", "%"), fig
        assert fig["trials"] >= 1 and fig["samples"] >= 1, fig
        assert all(isinstance(v, (int, float)) for v in fig["spread"].values()), fig
        if fig["goal"] is not None:
            assert fig["goal_met"] in (True, False, None), fig
    else:
        assert fig["value"] is None
        assert isinstance(fig["reason"], str) and fig["reason"], fig


def test_micro_runs_and_writes_the_documented_json(micro_result):
    rc, result = micro_result
    assert rc == 0
    assert result["schema"] == "ray_lite.bench/1"
    assert result["scale"] == "smoke"
    assert MACHINE_KEYS <= set(result["machine"])
    suite = result["suites"]["micro"]
    assert suite["seconds"] >= 0
    figures = suite["figures"]
    for fig in figures:
        check_figure(fig)
    for bench_id, name, hot_path in TWIN_ROWS:
        for twin, suffix in (("compiled", "c"), ("python", "py")):
            rows = find(figures, bench_id, name, twin)
            assert len(rows) == 1, (bench_id, name, twin, rows)
            # "not built" exactly when the twin cannot be imported.
            built = importable(f"ray_lite._fast._{hot_path}_{suffix}")
            assert (rows[0]["status"] == "ok") == built, rows[0]
            if built:
                # A verdict, or no goal, or why there is none (a pure twin
                # beside a compiled run; msgspec, B12's reference, absent).
                row = rows[0]
                assert row["goal_met"] is not None or row["goal"] is None or row["goal_note"]
                if twin == "python" and result["machine"]["compiled"]:
                    assert row["goal_met"] is None and (row["goal"] is None
                                                        or row["informational"])
    for bench_id, name, impl, label in ANCHOR_ROWS:
        rows = find(figures, bench_id, name, impl, label)
        assert len(rows) == 1, (bench_id, name, impl, label)
    # The anchors that need no extra install are always measured.
    for label in ("int.bit_length", "multiprocessing.Pipe"):
        assert [f for f in figures if f["label"].startswith(label)][0]["status"] == "ok"
    for lib in ("msgpack", "pickle"):
        assert all(f["status"] == "ok" for f in figures if f["label"].startswith(lib))
    assert (find(figures, "B4", "round trip", "C", "machine floor")[0]["status"] == "ok") == \
        importable("ray_lite.bench._floor_c")
    assert (find(figures, "B4", "round trip", "C", "compiled ring driven")[0]["status"] == "ok") == \
        importable("ray_lite.bench._ringbench_c")


def test_latency_rows_carry_percentiles(micro_result):
    _, result = micro_result
    for fig in result["suites"]["micro"]["figures"]:
        if fig["bench"] == "B4" and fig["status"] == "ok":
            assert fig["stat"] == "p50"
            assert fig["spread"]["p99"] >= fig["value"] * 0.999
        if fig["bench"] == "B5" and fig["status"] == "ok" and fig["unit"] == "%":
            assert fig["detail"]["wall_s"] > 0


def test_compare_ray_is_accepted_and_micro_says_it_has_no_ray_workload(monkeypatch, tmp_path, capsys):
    ran = []
    fake = types.ModuleType("fake_micro")
    fake.run = lambda ctx: ran.append(ctx.scale) or [
        _harness.Figure("B3", "x", "compiled", "ray_lite (compiled)", "ns", 1.0, trials=1, samples=1)]
    monkeypatch.setitem(sys.modules, "fake_micro", fake)
    monkeypatch.setitem(bench.SUITES, "micro", "fake_micro")
    path = tmp_path / "out.json"
    assert bench.main(["micro", "--compare-ray", "/nonexistent/python", "--json", str(path)]) == 0
    assert ran == ["full"]
    result = json.loads(path.read_text())
    assert result["compare_ray"] == "/nonexistent/python"
    assert any("no Ray workload" in n for n in result["suites"]["micro"]["notes"])
    assert "no Ray workload" in capsys.readouterr().out


def test_a_registered_suite_plugs_in(monkeypatch, tmp_path, capsys):
    fake = types.ModuleType("fake_suite")
    fake.DESCRIPTION = "a suite added by a later issue"
    fake.run = lambda ctx: [_harness.Figure("B11", "task round trip", "compiled", "ray_lite", "us",
                                            12.5, trials=3, samples=300, goal="<= 20 µs",
                                            goal_met=True)]
    fake.compare_ray = lambda ctx, python: [
        _harness.missing("B11", "task round trip", "anchor", f"Ray via {python}", "us",
                         _harness.UNAVAILABLE, "no Ray here")]
    monkeypatch.setitem(sys.modules, "fake_suite", fake)
    monkeypatch.setattr(bench, "SUITES", dict(bench.SUITES))
    bench.register_suite("core", "fake_suite")
    assert bench.main(["--list"]) == 0
    assert "a suite added by a later issue" in capsys.readouterr().out
    path = tmp_path / "out.json"
    assert bench.main(["core", "--quick", "--compare-ray", "py", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "task round trip" in out and "Ray via py" in out
    figures = json.loads(path.read_text())["suites"]["core"]["figures"]
    assert [f["impl"] for f in figures] == ["compiled", "anchor"]
    assert figures[0]["value"] == 12.5 and figures[1]["reason"] == "no Ray here"


def test_a_crashing_suite_is_reported_and_fails_the_run(monkeypatch, tmp_path):
    fake = types.ModuleType("broken_suite")

    def run(ctx):
        raise RuntimeError("workload exploded")
    fake.run = run
    monkeypatch.setitem(sys.modules, "broken_suite", fake)
    monkeypatch.setitem(bench.SUITES, "broken", "broken_suite")
    path = tmp_path / "out.json"
    assert bench.main(["broken", "--json", str(path)]) == 1
    (fig,) = json.loads(path.read_text())["suites"]["broken"]["figures"]
    assert fig["status"] == "error" and "workload exploded" in fig["reason"]


# A suite that starts a child, says its PID, and waits (for stdin, which the
# test never writes) with the child's end in its ``finally``, as the serve
# suite's servers and hogs are ended.
_SUITE_THAT_WAITS = r"""
import subprocess, sys, types
from ray_lite import bench

def run(ctx):
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    try:
        print(child.pid, flush=True)
        sys.stdin.readline()
    finally:
        child.stdin.close()
        child.wait(30)
        print("child ended", flush=True)
    return []

suite = types.ModuleType("waiting_suite")
suite.run = run
sys.modules["waiting_suite"] = suite
bench.register_suite("waiting", "waiting_suite")
sys.exit(bench.main(["waiting"]))
"""


def test_sigterm_ends_a_run_through_the_suites_finally():
    # (`timeout` and job schedulers send SIGTERM: Python's default would end
    # the run at once and leave a suite's servers running.)
    proc = subprocess.Popen([sys.executable, "-c", _SUITE_THAT_WAITS], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        child = int(proc.stdout.readline())
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert "child ended" in out
    assert proc.returncode == 128 + signal.SIGTERM
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)


_FORK_DURING_A_RUN = """
import multiprocessing, signal, sys
import ray_lite.bench as bench

def child(ready, disposition):
    disposition.value = signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    ready.set()
    signal.pause()

if __name__ == "__main__":
    ctx = multiprocessing.get_context("fork")
    ready, disposition = ctx.Event(), ctx.Value("b", 0)
    with bench._ended_through_finally_on_sigterm():
        proc = ctx.Process(target=child, args=(ready, disposition))
        proc.start()
    try:
        assert ready.wait(60)
        proc.terminate()
        proc.join(60)
        print(disposition.value, proc.exitcode)
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join(10)
"""


def test_a_process_forked_during_a_run_keeps_sigterms_default(tmp_path):
    # B17 times the standard library's Pool, whose terminate() ends its
    # workers with SIGTERM and waits for them.  (In a fresh interpreter: the
    # test run's own SIGTERM handling would hide the run's.)
    script = tmp_path / "fork_during_a_run.py"
    script.write_text(_FORK_DURING_A_RUN)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", str(-signal.SIGTERM)]


def test_unknown_suite_is_a_usage_error(capsys):
    assert bench.main(["no-such-suite"]) == 2
    assert "unknown suite" in capsys.readouterr().err


def test_percentile_interpolates():
    assert _harness.percentile([1, 2, 3, 4], 50) == 2.5
    assert _harness.percentile([5], 99) == 5
    assert _harness.percentile(list(range(101)), 99) == 99
    value, spread = _harness.summarize_samples([3, 1, 2], [2.0, 4.0])
    assert value == 2 and spread["max"] == 3
    assert spread["trial_p50_min"] == 2.0 and spread["trial_p50_max"] == 4.0


def test_figures_are_related_to_the_anchor_of_the_same_run():
    from ray_lite.bench._harness import Figure, relate_to_anchors

    def fig(bench, impl, label, unit, value):
        return Figure(bench=bench, name="w", impl=impl, label=label, unit=unit, value=value)

    ours_rate = fig("B1", "compiled", "ray_lite", "tokens/s", 600_000)
    ours_time = fig("B11", "compiled", "ray_lite", "us", 10.0)
    figures = [ours_rate, fig("B1", "anchor", "Ray", "tokens/s", 2_000),
               ours_time, fig("B11", "anchor", "Ray", "us", 2_500.0),
               fig("B13", "compiled", "ray_lite", "MB", 20.0)]   # no anchor: untouched
    latency = fig("B9", "compiled", "ray_lite", "us", 150.0)
    figures += [latency, fig("B9", "anchor", "Ray Serve", "us", 4_500.0),
                fig("B9", "ceiling", "bare uvicorn", "us", 120.0)]
    relate_to_anchors(figures)
    assert ours_rate.detail["x_anchor"] == 300 and "300x Ray" in ours_rate.note
    assert ours_time.detail["x_anchor"] == 250          # less time is better
    assert "x_anchor" not in figures[4].detail and figures[4].note is None
    # A ceiling is related too, each with its own factor.
    assert latency.detail["x_anchor"] == 30 and latency.detail["x_ceiling"] == 0.8
    assert latency.note == "30x Ray Serve; 0.80x bare uvicorn"
    # Relating judges nothing: goals are _goals.judge's.
    assert all(f.goal is None and f.goal_met is None for f in figures)


@pytest.mark.parametrize("driver, governor, poll_ns, text", [
    ("haltpoll", "haltpoll", "0", "idle CPUs: haltpoll (halt at once)"),
    ("haltpoll", "haltpoll", "200000", "idle CPUs: haltpoll (poll 200 µs, then halt)"),
    ("intel_idle", "menu", None, "idle CPUs: intel_idle/menu"),
    (None, None, None, None),          # no cpuidle in /sys: nothing said
])
def test_the_machine_block_says_how_idle_cpus_wait(tmp_path, driver, governor, poll_ns, text):
    """Where idle virtual CPUs halt at once, every cross-process latency
    pays for waking one: the machine line says so."""
    from ray_lite.bench import _harness
    cpuidle = tmp_path / "devices" / "system" / "cpu" / "cpuidle"
    cpuidle.mkdir(parents=True)
    if driver:
        (cpuidle / "current_driver").write_text(driver + "\n")
        (cpuidle / "current_governor_ro").write_text(governor + "\n")
    if poll_ns is not None:
        params = tmp_path / "module" / "haltpoll" / "parameters"
        params.mkdir(parents=True)
        (params / "guest_halt_poll_ns").write_text(poll_ns + "\n")
    idle = _harness.cpu_idle(str(tmp_path))
    info = _harness.machine_info()
    info.pop("cpu_idle", None)
    if idle is not None:
        info["cpu_idle"] = idle
    line = _harness.machine_line(info)
    if text is None:
        assert idle is None and "idle CPUs" not in line
    else:
        assert text in line
        assert idle["driver"] == driver
        assert idle.get("halt_poll_ns") == (int(poll_ns) if poll_ns else None)
    # This machine's own block carries it whenever Linux says (JSON too).
    assert ("cpu_idle" in _harness.machine_info()) == (_harness.cpu_idle() is not None)


def test_the_machine_block_says_when_ray_lite_compiles_from_source(monkeypatch):
    from ray_lite.bench import _harness
    info = _harness.machine_info()
    assert isinstance(info["bytecode_cached"], bool)
    info["bytecode_cached"] = False
    assert "compiles it from source" in _harness.machine_line(info)
    info["bytecode_cached"] = True
    assert "from source" not in _harness.machine_line(info)
    # Without a cache file next to the module, it is not cached.
    monkeypatch.setattr("importlib.util.cache_from_source", lambda path: path + ".missing")
    assert _harness.bytecode_cached() is False
