"""What `ray-lite bench` prints: lines within 100 columns (and 100 bytes of
UTF-8, what a byte-counting `awk 'length > 100'` sees), microseconds spelled
µs, a goals line per suite, every detail in --verbose, and a warning when
the machine is busy before a run."""
import json
import os
import re
import subprocess
import sys
import types

import pytest

import ray_lite.bench as bench
from ray_lite.bench import _harness, _report
from ray_lite.bench._harness import Figure

LONG = ("a workload described at great length, with every parameter of the load spelled "
        "out, so that no table could hold it whole")


def _fits(text):
    for line in text.splitlines():
        assert len(line) <= 100, (len(line), line)
        assert len(line.encode()) <= 100, (len(line.encode()), line)


def _no_us(text):
    assert not re.search(r"\bus\b", text), [ln for ln in text.splitlines()
                                            if re.search(r"\bus\b", ln)]


def _figures():
    """Rows of every shape the suites make: twins, anchors, ceilings, C
    loops, rates, percentages, long texts, rows that could not be measured."""
    ours = Figure("B4", LONG, "compiled", "ray_lite (compiled) with a long tail of words",
                  "us", 0.7, stat="p50", trials=3, samples=3000,
                  spread={"p99": 2.18, "max": 83.0, "trial_p50_min": 0.61, "trial_p50_max": 2.02},
                  goal="<= 0.3 us p50 and a second condition as long as the first one",
                  goal_met=False, note="1.23 cores busy, foreign load 0.02 us")
    twin = Figure("B4", LONG, "python", "ray_lite (pure Python) with a long tail of words",
                  "us", 5.25, stat="p50", trials=1, samples=3000, spread={"p99": 6.62},
                  goal=ours.goal, goal_met=False)
    figures = [
        ours, twin,
        Figure("B4", LONG, "anchor", "multiprocessing.Pipe send_bytes/recv_bytes and more", "us",
               13.2, stat="p50", spread={"p99": 83.2}, trials=3, samples=3000),
        Figure("B4", LONG, "C", "machine floor: 2 processes spinning on one cache line (C)",
               "us", 0.26, stat="p50", spread={"p99": 8.35}, trials=3, samples=3000),
        Figure("B1", "core streaming, async actor -> async caller actor, tokens/s", "compiled",
               "ray_lite (compiled)", "tokens/s", 1_234_567.0, spread={"min": 1e6, "max": 1.3e6},
               trials=5, goal=">= 1,000,000", goal_met=True,
               note="P50 11.0 ms, P99 31.0 ms per stream"),
        Figure("B1", "core streaming, async actor -> async caller actor, tokens/s", "anchor",
               "Ray", "tokens/s", 4_321.0, spread={"min": 4e3, "max": 5e3}, trials=5),
        Figure("B7", "HTTP hi, 48 replicas, ab -c 100", "ray_lite", "ray_lite", "req/s",
               12_345.0, spread={"min": 11_000.0, "max": 13_000.0}, trials=3,
               goal="0 failed and >= 1.2x bare uvicorn", goal_met=None),
        Figure("B7", "HTTP hi, 48 replicas, ab -c 100", "ceiling", "bare uvicorn", "req/s",
               11_000.0, trials=3, spread={"min": 10_000.0, "max": 12_000.0}),
        Figure("B5", "CPU of a consumer blocked in get() on an empty ring", "compiled",
               "ray_lite (compiled)", "%", 0.03, stat="over 1.0 s", trials=1, samples=1,
               goal="<= 1 % of a core", goal_met=True),
        Figure("B5", "wake-up from idle", "compiled", "ray_lite (compiled)", "us", 89.9,
               stat="p50", spread={"max": 183.0, "after long idle": 64.7}, trials=5, samples=5,
               goal="<= 50 us", goal_met=False),
        _harness.missing("B12", LONG, "anchor", "msgspec.msgpack encode/decode", "ns",
                         _harness.UNAVAILABLE, "msgspec is not installed (optional); " + LONG),
        _harness.missing("B6", "collective_rpc round trip", "compiled",
                         "ray_lite MultiprocExecutor (compiled)", "us", _harness.ERROR,
                         "RuntimeError: the worker exited with code 1 after 30 us"),
    ]
    _harness.relate_to_anchors(figures)
    return figures


def _result(figures, load=None):
    info = _harness.machine_info()
    info["cpu_idle"] = {"driver": "haltpoll", "governor": "haltpoll", "halt_poll_ns": 200000}
    result = {"schema": "ray_lite.bench/1", "scale": "quick", "machine": info,
              "suites": {"micro": {"seconds": 1.0, "notes": [LONG],
                                   "goals": _report.goal_summary(figures),
                                   "figures": [f.to_json() for f in figures],
                                   "_figures": figures}}}
    if load is not None:
        result["load_before"] = load
    return result


