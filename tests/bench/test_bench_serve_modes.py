"""``ray-lite bench serve``: the HTTP rows in each of Serve's HTTP modes
(``--http-mode proxies|direct|both``) and the CPU-bound row (B23)."""
import json
import os
import shutil
import subprocess
import sys
import time
import types

import pytest

from ray_lite.bench import _servers, serve_cpu_bound_app, serve_suite
from ray_lite.bench._harness import Context


class _FakeServer:
    """Stands in for a real server: records what each start was asked for."""
    started = []

    def __init__(self, python, raymod, replicas, app=None, http_mode=None):
        self.raymod, self.app, self.http_mode = raymod, app, http_mode
        self.port = len(self.started)
        self.up_s = 0.5 if http_mode == "direct" else 1.0
        self.stderr_lines = []
        self.cpu = 0.0
        self.started.append((raymod, http_mode, app.module))

    def wait_up(self, timeout):
        return self.up_s

    def wait_ready(self, timeout):
        pass

    def cpu_s(self):
        self.cpu += 1.0
        return self.cpu

    def stop(self):
        pass


# Per server kind: ab's req/s, its mean latency (ms) and wrk's req/s.
_LOAD = {("ray_lite", "proxies"): (1000.0, 0.4, 2000.0),
         ("ray_lite", "direct"): (1500.0, 0.2, 2500.0),
         (_servers.UVICORN_WORKERS, None): (3000.0, 0.1, 4000.0),
         ("uvicorn", None): (2000.0, 0.1, 3000.0),
         (_servers.GRANIAN, None): (3500.0, 0.1, 4500.0)}


@pytest.fixture
def fake_load(monkeypatch):
    """Fake servers and loads; returns the ``ab`` calls made, ``(n, c)``."""
    _FakeServer.started = []
    ab_calls = []
    monkeypatch.setattr(serve_suite, "_Server", _FakeServer)
    monkeypatch.setattr(serve_suite.shutil, "which", lambda tool: f"/usr/bin/{tool}")

    def kind(port):
        return _FakeServer.started[port][:2]

    def fake_ab(port, n, c):
        ab_calls.append((n, c))
        rps, mean_ms, _ = _LOAD[kind(port)]
        return {"rps": rps, "failed": 0, "mean_ms": mean_ms, "p50_ms": 80, "p99_ms": 120}

    def fake_wrk(port, seconds, path="/"):
        return {"rps": _LOAD[kind(port)][2], "requests": 10000, "non2xx": 0}
    monkeypatch.setattr(serve_suite, "_ab", fake_ab)
    monkeypatch.setattr(serve_suite, "_wrk", fake_wrk)
    return ab_calls


def _bare_servers_probe(monkeypatch, present):
    monkeypatch.setattr(serve_suite.subprocess, "run",
                        lambda *a, **kw: types.SimpleNamespace(returncode=0 if present else 1))


def test_both_modes_run_in_the_same_rounds_alternating_and_are_labelled(fake_load,
                                                                         monkeypatch):
    _bare_servers_probe(monkeypatch, present=False)
    ctx = Context(scale="quick", log=lambda msg: None)
    ctx.http_mode = "both"
    figs = serve_suite._http_figures(ctx, serve_suite.HI_APP)
    # Three rounds; the two modes swap places every other round.
    assert _FakeServer.started == [("ray_lite", "proxies", "serve_hi_app"),
                                   ("ray_lite", "direct", "serve_hi_app"),
                                   ("ray_lite", "direct", "serve_hi_app"),
                                   ("ray_lite", "proxies", "serve_hi_app"),
                                   ("ray_lite", "proxies", "serve_hi_app"),
                                   ("ray_lite", "direct", "serve_hi_app")]
    by = {(f.bench, f.label): f for f in figs}
    benches = ("B10", "B7", "B9", "B8", "B16")
    assert set(by) == {(b, lab) for b in benches
                       for lab in ("ray_lite (proxies)", "ray_lite (direct)")}
    for (bench, label), f in by.items():
        assert f.impl == "ray_lite" and f.trials == 3
        assert f.goal_id == (None if bench == "B10" else bench)    # both judged alike
        assert f.detail["http_mode"] == label[len("ray_lite ("):-1]
    # A direct row says its factor over the proxies' row: more per second,
    # or less time or CPU, is better.
    assert by[("B7", "ray_lite (direct)")].detail["x_proxies"] == 1.5
    assert by[("B7", "ray_lite (direct)")].note.startswith("1.50x proxies; 0 failed")
    assert by[("B9", "ray_lite (direct)")].detail["x_proxies"] == 2.0
    assert by[("B10", "ray_lite (direct)")].detail["x_proxies"] == 2.0
    assert by[("B16", "ray_lite (direct)")].detail["x_proxies"] == 1.0
    assert all("x_proxies" not in f.detail for (_, lab), f in by.items() if "proxies" in lab)


