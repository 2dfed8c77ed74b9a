"""``ray-lite status``, ``ray-lite list KIND`` and ``ray-lite summary KIND``:
Ray's state CLI for a ray_lite program running in another terminal.

The program is reached through its driver's state socket
(``_private/node/state_socket.py``); ``--address`` names it (a driver's pid
or a socket path) when several run.  The records are the state API's
(``ray_lite.util.state``), with Ray's columns: a table shows the columns
Ray shows without ``--detail``, ``--detail`` shows every field.
"""
import argparse
import datetime
import json
import sys

from ray_lite._private.node import state_socket

__all__ = ["main", "parse_filter", "format_records", "COLUMNS"]

KINDS = ("actors", "tasks", "objects", "workers", "nodes", "placement-groups", "jobs")
SUMMARY_KINDS = ("tasks", "actors", "objects")
FORMATS = ("default", "table", "json", "yaml")
# Ray's columns without --detail, per kind.
COLUMNS = {
    "actors": ["actor_id", "class_name", "state", "job_id", "name", "node_id", "pid",
               "ray_namespace"],
    "tasks": ["task_id", "attempt_number", "name", "state", "job_id", "actor_id", "type",
              "func_or_class_name", "parent_task_id", "node_id", "worker_id", "worker_pid",
              "error_type"],
    "objects": ["object_id", "object_size", "task_status", "reference_type", "call_site",
                "type", "pid", "ip"],
    "workers": ["worker_id", "is_alive", "worker_type", "exit_type", "node_id", "ip", "pid",
                "exit_detail"],
    "nodes": ["node_id", "node_ip", "is_head_node", "state", "state_message", "node_name",
              "resources_total", "labels"],
    "placement-groups": ["placement_group_id", "name", "creator_job_id", "state"],
    "jobs": ["job_id", "submission_id", "entrypoint", "type", "status", "message",
             "error_type", "driver_info"],
}


def parse_filter(text):
    """``"key=value"`` or ``"key!=value"`` (Ray's ``--filter``) as a triple."""
    for pred in ("!=", "="):
        key, sep, value = text.partition(pred)
        if sep and key.strip():
            return (key.strip(), pred, value.strip())
    raise ValueError(f"a filter is KEY=VALUE or KEY!=VALUE, got {text!r}")