BUSY = {"cores": 2, "sample_s": 0.5, "loadavg_1min": 1.9, "others_cores": 1.2,
        "busiest": [{"pid": 4242, "name": "python3 busy_loop.py --forever", "cores": 0.97},
                    {"pid": 17, "name": "kworker", "cores": 0.2}]}
QUIET = {"cores": 2, "sample_s": 0.5, "loadavg_1min": 0.05, "others_cores": 0.02,
         "busiest": [{"pid": 17, "name": "kworker", "cores": 0.02}]}


def test_every_line_of_the_table_fits_100_columns_and_spells_microseconds():
    figures = _figures()
    table = _report.render_table(figures)
    _fits(table)
    _no_us(table)
    assert "µs" in table
    text = _report.format_result(_result(figures, BUSY))
    _fits(text)
    _no_us(text)
    # Each workload's heading, each implementation's line, and the goal.
    assert "B4   a workload described at great" in table
    assert "goal <= 0.3 µs p50" in table
    lines = table.splitlines()
    row = next(ln for ln in lines if ln.lstrip().startswith("compiled with a long"))
    assert "0.70 µs p50" in row and "±" in row and "NO" in row and "19x mp.Pipe" in row
    row = next(ln for ln in lines if ln.lstrip().startswith("ray_lite (compiled)  "))
    assert "1.23M tokens/s" in row and "286x Ray" in row and row.endswith("yes")
    # The machine: CPU, cores and how idle CPUs wait, in the first lines.
    head = "\n".join(text.splitlines()[:3])
    assert "2 cores" in head or "cores" in head
    assert "idle CPUs: haltpoll (poll 200 µs, then halt)" in text


def test_a_long_text_is_abbreviated_in_the_table_and_whole_in_verbose():
    figures = _figures()
    table = _report.render_table(figures)
    assert LONG not in table and "…" in table
    verbose = _report.format_result(_result(figures), verbose=True)
    _no_us(verbose)
    assert LONG in verbose
    assert "multiprocessing.Pipe send_bytes/recv_bytes and more" in verbose
    assert "p50s 0.61 µs – 2.02 µs" in verbose and "p99 2.18 µs" in verbose
    assert "foreign load 0.02 µs" in verbose
    # A reason cut in the table is printed whole under it.
    text = _report.format_result(_result(figures))
    assert f"msgspec is not installed (optional); {LONG}" in " ".join(text.split())


def test_a_missing_row_says_why_in_the_table():
    figures = [
        Figure("B4", "round trip", "python", "ray_lite (pure Python)", "us", 6.0, stat="p50",
               spread={"p99": 9.0}, trials=2, samples=10, goal="<= 2 µs p50", goal_met=False),
        _harness.missing("B4", "round trip", "compiled", "ray_lite (compiled)", "us",
                         _harness.NOT_BUILT, "ray_lite._fast._ring_c is not built"),
    ]
    table = _report.render_table(figures)
    assert "B4   round trip" in table and "goal <= 2 µs p50" in table
    row = next(ln for ln in table.splitlines() if "pure Python" in ln)
    assert "6.00 µs p50" in row and "p99 9.00 µs" in row and row.rstrip().endswith("NO")
    row = next(ln for ln in table.splitlines() if "(compiled)" in ln)
    assert "not built" in row and "_ring_c is not built" in row


def test_the_goals_line_counts_and_names_what_missed():
    figures = _figures()
    summary = _report.goal_summary(figures)
    # Goals of ray_lite's rows only, counted where judged: B4 x2 and B5
    # wake-up missed, B1 and B5 CPU met; B7 not judged (listed, not counted);
    # the error row's goal (none) is not counted.
    assert (summary["met"], summary["of"]) == (2, 5)
    assert [m["bench"] for m in summary["missed"]] == ["B4", "B4", "B5"]
    assert [m["bench"] for m in summary["unjudged"]] == ["B7"]
    lines = _report.summary_lines(summary)
    text = " ".join(" ".join(lines).split())
    assert text.startswith("goals met: 2 of 5; missed: B4 (compiled, pure-Python), B5 (compiled)")
    assert text.endswith("not judged: B7 (ray_lite)")
    assert "informational" not in text
    _fits("\n".join(lines))
    assert _report.summary_lines(_report.goal_summary(figures[2:4])) == [
        "goals: none in this suite"]