@pytest.mark.parametrize("mode, label", [("proxies", "ray_lite (proxies)"),
                                         ("direct", "ray_lite")])
def test_one_mode_runs_ray_lite_once_a_round(fake_load, monkeypatch, mode, label):
    _bare_servers_probe(monkeypatch, present=False)
    ctx = Context(scale="smoke", log=lambda msg: None)
    ctx.http_mode = mode
    figs = serve_suite._http_figures(ctx, serve_suite.SSE_APP)
    assert _FakeServer.started == [("ray_lite", mode, "serve_sse_app")]
    assert [(f.bench, f.label, f.detail["http_mode"]) for f in figs] == [("B14", label, mode)]
    assert "x_proxies" not in figs[0].detail


def test_an_unknown_http_mode_is_refused():
    ctx = Context(scale="smoke")
    assert serve_suite.http_modes(ctx) == ("direct",)      # the default, as Serve's
    ctx.http_mode = "sideways"
    with pytest.raises(ValueError, match="proxies, direct, both"):
        serve_suite.http_modes(ctx)
    from ray_lite.bench import _parser
    assert _parser().parse_args(["serve", "--http-mode", "both"]).http_mode == "both"
    assert _parser().parse_args(["serve"]).http_mode == "direct"


def test_the_cpu_bound_row_is_ab_c8_beside_uvicorn_with_a_worker_per_core(fake_load,
                                                                           monkeypatch):
    _bare_servers_probe(monkeypatch, present=True)
    ctx = Context(scale="quick", log=lambda msg: None)
    ctx.http_mode = "both"
    figs = serve_suite._http_figures(ctx, serve_suite.CPU_APP)
    assert {s[:2] for s in _FakeServer.started} == set(_LOAD)
    assert all(s[2] == "serve_cpu_bound_app" for s in _FakeServer.started)
    # A warm-up, then the measured load, at 8 concurrent requests.
    assert set(fake_load) == {(16, 8), (200, 8)}
    by = {f.label: f for f in figs}
    n = _servers.uvicorn_workers()
    assert set(by) == {"ray_lite (proxies)", "ray_lite (direct)", f"uvicorn, {n} workers",
                       "bare uvicorn", "granian, 1 worker"}
    for f in figs:
        assert (f.bench, f.unit, f.trials) == ("B23", "req/s", 3)
        assert f.name == "HTTP CPU-bound, 21 ms of Python a request, 2 replicas, ab -c 8"
        assert f.detail["p50_ms"] == [80, 80, 80] and f.detail["p99_ms"] == [120, 120, 120]
        assert "P50 80 ms, P99 120 ms" in f.note
    assert by[f"uvicorn, {n} workers"].impl == by["granian, 1 worker"].impl == "ceiling"
    assert by["ray_lite (direct)"].detail["x_proxies"] == 1.5
    # --only B23 runs this app and no other.
    ctx.only = {"B23"}
    assert [app for app in (serve_suite.HI_APP, serve_suite.SSE_APP, serve_suite.FASTAPI_APP,
                            serve_suite.CPU_APP)
            if serve_suite._wanted(ctx, app.rows(0))] == [serve_suite.CPU_APP]


