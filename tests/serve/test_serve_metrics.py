"""Serve's metrics in Prometheus text format on the port the user chose
(``http_options["metrics_export_port"]``), with Ray Serve's names: the
counts match the requests sent (errors included), latency histograms per
route and deployment, requests in flight per replica, replica starts; and
the access log (one line per request)."""
import importlib.util
import os
import re
import signal
import socket
import sys
import threading
import time

import pytest
from starlette.requests import Request

from ray_lite import serve

from serve_helpers import free_port as _free_port
from serve_helpers import http, process_gone, wait_until
from serve_helpers import metric_value as _value
from serve_helpers import scrape_metrics as _scrape

pytestmark = pytest.mark.skipif(importlib.util.find_spec("prometheus_client") is None,
                                reason="prometheus_client is not installed")

# Each test that takes serve_port (or serve_http_mode) runs through the
# proxies and with direct ingress (conftest).
SERVE_HTTP_MODES = ("proxies", "direct")


def _until(check, timeout=60):
    end = time.monotonic() + timeout
    while True:
        got = check()
        if got or time.monotonic() > end:
            return got
        time.sleep(0.05)


@serve.deployment(num_replicas=1, max_ongoing_requests=10)
class App:
    def __init__(self, flag):
        self.flag = flag

    async def __call__(self, request: Request):
        import asyncio
        what = request.query_params.get("do", "")
        if what == "fail":
            raise ValueError("asked to fail")
        if what == "wait":
            end = asyncio.get_running_loop().time() + 60
            while not os.path.exists(self.flag) and asyncio.get_running_loop().time() < end:
                await asyncio.sleep(0.02)
        if what == "pid":
            return str(os.getpid())
        return "ok"


@pytest.fixture
def metrics_serve(serve_runtime, serve_http_options):
    from ray_lite.serve.api import _http_port
    mport = _free_port()
    serve.start(http_options=serve.HTTPOptions(**serve_http_options(
        port=0, proxies=1, metrics_export_port=mport, access_log=True)))
    yield _http_port(), mport


def test_request_counts_errors_and_latency_match_what_was_sent(metrics_serve, tmp_path):
    port, mport = metrics_serve
    serve.run(App.bind(str(tmp_path / "flag")), name="app", route_prefix="/app")
    for _ in range(7):
        assert http(port, "GET", "/app/")[0] == 200
    for _ in range(3):
        assert http(port, "GET", "/app/?do=fail")[0] == 500
    assert http(port, "POST", "/app/")[0] == 200
    assert http(port, "GET", "/nowhere")[0] == 404

    s = _scrape(mport)
    total = "ray_serve_num_http_requests_total"
    assert _value(s, total, route="/app", application="app", method="GET",
                  status_code="200") == 7
    assert _value(s, total, route="/app", method="GET", status_code="500") == 3
    assert _value(s, total, route="/app", method="POST", status_code="200") == 1
    assert _value(s, total, route="", status_code="404") == 1
    assert _value(s, "ray_serve_num_http_error_requests_total", route="/app",
                  error_code="500", application="app") == 3
    assert _value(s, "ray_serve_num_http_error_requests_total", error_code="404") == 1
    assert _value(s, "ray_serve_num_deployment_http_error_requests_total",
                  deployment="App", error_code="500") == 3
    # The latency histogram: one observation per request, in Ray's buckets.
    assert _value(s, "ray_serve_http_request_latency_ms_count", route="/app") == 11
    assert _value(s, "ray_serve_http_request_latency_ms_bucket", route="/app", le="+Inf",
                  status_code="200", method="GET") == 7
    # The replica's side: the same requests, per deployment.
    assert _value(s, "ray_serve_deployment_request_counter_total", deployment="App",
                  application="app") == 11
    assert _value(s, "ray_serve_deployment_processing_latency_ms_count",
                  deployment="App") == 11
    assert _value(s, "ray_serve_deployment_error_counter_total", deployment="App") == 3
    assert _value(s, "ray_serve_deployment_replica_starts_total", deployment="App") == 1



def test_requests_in_flight_per_replica_and_replica_restarts(metrics_serve, tmp_path):
    port, mport = metrics_serve
    flag = tmp_path / "flag"
    serve.run(App.bind(str(flag)), name="app", route_prefix="/app")
    got = {}
    waiting = threading.Thread(target=lambda: got.update(r=http(port, "GET", "/app/?do=wait")))
    waiting.start()
    try:
        assert _until(lambda: _value(_scrape(mport), "ray_serve_replica_processing_queries",
                                     deployment="App") == 1)
    finally:
        flag.write_text("go")
        waiting.join(60)
    assert got["r"][0] == 200
    assert _until(lambda: _value(_scrape(mport), "ray_serve_replica_processing_queries",
                                 deployment="App") == 0)

    pid = int(http(port, "GET", "/app/?do=pid")[2])
    os.kill(pid, signal.SIGKILL)
    # (With direct ingress, until then a connection may land in its queue.)
    wait_until(lambda: process_gone(pid), "the killed replica's end")

    def replaced():
        status, _, body = http(port, "GET", "/app/?do=pid")
        return status == 200 and body != str(pid).encode()
    assert _until(replaced)
    s = _scrape(mport)
    assert _value(s, "ray_serve_deployment_replica_starts_total", deployment="App") == 2
    # The dead replica's requests in flight are no longer counted.
    assert len([1 for lab, _ in s["ray_serve_replica_processing_queries"]
                if lab["deployment"] == "App"]) == 1


