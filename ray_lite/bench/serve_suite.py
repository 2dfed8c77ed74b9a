"""Serve benchmarks: B7, B8, B9 (HTTP), B16 (CPU per request), B2 (handle
streaming), B10 (48 replicas up), B14 (server-sent events), B15 (a FastAPI
ingress), B23 (a CPU-bound handler)
(``ray-lite bench serve [--compare-ray PYTHON] [--http-mode MODE]``).

B7/B8/B9 load the 48-replica "hi" app (``serve_hi_app.py``, the Ray issue's
reproduction) started with ``ray-lite serve run ...:model`` using ``ab`` and
``wrk`` (Debian: ``apt-get install -y apache2-utils wrk``).  B10 is the time
from starting that command to the first answer.  B16 is the CPU time (user +
system) all the server's processes spend per request during the wrk run.
B2 runs the workload of Ray's ``streaming_handle_throughput.py``
(``_serve_workloads.py``, a file Ray's Python runs as is).  With ``--compare-ray`` the same app and workload run on Ray
Serve with that Python, and B7/B8/B9/B16 also on a bare "hi" ASGI app served
by uvicorn (uvloop, httptools, one process) when that Python has them: the
ceiling of one Python process answering by itself, with no replica behind it.

B14 and B15 load two more apps the same way (``serve_sse_app.py``: 100
server-sent events a request from 4 replicas; ``serve_fastapi_app.py``:
``GET /echo/{word}?times=2`` on a FastAPI app behind ``@serve.ingress``, 8
replicas) with ``wrk -t1 -c100``; their ceiling is the same stream, or the
same FastAPI app, on bare uvicorn.

B23 loads ``serve_cpu_bound_app.py`` (21 ms of pure Python a request, 2
replicas) with ``ab -c 8``: the case where routing by load matters most.
Its ceilings are the same handler on bare uvicorn, one process and a worker
per core.

``--http-mode`` says how ray_lite's Serve takes HTTP in every HTTP row:
``proxies`` (the default), ``direct`` (direct ingress: the ingress replicas
listen themselves) or ``both``: each row measured in both modes, labelled
"ray_lite (proxies)" and "ray_lite (direct)", in the same interleaved
rounds (the two modes' order alternating from round to round); a direct
row then says its factor over the proxies' (``detail["x_proxies"]``).

Every HTTP figure is the median of several rounds, with their min-max: in
each round every server (ray_lite, then its anchors) is started, measured
once every replica is ready (the server says so once ``serve.run``
returned, which waits for all of them), and stopped -- so a drift of the
machine during the run touches all of them alike, and one server never
runs beside another.
"""
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
from collections import namedtuple

from .._private.process.boot import python_argv
from ._harness import ERROR, UNAVAILABLE, Figure, missing, ratio_text, summarize_trials
from ._procs import start_hog, stop_hog
from ._servers import GRANIAN, HI, HTTP_MODES, UVICORN_WORKERS, AppSpec, env_for, is_bare_server
from ._servers import Server as _Server
from ._servers import uvicorn_workers

HERE = os.path.dirname(os.path.abspath(__file__))
B2_NAME = "handle streaming, Caller -> Endpoint, tokens/s"

DESCRIPTION = ("Serve: HTTP req/s (ab, wrk), latency at c=1, CPU per request, handle "
               "streaming, 48 replicas up, server-sent events, FastAPI ingress, CPU-bound")
INSTALL = "apt-get install -y apache2-utils wrk"
#: ``--http-mode``: what each names (``Context.http_mode``; default "proxies").
# Serve's own default (direct ingress: _direct.direct_ingress_on).
DEFAULT_HTTP_MODE = "direct"
HTTP_MODE_CHOICES = {"proxies": ("proxies",), "direct": ("direct",), "both": HTTP_MODES}


def _sizes(ctx):
    return {"replicas": ctx.pick(48, 48, 4), "ab_n": ctx.pick(10000, 3000, 300),
            "wrk_s": ctx.pick(10, 3, 1), "c1_n": ctx.pick(2000, 500, 50),
            "rounds": ctx.pick(5, 3, 1),
            "b2_trials": ctx.pick(5, 2, 1), "b2_trial_s": ctx.pick(5, 2, 0.3),
            "b2_tokens": ctx.pick(1000, 1000, 100),
            "sse_replicas": ctx.pick(4, 4, 2), "fastapi_replicas": ctx.pick(8, 8, 2),
            "cpu_replicas": 2, "cpu_n": ctx.pick(1000, 200, 16),
            "warm_s": ctx.pick(2, 1, 0)}