def _text(value):
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def _table(rows, columns):
    cells = [[c.upper() for c in columns]] + [[_text(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = []
    for n, row in enumerate(cells):
        prefix = "    " if n == 0 else f"{n - 1:<4}"
        lines.append(prefix + "  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip())
    return "\n".join(lines)


def _dump(value, fmt):
    if fmt == "json":
        return json.dumps(value, indent=2, sort_keys=True, default=str)
    try:
        import yaml
    except ImportError:
        raise SystemExit("--format yaml needs PyYAML, which is not installed "
                         "(pip install pyyaml); --format json shows the same") from None
    return yaml.safe_dump(value, sort_keys=True, default_flow_style=False).rstrip()


def _stamp():
    return datetime.datetime.now().isoformat(sep=" ")


def format_records(rows, kind, fmt="default", detail=False):
    """The text ``ray-lite list`` prints."""
    if fmt in ("json", "yaml"):
        return _dump(rows, fmt)
    columns = COLUMNS[kind]
    if detail:
        columns = columns + sorted({k for r in rows for k in r} - set(columns))
    return (f"======== List: {_stamp()} ========\nStats:\n------------------------------\n"
            f"Total: {len(rows)}\n\nTable:\n------------------------------\n"
            + _table(rows, columns))


def format_summary(result, kind, fmt="default"):
    if fmt in ("json", "yaml"):
        return _dump(result, fmt)
    cluster = result["cluster"]
    stats = "\n".join(f"{k}: {v}" for k, v in sorted(cluster.items())
                      if k not in ("summary", "summary_by"))
    rows = []
    for entry in cluster["summary"].values():
        row = dict(entry)
        for key, value in entry.items():
            if isinstance(value, dict):
                row[key] = ", ".join(f"{k}: {v}" for k, v in sorted(value.items()))
        rows.append(row)
    columns = sorted({k for r in rows for k in r})
    return (f"======== {kind.capitalize()} Summary: {_stamp()} ========\nStats:\n"
            f"------------------------------------\n{stats}\n\n"
            f"Table (group by {cluster.get('summary_by')}):\n"
            f"------------------------------------\n" + (_table(rows, columns) if rows else ""))


def _mib(n):
    return f"{n / 2**20:.1f}MiB"


def format_status(st, fmt="default"):
    if fmt in ("json", "yaml"):
        return _dump(st, fmt)
    lines = [f"======== ray_lite status: {_stamp()} ========",
             f"Driver pid: {st['driver_pid']}", "", "Resources", "-" * 40, "Usage:"]
    for name, r in st["resources"].items():
        if name == "object_store_memory":
            continue    # below: what the store holds, not what tasks reserved
        show = _mib if name == "memory" else "{:g}".format
        lines.append(f" {show(r['used'])}/{show(r['total'])} {name}"
                     f" ({show(r['total'] - r['used'])} free)")
    store = st["object_store"]
    lines.append(f" {_mib(store['used_bytes'])}/{_mib(store['capacity_bytes'])} "
                 f"object_store_memory (in use)")
    lines += ["", "Processes", "-" * 40]
    for p in st["processes"]:
        cpu = "" if p["cpu_percent"] is None else f"{p['cpu_percent']:.1f}% CPU, "
        lines.append(f" {p['pid']:>7}  {p['kind']:<24} {cpu}{_mib(p['rss_bytes'])} RSS")
    lines += ["", "Serve applications", "-" * 40]
    if not st["serve"]:
        lines.append(" (none)")
    for name, app in st["serve"].items():
        lines.append(f" {name}: {app['status']} (route prefix {app['route_prefix']})")
        for dep, states in app["deployments"].items():
            counts = ", ".join(f"{k}: {v}" for k, v in sorted(states.items()))
            lines.append(f"   {dep}: {counts or 'no replicas'}")
    return "\n".join(lines)


def _common(p):
    p.add_argument("--address", default=None,
                   help="the program to ask: its driver's pid or its state socket's path "
                        "(needed when several run)")
    p.add_argument("--format", choices=FORMATS, default="default",
                   help="table (default), json or yaml (yaml needs PyYAML)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the answer")


def build_parser(prog="ray-lite"):
    parser = argparse.ArgumentParser(prog=prog)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("status", help="resources, processes, object store, Serve")
    _common(p)
    p = sub.add_parser("list", help="list actors, tasks, objects, workers, nodes, "
                                    "placement groups or jobs")
    p.add_argument("kind", choices=KINDS)
    _common(p)
    p.add_argument("--filter", action="append", default=[], metavar="KEY=VALUE",
                   help="keep records whose KEY is (=) or is not (!=) VALUE; repeatable")
    p.add_argument("--limit", type=int, default=100, help="at most this many records")
    p.add_argument("--detail", action="store_true", help="every field, not Ray's short columns")
    p = sub.add_parser("summary", help="summarize tasks, actors or objects")
    p.add_argument("kind", choices=SUMMARY_KINDS)
    _common(p)
    return parser


def main(argv):
    """``ray-lite status|list|summary ...``; the exit status."""
    args = build_parser().parse_args(argv)
    try:
        address = state_socket.find_address(args.address)
        if args.command == "status":
            out = format_status(state_socket.request(address, {"op": "status"}, args.timeout),
                                args.format)
        elif args.command == "list":
            try:
                filters = [parse_filter(f) for f in args.filter]
            except ValueError as exc:
                print(f"ray-lite list: {exc}", file=sys.stderr)
                return 2
            rows = state_socket.request(address, {"op": "list", "args": {
                "kind": args.kind, "filters": filters, "limit": args.limit,
                "detail": args.detail}}, args.timeout)
            out = format_records(rows, args.kind, args.format, args.detail)
        else:
            result = state_socket.request(address, {"op": "summary", "args": {
                "kind": args.kind}}, args.timeout)
            out = format_summary(result, args.kind, args.format)
    except state_socket.StateSocketError as exc:
        print(f"ray-lite {args.command}: {exc}", file=sys.stderr)
        return 1
    print(out)
    return 0
