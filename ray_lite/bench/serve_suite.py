"""Serve benchmarks: B7, B8, B9 (HTTP), B2 (handle streaming), B10 (48 replicas up)
(``ray-lite bench serve [--compare-ray PYTHON]``).

B7/B8/B9 load the 48-replica "hi" app (``serve_hi_app.py``, the Ray issue's
reproduction) started with ``ray-lite serve run ...:model`` using ``ab`` and
``wrk`` (Debian: ``apt-get install -y apache2-utils wrk``).  B10 is the time
from starting that command to the first answer.  B2 runs the workload of
Ray's ``streaming_handle_throughput.py`` (below, ``_b2_main``).  With
``--compare-ray`` the same app and workload run on Ray Serve with that Python,
and B7/B8/B9 also on a bare "hi" ASGI app served by uvicorn (uvloop,
httptools, one process) when that Python has them: the ceiling of one
Python process answering by itself, with no replica behind it.
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

if __package__:
    from ._harness import ERROR, UNAVAILABLE, Figure, missing

# Goals relative to bare uvicorn, the ceiling measured in the same run (with
# --compare-ray): B7 1.2 times its req/s, B8 as many, B9 no more time.
CEILING_GOALS = {"B7": 1.2, "B8": 1.0, "B9": 1.0}
DESCRIPTION = "Serve: HTTP req/s (ab, wrk), latency at c=1, handle streaming, 48 replicas up"
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
INSTALL = "apt-get install -y apache2-utils wrk"


def _sizes(ctx):
    return {"replicas": ctx.pick(48, 48, 4), "ab_n": ctx.pick(10000, 3000, 300),
            "wrk_s": ctx.pick(10, 3, 1), "c1_n": ctx.pick(2000, 500, 50),
            "b2_trials": ctx.pick(5, 2, 1), "b2_trial_s": ctx.pick(5, 2, 0.3),
            "b2_tokens": ctx.pick(1000, 1000, 100)}


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _env(raymod, replicas):
    env = dict(os.environ, RAYMOD=raymod, REPLICAS=str(replicas), RAY_AUTH_MODE="disabled")
    if raymod == "ray_lite":
        env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in sys.path if p])
    return env


_RAY_SERVER = """
import sys, time, ray
from ray import serve
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
serve.start(http_options={"host": "127.0.0.1", "port": int(sys.argv[1])})
sys.path.insert(0, sys.argv[2])
import ray.cloudpickle as cloudpickle, serve_hi_app
cloudpickle.register_pickle_by_value(serve_hi_app)   # Ray's workers cannot import it
serve.run(serve_hi_app.model({}), route_prefix="/")
time.sleep(3600)
"""


_UVICORN_SERVER = """
import sys, uvicorn

async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain; charset=utf-8")]})
    await send({"type": "http.response.body", "body": b"hi"})

uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), loop="uvloop", http="httptools",
            access_log=False, log_level="warning")
"""


class _Server:
    """The hi app served by ray_lite's CLI, Ray Serve or bare uvicorn, until stopped."""

    def __init__(self, python, raymod, replicas):
        self.port = _free_port()
        self.raymod = raymod
        env = _env(raymod, replicas)
        if raymod == "ray_lite":
            cmd = [python, "-c", "import sys; from ray_lite.scripts import main; sys.exit(main())",
                   "serve", "run", "ray_lite.bench.serve_hi_app:model", "--port", str(self.port)]
        elif raymod == "uvicorn":
            cmd = [python, "-c", _UVICORN_SERVER, str(self.port)]
        else:
            cmd = [python, "-c", _RAY_SERVER, str(self.port), HERE]
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        self.up_s = None

    def wait_up(self, timeout):
        url = f"http://127.0.0.1:{self.port}/"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the {self.raymod} server exited ({self.proc.returncode})")
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.read() == b"hi":
                        self.up_s = time.monotonic() - self.t0
                        return self.up_s
            except OSError:
                time.sleep(0.01)
        raise RuntimeError(f"the {self.raymod} server did not answer within {timeout} s")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT if self.raymod == "ray" else signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        if self.raymod == "ray":
            ray_bin = os.path.join(os.path.dirname(self.proc.args[0]), "ray")
            if os.path.exists(ray_bin):
                subprocess.run([ray_bin, "stop", "--force"], capture_output=True, timeout=120)