def _ab(port, n, c):
    run = subprocess.run(["ab", "-n", str(n), "-c", str(c), f"http://127.0.0.1:{port}/"],
                         capture_output=True, text=True, timeout=900)
    out = run.stdout

    def grab(pattern, default=None):
        m = re.search(pattern, out)
        return float(m.group(1)) if m else default
    rps = grab(r"Requests per second:\s+([\d.]+)")
    if rps is None:
        raise RuntimeError(f"ab failed: {run.stderr.strip()[-300:] or out[-400:]}")
    return {"rps": rps, "failed": int(grab(r"Failed requests:\s+(\d+)", 0)),
            "mean_ms": grab(r"Time per request:\s+([\d.]+) \[ms\] \(mean\)"),
            "p50_ms": grab(r"\n\s+50%\s+(\d+)"), "p99_ms": grab(r"\n\s+99%\s+(\d+)")}


def _wrk(port, seconds, path="/"):
    out = subprocess.run(["wrk", "-t1", "-c100", f"-d{seconds}s", f"http://127.0.0.1:{port}{path}"],
                         capture_output=True, text=True, timeout=seconds + 120).stdout
    m = re.search(r"Requests/sec:\s+([\d.]+)", out)
    n = re.search(r"(\d+) requests in", out)
    if m is None or n is None:
        raise RuntimeError(f"wrk failed: {out[-400:]}")
    errors = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    return {"rps": float(m.group(1)), "requests": int(n.group(1)),
            "non2xx": int(errors.group(1)) if errors else 0}


# (bench, name, unit, stat of one round); the values are medians of rounds.
def _http_rows(replicas):
    return {"B10": (f"serve run of {replicas} replicas until it answers (CLI start included)",
                    "s"),
            "B7": (f"HTTP hi, {replicas} replicas, ab -c 100", "req/s"),
            "B9": ("HTTP latency, ab -c 1 (new connection each)", "us"),
            "B8": ("HTTP hi, keep-alive, wrk -t1 -c100", "req/s"),
            "B16": ("CPU per HTTP request, all the server's processes, wrk -t1 -c100", "us")}


def _one_round(srv, sz, have_ab, have_wrk):
    """One round of every load on a ready server: {bench: (value, detail)}."""
    out = {}
    if not is_bare_server(srv.raymod):
        out["B10"] = (srv.up_s, {})
    if have_ab:
        _ab(srv.port, 200, 10)    # warm-up
        r = _ab(srv.port, sz["ab_n"], 100)
        out["B7"] = (r["rps"], r)
        r = _ab(srv.port, sz["c1_n"], 1)
        out["B9"] = (r["mean_ms"] * 1000, r)
    if have_wrk:
        cpu0 = srv.cpu_s()
        r = _wrk(srv.port, sz["wrk_s"])
        cpu = srv.cpu_s() - cpu0
        out["B8"] = (r["rps"], r)
        out["B16"] = (cpu * 1e6 / max(r["requests"], 1), {"cpu_s": cpu, "requests": r["requests"]})
    return out


def _wrk_round(bench, per_request):
    """One round of an app's wrk load: {bench: (requests/s x ``per_request``, detail)}."""
    def one_round(srv, sz, have_ab, have_wrk):
        if not have_wrk:
            return {}
        if sz["warm_s"]:
            _wrk(srv.port, sz["warm_s"], srv.app.path)
        r = _wrk(srv.port, sz["wrk_s"], srv.app.path)
        return {bench: (r["rps"] * per_request, r)}
    return one_round


def _cpu_round(srv, sz, have_ab, have_wrk):
    """One round of B23: ``ab -c 8`` on the CPU-bound app."""
    if not have_ab:
        return {}
    _ab(srv.port, 16, 8)      # warm-up: every replica has run the handler
    r = _ab(srv.port, sz["cpu_n"], 8)
    return {"B23": (r["rps"], r)}


