"""Where an HTTP request's CPU goes in ray_lite's Serve (``ray-lite bench serve_cpu``,
or ``python -m ray_lite.bench.serve_cpu`` for the options below).

Throughput on a shared machine is noise; what a request costs is not.  This
starts the 48-replica "hi" app (``serve_hi_app``, as B7/B8/B16 do), loads it
with ``wrk -t1 -cN`` and reports, per request, for each role (proxies,
replicas, the rest: driver, controller, zygote):

- CPU: user and system time from ``/proc/<pid>/stat`` over the load;
- sleeps: voluntary context switches (each one a sleep and so a later
  wake-up), and involuntary ones (preemptions);
- system calls: ``perf stat`` on the syscall tracepoints of each role's
  processes (total and the main kinds), when ``perf`` can (root, or
  ``perf_event_paranoid`` low enough);
- with ``--profile``, where the proxy's and the replicas' time goes by stage
  (HTTP parse, routing, ring send, ring receive and wake-up, handler, reply
  and socket write, event loop), from ``py-spy`` samples (``pip install
  py-spy``) attributed to the innermost stage on each stack, scaled to the
  role's CPU per request.

``--beside-hog`` runs one CPU-bound process (normal priority) during the
loads, ended by its PID afterwards; ``-c 100,8,4`` measures at several
connection counts.  Instruction counts would be load-independent, but VMs
often lack the hardware counters; CPU time over tens of thousands of
requests is stable within a few per cent on a quiet machine.
"""
import argparse
import collections
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

if __package__:
    from ._harness import ERROR, UNAVAILABLE, Figure, missing
    from ._procs import descendants, holds_socket, listening_inodes, stat_fields
    from ._procs import start_hog, stop_hog
    from ._servers import Server

DESCRIPTION = "Serve: CPU, sleeps and system calls per HTTP request, by process role"
ROLES = ("proxy", "replica", "other")
SYSCALLS = ("epoll_wait", "epoll_pwait", "read", "write", "recvfrom", "sendto", "recvmsg",
            "sendmsg", "writev", "futex", "sched_yield", "epoll_ctl", "getpid", "getsockopt",
            "ioctl", "accept4", "close")

# py-spy frames -> stage; the innermost frame that matches names the stage.
PROXY_STAGES = (
    ("HTTP parse", ("HttpConnection.data_received", "HttpConnection.on_url",
                    "HttpConnection.on_header", "HttpConnection.on_body",
                    "HttpConnection.on_message_complete", "HttpConnection.on_headers_complete",
                    "HttpRequest.__init__", "HttpConnection._reset")),
    ("routing", ("ProxyActor.dispatch", "ProxyActor.route_request", "first_idle_else_power_of_two",
                 "power_of_two", "for_model")),
    ("ring send (encode, publish, wake)", ("ProxyActor._send", "ActorMethod.remote", "Link.send",
                                           "on_ready", "Node.new_oid")),
    ("ring receive (drain, re-arm)", ("_LoopBridge.on_readable", "DrivingMixin._drain",
                                      "_LoopBridge._rearm", "_LoopBridge._drain_and_arm",
                                      "Link.recv_all", "Link.disarm", "Link.arm",
                                      "Node._on_result", "_Entry.set_value")),
    ("reply (peek, release)", ("ProxyActor._on_reply", "ProxyActor.release", "peek",
                               "ProxyActor._pump")),
    ("socket write", ("HttpConnection.respond", "HttpConnection.next")),
    ("spin for the reply", ("ProxyActor._wait_for_reply", "wait_briefly")),
)
REPLICA_STAGES = (
    ("ring receive (drain, re-arm)", ("_LoopBridge.on_readable", "DrivingMixin._drain",
                                      "_LoopBridge._rearm", "_LoopBridge._drain_and_arm",
                                      "Link.recv_all", "Link.disarm", "Link.arm")),
    ("request object (Starlette)", ("Request.__init__", "http_scope", "parse_headers", "addr",
                                    "split_addr", "HTTPConnection.__init__")),
    ("handler", ("TestDeployment.__call__",)),
    ("reply (encode, publish, wake)", ("Link.send", "WorkerNode.reply")),
    ("replica bookkeeping", ("ServeReplica.handle_http", "ServeReplica._leave",
                             "AsyncActor._run_method_async", "AsyncActor.on_method")),
    ("spin for the next request", ("ServeReplica._spin_for_next", "spin_for_messages")),
)