def _ab(port, n, c):
    out = subprocess.run(["ab", "-n", str(n), "-c", str(c), f"http://127.0.0.1:{port}/"],
                         capture_output=True, text=True, timeout=900).stdout

    def grab(pattern, default=None):
        m = re.search(pattern, out)
        return float(m.group(1)) if m else default
    rps = grab(r"Requests per second:\s+([\d.]+)")
    if rps is None:
        raise RuntimeError(f"ab failed: {out[-400:]}")
    return {"rps": rps, "failed": int(grab(r"Failed requests:\s+(\d+)", 0)),
            "mean_ms": grab(r"Time per request:\s+([\d.]+) \[ms\] \(mean\)"),
            "p50_ms": grab(r"\n\s+50%\s+(\d+)"), "p99_ms": grab(r"\n\s+99%\s+(\d+)")}


def _wrk(port, seconds):
    out = subprocess.run(["wrk", "-t1", "-c100", f"-d{seconds}s", f"http://127.0.0.1:{port}/"],
                         capture_output=True, text=True, timeout=seconds + 120).stdout
    m = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if m is None:
        raise RuntimeError(f"wrk failed: {out[-400:]}")
    errors = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    return {"rps": float(m.group(1)), "non2xx": int(errors.group(1)) if errors else 0}


def _http_figures(ctx, python, raymod, impl, label, goals):
    sz = _sizes(ctx)
    figs = []
    have_ab, have_wrk = shutil.which("ab"), shutil.which("wrk")
    srv = _Server(python, raymod, sz["replicas"])
    try:
        up = srv.wait_up(600)
        if raymod != "uvicorn":
            figs.append(Figure(bench="B10", name=f"serve run of {sz['replicas']} replicas until "
                               f"it answers (CLI start included)", impl=impl, label=label,
                               unit="s", value=up, stat="once", trials=1,
                               goal="<= 0.5 s" if goals else None,
                               goal_met=(up <= 0.5) if goals else None))
        if have_ab:
            _ab(srv.port, 200, 10)    # warm-up
            r = _ab(srv.port, sz["ab_n"], 100)
            figs.append(Figure(bench="B7", name=f"HTTP hi, {sz['replicas']} replicas, ab -c 100",
                               impl=impl, label=label, unit="req/s", value=r["rps"], stat="once",
                               trials=1, samples=sz["ab_n"],
                               note=f"{r['failed']} failed, P50 {r['p50_ms']:g} ms, "
                                    f"P99 {r['p99_ms']:g} ms", detail=r,
                               goal="0 failed" if goals else None,
                               goal_met=(r["failed"] == 0) if goals else None))
            r = _ab(srv.port, sz["c1_n"], 1)
            mean_us = r["mean_ms"] * 1000
            figs.append(Figure(bench="B9", name="HTTP latency, ab -c 1 (new connection each)",
                               impl=impl, label=label, unit="us", value=mean_us, stat="mean",
                               trials=1, samples=sz["c1_n"],
                               note=f"P50 {r['p50_ms']:g} ms, P99 {r['p99_ms']:g} ms", detail=r))
        else:
            for b in ("B7", "B9"):
                figs.append(missing(b, "HTTP hi (ab)", impl, label, "req/s", UNAVAILABLE,
                                    f"ab not found: {INSTALL}"))
        if have_wrk:
            r = _wrk(srv.port, sz["wrk_s"])
            figs.append(Figure(bench="B8", name="HTTP hi, keep-alive, wrk -t1 -c100",
                               impl=impl, label=label, unit="req/s", value=r["rps"], stat="once",
                               trials=1, note=f"{r['non2xx']} non-2xx", detail=r))
        else:
            figs.append(missing("B8", "HTTP hi (wrk)", impl, label, "req/s", UNAVAILABLE,
                                f"wrk not found: {INSTALL}"))
    finally:
        srv.stop()
    return figs


def _b2(ctx, python, raymod, impl, label, goals):
    sz = _sizes(ctx)
    env = _env(raymod, 1)
    env.update(TOKENS=str(sz["b2_tokens"]), TRIALS=str(sz["b2_trials"]),
               TRIAL_S=str(sz["b2_trial_s"]), BATCH="10")
    out = subprocess.run([python, "-m", "ray_lite.bench.serve_suite", "b2"] if raymod == "ray_lite"
                         else [python, os.path.abspath(__file__), "b2"], env=env,
                         capture_output=True, text=True, timeout=1200, cwd=HERE)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[7:])
            return [Figure(bench="B2", name="handle streaming, Caller -> Endpoint, tokens/s",
                           impl=impl, label=label, unit="tokens/s", value=r["mean"],
                           stat="mean", spread={"std": r["std"]}, trials=sz["b2_trials"],
                           note=f"P50 {r['p50']:.1f} ms per stream", detail=r,
                           goal=">= 1,000,000" if goals else None,
                           goal_met=(r["mean"] >= 1_000_000) if goals else None)]
    return [missing("B2", "handle streaming", impl, label, "tokens/s", ERROR,
                    f"exit {out.returncode}: {out.stderr.strip()[-600:]}")]


