"""``@serve.ingress(app)`` over real HTTP (FastAPI, Starlette, a bare ASGI
callable, lifespan), ``async def __init__``, and Ray's errors for handle
calls (a generator without stream=True, a missing method) and its handle
getters (one handle per name)."""
import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

from serve_helpers import http

# Each test that takes serve_port (or serve_http_mode) runs through the
# proxies and with direct ingress (conftest).
SERVE_HTTP_MODES = ("proxies", "direct")

needs_fastapi = pytest.mark.skipif(importlib.util.find_spec("fastapi") is None,
                                   reason="fastapi is not installed")


def _json(port, method, path, body=None, headers=None):
    status, hdrs, data = http(port, method, path, body=body, headers=headers)
    return status, hdrs, (json.loads(data) if data and hdrs.get("content-type", "").startswith(
        "application/json") else data)


# ------------------------------------------------------------------ FastAPI
@needs_fastapi
def test_fastapi_class_view_routes_params_bodies_and_errors(serve_port):
    from fastapi import FastAPI, HTTPException
    from pydantic import BaseModel

    from ray_lite import serve

    app = FastAPI()

    class Item(BaseModel):
        name: str
        price: float

    @app.get("/module-level")
    def module_level():
        return {"where": "module"}

    @serve.deployment
    @serve.ingress(app)
    class Api:
        def __init__(self, greeting):
            self.greeting = greeting

        @app.get("/echo/{word}")
        def echo(self, word: str, times: int = 1):
            return {"said": f"{self.greeting} {word * times}"}

        @app.post("/items/{item_id}")
        async def put_item(self, item_id: int, item: Item):
            return {"id": item_id, "total": item.price * 2, "name": item.name}

        @app.get("/things/{thing}")
        def thing(self, thing: str):
            if thing != "known":
                raise HTTPException(status_code=404, detail=f"no {thing}")
            return thing

    serve.run(Api.bind("hello"), name="api", route_prefix="/api")
    port = serve_port

    assert _json(port, "GET", "/api/echo/ab?times=2")[::2] == (200, {"said": "hello abab"})
    assert _json(port, "GET", "/api/module-level")[::2] == (200, {"where": "module"})
    status, _, body = _json(port, "GET", "/api/echo/ab?times=many")
    assert status == 422 and body["detail"][0]["loc"] == ["query", "times"]

    ok = json.dumps({"name": "pen", "price": 1.5})
    hdr = {"content-type": "application/json"}
    assert _json(port, "POST", "/api/items/7", ok, hdr)[::2] == (
        200, {"id": 7, "total": 3.0, "name": "pen"})
    status, _, body = _json(port, "POST", "/api/items/7", json.dumps({"name": "pen"}), hdr)
    assert status == 422 and body["detail"][0]["loc"] == ["body", "price"]

    assert _json(port, "GET", "/api/things/known")[::2] == (200, "known")
    assert _json(port, "GET", "/api/things/other")[::2] == (404, {"detail": "no other"})
    assert http(port, "GET", "/api/nowhere")[0] == 404

    # The docs live under the route prefix; self is no parameter of any route.
    status, _, spec = _json(port, "GET", "/api/openapi.json")
    assert status == 200
    assert set(spec["paths"]) == {"/module-level", "/echo/{word}", "/items/{item_id}",
                                  "/things/{thing}"}
    assert "self" not in json.dumps(spec["paths"])
    status, _, page = http(port, "GET", "/api/docs")
    assert status == 200 and b"/api/openapi.json" in page


