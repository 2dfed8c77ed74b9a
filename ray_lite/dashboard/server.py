"""The dashboard's HTTP server: the page (static files shipped in the
package) and JSON under ``/api/``, on Ray's dashboard paths where Ray has
one.

- ``/api/v0/{actors,tasks,objects,workers,nodes,placement_groups,jobs}``:
  the state API's listing in Ray's response shape (``{"result": true, "msg":
  "", "data": {"result": {"total", "num_after_truncation", "num_filtered",
  "result": [...]}}}``); query ``limit``, ``detail``, and Ray's
  ``filter_keys`` / ``filter_predicates`` / ``filter_values``.
- ``/api/v0/{tasks,actors,objects}/summarize``: the summaries.
- ``/api/v0/tasks/timeline``: ``ray_lite.timeline()``'s events
  (``?download=1``: as a file to load in chrome://tracing or Perfetto).
- ``/api/serve/applications/``: Serve's applications, deployments, replicas.
- ``/api/version``; ``/api/ray_lite/overview`` and
  ``/api/ray_lite/recent_tasks`` (the page's own, no Ray counterpart).

One thread blocks in ``select`` on the listening socket (no timer wakes it);
each request runs on its own thread (``ThreadingHTTPServer``).
"""
import json
import os
import select
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from ray_lite._private.process import state
from ray_lite.exceptions import DashboardError
from ray_lite._version import __version__

__all__ = ["DashboardError", "DashboardServer", "serve_in_process", "STATIC_DIR"]

STATIC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
_STATIC = {"index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8",
           "style.css": "text/css; charset=utf-8"}
_KINDS = {"actors": "actors", "tasks": "tasks", "objects": "objects", "workers": "workers",
          "nodes": "nodes", "placement_groups": "placement-groups", "jobs": "jobs"}
_LOOPBACK_NAMES = {"127.0.0.1", "localhost", "::1", "[::1]"}


def _ray_response(data, ok=True, msg=""):
    return {"result": ok, "msg": msg, "data": data}


def _query_filters(q):
    keys, preds, values = (q.get("filter_keys", []), q.get("filter_predicates", []),
                           q.get("filter_values", []))
    if not (len(keys) == len(preds) == len(values)):
        raise ValueError("filter_keys, filter_predicates and filter_values must pair up")
    return [list(f) for f in zip(keys, preds, values)]


def api_answer(source, path, query):
    """(status, JSON-able body, extra headers) for an ``/api/`` path."""
    q = parse_qs(query)
    parts = [p for p in path.split("/") if p]
    if parts == ["api", "version"]:
        return 200, {"version": "ray_lite", "ray_version": __version__,
                     "ray_commit": None}, {}
    if parts == ["api", "serve", "applications"]:
        return 200, source("serve"), {}
    if parts == ["api", "ray_lite", "overview"]:
        return 200, source("overview"), {}
    if parts == ["api", "ray_lite", "recent_tasks"]:
        return 200, source("recent_tasks"), {}
    if parts[:2] == ["api", "v0"] and len(parts) == 3 and parts[2] in _KINDS:
        limit = int(q.get("limit", ["100"])[0])
        detail = q.get("detail", ["false"])[0].lower() in ("1", "true")
        rows = source("list", kind=_KINDS[parts[2]], filters=_query_filters(q),
                      limit=limit, detail=detail)
        return 200, _ray_response({"result": {
            "total": len(rows), "num_after_truncation": len(rows), "num_filtered": len(rows),
            "result": rows, "partial_failure_warning": "", "warnings": None}}), {}
    if parts[:2] == ["api", "v0"] and len(parts) == 4 and parts[3] == "summarize" \
            and parts[2] in ("tasks", "actors", "objects"):
        s = source("summary", kind=parts[2])
        return 200, _ray_response({"result": {"node_id_to_summary": s,
                                              "partial_failure_warning": "",
                                              "warnings": None}}), {}
    if parts == ["api", "v0", "tasks", "timeline"]:
        headers = {}
        if q.get("download", ["0"])[0] in ("1", "true"):
            headers["Content-Disposition"] = 'attachment; filename="timeline.json"'
        return 200, source("timeline"), headers
    return 404, _ray_response(None, False, f"no such endpoint: {path}"), {}


