"""`ray-lite bench`'s goals: one table (`_goals.GOALS`) judged on ray_lite's
rows, relative goals against the reference measured in the same run (or not
judged, saying why), pure-Python twins informational beside a compiled run
and judged in a pure one; and a reader that stops early (`| head`) ends the
run quietly.  No timing is measured: the figures are made up."""
import ast
import json
import os
import pathlib
import subprocess
import sys
import types

import pytest

import ray_lite.bench as bench
from ray_lite.bench import _goals, _harness, _report
from ray_lite.bench._harness import Figure

BENCH_DIR = pathlib.Path(bench.__file__).parent


def fig(bench_id, impl, value, unit="us", goal_id=None, label=None, name="w", **kw):
    label = label or _harness.TWIN_LABEL.get(impl, impl)
    return Figure(bench_id, name, impl, label, unit, value, goal_id=goal_id, trials=3,
                  samples=3, **kw)


def floor(value):
    return fig("B4", "C", value, label="machine floor: 2 processes spinning on one cache line (C)")


def test_every_goal_a_suite_names_is_in_the_table():
    named = set()
    for path in BENCH_DIR.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.keyword) and node.arg == "goal_id" \
                    and isinstance(node.value, ast.Constant) and node.value.value:
                named.add(node.value.value)
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "_fig":
                for arg in node.args[6:7]:
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                        named.add(arg.value)
    assert {"B1", "B3 next+get", "B4", "B5 cpu", "B11 task", "B12", "B13"} <= named
    assert named <= set(_goals.GOALS), named - set(_goals.GOALS)
    # Serve's rows name their goal by their id.
    assert {"B2", "B7", "B8", "B9", "B14", "B15", "B16"} <= set(_goals.GOALS)


@pytest.mark.parametrize("goal_id, value, unit, met", [
    ("B1", 1_499_999.0, "tokens/s", False), ("B1", 1_500_000.0, "tokens/s", True),
    ("B2", 1_000_000.0, "tokens/s", True),
    ("B3 next+get", 0.21, "us", False), ("B3 next+get", 0.2, "us", True),
    ("B3 wait", 0.5, "us", True), ("B3 wait", 0.51, "us", False),
    ("B5 cpu", 1.01, "%", False), ("B5 wake", 49.0, "us", True),
    ("B6", 8.0, "us", True), ("B6", 8.1, "us", False),
    ("B11 task", 2.5, "us", True), ("B11 actor", 2.6, "us", False),
    ("B13", 15.2, "MB", False),
])
def test_a_bound_is_judged_on_the_compiled_row(goal_id, value, unit, met):
    row = fig(goal_id.split()[0], "compiled", value, unit, goal_id)
    anchor = fig(goal_id.split()[0], "anchor", value * 100, unit, goal_id, label="Ray")
    _goals.judge([row, anchor])
    assert row.goal == _goals.GOALS[goal_id].text
    assert row.goal_met is met and row.goal_note is None
    assert anchor.goal is None and anchor.goal_met is None      # anchors are not judged


def test_b4_is_judged_against_the_machine_floor_of_the_same_run():
    near, far = fig("B4", "compiled", 0.52, goal_id="B4"), fig("B4", "compiled", 0.53, goal_id="B4")
    _goals.judge([near, floor(0.26)])
    _goals.judge([far, floor(0.26)])
    assert near.goal == "<= 2x the machine floor"
    assert near.goal_met is True and far.goal_met is False
    assert near.detail["x_goal"] == 0.5 and near.detail["goal_reference"].startswith("machine")
    # The floor not built: not judged, saying why, rather than guessed.
    row = fig("B4", "compiled", 0.3, goal_id="B4")
    missing_floor = _harness.missing("B4", "w", "C", "machine floor: 2 processes (C)", "us",
                                     _harness.NOT_BUILT, "ray_lite.bench._floor_c is not built")
    _goals.judge([row, missing_floor])
    assert row.goal_met is None
    assert row.goal_note == "not judged: ray_lite.bench._floor_c is not built"
    # No floor row at all.
    row = fig("B4", "compiled", 0.3, goal_id="B4")
    _goals.judge([row, fig("B4", "anchor", 50.0, label="multiprocessing.Pipe")])
    assert row.goal_met is None and "machine floor not measured" in row.goal_note