@needs_fastapi
def test_fastapi_dependencies_middleware_and_lifespan_state(serve_port):
    import contextlib

    from fastapi import Depends, FastAPI, Request

    from ray_lite import serve

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield {"model": "loaded-in-lifespan"}

    app = FastAPI(lifespan=lifespan)

    @app.middleware("http")
    async def add_header(request, call_next):
        response = await call_next(request)
        response.headers["x-middleware"] = "ran"
        return response

    def user_agent(request: Request):
        return request.headers.get("user-agent", "")

    @serve.deployment(num_replicas=2)
    @serve.ingress(app)
    class Api:
        @app.get("/whoami")
        def whoami(self, agent: str = Depends(user_agent)):
            return {"agent": agent}

        @app.get("/model")
        def model(self, request: Request):
            return {"model": request.state.model, "replica": self.replica()}

        def replica(self):
            ctx = serve.get_replica_context()
            rid = ctx.replica_id
            return {"tag": ctx.replica_tag, "unique": rid.unique_id,
                    "deployment": [rid.deployment_id.name, rid.deployment_id.app_name],
                    "full": rid.to_full_id_str(), "rank": ctx.rank.rank,
                    "world": ctx.world_size}

    serve.run(Api.bind(), route_prefix="/")
    status, hdrs, body = _json(serve_port, "GET", "/whoami", headers={"user-agent": "t/1"})
    assert (status, body, hdrs["x-middleware"]) == (200, {"agent": "t/1"}, "ran")
    status, _, body = _json(serve_port, "GET", "/model")
    assert status == 200 and body["model"] == "loaded-in-lifespan"
    # Ray's ReplicaContext: a ReplicaID, the rank among the deployment's
    # replicas and their number.
    rep = body["replica"]
    assert rep["tag"] == rep["unique"] and rep["unique"] and "#" not in rep["unique"]
    assert rep["deployment"] == ["Api", "default"]
    assert rep["full"] == f"SERVE_REPLICA::default#Api#{rep['unique']}"
    assert rep["rank"] in (0, 1) and rep["world"] == 2        # num_replicas=2


@needs_fastapi
@needs_fastapi
def test_fastapi_method_name_defined_again_for_another_route(serve_port):
    # ``def handler`` for GET, ``def handler`` again for POST: the first is no
    # longer in the class's namespace, but still the class's (Ray binds both).
    from fastapi import FastAPI
    from ray_lite import serve

    app = FastAPI()

    @serve.deployment
    @serve.ingress(app)
    class Twice:
        def __init__(self):
            self.word = "hi"

        @app.get("/")
        def handler(self):
            return f"{self.word} get"

        @app.post("/")  # noqa: F811 - the point of the test
        def handler(self):  # noqa: F811
            return f"{self.word} post"

    serve.run(Twice.bind(), route_prefix="/t")
    assert _json(serve_port, "GET", "/t/")[::2] == (200, "hi get")
    assert _json(serve_port, "POST", "/t/")[::2] == (200, "hi post")


def test_fastapi_streaming_response_is_streamed(serve_port):
    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse

    from ray_lite import serve

    app = FastAPI()

    @serve.deployment
    @serve.ingress(app)
    class Streamer:
        @app.get("/count/{n}")
        def count(self, n: int):
            async def numbers():
                for i in range(n):
                    yield f"{i}\n"
            return StreamingResponse(numbers(), media_type="text/plain")

    serve.run(Streamer.bind(), route_prefix="/s")
    status, hdrs, body = http(serve_port, "GET", "/s/count/50")
    assert status == 200
    assert hdrs.get("transfer-encoding") == "chunked" and "content-length" not in hdrs
    assert body == "".join(f"{i}\n" for i in range(50)).encode()