class _App(AppSpec):
    """An app the HTTP benchmarks load (:class:`AppSpec`), with the sizes'
    key of its replica count, and ``rows(replicas)``: the figures ({bench:
    (name, unit)}) that ``one_round(server, sizes, have_ab, have_wrk)``
    measures."""

    def __init__(self, module, asgi, replicas, path, expect, rows, one_round):
        super().__init__(module, asgi, path, expect)
        self.replicas = replicas
        self.rows, self.one_round = rows, one_round


HI_APP = _App(HI.module, HI.asgi, "replicas", HI.path, HI.expect, _http_rows, _one_round)
SSE_APP = _App(
    "serve_sse_app", "asgi", "sse_replicas", "/?n=100", b"data: tok0",
    lambda n: {"B14": (f"HTTP server-sent events, 100 a request, {n} replicas, wrk -t1 -c100",
                       "events/s")},
    _wrk_round("B14", 100))
FASTAPI_APP = _App(
    "serve_fastapi_app", "app", "fastapi_replicas", "/echo/hi?times=2", b'{"echo":"hi hi"}',
    lambda n: {"B15": (f"HTTP FastAPI ingress, GET /echo/{{word}}?times=2, {n} replicas, "
                       f"wrk -t1 -c100", "req/s")},
    _wrk_round("B15", 1))
CPU_APP = _App(
    "serve_cpu_bound_app", "asgi", "cpu_replicas", "/", b"done",
    lambda n: {"B23": (f"HTTP CPU-bound, 21 ms of Python a request, {n} replicas, ab -c 8",
                       "req/s")},
    _cpu_round)
# The benches the wrk load measures (the others: ab, or the start-up).
_WRK_BENCHES = ("B8", "B16", "B14", "B15")


def _round_figures(bench, name, unit, impl, label, rounds, goals):
    """A row of the rounds' figures; ``goals``: whether it is judged against
    its workload's goal (``_goals.GOALS``; the hi app's B10 has none)."""
    values = [r[0] for r in rounds]
    value, spread = summarize_trials(values)
    fig = Figure(bench=bench, name=name, impl=impl, label=label, unit=unit, value=value,
                 spread=spread, trials=len(values), detail={"rounds": values},
                 goal_id=bench if goals and bench != "B10" else None)
    details = [r[1] for r in rounds]
    if bench in ("B7", "B9", "B23"):
        fig.detail.update(p50_ms=[d["p50_ms"] for d in details],
                          p99_ms=[d["p99_ms"] for d in details])
    if bench in ("B7", "B23"):
        failed = sum(d["failed"] for d in details)
        fig.note = (f"{failed} failed, P50 {statistics.median(d['p50_ms'] for d in details):g} ms"
                    f", P99 {max(d['p99_ms'] for d in details):g} ms")
    elif bench == "B9":
        fig.note = (f"P50 {statistics.median(d['p50_ms'] for d in details):g} ms, "
                    f"P99 {max(d['p99_ms'] for d in details):g} ms")
    elif bench in ("B8", "B14", "B15"):
        fig.note = f"{sum(d['non2xx'] for d in details)} non-2xx"
    return fig


#: A server an HTTP row measures; ``label`` is unique among a run's servers,
#: ``mode`` is ray_lite's HTTP mode (None: not ray_lite).
_Srv = namedtuple("_Srv", "python raymod impl label goals mode", defaults=(None,))


def http_modes(ctx):
    """The HTTP modes of ray_lite this run measures (``ctx.http_mode``)."""
    choice = getattr(ctx, "http_mode", None) or DEFAULT_HTTP_MODE
    if choice not in HTTP_MODE_CHOICES:
        raise ValueError(f"http mode must be one of {', '.join(HTTP_MODE_CHOICES)}, "
                         f"got {choice!r}")
    return HTTP_MODE_CHOICES[choice]


def mode_label(mode, modes):
    """ray_lite's label in ``mode``: "ray_lite" when the run measures Serve's
    default mode alone, else "ray_lite (proxies)" / "ray_lite (direct)"."""
    return "ray_lite" if modes == (DEFAULT_HTTP_MODE,) else f"ray_lite ({mode})"


