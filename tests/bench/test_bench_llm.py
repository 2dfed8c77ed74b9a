"""``ray-lite bench llm`` (B22) at its smallest size: its rows and goals
(no timings are judged here)."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("numpy")
pytest.importorskip("uvicorn")


def test_the_llm_suite_measures_every_contender_and_names_its_goals(tmp_path):
    out = tmp_path / "b22.json"
    env = dict(os.environ, RAY_LITE_BENCH_SMOKE="1")
    run = subprocess.run([sys.executable, "-m", "ray_lite.bench", "llm", "--json", str(out)],
                         capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    result = json.loads(out.read_text())
    figures = result["suites"]["llm"]["figures"]
    assert all(f["status"] == "ok" for f in figures), [f["reason"] for f in figures]
    assert {f["label"] for f in figures} >= {"floor: one process, no runtime", "ray_lite",
                                              "hand-written: uvicorn + pipes"}
    names = {f["name"] for f in figures}
    for what in ("output tokens/s", "time to first token", "inter-token latency",
                 "ITL p99 less the floor's step", "TTFT p50 less the floor's"):
        assert any(name.endswith(what) for name in names), what
    rates = [f for f in figures if f["name"].endswith("output tokens/s")]
    assert all(f["value"] > 0 and f["unit"] == "tokens/s" for f in rates)
    ttft = [f for f in figures if f["name"].endswith("time to first token")]
    assert all(f["stat"] == "p50" and "p99" in f["spread"] for f in ttft)
    judged = {f["goal_id"]: f for f in figures if f["goal_id"]}
    assert set(judged) == {"B22 floor", "B22 hand-written", "B22 itl", "B22 ttft"}
    assert all(f["goal_met"] in (True, False) for f in judged.values())
    step = [f for f in figures if "engine step" in f["name"]]
    assert step and step[0]["label"].startswith("floor") and "shard p50" in step[0]["spread"]
    assert all(len(line.encode()) <= 100 for line in run.stdout.splitlines()), run.stdout
    assert run.returncode == 0, run.stderr[-2000:]