def test_a_busy_machine_is_warned_about_naming_the_busiest_process():
    text = _report.busy_warning(BUSY)
    assert "load average 1.90 over the last minute on 2 cores" in text
    assert "other processes used 1.20 cores" in text
    assert "pid 4242" in text and "busy_loop.py" in text
    assert "not meaningful" in text
    _fits("\n".join(_report.busy_lines(BUSY)))
    assert _report.busy_warning(QUIET) is None
    assert _report.busy_warning(None) is None
    # Either sign alone is enough: a load average left by a run that just
    # ended, or a process that started a moment ago.
    assert _report.busy_warning(dict(QUIET, loadavg_1min=1.5))
    assert _report.busy_warning(dict(QUIET, others_cores=0.9))


def test_the_warning_comes_before_the_run_and_is_kept_with_the_result(monkeypatch, tmp_path,
                                                                        capsys):
    order = []
    fake = types.ModuleType("fake_quiet_suite")
    fake.run = lambda ctx: order.append("run") or [
        Figure("B3", "x", "compiled", "ray_lite (compiled)", "ns", 1.0, trials=1, samples=1)]
    monkeypatch.setitem(sys.modules, "fake_quiet_suite", fake)
    monkeypatch.setitem(bench.SUITES, "quietness", "fake_quiet_suite")
    readings = iter([BUSY])

    def reading(sample_s=0.5, exclude=None):
        order.append("load")
        return next(readings)
    monkeypatch.setattr(_harness, "load_reading", reading)
    path = tmp_path / "out.json"
    assert bench.main(["quietness", "--json", str(path)]) == 0
    assert order == ["load", "run"]
    captured = capsys.readouterr()
    assert "warning: this machine is busy" in captured.err
    assert "warning: this machine is busy" in captured.out      # kept beside the table
    saved = json.loads(path.read_text())
    assert saved["load_before"]["busiest"][0]["pid"] == 4242
    assert saved["suites"]["quietness"]["goals"] == {"met": 0, "of": 0, "missed": [],
                                                    "unjudged": [], "informational": 0,
                                                    "pure_run": saved["suites"]["quietness"]
                                                    ["goals"]["pure_run"]}


def test_a_quiet_reading_prints_no_warning(monkeypatch, capsys):
    monkeypatch.setattr(_harness, "load_reading", lambda sample_s=0.5, exclude=None: QUIET)
    assert bench.check_load() == QUIET
    assert "warning" not in capsys.readouterr().err


def test_the_load_reading_names_processes_and_leaves_this_one_out():
    reading = _harness.load_reading(0.05)
    assert reading["cores"] >= 1 and reading["sample_s"] == 0.05
    assert reading["others_cores"] >= 0
    for proc in reading["busiest"]:
        assert proc["pid"] != os.getpid()
        assert proc["name"] and proc["cores"] > 0


def test_an_older_result_without_the_new_fields_still_prints(tmp_path, capsys):
    figures = _figures()
    result = _result(figures)
    del result["suites"]["micro"]["goals"], result["suites"]["micro"]["_figures"]
    saved = tmp_path / "old.json"
    saved.write_text(json.dumps(result))
    assert bench.main(["--from-json", str(saved)]) == 0
    out = capsys.readouterr().out
    _fits(out)
    assert "goals met: 2 of 5" in out


def _ray_lite_command():
    script = os.path.join(os.path.dirname(sys.executable), "ray-lite")
    if os.path.exists(script):
        return [script]
    return [sys.executable, "-c", "import sys; from ray_lite.scripts import main; sys.exit(main())"]


def test_the_micro_suite_prints_no_line_over_100_columns(tmp_path):
    """The command as a user runs it, from a folder outside the checkout (at
    the tests' size: the layout is the same at every size)."""
    path = tmp_path / "micro.json"
    env = dict(os.environ, **{bench.SMOKE_ENV: "1"})
    out = subprocess.run(_ray_lite_command() + ["bench", "micro", "--quick", "--json", str(path)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    errors = [line for line in out.stdout.splitlines() if "error" in line]
    assert out.returncode == 0, "\n".join(errors + [out.stderr[-2000:]])
    _fits(out.stdout)
    _fits(out.stderr)
    _no_us(out.stdout)
    assert "== micro" in out.stdout and "machine: " in out.stdout
    assert re.search(r"^goals met: \d+ of \d+", out.stdout, re.M)
    saved = json.loads(path.read_text())
    assert saved["schema"] == "ray_lite.bench/1"
    assert {"met", "of", "missed", "unjudged"} <= set(saved["suites"]["micro"]["goals"])
    assert "cores" in saved["load_before"]


@pytest.mark.parametrize("x, text", [(262.4, "262x"), (2.514, "2.51x"), (0.0612, "0.061x"),
                                     (1234.0, "1,234x")])
def test_factors_are_printed_short(x, text):
    assert _harness.ratio_text(x) == text