def _http_servers(ctx, app=None):
    """(python, raymod, impl, label, goals, mode) of every server this run
    measures for ``app`` (default: the hi app)."""
    modes = http_modes(ctx)
    servers = [(sys.executable, "ray_lite", "ray_lite", mode_label(m, modes), True, m)
               for m in modes]
    python = ctx.compare_ray
    if python:
        servers.append((python, "ray", "anchor", "Ray Serve", False))
    # The ceiling: from the Ray Python with --compare-ray, else from this one
    # when it has uvicorn (pip install uvicorn), so that a run without Ray
    # still measures ray_lite against one bare Python process.
    python = python or sys.executable
    wide = app in (None, HI_APP, CPU_APP)
    if wide:
        # The marks past one process: granian with one worker (an HTTP
        # server in Rust), where installed, and below, uvicorn with a worker
        # process per core (B8's goal; B23's: the machine's ceiling).
        probe = subprocess.run([python, "-c", "import granian"], capture_output=True,
                               timeout=120)
        if probe.returncode == 0:
            servers.append((python, GRANIAN, "ceiling", "granian, 1 worker", False))
    probe = subprocess.run([python, "-c", "import uvicorn, uvloop, httptools"],
                           capture_output=True, timeout=120)
    if probe.returncode == 0:
        if wide:
            # Before the one-process ceiling, which stays the one the table
            # compares with.
            servers.append((python, UVICORN_WORKERS, "ceiling",
                            f"uvicorn, {uvicorn_workers()} workers", False))
        servers.append((python, "uvicorn", "ceiling", "bare uvicorn", False))
    return servers


def _http_figures(ctx, app=None):
    """B10, B7, B9, B8, B16 of ray_lite (or, given another ``_App``, its
    figures) and (with --compare-ray) its anchors, in interleaved rounds."""
    app = app or HI_APP
    sz = _sizes(ctx)
    replicas = sz[app.replicas]
    rows = app.rows(replicas)
    have_ab, have_wrk = shutil.which("ab"), shutil.which("wrk")
    servers = [_Srv(*s) for s in _http_servers(ctx, app)]
    rounds = {s.label: [] for s in servers}    # label -> [{bench: (value, detail)}]
    errors = {}                                # label -> reason
    warnings = {}                              # label -> stderr lines about the twins
    for i in range(sz["rounds"]):
        for python, raymod, impl, label, _, mode in _round_order(servers, i):
            if label in errors:
                continue
            ctx.log(f"serve: round {i + 1}/{sz['rounds']}: {label}")
            srv = None
            try:
                srv = _Server(python, raymod, replicas, app, http_mode=mode)
                srv.wait_up(600)
                srv.wait_ready(600)
                hog = start_hog() if getattr(ctx, "beside_hog", False) else None
                try:
                    rounds[label].append(app.one_round(srv, sz, have_ab, have_wrk))
                finally:
                    stop_hog(hog)
            except Exception as exc:   # noqa: BLE001 - a row, not a crash
                errors[label] = f"{type(exc).__name__}: {exc}"
            finally:
                if srv is not None:
                    srv.stop()
                    lines = [ln for ln in srv.stderr_lines if "pure-Python hot paths" in ln]
                    if lines:
                        warnings[label] = lines[0]
    figs = []
    for python, raymod, impl, label, goals, mode in servers:
        got = rounds[label]
        for bench, (name, unit) in rows.items():
            if bench == "B10" and is_bare_server(raymod):
                continue
            per_round = [r[bench] for r in got if bench in r]
            if label in errors and not per_round:
                figs.append(missing(bench, name, impl, label, unit, ERROR, errors[label]))
            elif not per_round:
                tool = "wrk" if bench in _WRK_BENCHES else "ab"
                figs.append(missing(bench, name, impl, label, unit, UNAVAILABLE,
                                    f"{tool} not found: {INSTALL}"))
            else:
                fig = _round_figures(bench, name, unit, impl, label, per_round, goals)
                if mode:
                    fig.detail["http_mode"] = mode
                remarks = [fig.note, warnings.get(label)]
                if label in errors:     # a later round failed: say so beside the others
                    remarks.append(f"{len(per_round)} of {sz['rounds']} rounds; then "
                                   f"{errors[label]}")
                fig.note = "; ".join(r for r in remarks if r) or None
                figs.append(fig)
    _relate_modes(figs, [s for s in servers if s.mode])
    if ctx.compare_ray and not any(s[1] == "uvicorn" for s in servers):
        bench = "B9" if app is HI_APP else next(iter(rows))
        what = "hi" if app is HI_APP else app.module
        figs.append(missing(bench, f"HTTP {what} (bare uvicorn)", "ceiling",
                            "bare uvicorn", rows.get(bench, ("", "us"))[1], UNAVAILABLE,
                            f"{ctx.compare_ray} lacks uvicorn, uvloop or httptools"))
    return figs