def test_a_server_is_started_in_the_http_mode_asked_for(monkeypatch):
    started = []
    monkeypatch.setattr(_servers.subprocess, "Popen",
                        lambda cmd, env, **kw: started.append((cmd, env)) or cmd)
    monkeypatch.setenv(_servers.DIRECT_INGRESS_ENV, "1")
    servers = [_servers.Server("py", "ray_lite", 2, serve_suite.CPU_APP, http_mode="proxies"),
               _servers.Server("py", "ray_lite", 2, serve_suite.CPU_APP, http_mode="direct"),
               _servers.Server("py", "ray_lite", 2, serve_suite.CPU_APP),
               _servers.Server("py", _servers.UVICORN_WORKERS, 2, serve_suite.CPU_APP,
                               http_mode="direct"),
               _servers.Server("py", _servers.GRANIAN, 2, serve_suite.CPU_APP)]
    for srv in servers:
        srv.out.close()
        srv.err.close()
    # Set either way, whatever the environment says; None leaves it.
    assert [env[_servers.DIRECT_INGRESS_ENV] for _, env in started] == ["0", "1", "1", "1", "1"]
    assert "ray_lite.bench.serve_cpu_bound_app:model" in started[0][0]
    assert started[0][1]["REPLICAS"] == "2"
    # uvicorn with a worker per core serves the same handler by its import string.
    assert started[3][0][-2:] == ["serve_cpu_bound_app:asgi", str(_servers.uvicorn_workers())]
    # granian: one worker, on loopback, the same handler, found in the bench folder.
    granian = started[4][0]
    assert granian[1:3] == ["-m", "granian"] and granian[-1] == "serve_cpu_bound_app:asgi"
    assert granian[granian.index("--host") + 1] == "127.0.0.1"
    assert granian[granian.index("--workers") + 1] == "1"
    assert granian[granian.index("--working-dir") + 1] == _servers.HERE
    with pytest.raises(ValueError, match="http_mode"):
        _servers.Server("py", "ray_lite", 2, http_mode="sideways")


def test_the_cpu_bound_handler_burns_cpu_time_and_answers_done():
    t0 = time.thread_time()
    serve_cpu_bound_app.burn(0.01)
    assert time.thread_time() - t0 >= 0.01
    import asyncio
    sent = []

    async def send(msg):
        sent.append(msg)
    t0 = time.thread_time()
    asyncio.run(serve_cpu_bound_app.asgi({"type": "http"}, None, send))
    assert time.thread_time() - t0 >= serve_cpu_bound_app.BURN_S == 0.021
    assert sent[0]["status"] == 200 and sent[1]["body"] == b"done"
    assert serve_suite.CPU_APP.expect == b"done"


@pytest.mark.skipif(shutil.which("ab") is None, reason="ab not installed (apache2-utils)")
def test_a_run_of_the_cpu_bound_row_in_both_modes(tmp_path):
    """The smallest real run: ``ray-lite bench serve --only B23 --http-mode
    both``: ray_lite's two rows are measured, labelled and related, and the
    table keeps within 100 columns."""
    out_json = tmp_path / "serve.json"
    env = dict(os.environ, RAY_LITE_BENCH_SMOKE="1")
    env.pop("RAY_SERVE_ENABLE_DIRECT_INGRESS", None)
    out = subprocess.run([sys.executable, "-m", "ray_lite.bench", "serve", "--only", "B23",
                          "--http-mode", "both", "--json", str(out_json)],
                         env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert all(len(line) <= 100 for line in out.stdout.splitlines()), out.stdout
    result = json.loads(out_json.read_text())
    figs = {f["label"]: f for f in result["suites"]["serve"]["figures"]}
    for label, mode in (("ray_lite (proxies)", "proxies"), ("ray_lite (direct)", "direct")):
        f = figs[label]
        assert (f["bench"], f["status"], f["unit"]) == ("B23", "ok", "req/s")
        assert f["value"] > 0 and f["detail"]["http_mode"] == mode
        assert f["note"].count("0 failed") == 1
    assert figs["ray_lite (direct)"]["detail"]["x_proxies"] > 0
    assert "ray_lite (proxies)" in out.stdout and "ray_lite (direct)" in out.stdout
