"""``HTTPOptions`` and the proxy's own paths as Ray Serve answers them:
``/-/healthz`` (503 until an application has a route, then 200 "success"),
``/-/routes`` ({route_prefix: app name}), ``request_timeout_s`` (408 naming the request, the
proxy keeps serving), ``keep_alive_timeout_s``; a port another program holds."""
import asyncio
import json
import socket

import pytest
from starlette.requests import Request

import ray_lite as ray
from ray_lite import serve
from ray_lite.serve import api as serve_api
from ray_lite.serve.exceptions import RayServeException
from ray_lite.util.state import list_actors

from serve_helpers import http


@serve.deployment
def hello(request: Request):
    return "hello"


@serve.deployment(max_ongoing_requests=10)
class Sleepy:
    async def __call__(self, request: Request):
        if request.query_params.get("sleep"):
            await asyncio.sleep(float(request.query_params["sleep"]))
        return "awake"


@ray.remote
class _DiesStarting:
    def __init__(self):
        raise OSError("no port for this one")

    def ping(self):
        return "pong"


@ray.remote
class _Controller:
    """Stands for Serve's controller: its method fails because another actor died."""

    def __init__(self):
        self.calls = 0

    def start_child(self):
        self.calls += 1
        ray.get(_DiesStarting.remote().ping.remote(), timeout=30)

    def calls_made(self):
        return self.calls


def test_a_port_another_program_holds_fails_at_once_naming_it(serve_runtime):
    busy = socket.socket()
    try:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(RayServeException,
                           match=f"HTTP cannot listen on 127.0.0.1:{port}: Address already in use"):
            serve.start(http_options={"host": "127.0.0.1", "port": port})
    finally:
        busy.close()
    # Found before any proxy started: none died trying, none was retried.
    assert [a for a in list_actors() if a.get("class_name") == "ProxyActor"] == []


def test_a_controller_call_failed_by_another_actors_death_is_not_made_again(serve_runtime):
    # Only the controller's own death makes Serve call it again (the runtime
    # restarts it); an error its method raised is the answer.
    ctl = _Controller.remote()
    with pytest.raises(ray.exceptions.RayActorError, match="no port for this one"):
        serve_api._ask(ctl, "start_child", timeout=60)
    assert ray.get(ctl.calls_made.remote(), timeout=30) == 1


def test_http_options_fields_and_defaults():
    opts = serve.HTTPOptions(port=0, request_timeout_s=2.5)
    assert (opts.host, opts.port, opts.request_timeout_s) == ("127.0.0.1", 0, 2.5)
    assert opts.keep_alive_timeout_s == 90
    assert opts.to_dict()["request_timeout_s"] == 2.5
    serve.HTTPOptions(location="EveryNode")      # Ray's, meaningless here: accepted
    with pytest.raises(TypeError, match="hots"):
        serve.HTTPOptions(hots="x")


def test_healthz_and_routes_follow_the_route_table(serve_runtime):
    from ray_lite.serve.api import _http_port
    serve.start(http_options=serve.HTTPOptions(port=0, proxies=1))
    port = _http_port()
    status, hdrs, body = http(port, "GET", "/-/healthz")
    assert (status, body) == (503, b"Route table is not populated yet.")
    status, hdrs, body = http(port, "GET", "/-/routes")
    hdrs.pop("x-request-id")
    assert (hdrs, body) == ({"content-type": "application/json", "content-length": "2"}, b"{}")

    serve.run(hello.bind(), name="nohttp", route_prefix=None)
    assert http(port, "GET", "/-/healthz")[0] == 503     # no route yet: still not ready

    serve.run(hello.bind(), name="app1", route_prefix="/a")
    serve.run(hello.bind(), name="app2", route_prefix="/b/c")
    status, hdrs, body = http(port, "GET", "/-/healthz")
    assert (status, body) == (200, b"success")
    assert hdrs["content-type"].startswith("text/plain")
    status, hdrs, body = http(port, "GET", "/-/routes")
    assert status == 200 and hdrs["content-type"] == "application/json"
    assert json.loads(body) == {"/a": "app1", "/b/c": "app2"}

    # An application at "/" does not hide them; other /-/ paths are its own.
    serve.run(hello.bind(), name="root", route_prefix="/")
    assert json.loads(http(port, "GET", "/-/routes")[2])["/"] == "root"
    assert http(port, "GET", "/-/other")[2] == b"hello"


def test_request_timeout_gives_408_and_the_proxy_keeps_serving(serve_runtime):
    from ray_lite.serve.api import _http_port
    serve.start(http_options={"port": 0, "proxies": 1, "request_timeout_s": 0.5})
    port = _http_port()
    serve.run(Sleepy.bind())
    status, hdrs, body = http(port, "GET", "/?sleep=30")
    assert status == 408 and hdrs["connection"] == "close"
    # Ray's text, naming the request by the id it answers with.
    assert body.decode() == f"Request {hdrs['x-request-id']} timed out after 0.5s."
    status, hdrs, body = http(port, "GET", "/?sleep=30", headers={"X-Request-ID": "abc-1"})
    assert (status, hdrs["x-request-id"]) == (408, "abc-1")
    assert body == b"Request abc-1 timed out after 0.5s."
    for _ in range(3):
        assert http(port, "GET", "/")[::2] == (200, b"awake")


@serve.deployment
class Streamer:
    def __call__(self, request: Request):
        from starlette.responses import StreamingResponse

        def parts():
            yield b"a"
            yield b"b"
        return StreamingResponse(parts(), media_type="text/plain")


def test_every_answer_carries_an_x_request_id(serve_runtime):
    # Ray's proxy names each request in its answer: the client's
    # x-request-id when it sent one, else a fresh id (one per request).
    from ray_lite.serve.api import _http_port
    serve.start(http_options={"port": 0, "proxies": 1})
    port = _http_port()
    serve.run(hello.bind(), name="hello", route_prefix="/hello")
    serve.run(Streamer.bind(), name="stream", route_prefix="/stream")
    seen = set()
    for path in ("/hello", "/stream", "/nowhere", "/-/healthz", "/hello"):
        status, hdrs, body = http(port, "GET", path)
        assert status in (200, 404), (path, status)
        assert hdrs.get("x-request-id"), (path, hdrs)
        seen.add(hdrs["x-request-id"])
    assert len(seen) == 5                   # fresh each time
    assert http(port, "GET", "/stream")[2] == b"ab"
    for path in ("/hello", "/stream", "/nowhere"):
        hdrs = http(port, "GET", path, headers={"X-Request-ID": "client-7"})[1]
        assert hdrs["x-request-id"] == "client-7", path
