"""Pieces of ``ray-lite bench serve`` that need no HTTP load tool: the CPU
of a server's process tree (B16) and the figures of interleaved rounds."""
import os
import subprocess
import sys
import types

from ray_lite.bench import _procs, serve_suite

# Burns CPU until its own clock shows 0.2 s, says so, then waits for stdin to close.
BURNER = """
import sys, time
while time.process_time() < 0.2:
    pass
print("burnt", flush=True)
sys.stdin.read()
"""


def test_the_cpu_of_a_process_tree_counts_its_descendants():
    before = _procs.tree_cpu_s(os.getpid())
    # A grandchild: the tree is followed past the first level.
    proc = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', sys.argv[1]]); "
         "sys.exit(p.wait())", BURNER],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "burnt\n"
        during = _procs.tree_cpu_s(os.getpid())
        alone = _procs.tree_cpu_s(proc.pid)
    finally:
        proc.stdin.close()
        proc.wait(60)
    # The grandchild's 0.2 s, less what the kernel's clock ticks drop: a tick
    # each of its user and system time (0.19 read as 0.18999... once).
    assert during - before >= 0.175
    assert alone >= 0.175
    assert _procs.tree_cpu_s(proc.pid) == 0.0   # gone: nothing to count


def test_a_figure_of_rounds_is_their_median_with_min_and_max():
    rounds = [(900.0, {"failed": 0, "p50_ms": 10, "p99_ms": 30}),
              (1100.0, {"failed": 2, "p50_ms": 12, "p99_ms": 50}),
              (1000.0, {"failed": 0, "p50_ms": 11, "p99_ms": 40})]
    fig = serve_suite._round_figures("B7", "HTTP hi", "req/s", "ray_lite", "ray_lite", rounds,
                                     goals=True)
    assert (fig.value, fig.spread, fig.trials) == (1000.0, {"min": 900.0, "max": 1100.0}, 3)
    assert fig.detail["rounds"] == [900.0, 1100.0, 1000.0]
    # Failed requests are said; the goal (B7's, over bare uvicorn) is judged later.
    assert fig.goal_id == "B7" and "2 failed" in fig.note and "P99 50 ms" in fig.note
    cpu = serve_suite._round_figures("B16", "CPU per request", "us", "anchor", "Ray Serve",
                                     [(80.0, {}), (60.0, {})], goals=False)
    assert cpu.value == 70.0 and cpu.goal_id is None


class _FakeServer:
    """Stands in for a real server: records the order servers run in."""
    started = []
    fail_second_ray = True      # Ray Serve's second start fails

    def __init__(self, python, raymod, replicas, app=None, http_mode=None):
        self.raymod = raymod
        self.http_mode = http_mode
        self.app = app or serve_suite.HI_APP
        self.replicas = replicas
        self.port = len(self.started)
        self.up_s = 0.25
        self.stderr_lines = []
        self.cpu = 0.0
        self.started.append(raymod)
        if self.fail_second_ray and raymod == "ray" and self.started.count("ray") == 2:
            raise RuntimeError("Ray Serve failed to start")

    def wait_up(self, timeout):
        return self.up_s

    def wait_ready(self, timeout):
        if self.raymod == "ray_lite":
            self.stderr_lines = ["ray_lite: the zygote (pid 1) runs the pure-Python hot paths "
                                 "while its parent's are compiled: RAY_LITE_NO_EXTENSIONS=1"]

    def cpu_s(self):
        self.cpu += 0.5        # 0.5 s of CPU during each wrk run
        return self.cpu

    def stop(self):
        pass