def test_a_client_that_leaves_a_stream_ends_the_apps_task(serve_port):
    import asyncio
    import socket

    from ray_lite import serve

    closed = {}

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        try:
            while True:      # endless: only the client's leaving ends it
                await send({"type": "http.response.body", "body": b"x" * 1024,
                            "more_body": True})
        finally:
            closed["event"].set()

    @serve.deployment
    @serve.ingress(app)
    class Endless:
        def __init__(self):
            closed["event"] = asyncio.Event()

        async def stream_ended(self):
            await asyncio.wait_for(closed["event"].wait(), 30)
            return True

    handle = serve.run(Endless.bind())
    with socket.create_connection(("127.0.0.1", serve_port), timeout=30) as s:
        s.sendall(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        got = b""
        while len(got) < 64 * 1024:
            got += s.recv(65536)
        assert got.startswith(b"HTTP/1.1 200")
    assert handle.stream_ended.remote().result(timeout_s=60) is True


@needs_fastapi
def test_fastapi_route_that_raises_gives_500_and_the_replica_keeps_serving(serve_port):
    from fastapi import FastAPI

    from ray_lite import serve

    app = FastAPI()

    @serve.deployment(num_replicas=1)
    @serve.ingress(app)
    class Fragile:
        def __init__(self):
            self.calls = 0

        @app.get("/boom")
        async def boom(self):
            self.calls += 1
            raise ValueError("route failed")

        @app.get("/ok")
        def ok(self):
            self.calls += 1
            return {"pid": os.getpid(), "calls": self.calls}

    serve.run(Fragile.bind())
    first = _json(serve_port, "GET", "/ok")[2]
    for _ in range(3):
        status, _, body = http(serve_port, "GET", "/boom")
        assert (status, body) == (500, b"Internal Server Error")
    after = _json(serve_port, "GET", "/ok")
    assert after[0] == 200
    assert after[2] == {"pid": first["pid"], "calls": 5}


@needs_fastapi
def test_fastapi_sync_routes_reuse_the_replicas_worker_threads(serve_port):
    # A sync endpoint runs in anyio's thread pool, whose threads live as
    # long as the loop's root task: one must exist (else a thread per call).
    import threading

    from fastapi import FastAPI

    from ray_lite import serve

    app = FastAPI()

    @serve.deployment(num_replicas=1)
    @serve.ingress(app)
    class Threads:
        @app.get("/tid")
        def tid(self):
            return {"tid": threading.get_native_id(), "threads": threading.active_count()}

    serve.run(Threads.bind())
    seen = [_json(serve_port, "GET", "/tid")[2] for _ in range(20)]
    assert len({s["tid"] for s in seen}) <= 2, seen     # one idle worker, reused
    assert max(s["threads"] for s in seen) <= 4, seen


@needs_fastapi
def test_fastapi_methods_are_callable_through_a_handle(serve_runtime):
    from fastapi import FastAPI

    from ray_lite import serve

    app = FastAPI()

    @serve.deployment
    @serve.ingress(app)
    class Api:
        @app.get("/double/{x}")
        def double(self, x: int):
            return {"double": self.twice(x)}

        def twice(self, x):
            return 2 * x

    handle = serve.run(Api.bind(), route_prefix=None)
    assert handle.twice.remote(21).result(timeout_s=30) == 42
    assert handle.double.remote(x=4).result(timeout_s=30) == {"double": 8}


@needs_fastapi
def test_fastapi_included_routers_and_their_class_views(serve_port):
    # include_router: FastAPI 0.137+ keeps a lock in the node it adds (serve.run
    # failed: "cannot pickle '_thread.lock'"), and nests the router's routes
    # there (a class view's method on it got no self: 422).
    from fastapi import APIRouter, FastAPI

    from ray_lite import serve

    app = FastAPI()
    plain = APIRouter(prefix="/plain")
    views = APIRouter()

    @plain.get("/hi")
    def hi():
        return "hi"

    class Base:
        @views.get("/name")
        def name(self, who: str = "world"):
            return {"name": f"{self.greeting} {who}"}

    app.include_router(plain)
    app.include_router(views, prefix="/views")

    @serve.deployment
    @serve.ingress(app)
    class Api(Base):
        def __init__(self):
            self.greeting = "hello"

        @app.get("/direct")
        def direct(self):
            return self.greeting

    serve.run(Api.bind())
    assert _json(serve_port, "GET", "/plain/hi")[::2] == (200, "hi")
    assert _json(serve_port, "GET", "/views/name?who=serve")[::2] == (
        200, {"name": "hello serve"})
    assert _json(serve_port, "GET", "/direct")[::2] == (200, "hello")
    import threading

    import ray_lite
    with pytest.raises(TypeError):      # a lock stays unserialisable elsewhere
        ray_lite.put(threading.Lock())


def test_two_ingress_deployments_in_one_application_are_refused(serve_runtime):
    from ray_lite import serve
    from ray_lite.serve.exceptions import RayServeException

    async def app(scope, receive, send):
        pass

    @serve.deployment
    @serve.ingress(app)
    class Inner:
        pass

    @serve.deployment
    @serve.ingress(app)
    class Outer:
        def __init__(self, inner):
            self.inner = inner
    with pytest.raises(RayServeException, match="multiple FastAPI deployments"):
        serve.run(Outer.bind(Inner.bind()), name="two", route_prefix=None)


def test_ingress_of_an_app_alone(serve_port):
    # As Ray's serve.ingress(app)(): a deployment that is only the app (an
    # app object or a builder), taking whatever bind() is given.
    from ray_lite import serve

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"alone"})

    for made in (app, lambda: app):
        deployment = serve.deployment(serve.ingress(made)())
        assert deployment.name == "ASGIIngressDeployment"
        serve.run(deployment.bind("ignored", option=1))
        status, _, body = http(serve_port, "GET", "/")
        assert (status, body) == (200, b"alone")


