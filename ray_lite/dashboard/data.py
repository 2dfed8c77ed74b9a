"""What the state CLI and the dashboard show, made in the driver.

``answer(msg)`` serves the driver's state socket (``{"op": ..., "args":
{...}}``); the dashboard served by the driver itself calls ``call`` directly.
The records come from the state API (``ray_lite.util.state``), the timeline
from ``ray_lite.timeline``'s collection, Serve's from its controller and
metric files; nothing here runs unless someone asks.
"""
import os
import sys
import threading
import time

from ray_lite._private.node import timeline as _timeline
from ray_lite._private.objects import object_store
from ray_lite._private.process import state
from ray_lite.util import state as state_api

__all__ = ["KINDS", "SUMMARIES", "answer", "call", "list_records", "summary", "status",
           "processes", "serve_details", "recent_tasks", "timeline_events"]

KINDS = {
    "actors": state_api.list_actors, "tasks": state_api.list_tasks,
    "objects": state_api.list_objects, "workers": state_api.list_workers,
    "nodes": state_api.list_nodes, "placement-groups": state_api.list_placement_groups,
    "jobs": state_api.list_jobs,
}
SUMMARIES = {"tasks": state_api.summarize_tasks, "actors": state_api.summarize_actors,
             "objects": state_api.summarize_objects}
_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")
_lock = threading.Lock()
_cpu_seen = {}          # pid -> (monotonic s, cpu s): the last sample, for a rate
_serve_seen = {}        # (app, deployment) -> (monotonic s, requests): for a rate


def list_records(kind, filters=None, limit=state_api.DEFAULT_LIMIT, detail=False):
    """``ray-lite list KIND``: the state API's records, as plain dicts."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}: one of {', '.join(KINDS)}")
    filters = [tuple(f) for f in filters or ()]
    return [dict(r) for r in KINDS[kind](filters=filters, limit=limit, detail=detail)]


def summary(kind):
    if kind not in SUMMARIES:
        raise ValueError(f"unknown kind {kind!r}: one of {', '.join(SUMMARIES)}")
    return SUMMARIES[kind]()


def _proc_sample(pid):
    """(cpu seconds used, resident bytes, command) of ``pid`` from /proc, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
        with open(f"/proc/{pid}/statm", "rb") as f:
            rss_pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    fields = raw[raw.rindex(b")") + 2:].split()
    cpu = (int(fields[11]) + int(fields[12])) / _TICKS
    return cpu, rss_pages * _PAGE


def processes():
    """Each process of the runtime: pid, kind, CPU % since the last look (or
    since it started), resident memory."""
    rows = []
    now = time.monotonic()
    actors = {a["pid"]: a["class_name"] for a in list_records("actors", limit=10**6)}
    for w in list_records("workers", limit=10**6):
        pid = w["pid"]
        sample = _proc_sample(pid)
        if sample is None:
            continue
        cpu, rss = sample
        with _lock:
            last = _cpu_seen.get(pid)
            _cpu_seen[pid] = (now, cpu)
        percent = None
        if last is not None and now > last[0]:
            percent = round(100.0 * (cpu - last[1]) / (now - last[0]), 1)
        kind = "driver" if w["worker_type"] == "DRIVER" else (
            f"actor {actors[pid]}" if pid in actors else "worker")
        rows.append({"pid": pid, "kind": kind, "cpu_percent": percent,
                     "cpu_seconds": round(cpu, 2), "rss_bytes": rss})
    with _lock:
        for pid in set(_cpu_seen) - {r["pid"] for r in rows}:
            del _cpu_seen[pid]
    return rows


def _object_store():
    node = state.get_node()
    return {"used_bytes": object_store.bytes_in_use(node),
            "capacity_bytes": object_store.capacity_of(node)}


def _serve_module():
    # Serve's status only where the program uses Serve: asking must not start it.
    return sys.modules.get("ray_lite.serve")


def serve_details():
    """Serve's applications, deployments and replicas, in the shape of Ray
    dashboard's ``/api/serve/applications/`` (the fields ray_lite has), with
    request rate, mean latency and errors per deployment when Serve exports
    metrics."""
    serve = _serve_module()
    if serve is None:
        return {"applications": {}, "http_options": None, "proxies": {}}
    from ray_lite.serve import api as serve_api
    ctl = serve_api._controller_or_none()
    if ctl is None:
        return {"applications": {}, "http_options": None, "proxies": {}}
    st = serve_api._ask(ctl, "status", timeout=10)
    pids = serve_api._ask(ctl, "process_ids", timeout=10)
    metrics = _serve_metrics()
    apps = {}
    for name, a in st["applications"].items():
        deployments = {}
        for dname, d in a["deployments"].items():
            replicas = [{"pid": pid, "state": "RUNNING"}
                        for pid in pids["replicas"].get(f"{name}/{dname}", [])]
            deployments[dname] = {
                "name": dname, "status": d["status"], "message": d["message"],
                "replica_states": d["replica_states"], "replicas": replicas,
                "metrics": metrics.get((name, dname))}
        apps[name] = {"name": name, "route_prefix": a["route_prefix"], "status": a["status"],
                      "message": a["message"], "deployments": deployments}
    return {"applications": apps,
            "http_options": {"host": "127.0.0.1", "port": st["http_port"]},
            "proxies": st["proxies"], "metrics_enabled": metrics is not _NO_METRICS}


