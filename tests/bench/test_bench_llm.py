"""``ray-lite bench llm`` (B22) at its smallest size: its rows and goals
(no timings are judged here), and the example it runs coming from the
package, not from the checkout."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import ray_lite

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
    way = [f for f in figures if "one token's way" in f["name"]]
    assert {f["label"] for f in way} == {"ray_lite", "hand-written: uvicorn + pipes"}
    for stage in ("executor: step to the workers", "generator: engine's generate yields",
                  "handle: engine to ingress", "proxy: ASGI send to client's read",
                  "engine step end to client's read"):
        rows = [f for f in way if f["name"].endswith(stage)]
        assert {f["label"] for f in rows} == {"ray_lite", "hand-written: uvicorn + pipes"}
        assert all(f["unit"] == "us" and f["samples"] > 0 for f in rows), rows
    first = [f for f in figures if "first token's way" in f["name"]]
    for stage in ("request: client's send to the app's route",
                  "request: route to the engine's add",
                  "the prefill step, to the engine's replies", "handle: engine to ingress",
                  "proxy: ASGI send to client's read", "client's send to its read (TTFT)"):
        rows = [f for f in first if f["name"].endswith(stage)]
        assert {f["label"] for f in rows} == {"ray_lite", "hand-written: uvicorn + pipes"}
        assert all(f["unit"] == "us" and f["samples"] >= 2 for f in rows), rows
    step = [f for f in figures if "engine step" in f["name"]]
    assert step and step[0]["label"].startswith("floor") and "shard p50" in step[0]["spread"]
    cpu = [f for f in figures if f["name"].endswith("CPU per output token, all the server's "
                                                    "processes")]
    assert {f["label"] for f in cpu} == {"floor: one process, no runtime", "ray_lite",
                                         "hand-written: uvicorn + pipes"}
    assert all(f["unit"] == "us" and f["value"] >= 0 and f["samples"] > 0 for f in cpu), cpu
    assert all(len(line.encode()) <= 100 for line in run.stdout.splitlines()), run.stdout
    assert run.returncode == 0, run.stderr[-2000:]


def test_a_timed_stream_that_came_in_one_chunk_gives_a_row_saying_so():
    # On a busy machine the rest of a short timed stream can come with its
    # first chunk: the breakdown then says why it is empty.
    from ray_lite.bench.llm_suite import _breakdown_rows
    stamps = {"send": 0, "work_start": 10_000, "work_end": 20_000, "replies": 25_000,
              "pushed": 26_000, "gen": 27_000, "recv": 40_000, "sse": 45_000,
              "read": 60_000}
    contenders = [("ray_lite", "ray_lite", "ray_lite", None),
                  ("handwritten", "anchor", "hand", None)]
    per_round = {"ray_lite": [{"timed": {"stamps": [], "first_stamps": [dict(stamps, t0=0,
                                                                              enter=1, add=2)]}}],
                 "handwritten": [{"timed": {"stamps": [stamps], "first_stamps": []}}]}
    rows = _breakdown_rows("tiny", per_round, contenders)
    failed = {(f.label, f.name): f.reason for f in rows if f.status != "ok"}
    assert failed == {
        ("ray_lite", "one token's way, tiny model, 1 stream"):
            "every token of the timed stream came in its first chunk: no token's way to time",
        ("hand", "first token's way, tiny model, 1 stream"):
            "no first chunk carried its timestamps"}
    way = {f.name.split(": ", 1)[1]: f.value for f in rows
           if f.status == "ok" and f.label == "hand" and "one token's way" in f.name}
    assert way["handle: engine to ingress"] == 13.0 and way["engine step end to client's read"] \
        == 35.0


def test_the_suite_runs_the_example_shipped_in_the_package(tmp_path):
    # Outside the checkout, with nothing on PYTHONPATH: the app the suite's
    # servers run (python -m APP) is found inside the installed package.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = ("import importlib.util, json, sys, ray_lite\n"
            "from ray_lite.bench import llm_suite\n"
            "import ray_lite._examples.llm_server.deployments as d\n"
            "print(json.dumps({'app': importlib.util.find_spec(llm_suite.APP + '.__main__')"
            ".origin, 'deployments': d.__file__, 'pkg': ray_lite.__file__, "
            "'path': sys.path}))")
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout)
    package = Path(found["pkg"]).parent
    for key in ("app", "deployments"):
        assert Path(found[key]).is_relative_to(package / "_examples" / "llm_server"), found
    assert not [p for p in found["path"] if p and Path(p).name == "examples"], found["path"]


def test_the_wheel_carries_the_example():
    checkout = Path(__file__).resolve().parents[2]
    if not (checkout / "pyproject.toml").is_file():
        pytest.skip("run from an installed package without its checkout")
    # Packages are found by their __init__.py (pyproject's packages.find);
    # CI runs this against the installed wheel, which must carry the app.
    for root in (checkout / "ray_lite", Path(ray_lite.__file__).parent):
        assert (root / "_examples" / "__init__.py").is_file()
        assert (root / "_examples" / "llm_server" / "__init__.py").is_file()
    assert (Path(ray_lite.__file__).parent / "_examples" / "llm_server" / "engine.py").is_file()