# ------------------------------------------------------------ the processes
def _stat(pid):
    """(utime, stime) in clock ticks, (voluntary, involuntary) switches."""
    fields = stat_fields(pid)
    if fields is None:
        raise OSError(f"process {pid} is gone")
    vol = invol = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches"):
                vol = int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches"):
                invol = int(line.split()[1])
    return int(fields[11]), int(fields[12]), vol, invol


def _roles(root, port):
    """{pid: role}: the proxies hold the listening socket, replicas are the
    actors that answer (found by their CPU under load: see ``_split``)."""
    inodes = listening_inodes(port)
    return {pid: ("proxy" if holds_socket(pid, inodes) else "other") for pid in descendants(root)}


def _counters(pids):
    out = {}
    for pid in pids:
        try:
            out[pid] = _stat(pid)
        except (OSError, ValueError, IndexError):
            pass
    return out


def _perf_stat(pids):
    """A ``perf stat`` counting system calls of ``pids`` until stopped, or None."""
    if not pids or not shutil.which("perf"):
        return None
    out = tempfile.NamedTemporaryFile(prefix="rl_perf_", suffix=".csv", delete=False)
    events = ["raw_syscalls:sys_enter"] + [f"syscalls:sys_enter_{s}" for s in SYSCALLS]
    cmd = ["perf", "stat", "-x", ",", "-o", out.name, "-e", ",".join(events),
           "-p", ",".join(str(p) for p in pids)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, out.name


def _perf_result(handle):
    if handle is None:
        return None
    proc, path = handle
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
    counts = {}
    try:
        with open(path) as f:
            for line in f:
                cols = line.strip().split(",")
                if len(cols) > 2 and cols[0].isdigit():
                    name = cols[2].split(":")[-1].replace("sys_enter_", "")
                    counts["all" if name == "sys_enter" else name] = int(cols[0])
    finally:
        os.unlink(path)
    return counts or None


def _py_spy(pids, seconds):
    """py-spy samples of ``pids`` over ``seconds`` (background), or None."""
    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(spy):
        return None
    runs = []
    for pid in pids:
        out = tempfile.NamedTemporaryFile(prefix="rl_spy_", suffix=".txt", delete=False)
        proc = subprocess.Popen([spy, "record", "-p", str(pid), "-r", "200", "-d", str(seconds),
                                 "-f", "raw", "-o", out.name, "--nonblocking"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        runs.append((proc, out.name))
    return runs


def _stage_shares(runs, stages):
    """{stage: share of the samples} over every run, innermost match wins."""
    counts = collections.Counter()
    total = 0
    for proc, path in runs:
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        try:
            with open(path) as f:
                lines = f.read().splitlines()
        finally:
            os.unlink(path)
        for line in lines:
            stack, _, n = line.rpartition(" ")
            if not n.isdigit():
                continue
            n = int(n)
            total += n
            stage = "event loop (uvloop, tasks, epoll), other"
            for frame in reversed(stack.split(";")):
                name = frame.split(" (")[0]
                hit = next((s for s, names in stages
                            if any(name == x or (x.endswith(".") and name.startswith(x))
                                   for x in names)), None)
                if hit is not None:
                    stage = hit
                    break
            counts[stage] += n
    return {s: c / total for s, c in counts.items()} if total else {}


# --------------------------------------------------------------- the loads
def _wrk(port, seconds, conns):
    out = subprocess.run(["wrk", "-t1", f"-c{conns}", f"-d{seconds}s",
                          f"http://127.0.0.1:{port}/"],
                         capture_output=True, text=True, timeout=seconds + 120).stdout
    n = re.search(r"(\d+) requests in", out)
    if n is None:
        raise RuntimeError(f"wrk failed: {out[-400:]}")
    return int(n.group(1))


def measure(port, root, conns, seconds, profile=False):
    """One load of ``seconds`` at ``conns`` connections: the per-request figures."""
    ticks = os.sysconf("SC_CLK_TCK")
    roles = _roles(root, port)
    _wrk(port, 1, conns)        # warm-up
    before = _counters(roles)
    proxies = [p for p, r in roles.items() if r == "proxy"]
    others = [p for p, r in roles.items() if r != "proxy"]
    perf = {"proxy": _perf_stat(proxies), "rest": _perf_stat(others)}
    time.sleep(0.3)             # perf attached
    requests = _wrk(port, seconds, conns)
    after = _counters(roles)
    calls = {k: _perf_result(h) for k, h in perf.items()}
    spy = None
    if profile:
        replicas = _split(roles, before, after)[1]
        # A profile costs the target little (--nonblocking) but is kept out
        # of the CPU figures: a second load of its own.
        sample = sorted(replicas, key=lambda p: -sum(after[p][:2]) + sum(before[p][:2]))[:6]
        runs_p = _py_spy(proxies, seconds)
        runs_r = _py_spy(sample, seconds)
        if runs_p is not None:
            time.sleep(0.5)
            _wrk(port, seconds, conns)
            spy = {"proxy": _stage_shares(runs_p, PROXY_STAGES),
                   "replica": _stage_shares(runs_r, REPLICA_STAGES)}
    return _report(roles, before, after, requests, ticks, calls, spy, conns, seconds)


def _split(roles, before, after):
    """(proxies, replicas, rest): the replicas are the non-proxies that
    worked under load (the controller, driver and zygote barely do)."""
    proxies, replicas, rest = [], [], []
    for pid, role in roles.items():
        if pid not in before or pid not in after:
            continue
        if role == "proxy":
            proxies.append(pid)
        elif os.getpriority(os.PRIO_PROCESS, pid) > 0 or \
                sum(after[pid][:2]) - sum(before[pid][:2]) > 1:
            replicas.append(pid)
        else:
            rest.append(pid)
    return proxies, replicas, rest


def _report(roles, before, after, requests, ticks, calls, spy, conns, seconds):
    groups = dict(zip(ROLES, _split(roles, before, after)))
    per = {}
    for role, pids in groups.items():
        d = [tuple(a - b for a, b in zip(after[p], before[p])) for p in pids]
        per[role] = {"processes": len(pids),
                     "user_us": sum(x[0] for x in d) / ticks * 1e6 / requests,
                     "sys_us": sum(x[1] for x in d) / ticks * 1e6 / requests,
                     "sleeps": sum(x[2] for x in d) / requests,
                     "preempted": sum(x[3] for x in d) / requests}
    out = {"connections": conns, "seconds": seconds, "requests": requests,
           "rps": requests / seconds,
           "cpu_us": sum(r["user_us"] + r["sys_us"] for r in per.values()), "roles": per}
    if calls.get("proxy"):
        per["proxy"]["syscalls"] = {k: v / requests for k, v in calls["proxy"].items()}
    if calls.get("rest"):
        # The replicas make all but a few of the rest's calls.
        per["replica"]["syscalls"] = {k: v / requests for k, v in calls["rest"].items()}
    if spy:
        for role in ("proxy", "replica"):
            cpu = per[role]["user_us"] + per[role]["sys_us"]
            per[role]["stages_us"] = {s: share * cpu for s, share in
                                      sorted(spy[role].items(), key=lambda x: -x[1])}
    return out


def format_report(r):
    lines = [f"wrk -t1 -c{r['connections']} {r['seconds']} s: {r['requests']} requests "
             f"({r['rps']:.0f}/s); CPU per request, all server processes: "
             f"{r['cpu_us']:.1f} µs"]
    for role, d in r["roles"].items():
        lines.append(f"  {role:8s} x{d['processes']:<3d} user {d['user_us']:6.1f} µs  "
                     f"sys {d['sys_us']:6.1f} µs  sleeps {d['sleeps']:.2f}  "
                     f"preempted {d['preempted']:.2f}  per request")
        sc = d.get("syscalls")
        if sc:
            kinds = ", ".join(f"{k} {v:.2f}" for k, v in sorted(sc.items(), key=lambda x: -x[1])
                              if k != "all" and v >= 0.01)
            lines.append(f"           system calls {sc.get('all', 0):.2f}: {kinds}")
        for stage, us in (d.get("stages_us") or {}).items():
            lines.append(f"           {us:6.1f} µs  {stage}")
    return "\n".join(lines)


# ------------------------------------------------ stages measured in-process
class _Transport:
    """What the proxy's connection writes to, counted instead of sent."""

    def __init__(self):
        self.written = 0

    def write(self, data):
        self.written += 1

    def get_extra_info(self, name):
        return ("127.0.0.1", 1) if name == "peername" else None

    def close(self):
        pass

    def pause_reading(self):
        pass

    def resume_reading(self):
        pass


class _AnsweringProxy:
    """The proxy's side of a connection with the replica taken out: each
    request is answered at once with the reply a replica gives to "hi"."""

    def __init__(self):
        self.conns = set()
        self.idle_sweep = 1
        self.max_body = 1 << 20
        from ray_lite.serve._request_calls import request_id_maker
        self.new_request_id = request_id_maker()     # as the proxy's: every answer names one

    def dispatch(self, conn, req):
        conn.respond(req, 200, b"content-type: text/plain; charset=utf-8\r\n"
                               b"content-length: 2\r\n", b"hi")


def _best_us(fn, n, rounds=5):
    """The least thread CPU time per call of ``fn`` over ``rounds`` of ``n``:
    other processes slow a round down, never speed it up."""
    best = None
    for _ in range(rounds):
        t = time.thread_time()
        fn(n)
        us = (time.thread_time() - t) * 1e6 / n
        best = us if best is None or us < best else best
    return best


def proxy_http_us(n=20000):
    """The proxy's HTTP work per request (parse with httptools, the request
    object, the status line and one write), without the replica."""
    from ray_lite.serve._proxy import HttpConnection
    conn = HttpConnection(_AnsweringProxy())
    transport = _Transport()
    conn.connection_made(transport)
    request = b"GET / HTTP/1.1\r\nHost: localhost:8000\r\nUser-Agent: wrk\r\n\r\n"

    def run(k):
        feed = conn.data_received
        for _ in range(k):
            feed(request)
    us = _best_us(run, n)
    assert transport.written >= n
    return us


def replica_http_us(n=5000):
    """The replica's work per HTTP request in ``handle_http`` (ASGI scope,
    Starlette request, the handler, the reply tuple), without the ring."""
    import asyncio

    import cloudpickle

    from ray_lite.serve._replica import ServeReplica
    from ray_lite.serve._spin import SpinPolicy

    class Hi:
        async def __call__(self, request):
            return "hi"

    async def main():
        rep = ServeReplica(None, "app", "Hi", "r0", cloudpickle.dumps(Hi), (), {}, {})
        rep._spin = SpinPolicy(0)     # no links to spin on here (and no runtime)
        handle = rep.handle_http
        headers = b"host:localhost:8000\r\nuser-agent:wrk"

        async def batch(k):
            for _ in range(k):
                await handle("GET", "/", b"", headers, b"", "127.0.0.1:1", "", "1.1",
                             "127.0.0.1:8000")
        await batch(100)
        best = None
        for _ in range(5):
            t = time.thread_time()
            await batch(n)
            us = (time.thread_time() - t) * 1e6 / n
            best = us if best is None or us < best else best
        return best
    return asyncio.run(main())


def ring_round_trip_us(n=20000):
    """A request-sized message put and taken on a ring, and the reply-sized
    one back (both ends in this thread: the ring's own cost, no wake-up)."""
    from ray_lite._fast.ring import ShmRing
    pair = []
    for _ in range(2):
        p = ShmRing.create(1 << 20, side="producer")
        pair.append((p, ShmRing.attach(p.name, side="consumer")))
    (req_tx, req_rx), (rep_tx, rep_rx) = pair
    msg = ("call", 12345, 7, "handle_http", ("GET", "/", b"", b"host:localhost:8000\r\nuser-agent:wrk",
                                             b"", "127.0.0.1:50000", "", "1.1", "127.0.0.1:8000"))
    reply = ("result", 12345, (200, b"content-type: text/plain; charset=utf-8\r\n"
                                    b"content-length: 2\r\n", b"hi", 0))

    def run(k):
        for _ in range(k):
            req_tx.put(msg)
            req_rx.get_nowait()
            rep_tx.put(reply)
            rep_rx.get_nowait()
    try:
        return _best_us(run, n)
    finally:
        for p, c in pair:
            c.close()
            p.close()


def stage_costs():
    """{stage: us per request} of the parts measurable in one process."""
    return {"proxy HTTP (parse, request object, status line, write call)": proxy_http_us(),
            "ring hop both ways (encode, publish, read, decode; no wake-up)": ring_round_trip_us(),
            "replica handle_http (scope, Starlette request, handler, reply)": replica_http_us()}


# ------------------------------------------------------------------ running
def _server(replicas):
    srv = Server(sys.executable, "ray_lite", replicas)
    srv.wait_up(600)
    srv.wait_ready(600)
    return srv


def breakdown(replicas=48, conns=(100,), seconds=5, profile=False, beside_hog=False):
    """Every load's report (a list of dicts), on one server started for them."""
    srv = _server(replicas)
    hog = None
    try:
        if beside_hog:
            hog = start_hog()
        return [measure(srv.port, srv.proc.pid, c, seconds, profile) for c in conns]
    finally:
        stop_hog(hog)
        srv.stop()


def run(ctx):
    """The suite: B16's CPU per request broken down by role, quiet and
    beside a CPU hog, at -c100, -c8 and -c4."""
    if not shutil.which("wrk"):
        return [missing("B16a", "CPU per request by role", "ray_lite", "ray_lite", "us",
                        UNAVAILABLE, "wrk not found: apt-get install -y wrk")]
    figs = []
    seconds = ctx.pick(5, 3, 1)
    for hog in (False, True):
        try:
            reports = breakdown(ctx.pick(48, 48, 4), (100, 8, 4), seconds, beside_hog=hog)
        except Exception as exc:   # noqa: BLE001
            figs.append(missing("B16a", "CPU per request by role", "ray_lite", "ray_lite", "us",
                                ERROR, f"{type(exc).__name__}: {exc}"))
            continue
        for r in reports:
            where = f"wrk -c{r['connections']}" + (" beside a CPU hog" if hog else "")
            roles = r["roles"]
            figs.append(Figure(
                bench="B16a", name=f"CPU per HTTP request, {where}", impl="ray_lite",
                label="ray_lite", unit="us", value=r["cpu_us"], stat="once", trials=1,
                note="; ".join(f"{k} {v['user_us'] + v['sys_us']:.1f}" for k, v in roles.items()),
                detail=r))
    return figs


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m ray_lite.bench.serve_cpu", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", type=int, default=48)
    p.add_argument("-c", "--connections", default="100",
                   help="comma-separated wrk connection counts (default 100)")
    p.add_argument("--seconds", type=float, default=5)
    p.add_argument("--profile", action="store_true", help="py-spy stages (a second load)")
    p.add_argument("--beside-hog", action="store_true",
                   help="one CPU-bound process at normal priority during the loads")
    p.add_argument("--stages", action="store_true",
                   help="only the in-process stage costs (no server, no load)")
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args(argv)
    if args.stages:
        for stage, us in stage_costs().items():
            print(f"{us:7.2f} µs  {stage}")
        return 0
    conns = [int(c) for c in args.connections.split(",")]
    reports = breakdown(args.replicas, conns, int(args.seconds), args.profile, args.beside_hog)
    for r in reports:
        print(format_report(r))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(reports, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