def _round_order(servers, i):
    """The servers of round ``i``: ray_lite's modes swap places every other
    round, so that neither always runs first."""
    if i % 2 == 0:
        return servers
    at = [k for k, s in enumerate(servers) if s.mode]
    out = list(servers)
    for k, j in zip(at, reversed(at)):
        out[k] = servers[j]
    return out


def _relate_modes(figs, ours):
    """With both modes measured: each direct row's factor over the proxies'
    row of the same figure (> 1: direct is better), in its detail
    (``x_proxies``) and first in its note."""
    proxies = next((s.label for s in ours if s.mode == "proxies"), None)
    direct = next((s.label for s in ours if s.mode == "direct"), None)
    if proxies is None or direct is None:
        return
    ref = {(f.bench, f.name): f for f in figs if f.label == proxies and f.value}
    for f in figs:
        p = ref.get((f.bench, f.name))
        if f.label != direct or not f.value or p is None:
            continue
        x = f.value / p.value if f.unit.endswith("/s") else p.value / f.value
        f.detail["x_proxies"] = round(x, 3)
        f.note = f"{ratio_text(x)} proxies" + (f"; {f.note}" if f.note else "")


def _b2(ctx, python, raymod, impl, label, goals):
    sz = _sizes(ctx)
    env = env_for(raymod, 1)
    env.update(TOKENS=str(sz["b2_tokens"]), TRIALS=str(sz["b2_trials"]),
               TRIAL_S=str(sz["b2_trial_s"]), BATCH="10")
    cmd = (python_argv("from ray_lite.bench._serve_workloads import b2_main; b2_main()",
                       "B2 benchmark", python=python) if raymod == "ray_lite"
           else [python, os.path.join(HERE, "_serve_workloads.py")])
    out = subprocess.run(cmd, env=env,
                         capture_output=True, text=True, timeout=1200, cwd=HERE)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[7:])
            return [Figure(bench="B2", name=B2_NAME,
                           impl=impl, label=label, unit="tokens/s", value=r["mean"],
                           stat="mean", spread={"std": r["std"]}, trials=sz["b2_trials"],
                           note=f"P50 {r['p50']:.1f} ms per stream", detail=r,
                           goal_id="B2" if goals else None)]
    return [missing("B2", B2_NAME, impl, label, "tokens/s", ERROR,
                    f"exit {out.returncode}: {out.stderr.strip()[-600:]}")]


def run(ctx):
    """ray_lite's figures and, with --compare-ray, the HTTP anchors too: they
    are measured in the same interleaved rounds."""
    figs = []
    for app in (HI_APP, SSE_APP, FASTAPI_APP, CPU_APP):
        if not _wanted(ctx, app.rows(0)):
            continue
        try:
            figs += _http_figures(ctx, app)
        except Exception as exc:   # noqa: BLE001
            figs.append(missing("-", f"HTTP {app.module}", "ray_lite", "ray_lite", "", ERROR,
                                f"{type(exc).__name__}: {exc}"))
    if not _wanted(ctx, {"B2": None}):
        return figs
    try:
        figs += _b2(ctx, sys.executable, "ray_lite", "ray_lite", "ray_lite", True)
    except Exception as exc:   # noqa: BLE001
        figs.append(missing("B2", B2_NAME, "ray_lite", "ray_lite", "tokens/s", ERROR,
                            f"{type(exc).__name__}: {exc}"))
    return figs


def _wanted(ctx, rows):
    """Whether ``--only`` (``ctx.only``) keeps any of these benches; the hi
    app's rows are B7-B10 and B16, always measured together."""
    only = getattr(ctx, "only", None)
    return only is None or any(bench in only for bench in rows)


def compare_ray(ctx, python):
    """Ray Serve's B2 (its HTTP figures come with ``run``'s rounds)."""
    if not _wanted(ctx, {"B2": None}):
        return []
    try:
        return _b2(ctx, python, "ray", "anchor", "Ray Serve", False)
    except Exception as exc:   # noqa: BLE001
        return [missing("B2", B2_NAME, "anchor", "Ray Serve", "tokens/s", ERROR,
                        f"{type(exc).__name__}: {exc}")]