def test_b12_is_judged_against_msgspec_or_says_it_is_not_installed():
    msgspec = fig("B12", "anchor", 100.0, "ns", label="msgspec.msgpack encode/decode")
    packb = fig("B12", "anchor", 250.0, "ns", label="msgpack packb/unpackb")
    fast, slow = fig("B12", "compiled", 99.0, "ns", "B12"), fig("B12", "compiled", 101.0, "ns", "B12")
    _goals.judge([fast, packb, msgspec])
    _goals.judge([slow, packb, msgspec])
    assert fast.goal == "<= 1.0x msgspec" and fast.goal_met is True and slow.goal_met is False
    row = fig("B12", "compiled", 50.0, "ns", "B12")
    absent = _harness.missing("B12", "w", "anchor", "msgspec.msgpack encode/decode", "ns",
                              _harness.UNAVAILABLE, "msgspec not installed (optional)")
    figures = _goals.judge([row, packb, absent])
    assert row.goal_met is None
    assert row.goal_note == "not judged: msgspec not installed (optional)"
    summary = _report.goal_summary(figures)
    assert (summary["met"], summary["of"]) == (0, 0)
    text = " ".join(" ".join(_report.summary_lines(summary)).split())
    assert text == "goals met: 0 of 0; not judged: B12 (compiled: msgspec not installed (optional))"
    table = _report.render_table(figures)
    line = next(ln for ln in table.splitlines() if ln.lstrip().startswith("ray_lite (compiled)"))
    assert line.rstrip().endswith("-")


def test_http_goals_are_factors_over_bare_uvicorn_and_b8_over_a_worker_per_core():
    def http(bench_id, impl, value, unit, label):
        return fig(bench_id, impl, value, unit, bench_id if impl == "ray_lite" else None,
                   label=label, name=bench_id)
    rows = [http("B9", "ray_lite", 110.0, "us", "ray_lite"),
            http("B9", "ceiling", 121.0, "us", "bare uvicorn"),
            http("B16", "ray_lite", 28.6, "us", "ray_lite"),
            http("B16", "ceiling", 17.4, "us", "bare uvicorn"),
            http("B7", "ray_lite", 24_583.0, "req/s", "ray_lite"),
            http("B7", "ceiling", 16_790.0, "req/s", "bare uvicorn"),
            http("B8", "ray_lite", 56_000.0, "req/s", "ray_lite"),
            http("B8", "ceiling", 55_700.0, "req/s", "bare uvicorn")]
    _goals.judge(rows)
    b9, b16, b7, b8 = rows[0], rows[2], rows[4], rows[6]
    assert b9.goal == "<= bare uvicorn" and b9.goal_met is True        # less time
    assert b16.goal == "<= bare uvicorn's" and b16.goal_met is False
    assert b7.goal == ">= 1.2x bare uvicorn" and b7.goal_met is True
    # B8's reference is uvicorn with a worker per core, not the 1-worker ceiling.
    assert b8.goal_met is None and "uvicorn not measured" in b8.goal_note
    workers = http("B8", "ceiling", 70_000.0, "req/s", "uvicorn, 2 workers")
    b8.goal_note = None
    _goals.judge([b8, rows[7], workers])
    assert b8.goal_met is False and b8.goal == ">= uvicorn with a worker per core"
    _goals.judge([b8, workers], beside_hog=True)                        # 0.8x beside a hog
    assert b8.goal_met is True and b8.goal.startswith("beside a CPU hog: >= 0.8x")


def test_kept_rows_keep_their_factor_less_the_noise_or_have_no_goal():
    pool = fig("B17", "compiled", 0.2, "ms", "B17", name="p")
    stdlib = fig("B17", "ceiling", 0.46, "ms", label="stdlib multiprocessing.Pool(2)", name="p")
    _goals.judge([pool, stdlib])
    assert pool.goal_met is False and pool.goal == ">= 2.4x stdlib Pool (kept)"
    pss = fig("B21", "compiled", 0.35, "GB", "B21 pss", detail={"array_gb": 0.27})
    _goals.judge([pss])
    assert pss.goal_met is True               # <= 1.1 x (0.27 + 0.05) GB
    # B10, B18-B20 keep figures of another day: no goal.
    assert not {"B10", "B18", "B19", "B20"} & {k.split()[0] for k in _goals.GOALS}


def _twins():
    return [fig("B4", "compiled", 0.5, goal_id="B4"), fig("B4", "python", 4.0, goal_id="B4"),
            floor(0.26),
            fig("B5", "compiled", 0.03, "%", "B5 cpu"), fig("B5", "python", 0.02, "%", "B5 cpu")]