def test_ingress_refuses_a_function_and_a_class_with_call():
    from ray_lite import serve

    async def app(scope, receive, send):
        pass

    with pytest.raises(ValueError, match="must be used with a class"):
        serve.ingress(app)(lambda: None)

    class WithCall:
        def __call__(self):
            pass

    class Inherits(WithCall):
        pass
    for cls in (WithCall, Inherits):
        with pytest.raises(ValueError, match="Classes passed to @serve.ingress may not have "
                                             "__call__ method"):
            serve.ingress(app)(cls)


# -------------------------------------------------- Starlette and bare ASGI
def test_starlette_app_with_lifespan_startup_and_shutdown(serve_port, tmp_path):
    import contextlib

    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, PlainTextResponse
    from starlette.routing import Route

    from ray_lite import serve

    marker = tmp_path / "shutdown"

    @contextlib.asynccontextmanager
    async def lifespan(app):
        app.state.started = True
        yield
        with open(marker, "a") as f:
            f.write(f"{os.getpid()}\n")

    async def hello(request):
        return JSONResponse({"started": request.app.state.started,
                             "root_path": request.scope["root_path"],
                             "path": request.url.path})

    async def text(request):
        return PlainTextResponse("plain")

    app = Starlette(routes=[Route("/hello", hello), Route("/text", text)], lifespan=lifespan)

    @serve.deployment(num_replicas=2, graceful_shutdown_timeout_s=5)
    @serve.ingress(app)
    class Web:
        pass

    serve.run(Web.bind(), name="web", route_prefix="/web")
    assert _json(serve_port, "GET", "/web/hello")[::2] == (
        200, {"started": True, "root_path": "/web", "path": "/web/hello"})
    assert http(serve_port, "GET", "/web/text")[::2] == (200, b"plain")
    serve.delete("web")
    # Each replica ran its shutdown handler before it stopped.
    assert len(marker.read_text().split()) == 2


def test_bare_asgi_callable_gets_the_scope_and_body(serve_port):
    from ray_lite import serve

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return              # no lifespan support: it returns
        msg = await receive()
        seen = {k: scope[k] for k in ("method", "path", "root_path", "http_version")}
        seen["query"] = scope["query_string"].decode()
        seen["header"] = dict(scope["headers"]).get(b"x-test", b"").decode()
        seen["client"] = scope["client"][0]
        seen["body"] = msg["body"].decode()
        out = json.dumps(seen).encode()
        await send({"type": "http.response.start", "status": 201,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", b"%d" % len(out))]})
        await send({"type": "http.response.body", "body": out})

    @serve.deployment
    @serve.ingress(app)
    class Raw:
        pass

    serve.run(Raw.bind(), route_prefix="/raw")
    status, _, body = _json(serve_port, "POST", "/raw/a/b?x=1&y=2", body=b"payload",
                            headers={"x-test": "yes"})
    assert status == 201
    assert body == {"method": "POST", "path": "/raw/a/b", "root_path": "/raw",
                    "http_version": "1.1", "query": "x=1&y=2", "header": "yes",
                    "client": "127.0.0.1", "body": "payload"}


def test_bare_asgi_app_streaming_in_parts_and_an_app_builder(serve_port):
    from ray_lite import serve

    def build():
        # Called in each replica: the app need not be picklable.
        async def app(scope, receive, send):
            if scope["type"] != "http":
                return
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/plain"),
                                    (b"content-length", b"15")]})
            for part in (b"first,", b"second,", b"end"):
                await send({"type": "http.response.body", "body": part, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        return app

    @serve.deployment
    @serve.ingress(build)
    class Parts:
        pass

    serve.run(Parts.bind())
    status, hdrs, body = http(serve_port, "GET", "/")
    assert (status, body) == (200, b"first,second,end")
    # Sent in parts, it goes out chunked: the app's content-length is dropped.
    assert hdrs.get("transfer-encoding") == "chunked" and "content-length" not in hdrs


def test_bare_asgi_app_that_fails_midway_gives_500_then_serves(serve_port):
    from ray_lite import serve

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        if scope["path"] == "/fail-before":
            raise RuntimeError("before any answer")
        if scope["path"] == "/no-answer":
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"fine"})

    @serve.deployment
    @serve.ingress(app)
    class Raw:
        pass

    serve.run(Raw.bind())
    assert http(serve_port, "GET", "/fail-before")[::2] == (500, b"Internal Server Error")
    assert http(serve_port, "GET", "/no-answer")[0] == 500
    assert http(serve_port, "GET", "/ok")[::2] == (200, b"fine")