_NO_METRICS = {}


def _serve_metrics():
    """(app, deployment) -> requests, errors, requests per second since the
    last look, mean latency (ms); ``_NO_METRICS`` unless Serve exports them."""
    from ray_lite._private.job import metrics_files
    path = metrics_files.metrics_dir()
    if path is None or not os.path.isdir(path):
        return _NO_METRICS
    try:
        from prometheus_client.parser import text_string_to_metric_families
        from ray_lite.serve import _metrics
        text = _metrics.scrape(path).decode()
    except Exception:   # noqa: BLE001 - metrics are a view: without them, no numbers
        return _NO_METRICS
    acc = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.labels.get("application"), s.labels.get("deployment"))
            if key[1] is None:
                continue
            entry = acc.setdefault(key, {"requests": 0.0, "errors": 0.0, "latency_sum_ms": 0.0})
            if s.name == "ray_serve_deployment_processing_latency_ms_count":
                entry["requests"] += s.value
            elif s.name == "ray_serve_deployment_processing_latency_ms_sum":
                entry["latency_sum_ms"] += s.value
            elif s.name == "ray_serve_deployment_error_counter_total":
                entry["errors"] += s.value
    now = time.monotonic()
    out = {}
    for key, e in acc.items():
        with _lock:
            last = _serve_seen.get(key)
            _serve_seen[key] = (now, e["requests"])
        rate = None
        if last is not None and now > last[0]:
            rate = round((e["requests"] - last[1]) / (now - last[0]), 2)
        out[key] = {"requests": int(e["requests"]), "errors": int(e["errors"]),
                    "requests_per_s": rate,
                    "mean_latency_ms": (round(e["latency_sum_ms"] / e["requests"], 3)
                                        if e["requests"] else None)}
    return out


def status():
    """``ray-lite status``: resources in use and free, processes, the object
    store, Serve's applications."""
    import ray_lite
    total = ray_lite.cluster_resources()
    free = ray_lite.available_resources()
    serve = serve_details()
    return {
        "resources": {k: {"total": v, "used": round(v - free.get(k, 0.0), 4)}
                      for k, v in sorted(total.items()) if not k.startswith("node:")},
        "processes": processes(),
        "object_store": _object_store(),
        "serve": {name: {"status": a["status"], "route_prefix": a["route_prefix"],
                         "deployments": {d: dd["replica_states"]
                                         for d, dd in a["deployments"].items()}}
                  for name, a in serve["applications"].items()},
        "driver_pid": os.getpid(),
    }


def timeline_events():
    return _timeline.chrome_events(_timeline.collect())


def recent_tasks(limit=200):
    """The tasks and calls waiting or running (the state API), then those
    that finished or failed recently (the timeline's records, newest first)."""
    rows = [{"name": t["name"], "state": t["state"], "type": t["type"],
             "pid": t["worker_pid"], "duration_ms": None, "error_type": None}
            for t in list_records("tasks", limit=limit)]
    done = [e for e in timeline_events()
            if e["ph"] == "X" and e["args"]["state"] != "RUNNING"]   # listed above
    for e in reversed(done[-limit:]):
        rows.append({"name": e["name"], "state": e["args"]["state"], "type": "",
                     "pid": e["pid"], "duration_ms": round(e["dur"] / 1e3, 3),
                     "error_type": e["args"].get("error_type")})
    return {"tasks": rows[:limit],
            "timeline_recording": bool(done) or _recording_on()}


def _recording_on():
    from ray_lite import _config
    return _config.read("RAY_LITE_TIMELINE")


def overview():
    """The dashboard's first page."""
    return {"processes": processes(), "object_store": _object_store(),
            "resources": status()["resources"], "driver_pid": os.getpid()}


_OPS = {
    "list": list_records, "summary": summary, "status": status, "processes": processes,
    "serve": serve_details, "timeline": timeline_events, "recent_tasks": recent_tasks,
    "overview": overview,
}


def call(op, **args):
    fn = _OPS.get(op)
    if fn is None:
        raise ValueError(f"unknown request {op!r}")
    return fn(**args)


def answer(msg):
    """One request of the state socket."""
    return call(msg["op"], **(msg.get("args") or {}))