def _socket_app():
    from starlette.applications import Starlette
    from starlette.routing import WebSocketRoute
    from starlette.websockets import WebSocketDisconnect

    async def chat(ws):
        await ws.accept()
        try:
            while True:
                text = await ws.receive_text()
                if text == "close-4001":
                    await ws.close(code=4001)
                    return
                await ws.send_text(text)
        except WebSocketDisconnect:
            return

    async def refuse(ws):
        await ws.close()
    return Starlette(routes=[WebSocketRoute("/chat", chat), WebSocketRoute("/refuse", refuse)])


def _vanish_after_handshake(port, path):
    """Open a WebSocket, then drop the TCP connection without a close frame."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
              "Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
              "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n".encode())
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = s.recv(4096)
        assert chunk, got
        got += chunk
    assert got.startswith(b"HTTP/1.1 101"), got
    s.close()


@pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("websockets", "wsproto")),
                    reason="websockets or wsproto is not installed")
def test_websockets_count_as_requests_with_their_close_codes(metrics_serve):
    # Ray's proxy counts a WebSocket as a request of method "WS" whose status
    # is its close code; any code but 1000/1001 is an error.
    import asyncio

    import websockets
    port, mport = metrics_serve

    @serve.deployment
    @serve.ingress(_socket_app())
    class Sockets:
        pass
    serve.run(Sockets.bind(), name="ws", route_prefix="/ws")

    async def talk():
        async with websockets.connect(f"ws://127.0.0.1:{port}/ws/chat") as ws:
            await ws.send("hi")
            assert await ws.recv() == "hi"
        async with websockets.connect(f"ws://127.0.0.1:{port}/ws/chat") as ws:
            await ws.send("close-4001")
            with pytest.raises(websockets.ConnectionClosed):
                await ws.recv()
        with pytest.raises(websockets.InvalidStatus if hasattr(websockets, "InvalidStatus")
                           else websockets.InvalidStatusCode):
            async with websockets.connect(f"ws://127.0.0.1:{port}/ws/refuse"):
                pass
    asyncio.run(asyncio.wait_for(talk(), 60))
    _vanish_after_handshake(port, "/ws/chat")

    total = "ray_serve_num_http_requests_total"
    errors = "ray_serve_num_http_error_requests_total"

    def counted():
        s = _scrape(mport)
        return s if _value(s, total, route="/ws", method="WS") == 4 else None
    s = _until(counted)
    assert s, _scrape(mport).get(total)
    for code in ("1000", "4001", "1006", "403"):
        assert _value(s, total, route="/ws", application="ws", method="WS",
                      status_code=code) == 1, code
    assert _value(s, errors, route="/ws", method="WS") == 3
    assert _value(s, errors, route="/ws", error_code="1000") == 0
    assert _value(s, errors, route="/ws", error_code="4001") == 1
    assert _value(s, errors, route="/ws", error_code="1006") == 1
    assert _value(s, "ray_serve_num_deployment_http_error_requests_total",
                  deployment="Sockets", error_code="4001") == 1
    assert _value(s, "ray_serve_http_request_latency_ms_count", route="/ws",
                  method="WS") == 4


def test_without_metrics_nothing_is_exported_or_wrapped(serve_port):
    serve.run(App.bind("/nonexistent"), name="app", route_prefix="/app")
    assert http(serve_port, "GET", "/app/")[0] == 200
    from ray_lite.serve import _metrics
    assert not os.path.isdir(_metrics.metrics_dir())


def test_cli_metrics_export_port_and_access_log(tmp_path, monkeypatch, serve_http_mode):
    from test_serve_cli import _start, _stop, _wait_port
    # (Ray's switch, read by the CLI's runtime.)
    monkeypatch.setenv("RAY_SERVE_ENABLE_DIRECT_INGRESS",
                       "1" if serve_http_mode == "direct" else "0")
    mport = _free_port()
    proc = _start(tmp_path, "cli_app_mod:app", "--metrics-export-port", str(mport),
                  "--access-log")
    port, out = _wait_port(proc)
    try:
        for _ in range(4):
            assert http(port, "GET", "/x?y=1")[2] == b"hi"
        assert http(port, "POST", "/")[0] == 200
        s = _scrape(mport)
        assert _value(s, "ray_serve_num_http_requests_total", route="/",
                      application="default", status_code="200") == 5
        assert _value(s, "ray_serve_deployment_replica_starts_total",
                      deployment="TestDeployment") == 2
    finally:
        code, rest = _stop(proc, signal.SIGTERM)
    assert code == 0
    # One line per request: method, path (without the query), status, latency.
    lines = (out + rest).decode(errors="replace").splitlines()
    assert sum(bool(re.search(r" GET /x 200 \d+\.\dms$", line)) for line in lines) == 4
    assert sum(bool(re.search(r" POST / 200 \d+\.\dms$", line)) for line in lines) == 1


def test_a_killed_drivers_metric_directory_goes_at_the_next_serve_start(tmp_path, monkeypatch):
    """``serve.start`` (``_metrics.prepare``) removes the metric directories
    whose driver is dead; a live driver's, and what is not a directory, stay."""
    import subprocess
    import tempfile

    from ray_lite._fast import shm
    from ray_lite.serve import _metrics
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    assert child.wait(timeout=60) == 0
    dead = tmp_path / f"{_metrics._DIR_PREFIX}{shm.DEFAULT_PREFIX}{child.pid}_"
    live = tmp_path / f"{_metrics._DIR_PREFIX}{shm.DEFAULT_PREFIX}{os.getpid()}_"
    not_a_dir = tmp_path / f"{_metrics._DIR_PREFIX}{shm.DEFAULT_PREFIX}{child.pid}_file"
    for d in (dead, live):
        d.mkdir()
        (d / "counter_1.db").write_bytes(b"\0" * 64)
    not_a_dir.write_bytes(b"")
    _metrics.prepare({})            # metrics not asked for: still cleans up
    assert not dead.exists()
    assert live.is_dir() and (live / "counter_1.db").exists()
    assert not_a_dir.is_file()