def test_pure_python_rows_are_informational_beside_a_compiled_run():
    figures = _goals.judge(_twins())
    compiled, pure = figures[0], figures[1]
    assert compiled.goal_met is True
    assert pure.informational and pure.goal_met is None and pure.goal == compiled.goal
    assert pure.goal_note.startswith("informational")
    summary = _report.goal_summary(figures)
    assert (summary["met"], summary["of"], summary["informational"]) == (2, 2, 2)
    assert summary["missed"] == [] and summary["unjudged"] == []
    text = " ".join(" ".join(_report.summary_lines(summary)).split())
    assert text == ("goals met: 2 of 2; 2 pure-Python rows informational "
                    "(goals are for the compiled runtime)")
    # The table gives them no verdict: no "NO", no "-".
    table = _report.render_table(figures)
    for line in table.splitlines():
        if "pure Python" in line:
            assert not line.rstrip().endswith(("NO", "yes", "-")), line
    verbose = _report.render_verbose(figures)
    assert "informational: pure-Python twin" in verbose


def test_a_pure_python_run_judges_its_rows_and_says_so():
    figures = _goals.judge(_twins(), pure_run=True)
    pure = figures[1]
    assert not pure.informational and pure.goal_met is False      # 4.0 > 2 x 0.26
    summary = _report.goal_summary(figures, pure_run="RAY_LITE_NO_EXTENSIONS=1")
    assert (summary["met"], summary["of"], summary["informational"]) == (3, 4, 0)
    text = " ".join(" ".join(_report.summary_lines(summary)).split())
    assert text.startswith("goals met: 3 of 4 (a pure-Python run, RAY_LITE_NO_EXTENSIONS=1: "
                           "its rows are judged); missed: B4 (pure-Python)")


@pytest.mark.parametrize("compiled, no_ext_env, said", [
    (True, False, None),
    (False, True, "RAY_LITE_NO_EXTENSIONS=1"),
    (False, False, "no compiled hot path built"),
])
def test_a_run_is_judged_as_compiled_or_pure_from_its_machine(monkeypatch, capsys, compiled,
                                                             no_ext_env, said):
    fake = types.ModuleType("fake_twin_suite")
    fake.run = lambda ctx: _twins()
    monkeypatch.setitem(sys.modules, "fake_twin_suite", fake)
    monkeypatch.setitem(bench.SUITES, "twins", "fake_twin_suite")
    real = _harness.machine_info
    monkeypatch.setattr(_harness, "machine_info", lambda: dict(
        real(), compiled=compiled, no_extensions_env=no_ext_env))
    monkeypatch.setattr(_harness, "load_reading", lambda sample_s=0.5, exclude=None: {})
    result = bench.run_suites(["twins"], _harness.Context(scale="smoke"))
    goals = result["suites"]["twins"]["goals"]
    assert goals["pure_run"] == said
    assert goals["informational"] == (2 if compiled else 0)
    assert goals["of"] == (2 if compiled else 4)


def _saved_result(tmp_path, rows=200):
    figures = [fig("B4", "compiled", 0.5 + i, goal_id="B4", name=f"workload {i}")
               for i in range(rows)]
    result = {"schema": "ray_lite.bench/1", "scale": "quick", "machine": _harness.machine_info(),
              "suites": {"micro": {"seconds": 1.0, "notes": [],
                                   "goals": _report.goal_summary(figures),
                                   "figures": [f.to_json() for f in figures]}}}
    path = tmp_path / "result.json"
    path.write_text(json.dumps(result))
    return path


def test_a_reader_that_stops_early_ends_the_run_quietly(tmp_path):
    """`ray-lite bench ... | head`: the pipe's reader is gone before the
    table is written (its end closed before the command starts)."""
    path = _saved_result(tmp_path)
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        out = subprocess.run(
            [sys.executable, "-c", "import sys; from ray_lite.scripts import main; "
                                   "sys.exit(main())", "bench", "--from-json", str(path)],
            stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=300, cwd=tmp_path)
    finally:
        os.close(write_end)
    assert out.returncode == 1
    assert "Traceback" not in out.stderr and "BrokenPipeError" not in out.stderr, out.stderr
    assert "Exception ignored" not in out.stderr, out.stderr


def test_broken_pipe_in_main_returns_1_without_raising(monkeypatch, tmp_path):
    class ClosedPipe:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    assert bench.main(["--from-json", str(_saved_result(tmp_path, rows=3))]) == 1