class _Handler(BaseHTTPRequestHandler):
    server_version = "ray_lite-dashboard"
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass    # the program's terminal is not the dashboard's log

    def _send(self, status, body, ctype, headers=()):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for k, v in dict(headers).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _host_allowed(self):
        # Bound to loopback, only pages of loopback may ask (no DNS rebinding).
        if not self.server.loopback_only:
            return True
        host = (self.headers.get("Host") or "").strip()
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        return name in _LOOPBACK_NAMES

    def do_GET(self):   # noqa: N802 - http.server's name
        if not self._host_allowed():
            self._send(403, b"forbidden host\n", "text/plain")
            return
        url = urlsplit(self.path)
        if url.path.startswith("/api/"):
            try:
                status, body, headers = api_answer(self.server.source, url.path, url.query)
            except (ValueError, TypeError) as exc:
                status, body, headers = 400, _ray_response(None, False, str(exc)), {}
            except Exception as exc:    # noqa: BLE001 - shown to the page
                status, body = 500, _ray_response(None, False, f"{type(exc).__name__}: {exc}")
                headers = {}
            data = json.dumps(body, default=str).encode()
            self._send(status, data, "application/json", headers)
            return
        name = "index.html" if url.path in ("/", "/index.html") else url.path.rsplit("/", 1)[-1]
        if name not in _STATIC or url.path not in ("/", f"/{name}", f"/static/{name}"):
            self._send(404, b"not found\n", "text/plain")
            return
        with open(os.path.join(STATIC_DIR, name), "rb") as f:
            self._send(200, f.read(), _STATIC[name])


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    # A port some other process listens on is refused, not shared.
    allow_reuse_address = True


class DashboardServer:
    """Serves the dashboard on ``host:port`` (0: any free port) with
    ``source(op, **args)`` answering the data requests."""

    def __init__(self, source, host="127.0.0.1", port=8265):
        try:
            httpd = _HTTPServer((host, port), _Handler)
        except OSError as exc:
            if exc.errno == 98:     # EADDRINUSE
                raise DashboardError(
                    f"cannot serve the dashboard on {host}:{port}: the port is in use "
                    f"(another dashboard, Ray's or a second program's?); choose another "
                    f"with dashboard_port=... (ray-lite dashboard --port)") from None
            raise DashboardError(f"cannot serve the dashboard on {host}:{port}: {exc}") from None
        httpd.source = source
        httpd.loopback_only = host in _LOOPBACK_NAMES
        self._httpd = httpd
        self.host = host
        self.port = httpd.server_address[1]
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="ray_lite-dashboard",
                                        daemon=True)
        self._thread.start()

    @property
    def address(self):
        return f"{self.host}:{self.port}"

    def _serve(self):
        httpd = self._httpd
        while not self._closed:
            try:
                select.select([httpd], [], [])
            except (OSError, ValueError):
                return
            if self._closed:
                return
            httpd._handle_request_noblock()

    def stop(self):
        if self._closed:
            return
        self._closed = True
        try:
            self._httpd.socket.shutdown(socket.SHUT_RDWR)   # wakes the select
        except OSError:
            pass
        if self._thread is not threading.current_thread():
            self._thread.join(5.0)
        self._httpd.server_close()
        if state.dashboard_url == self.address:
            state.dashboard_url = None

    def wait(self):
        """Block until stopped (``ray-lite dashboard``); Ctrl-C ends it."""
        while self._thread.is_alive():
            self._thread.join(0.5)


def serve_in_process(host, port):
    """The driver's own dashboard (``init(include_dashboard=True)``)."""
    from . import data
    server = DashboardServer(data.call, host, port)
    state.dashboard_url = server.address
    return server