def test_a_scrape_skips_the_file_of_a_process_still_creating_it(tmp_path, monkeypatch):
    # A replica that is starting has created its file but not sized it yet:
    # a scrape in that moment answered nothing (prometheus_client cannot
    # read an empty file) and the scraper saw its connection reset.
    from ray_lite.serve._metrics import scrape
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    (tmp_path / "counter_4242.db").write_bytes(b"")
    (tmp_path / "gauge_livesum_4242.db").write_bytes(b"")
    body = scrape(str(tmp_path))
    assert isinstance(body, bytes) and b"4242" not in body


@serve.deployment(num_replicas=1)
class Counts:
    def __init__(self):
        from ray_lite.serve import metrics
        self.served = metrics.Counter("app_served", "Requests served.", tag_keys=("route",))
        self.size = metrics.Gauge("app_size", tag_keys=("model",)).set_default_tags(
            {"model": "m1"})
        self.info = (self.served.info, self.size.info)
        try:
            metrics.Counter("bad", tag_keys=("replica",))
            self.reserved = None
        except ValueError as exc:
            self.reserved = str(exc)

    async def __call__(self, request: Request):
        self.served.inc()           # the route is the request's
        self.size.set(42)
        return {"info": [i["tag_keys"] for i in self.info],
                "defaults": [sorted(i["default_tags"]) for i in self.info],
                "reserved": self.reserved, "replica": serve.get_replica_context().replica_tag}


def test_serve_metrics_carry_the_replicas_tags(metrics_serve):
    port, mport = metrics_serve
    serve.run(Counts.bind(), name="shop", route_prefix="/shop")
    for _ in range(4):
        status, _, body = http(port, "GET", "/shop/")
        assert status == 200
    import json
    got = json.loads(body)
    assert got["info"] == [["deployment", "replica", "application", "route"],
                           ["deployment", "replica", "application", "model"]]
    assert got["defaults"] == [["application", "deployment", "replica"],
                               ["application", "deployment", "model", "replica"]]
    assert got["reserved"] == "'replica' tag is reserved for Ray Serve metrics"
    s = _scrape(mport)
    assert _value(s, "ray_app_served_total", deployment="Counts", application="shop",
                  replica=got["replica"], route="/shop") == 4
    assert _value(s, "ray_app_size", deployment="Counts", model="m1") == 42


def test_serve_metrics_outside_a_replica_add_no_tags(monkeypatch):
    from ray_lite.serve import context, metrics
    # (A test that ran a replica's code in this process leaves its context set.)
    monkeypatch.setattr(context, "_replica_context", None)
    c = metrics.Counter("plain", tag_keys=("k",))
    assert c.info["tag_keys"] == ("k",) and c.info["default_tags"] == {}
    h = metrics.Histogram("plain_h", boundaries=[1, 2])
    import pickle
    again = pickle.loads(pickle.dumps(h))
    assert type(again) is metrics.Histogram and again.boundaries == [1, 2]
    with pytest.raises(TypeError, match="tuple"):
        metrics.Gauge("g", tag_keys=["k"])
    assert serve.metrics is metrics and serve.config.HTTPOptions is not None
