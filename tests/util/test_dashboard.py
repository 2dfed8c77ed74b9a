"""The dashboard: served by the driver (init(include_dashboard=True)) or by
`ray-lite dashboard`, JSON on Ray's dashboard paths, loopback only, and
nothing imported by a program that does not open it."""
import json
import re
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

import ray_lite
from ray_lite import serve
from ray_lite.dashboard.server import DashboardError, DashboardServer


@ray_lite.remote
class Tracker:
    def ping(self):
        return "pong"


@ray_lite.remote
def add(a, b):
    return a + b


@serve.deployment
class Hello:
    def __call__(self, request):
        return "hi"


def _get(url, headers=None):
    req = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.status, r.headers, r.read()


def _json(base, path):
    status, _, body = _get(base + path)
    assert status == 200
    return json.loads(body)


@pytest.fixture
def dashboard():
    ctx = ray_lite.init(num_cpus=1, include_dashboard=True, dashboard_port=0,
                        runtime_env={"env_vars": {"RAY_LITE_TIMELINE": "1"}})
    try:
        yield ctx
    finally:
        try:
            serve.shutdown()
        finally:
            ray_lite.shutdown()


def test_the_driver_serves_the_page_and_rays_endpoints(dashboard):
    url = ray_lite.get_runtime_context().get_dashboard_url()
    assert url == dashboard.dashboard_url and url.startswith("127.0.0.1:")
    assert dashboard.address_info["webui_url"] == url
    base = f"http://{url}"
    t = Tracker.options(name="tracker").remote()
    assert ray_lite.get(t.ping.remote()) == "pong"
    assert ray_lite.get(add.remote(1, 2)) == 3
    status, headers, page = _get(base + "/")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert b"/static/app.js" in page
    for name in ("app.js", "style.css"):
        status, _, body = _get(f"{base}/static/{name}")
        assert status == 200
        # Nothing is loaded from the internet: every resource is the package's.
        assert not re.search(rb"(src|href|url)\s*[=(]\s*[\"']?(https?:)?//", body + page)
    actors = _json(base, "/api/v0/actors")
    assert actors["result"] is True
    rows = actors["data"]["result"]["result"]
    assert [(a["name"], a["state"]) for a in rows] == [("tracker", "ALIVE")]
    assert actors["data"]["result"]["total"] == 1
    filtered = _json(base, "/api/v0/actors?filter_keys=state&filter_predicates=!%3D"
                           "&filter_values=ALIVE")
    assert filtered["data"]["result"]["result"] == []
    summary = _json(base, "/api/v0/actors/summarize")
    assert summary["data"]["result"]["node_id_to_summary"]["cluster"]["total_actors"] == 1
    overview = _json(base, "/api/ray_lite/overview")
    assert {p["kind"] for p in overview["processes"]} >= {"driver", "worker", "actor Tracker"}
    assert overview["object_store"]["capacity_bytes"] > 0
    names = [e["name"] for e in _json(base, "/api/v0/tasks/timeline") if e["ph"] == "X"]
    assert "add" in names and "Tracker.ping" in names
    recent = _json(base, "/api/ray_lite/recent_tasks")
    assert recent["timeline_recording"] is True
    assert any(r["name"] == "add" and r["state"] == "FINISHED" for r in recent["tasks"])
    _, headers, _ = _get(base + "/api/v0/tasks/timeline?download=1")
    assert "attachment" in headers["Content-Disposition"]
    assert _json(base, "/api/version")["version"] == "ray_lite"
    with pytest.raises(urllib.error.HTTPError) as err:
        _get(base + "/api/v0/nothing")
    assert err.value.code == 404
    with pytest.raises(urllib.error.HTTPError) as err:
        _get(base + "/../pyproject.toml")
    assert err.value.code == 404


def test_serve_applications_on_rays_path(dashboard):
    serve.start(http_options={"port": 0, "proxies": 1})
    serve.run(Hello.bind(), name="hello_app", route_prefix="/hello")
    base = f"http://{dashboard.dashboard_url}"
    apps = _json(base, "/api/serve/applications/")["applications"]
    app = apps["hello_app"]
    assert app["status"] == "RUNNING" and app["route_prefix"] == "/hello"
    dep = app["deployments"]["Hello"]
    assert dep["status"] == "HEALTHY" and dep["replica_states"] == {"RUNNING": 1}
    assert len(dep["replicas"]) == 1 and dep["replicas"][0]["pid"] > 0


def test_a_page_of_another_host_name_is_refused(dashboard):
    base = f"http://{dashboard.dashboard_url}"
    with pytest.raises(urllib.error.HTTPError) as err:
        _get(base + "/api/v0/actors", headers={"Host": "evil.example:8265"})
    assert err.value.code == 403


def test_a_port_in_use_is_refused_with_a_clear_error():
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        with pytest.raises(DashboardError, match="in use"):
            DashboardServer(lambda op, **kw: {}, "127.0.0.1", port)
        with pytest.raises(DashboardError, match="in use"):
            ray_lite.init(num_cpus=1, include_dashboard=True, dashboard_port=port)
        assert not ray_lite.is_initialized()
    finally:
        taken.close()


def test_ray_lite_dashboard_from_another_terminal(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    ray_lite.init(num_cpus=1)
    proc = None
    try:
        t = Tracker.options(name="seen-from-outside").remote()
        ray_lite.get(t.ping.remote())
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        proc = subprocess.Popen([sys.executable, "-m", "ray_lite.scripts", "dashboard",
                                 "--port", str(port)], stdout=subprocess.PIPE, text=True)
        line = proc.stdout.readline()
        assert f"http://127.0.0.1:{port}/" in line
        rows = _json(f"http://127.0.0.1:{port}", "/api/v0/actors")["data"]["result"]["result"]
        assert [a["name"] for a in rows] == ["seen-from-outside"]
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=60)
            proc.stdout.close()
        ray_lite.shutdown()


def test_nothing_of_the_dashboard_is_imported_unless_opened():
    code = ("import sys, ray_lite\n"
            "ray_lite.init(num_cpus=1)\n"
            "ray_lite.get(ray_lite.remote(lambda: 1).remote())\n"
            "print(sorted(m for m in sys.modules if m.startswith(('ray_lite.dashboard', "
            "'http.server', 'ray_lite.util.state'))))\n"
            "ray_lite.shutdown()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out.strip() == "[]"