def run(ctx):
    figs = []
    for part in (_http_figures, _b2):
        try:
            figs += part(ctx, sys.executable, "ray_lite", "ray_lite", "ray_lite", True)
        except Exception as exc:   # noqa: BLE001
            figs.append(missing("-", part.__name__, "ray_lite", "ray_lite", "", ERROR,
                                f"{type(exc).__name__}: {exc}"))
    return figs


def compare_ray(ctx, python):
    figs = []
    for part in (_http_figures, _b2):
        try:
            figs += part(ctx, python, "ray", "anchor", "Ray Serve", False)
        except Exception as exc:   # noqa: BLE001
            figs.append(missing("-", part.__name__, "anchor", "Ray Serve", "", ERROR,
                                f"{type(exc).__name__}: {exc}"))
    label = "bare uvicorn"
    probe = subprocess.run([python, "-c", "import uvicorn, uvloop, httptools"],
                           capture_output=True, timeout=120)
    if probe.returncode != 0:
        figs.append(missing("B9", "HTTP hi (bare uvicorn)", "ceiling", label, "us", UNAVAILABLE,
                            f"{python} lacks uvicorn, uvloop or httptools"))
        return figs
    try:
        figs += _http_figures(ctx, python, "uvicorn", "ceiling", label, False)
    except Exception as exc:   # noqa: BLE001
        figs.append(missing("-", "bare uvicorn", "ceiling", label, "", ERROR,
                            f"{type(exc).__name__}: {exc}"))
    return figs


# ------------------------------------------------------------------ B2 workload
def _b2_main():
    """Ray's streaming_handle_throughput.py workload (async), on RAYMOD."""
    import asyncio
    import importlib
    import statistics
    raymod = os.environ.get("RAYMOD", "ray_lite")
    ray = importlib.import_module(raymod)
    serve = importlib.import_module(raymod + ".serve")
    tokens = int(os.environ.get("TOKENS", 1000))
    batch = int(os.environ.get("BATCH", 10))
    trials = int(os.environ.get("TRIALS", 5))
    trial_s = float(os.environ.get("TRIAL_S", 5))

    @serve.deployment(ray_actor_options={"num_cpus": 0})
    class Endpoint:
        async def aio_stream(self):
            for _ in range(tokens):
                yield "OK"

    @serve.deployment(ray_actor_options={"num_cpus": 0})
    class Caller:
        def __init__(self, ep):
            self.ep = ep.options(stream=True)
            self.durations = []

        async def _consume(self):
            t = time.monotonic()
            async for _ in self.ep.aio_stream.remote():
                pass
            self.durations.append((time.monotonic() - t) * 1000)

        async def batch(self):
            await asyncio.gather(*[self._consume() for _ in range(batch)])

        async def run(self):
            end = time.monotonic() + 0.1
            while time.monotonic() < end:
                await self.batch()
            self.durations.clear()
            res = []
            for _ in range(trials):
                t0 = time.monotonic()
                n = 0
                while time.monotonic() - t0 < trial_s:
                    await self.batch()
                    n += 1
                res.append(batch * tokens * n / (time.monotonic() - t0))
            d = sorted(self.durations)
            q = [d[min(len(d) - 1, int(len(d) * p))] for p in (0.5, 0.75, 0.99)]
            return statistics.mean(res), (statistics.pstdev(res) if len(res) > 1 else 0.0), q

    kw = {"include_dashboard": False, "log_to_driver": False} if raymod == "ray" else {}
    ray.init(num_cpus=2, **kw)
    h = serve.run(Caller.bind(Endpoint.bind()), route_prefix=None)
    mean, std, q = h.run.remote().result(timeout_s=1200)
    print("RESULT " + json.dumps({"mean": mean, "std": std, "p50": q[0], "p75": q[1],
                                  "p99": q[2]}), flush=True)
    serve.shutdown()
    ray.shutdown()


if __name__ == "__main__" and sys.argv[1:] == ["b2"]:
    _b2_main()