def test_http_rounds_interleave_the_servers_and_keep_what_a_failed_round_measured(monkeypatch):
    from ray_lite.bench._harness import Context
    _FakeServer.started = []
    monkeypatch.setattr(serve_suite, "_Server", _FakeServer)
    monkeypatch.setattr(serve_suite.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    rps = {"ray_lite": 1000.0, "ray": 100.0, "uvicorn": 2000.0}

    def fake_ab(port, n, c):
        kind = _FakeServer.started[port]
        return {"rps": rps[kind], "failed": 0, "mean_ms": 0.2, "p50_ms": 0, "p99_ms": 1}

    def fake_wrk(port, seconds):
        return {"rps": rps[_FakeServer.started[port]] * 2, "requests": 10000, "non2xx": 0}
    monkeypatch.setattr(serve_suite, "_ab", fake_ab)
    monkeypatch.setattr(serve_suite, "_wrk", fake_wrk)
    monkeypatch.setattr(serve_suite, "_http_servers", lambda ctx, app=None: [
        ("py", "ray_lite", "ray_lite", "ray_lite", True), ("py", "ray", "anchor", "Ray Serve", False),
        ("py", "uvicorn", "ceiling", "bare uvicorn", False)])
    ctx = Context(scale="quick", compare_ray="py", log=lambda msg: None)
    figs = serve_suite._http_figures(ctx)
    # 3 rounds; Ray Serve's second round failed, so it is not started again.
    assert _FakeServer.started == ["ray_lite", "ray", "uvicorn", "ray_lite", "ray", "uvicorn",
                                   "ray_lite", "uvicorn"]
    by = {(f.bench, f.impl): f for f in figs}
    assert by[("B7", "ray_lite")].value == 1000.0 and by[("B7", "ray_lite")].trials == 3
    assert by[("B8", "ceiling")].value == 4000.0
    assert by[("B16", "ray_lite")].value == 50.0          # 0.5 s / 10,000 requests
    assert ("B10", "ceiling") not in by                    # uvicorn has no replicas to start
    assert by[("B7", "anchor")].trials == 1
    assert "1 of 3 rounds; then RuntimeError: Ray Serve failed to start" in by[("B7", "anchor")].note
    assert "pure-Python hot paths" in by[("B8", "ray_lite")].note


def test_the_hi_app_is_also_measured_on_uvicorn_with_a_worker_per_core(monkeypatch):
    """B8's goal is relative to uvicorn with as many workers as cores: the hi
    app's rounds run it beside one-process uvicorn; the other apps do not."""
    from ray_lite.bench import _servers
    from ray_lite.bench._harness import Context
    monkeypatch.setattr(serve_suite.subprocess, "run",
                        lambda *a, **kw: types.SimpleNamespace(returncode=0))
    ctx = Context(scale="quick", compare_ray="/ray/python", log=lambda msg: None)
    hi = serve_suite._http_servers(ctx, serve_suite.HI_APP)
    n = _servers.uvicorn_workers()
    assert [s[1:4] for s in hi] == [
        ("ray_lite", "ray_lite", "ray_lite"), ("ray", "anchor", "Ray Serve"),
        (_servers.GRANIAN, "ceiling", "granian, 1 worker"),
        (_servers.UVICORN_WORKERS, "ceiling", f"uvicorn, {n} workers"),
        ("uvicorn", "ceiling", "bare uvicorn")]       # the last ceiling: the one compared with
    assert all(s[0] == "/ray/python" for s in hi[1:])
    sse = serve_suite._http_servers(ctx, serve_suite.SSE_APP)
    assert {_servers.UVICORN_WORKERS, _servers.GRANIAN}.isdisjoint(s[1] for s in sse)
    # The server's command: the bare ASGI app by import string, a worker per core.
    monkeypatch.setattr(_servers.subprocess, "Popen", lambda cmd, **kw: cmd)
    srv = _servers.Server("/ray/python", _servers.UVICORN_WORKERS, 48)
    assert srv.proc[-2:] == ["_hi_asgi:app", str(n)]
    srv.out.close()
    srv.err.close()


def test_b14_and_b15_run_their_apps_in_interleaved_rounds(monkeypatch):
    from ray_lite.bench._harness import Context
    _FakeServer.started = []
    servers = []
    real_init = _FakeServer.__init__

    def recording_init(self, python, raymod, replicas, app=None, http_mode=None):
        real_init(self, python, raymod, replicas, app, http_mode)
        servers.append((raymod, self.app.module, replicas))
    monkeypatch.setattr(_FakeServer, "__init__", recording_init)
    monkeypatch.setattr(_FakeServer, "fail_second_ray", False)
    monkeypatch.setattr(serve_suite, "_Server", _FakeServer)
    monkeypatch.setattr(serve_suite.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    paths = []

    def fake_wrk(port, seconds, path="/"):
        paths.append(path)
        rps = {"ray_lite": 1000.0, "ray": 10.0, "uvicorn": 400.0}[_FakeServer.started[port]]
        return {"rps": rps, "requests": 100, "non2xx": 0}
    monkeypatch.setattr(serve_suite, "_wrk", fake_wrk)
    monkeypatch.setattr(serve_suite, "_http_servers", lambda ctx, app=None: [
        ("py", "ray_lite", "ray_lite", "ray_lite", True), ("py", "ray", "anchor", "Ray Serve", False),
        ("py", "uvicorn", "ceiling", "bare uvicorn", False)])
    ctx = Context(scale="full", compare_ray="py", log=lambda msg: None)
    sse = serve_suite._http_figures(ctx, serve_suite.SSE_APP)
    fastapi = serve_suite._http_figures(ctx, serve_suite.FASTAPI_APP)
    # Five rounds of each app, the three servers in turn, with the replicas asked for.
    assert servers[:3] == [("ray_lite", "serve_sse_app", 4), ("ray", "serve_sse_app", 4),
                           ("uvicorn", "serve_sse_app", 4)]
    assert len(servers) == 30 and servers[15] == ("ray_lite", "serve_fastapi_app", 8)
    assert set(paths) == {"/?n=100", "/echo/hi?times=2"}
    by = {(f.bench, f.impl): f for f in sse + fastapi}
    assert set(by) == {(b, i) for b in ("B14", "B15") for i in ("ray_lite", "anchor", "ceiling")}
    assert by[("B14", "ray_lite")].unit == "events/s"
    assert by[("B14", "ray_lite")].value == 100_000.0     # 1,000 req/s x 100 events
    assert by[("B15", "ceiling")].value == 400.0 and by[("B15", "ceiling")].unit == "req/s"
    assert by[("B15", "anchor")].trials == 5 and by[("B15", "anchor")].note == "0 non-2xx"
    # Their goals ("kept": their factor over bare uvicorn, less 10 %) are
    # judged on ray_lite's rows against the ceiling of the same run.
    from ray_lite.bench._goals import judge
    from ray_lite.bench._harness import relate_to_anchors
    figs = sse + fastapi
    relate_to_anchors(figs)
    judge(figs)
    b14, b15 = by[("B14", "ray_lite")], by[("B15", "ray_lite")]
    assert b14.detail["x_ceiling"] == 2.5 and b14.detail["x_anchor"] == 100.0
    assert b14.goal == ">= 3.2x bare uvicorn (kept)" and b14.goal_met is False
    assert b15.goal == ">= 1.6x bare uvicorn (kept)" and b15.goal_met is True
    assert all(f.goal is None for f in figs if f.impl != "ray_lite")


def test_the_b14_ceiling_streams_100_events_and_the_b15_app_echoes():
    import asyncio

    from ray_lite.bench import serve_fastapi_app, serve_sse_app
    sent = []

    async def send(msg):
        sent.append(msg)
    asyncio.run(serve_sse_app.asgi({"type": "http", "query_string": b"n=100"}, None, send))
    events = b"".join(m.get("body", b"") for m in sent[1:]).decode()
    assert sent[0]["status"] == 200
    assert events.count("data: tok") == 100 and events.startswith("data: tok0\n\n")
    assert serve_fastapi_app.echo("hi", 2) == {"echo": "hi hi"}
    # The figure's first answer is what wait_up looks for.
    assert serve_suite.SSE_APP.expect == b"data: tok0"
    assert serve_suite.FASTAPI_APP.expect == b'{"echo":"hi hi"}'


def test_the_b2_workload_runs_as_a_file_outside_the_package(tmp_path):
    """Ray's Python runs ``_serve_workloads.py`` as a file, with no ray_lite:
    everything up to importing the runtime RAYMOD names works standalone
    (isolated mode: no ray_lite on its path), and the runtime is the one asked for."""
    path = os.path.join(os.path.dirname(serve_suite.__file__), "_serve_workloads.py")
    env = dict(os.environ, RAYMOD="no_such_runtime_for_the_test")
    out = subprocess.run([sys.executable, "-I", path], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "No module named 'no_such_runtime_for_the_test'" in out.stderr, out.stderr[-1000:]
