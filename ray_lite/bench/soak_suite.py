"""Soak: sustained HTTP load with a slow reader beside it (``ray-lite bench soak``).

``ray-lite serve run ray_lite.bench.soak_suite:model`` serves the 48-replica
"hi" deployment at ``/`` and, from the same replicas, an endless stream of
64 kB chunks at ``/stream``.  A client reads that stream slowly (64 kB every
0.1 s) while ``wrk -t1 -c100 --latency`` loads ``/`` for the duration (60 s;
10 s with --quick).  Reported: req/s, p99 latency, errors (socket errors and
non-2xx answers of wrk, a stream cut short), and the resident memory (VmRSS)
of every process of the server after a warm-up and at the end.  Goals: zero
errors, proxy RSS growth under 20 MB, p99 under 20 ms.

The proxies are the processes holding the server's listening socket; the
others are the CLI's driver, the controller and the replicas.
"""
import os
import re
import shutil
import socket
import subprocess
import sys
import threading

if __package__:
    from ._harness import ERROR, UNAVAILABLE, Figure, missing
    from ._procs import descendants, holds_socket, listening_inodes
    from ._servers import AppSpec, Server

DESCRIPTION = "Serve soak: wrk -c100 on the 48-replica hi app beside a slow-reader stream, RSS growth"
CHUNK_BYTES = 65536
SLOW_READ_EVERY_S = 0.1


def model(args):
    """The soak app: "hi" at ``/``, an endless slow stream at ``/stream``."""
    from ray_lite import serve
    replicas = int(os.environ.get("REPLICAS", "48"))

    @serve.deployment(num_replicas=replicas, ray_actor_options={"num_cpus": 0})
    class SoakDeployment:
        async def __call__(self, request):
            if request.url.path != "/stream":
                return "hi"
            from starlette.responses import StreamingResponse
            chunk = b"s" * CHUNK_BYTES

            async def endless():
                while True:
                    yield chunk
            return StreamingResponse(endless())

    return SoakDeployment.bind()


# ------------------------------------------------------------ the processes
def _rss_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _snapshot(root, port):
    """``{pid: (role, rss kB)}`` of the server's processes."""
    inodes = listening_inodes(port)
    out = {}
    for pid in descendants(root):
        rss = _rss_kb(pid)
        if rss is None:
            continue
        role = "driver" if pid == root else "proxy" if holds_socket(pid, inodes) else "other"
        out[pid] = (role, rss)
    return out


# --------------------------------------------------------------- the clients
class _SlowReader(threading.Thread):
    """Reads ``/stream`` a chunk at a time, slowly, until stopped."""

    def __init__(self, port):
        super().__init__(daemon=True)
        self.port = port
        self.stop = threading.Event()
        self.received = 0
        self.error = None

    def run(self):
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=30) as s:
                s.sendall(b"GET /stream HTTP/1.1\r\nHost: soak\r\n\r\n")
                while not self.stop.wait(SLOW_READ_EVERY_S):
                    data = s.recv(CHUNK_BYTES)
                    if not data:
                        self.error = "the stream ended early"
                        return
                    self.received += len(data)
        except OSError as exc:
            self.error = f"{type(exc).__name__}: {exc}"


_UNIT_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


def _wrk(port, seconds):
    out = subprocess.run(["wrk", "-t1", "-c100", f"-d{seconds}s", "--latency",
                          f"http://127.0.0.1:{port}/"],
                         capture_output=True, text=True, timeout=seconds + 120).stdout
    m = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if m is None:
        raise RuntimeError(f"wrk failed: {out[-400:]}")
    p99 = re.search(r"\n\s+99%\s+([\d.]+)(us|ms|s)\b", out)
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    return {"rps": float(m.group(1)),
            "p99_ms": float(p99.group(1)) * _UNIT_MS[p99.group(2)] if p99 else None,
            "socket_errors": sum(int(x) for x in sock.groups()) if sock else 0,
            "non2xx": int(non2xx.group(1)) if non2xx else 0}


# ------------------------------------------------------------------ the suite
def _sizes(ctx):
    return {"replicas": ctx.pick(48, 48, 4), "seconds": ctx.pick(60, 10, 2),
            "warmup_s": ctx.pick(5, 2, 1)}


def run(ctx):
    if not shutil.which("wrk"):
        return [missing("S1", "soak (wrk)", "ray_lite", "ray_lite", "req/s", UNAVAILABLE,
                        "wrk not found: apt-get install -y wrk")]
    sz = _sizes(ctx)
    srv = reader = None
    try:
        # "hi" at / and the slow stream, from this module's ``model``.
        app = AppSpec("soak_suite", None, "/", b"hi")
        srv = Server(sys.executable, "ray_lite", sz["replicas"], app)
        srv.wait_up(600)
        port = srv.port
        reader = _SlowReader(port)
        reader.start()
        _wrk(port, sz["warmup_s"])
        start = _snapshot(srv.proc.pid, port)
        r = _wrk(port, sz["seconds"])
        end = _snapshot(srv.proc.pid, port)
        reader.stop.set()
        reader.join(30)
    except Exception as exc:   # noqa: BLE001
        return [missing("S1", "soak", "ray_lite", "ray_lite", "", ERROR,
                        f"{type(exc).__name__}: {exc}")]
    finally:
        if reader is not None:
            reader.stop.set()
        if srv is not None:
            srv.stop()
    return _figures(sz, r, reader, start, end)


def _figures(sz, r, reader, start, end):
    growth = {pid: (role, rss, end[pid][1], end[pid][1] - rss)
              for pid, (role, rss) in start.items() if pid in end}
    gone = sorted(pid for pid in start if pid not in end)
    proxy = [g for g in growth.values() if g[0] == "proxy"]
    other = [g for g in growth.values() if g[0] != "proxy"]
    errors = r["socket_errors"] + r["non2xx"] + (1 if reader.error else 0) + len(gone)
    name = f"{sz['replicas']} replicas, wrk -t1 -c100 {sz['seconds']} s + a slow reader"
    per_process = {str(pid): {"role": g[0], "start_kb": g[1], "end_kb": g[2]}
                   for pid, g in sorted(growth.items())}
    proxy_mb = max((g[3] for g in proxy), default=0) / 1024
    other_mb = max((g[3] for g in other), default=0) / 1024
    p99 = r["p99_ms"]
    return [
        Figure(bench="S1", name=f"HTTP hi, {name}", impl="ray_lite", label="ray_lite",
               unit="req/s", value=r["rps"], stat="once", trials=1, detail=r),
        Figure(bench="S1", name="p99 latency", impl="ray_lite", label="ray_lite", unit="ms",
               value=p99, stat="p99", trials=1, goal_id="S1 p99"),
        Figure(bench="S1", name="errors (wrk socket errors, non-2xx, stream cut, process lost)",
               impl="ray_lite", label="ray_lite", unit="errors", value=errors, stat="once",
               trials=1, goal_id="S1 errors",
               note=reader.error or (f"processes gone: {gone}" if gone else None),
               detail={"slow_reader_bytes": reader.received, "processes_gone": gone}),
        Figure(bench="S1", name=f"proxy RSS growth after warm-up (max of {len(proxy)})",
               impl="ray_lite", label="ray_lite", unit="MB", value=proxy_mb, stat="max",
               trials=1, goal_id="S1 proxy rss" if proxy else None,
               detail={"processes": per_process}),
        Figure(bench="S1", name=f"driver, controller, replicas: RSS growth (max of {len(other)})",
               impl="ray_lite", label="ray_lite", unit="MB", value=other_mb, stat="max",
               trials=1),
    ]