def test_lifespan_startup_failure_fails_serve_run_with_the_apps_error(serve_runtime):
    import contextlib

    from starlette.applications import Starlette

    from ray_lite import serve

    @contextlib.asynccontextmanager
    async def lifespan(app):
        raise RuntimeError("the model file is missing")
        yield

    app = Starlette(lifespan=lifespan)

    @serve.deployment
    @serve.ingress(app)
    class Broken:
        pass

    with pytest.raises(Exception, match="the model file is missing"):
        serve.run(Broken.bind(), route_prefix=None)


CLI_APP = textwrap.dedent("""
    import contextlib
    from starlette.applications import Starlette
    from ray_lite import serve

    @contextlib.asynccontextmanager
    async def lifespan(app):
        raise RuntimeError("cannot open the weights")
        yield

    @serve.deployment
    @serve.ingress(Starlette(lifespan=lifespan))
    class Broken:
        pass

    app = Broken.bind()
""")


def test_lifespan_startup_failure_fails_serve_run_cli(tmp_path):
    import ray_lite

    (tmp_path / "broken_lifespan_app.py").write_text(CLI_APP)
    root = os.path.dirname(os.path.dirname(os.path.abspath(ray_lite.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; from ray_lite.scripts import main; sys.exit(main())",
         "serve", "run", "broken_lifespan_app:app", "--app-dir", str(tmp_path), "--port", "0",
         "--proxies", "1", "--num-cpus", "1"],
        cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "cannot open the weights" in proc.stdout + proc.stderr


# ------------------------------------------------------- replicas and handles
def test_async_init_runs_before_the_replica_serves(serve_port):
    import asyncio

    from starlette.requests import Request

    from ray_lite import serve

    @serve.deployment(user_config={"suffix": "!"})
    class Slow:
        async def __init__(self, word):
            await asyncio.sleep(0)
            self.word = word

        def reconfigure(self, cfg):
            # After __init__ (it reads what __init__ set).
            self.word += cfg["suffix"]

        async def __call__(self, request: Request):
            return self.word

    handle = serve.run(Slow.bind("ready"))
    assert handle.remote(None).result(timeout_s=30) == "ready!"
    assert http(serve_port, "GET", "/")[::2] == (200, b"ready!")


def test_async_init_failure_fails_serve_run(serve_runtime):
    from ray_lite import serve

    @serve.deployment
    class Fails:
        async def __init__(self):
            raise ValueError("async init failed")

    with pytest.raises(Exception, match="async init failed"):
        serve.run(Fails.bind(), route_prefix=None)


def test_handle_errors_as_ray_gives_them(serve_runtime):
    from ray_lite import serve
    from ray_lite.serve.exceptions import RayServeException

    @serve.deployment
    class Gen:
        def numbers(self):
            yield 1

        async def async_numbers(self):
            yield 1

        def plain(self):
            return 1

        async def returns_a_generator(self):
            return self.numbers()

    handle = serve.run(Gen.bind(), route_prefix=None)
    for method in ("numbers", "async_numbers", "returns_a_generator"):
        with pytest.raises(TypeError, match=rf"Method '{method}' returned a generator\. You "
                                            r"must use `handle\.options\(stream=True\)`"):
            getattr(handle, method).remote().result(timeout_s=30)
    assert list(handle.options(stream=True).numbers.remote()) == [1]
    with pytest.raises(RayServeException) as info:
        handle.missing.remote().result(timeout_s=30)
    assert "Tried to call a method 'missing' that does not exist" in str(info.value)
    assert "['async_numbers', 'numbers', 'plain', 'returns_a_generator']" in str(info.value)
    assert handle.plain.remote().result(timeout_s=30) == 1
    with pytest.raises(TypeError, match=r"Called method 'plain' with "
                                        r"`handle\.options\(stream=True\)` but it did not "
                                        r"return a generator\."):
        list(handle.options(stream=True).plain.remote())


def test_handle_getters_return_the_same_handle(serve_runtime):
    from ray_lite import serve

    @serve.deployment
    class A:
        def __call__(self):
            return "a"

    serve.run(A.bind(), name="one", route_prefix=None)
    h = serve.get_app_handle("one")
    assert serve.get_app_handle("one") is h
    d = serve.get_deployment_handle("A", "one")
    assert serve.get_deployment_handle("A", "one") is d
    assert h.remote().result(timeout_s=30) == "a"
