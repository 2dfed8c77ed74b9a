"""``@serve.ingress(app)``: a replica that serves HTTP through an ASGI app.

The proxies stay protocol-only: they pass the ASGI scope's parts (method,
path, root_path = the route prefix, query string, headers, client) and the
body over the ring, as for any deployment; a replica whose class carries an
ASGI app runs the app on them and sends back the status, the headers and the
body, whole when the app sends it in one message, else as a stream (the
``http.response.body`` messages that queued up while the proxy was busy go
out joined: see _body.py).  The app's lifespan runs in each
replica: startup before the replica is ready (a failure fails the
deployment with the app's error), shutdown when it drains (when it stops
with a ``graceful_shutdown_timeout_s`` above 0, the default).

FastAPI class-based views: a route declared in the class body takes ``self``;
``ingress`` turns that parameter into a dependency on the replica's instance
of the class, so FastAPI neither reads it from the query nor documents it.
"""
import asyncio
import collections
import copyreg
import io
import inspect
import sys
import threading
import traceback
from time import monotonic as _monotonic

import cloudpickle

from .._private.objects.shipping import shipped_form
from . import context
from ._body import END, FAILED, BodyStream
from ._asgi_scope import Receive, check_headers, header_block, http_scope, stored_if_large
from ._request_calls import calls_of_this_request, cancel_calls

_ASGI_ATTR = "__serve_asgi_app__"


def ingress(app):
    """``@serve.ingress(app)`` on a deployment's class: its replicas serve HTTP
    through ``app`` (FastAPI, Starlette or any ASGI callable; or a function
    of no arguments that builds the app, called in each replica)."""
    if not callable(app):
        raise TypeError(f"serve.ingress expects an ASGI app or a function building one, "
                        f"got {type(app).__name__}")

    def decorate(cls=None):
        if cls is None:
            # ``serve.ingress(app)()``: a deployment that is only the app.
            cls = type("ASGIIngressDeployment", (_AppOnly,), {})
        if not inspect.isclass(cls):
            raise ValueError("@serve.ingress must be used with a class.")
        if any("__call__" in vars(k) for k in cls.__mro__ if k is not object):
            raise ValueError("Classes passed to @serve.ingress may not have __call__ method.")
        if _is_fastapi(app):
            _bind_class_routes(app, cls)
        _make_state_picklable()
        setattr(cls, _ASGI_ATTR, app)
        return cls
    return decorate


class _AppOnly:
    """The class of ``serve.ingress(app)()``: takes whatever ``.bind()`` gives."""

    def __init__(self, *args, **kwargs):
        pass


def asgi_app_of_class(cls):
    """The ASGI app ``@serve.ingress`` gave a deployment's class, or None."""
    return getattr(cls, _ASGI_ATTR, None) if inspect.isclass(cls) else None


def asgi_app_of(obj):
    """The ASGI app of a deployment's instance, or None (a plain deployment)."""
    return getattr(type(obj), _ASGI_ATTR, None) if obj is not None else None


def _make_state_picklable():
    """The app reaches each replica pickled with the class.  Starlette's
    ``app.state`` cannot be unpickled as it is (its __getattr__ recurses
    before its dict is set): it is pickled as the dict it holds."""
    datastructures = sys.modules.get("starlette.datastructures")
    if datastructures is not None:
        copyreg.pickle(datastructures.State, _reduce_state)


def pickle_deployment_class(cls):
    """``cls`` pickled for its replicas.  FastAPI (0.137 and later) keeps a
    lock in each router ``include_router`` adds: in an ingress class (and
    only there: a lock stays unserialisable elsewhere, and ``serve.run``
    refuses a plain deployment that captures one) a lock arrives as a new
    one, unlocked, as Ray Serve pickles it.  With its file name, as a task's
    function (``shipping.unship`` restores it: tracebacks and log records
    of a class defined in ``__main__`` name its file, not ``<dynamic-code>``)."""
    buf = io.BytesIO()
    pickler = _DeploymentClassPickler if asgi_app_of_class(cls) is not None else \
        cloudpickle.CloudPickler
    pickler(buf).dump(shipped_form(cls))
    return buf.getvalue()


class _DeploymentClassPickler(cloudpickle.CloudPickler):
    # (A class attribute: the pickler reads its table when it is made.)
    dispatch_table = collections.ChainMap(
        {type(threading.Lock()): lambda lock: (threading.Lock, ()),
         type(threading.RLock()): lambda lock: (threading.RLock, ())},
        cloudpickle.CloudPickler.dispatch_table)


def _reduce_state(state):
    return type(state), (dict(state._state),)


# ------------------------------------------------------- FastAPI class views
def _is_fastapi(app):
    fastapi = sys.modules.get("fastapi")
    return fastapi is not None and isinstance(app, (fastapi.FastAPI, fastapi.APIRouter))


def _servable_instance():
    """A FastAPI dependency: this replica's instance of the deployment's class."""
    return context.get_replica_context().servable_object


class _ClassFunctions:
    """The functions defined in ``cls``'s body or its bases': those in their
    namespaces, and those a later ``def`` of the same name replaced there
    (``def f`` for GET, ``def f`` again for POST), known by their qualified
    name, as Ray matches them."""

    def __init__(self, cls):
        self.found = set()
        self.prefixes = set()
        for klass in cls.__mro__:
            if klass is object:
                continue
            self.prefixes.add(klass.__qualname__ + ".")
            for v in vars(klass).values():
                if inspect.isfunction(v):
                    self.found.add(v)

    def __contains__(self, fn):
        if fn in self.found:
            return True
        prefix = getattr(fn, "__qualname__", "").rpartition(".")[0]
        return prefix + "." in self.prefixes


def _bind_class_routes(app, cls):
    from fastapi import APIRouter
    routes = app.routes if isinstance(app, APIRouter) else app.router.routes
    _bind_routes(routes, _ClassFunctions(cls))


def _bind_routes(routes, methods):
    """Give the routes of ``methods`` their ``self`` (this replica's instance),
    also in the routers ``include_router`` added."""
    from fastapi import Depends
    from fastapi.routing import APIRoute, APIWebSocketRoute

    for i, route in enumerate(routes):
        included = getattr(route, "original_router", None)
        if included is not None:
            # FastAPI 0.137 and later keep an included router as one node,
            # its routes looked up at request time.
            _bind_routes(included.routes, methods)
            continue
        if not isinstance(route, (APIRoute, APIWebSocketRoute)) or route.endpoint not in methods:
            continue
        fn = route.endpoint
        sig = inspect.signature(fn)
        params = list(sig.parameters.values())
        if not params:
            continue
        bound = getattr(params[0].default, "dependency", None) is _servable_instance
        if not bound:
            if params[0].default is not inspect.Parameter.empty:
                continue     # no self
            # FastAPI passes every parameter by keyword: keyword-only lets the
            # ones without a default follow self's.
            kw = inspect.Parameter.KEYWORD_ONLY
            params = [params[0].replace(default=Depends(_servable_instance), kind=kw)] + [
                p.replace(kind=kw) if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                else p for p in params[1:]]
            fn.__signature__ = sig.replace(parameters=params)
        # The route's parameters were read from the old signature when it was
        # declared: declare it again (each route of the function: one may
        # serve two paths), with everything else as it was.
        init_params = [p for p in inspect.signature(type(route).__init__).parameters
                       if p not in ("self", "path", "endpoint")]
        kwargs = {p: getattr(route, p) for p in init_params if hasattr(route, p)}
        routes[i] = type(route)(route.path, fn, **kwargs)


# ----------------------------------------------------------- the replica side
class AsgiIngress:
    """The HTTP side of one replica whose class has an ASGI app."""

    def __init__(self, replica, app):
        if not _is_asgi_callable(app):
            app = app()          # a builder: the app is made in the replica
        self._replica = replica
        self._app = app
        self._state = {}
        self._lifespan_inbox = None
        self._lifespan_task = None
        self._lifespan_end = None

    # ------------------------------------------------------------ lifespan
    async def startup(self):
        """Run the app's lifespan startup; raise with the app's error if it fails.
        An app that returns without answering has no lifespan: nothing to do."""
        loop = asyncio.get_running_loop()
        inbox = self._lifespan_inbox = asyncio.Queue()
        started = loop.create_future()
        end = self._lifespan_end = loop.create_future()
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"},
                 "state": self._state}

        async def send(msg):
            t = msg["type"]
            if t == "lifespan.startup.complete":
                _settle(started, None)
            elif t == "lifespan.startup.failed":
                _settle(started, RuntimeError(
                    f"ASGI lifespan startup failed: {msg.get('message', '')}"))
            elif t in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
                _settle(end, msg.get("message") if t.endswith("failed") else None)

        async def run():
            try:
                await self._app(scope, inbox.get, send)
            except BaseException as exc:   # noqa: BLE001 - reported through the futures
                if not started.done():
                    _settle(started, RuntimeError(
                        "ASGI lifespan startup failed:\n" + "".join(
                            traceback.format_exception(type(exc), exc, exc.__traceback__))))
            finally:
                _settle(started, None)
                _settle(end, None)

        inbox.put_nowait({"type": "lifespan.startup"})
        self._lifespan_task = loop.create_task(run())
        await started

    async def shutdown(self, timeout_s):
        """Run the app's lifespan shutdown (once; bounded by ``timeout_s``)."""
        end, self._lifespan_end = self._lifespan_end, None
        if end is None or end.done():
            return
        self._lifespan_inbox.put_nowait({"type": "lifespan.shutdown"})
        try:
            failure = await asyncio.wait_for(asyncio.shield(end), timeout_s)
        except asyncio.TimeoutError:
            self._lifespan_task.cancel()
            return
        if failure:
            print(f"Replica {self._replica._deployment}: ASGI lifespan shutdown failed: "
                  f"{failure}", file=sys.stderr, flush=True)

    # ---------------------------------------------------------------- HTTP
    async def handle_http(self, method, path, query, headers, body, client, root_path,
                          http_version, server, lone=False):
        """The replica's ``handle_http`` for an ASGI app: the same answer,
        ``(status, header block, body, stream token, seconds it took)``; a
        streamed answer's body is what the app had sent with its head (a
        chunk, a list of chunks, or None), the rest comes by the token
        (``lone``: unused, an ASGI app's replica does not spin)."""
        rep = self._replica
        await rep.admit()
        t0 = _monotonic()
        try:
            scope = http_scope(method, path, query, headers, client, root_path, http_version,
                               server)
            scope["state"] = self._state.copy()
            reply = _Reply()
            # The app's task (made in a copy of this context) notes the handle
            # calls it makes here: they are cancelled with the request.
            calls = calls_of_this_request(scope=scope)
            context.http_scope.set(scope)
            task = asyncio.get_running_loop().create_task(
                self._run(reply, scope, Receive(body), f"{method} {path}"))
            try:
                await reply.head
            except asyncio.CancelledError:
                task.cancel()        # the proxy gave up (the client left, its timeout)
                cancel_calls(calls)
                raise
            if reply.stream is None:
                body = b"".join(reply.body)
                return stored_if_large((reply.status, header_block(reply.headers, len(body)),
                                        body, 0, _monotonic() - t0))
            stream = reply.stream
            stream.task = task
            stream.calls = calls
            # The chunks already sent go with the head: the first event of a
            # stream (a token's) reaches the client without the proxy's
            # round trip for the stream.
            return (reply.status, header_block(reply.headers, None), stream.take_queued(),
                    rep._new_stream(stream), _monotonic() - t0)
        finally:
            rep._slots.release()
            rep._leave()

    async def _run(self, reply, scope, receive, what):
        try:
            await self._app(scope, receive, reply.send)
        except asyncio.CancelledError:
            raise
        except Exception:   # noqa: BLE001 - the client gets a 500, the replica goes on
            if reply.stream is not None and reply.stream.closed:
                return      # the client left: what send raised (ASGI 2.4) ends the app
            rep = self._replica
            print(f"Replica {rep._deployment}#{rep._id}: {what} failed:\n"
                  f"{traceback.format_exc()}", file=sys.stderr, end="", flush=True)
            reply.failed()
        finally:
            reply.finish()


def _is_asgi_callable(app):
    """An ASGI app takes (scope, receive, send); a builder takes nothing."""
    try:
        sig = inspect.signature(app)
    except (TypeError, ValueError):
        return True
    return len(sig.parameters) != 0


def _settle(fut, value):
    if not fut.done():
        if isinstance(value, BaseException):
            fut.set_exception(value)
        else:
            fut.set_result(value)


_INTERNAL_ERROR = b"Internal Server Error"


class _Reply:
    """What the app sends for one request: whole, or the head and a stream."""

    __slots__ = ("head", "status", "headers", "body", "stream")

    def __init__(self):
        self.head = asyncio.get_running_loop().create_future()
        self.status = None
        self.headers = ()
        self.body = []
        self.stream = None       # a BodyStream once the app sends in parts

    async def send(self, msg):
        t = msg["type"]
        if t == "http.response.start":
            headers = list(msg.get("headers") or ())
            check_headers(headers)      # the app hears of a bad one, as from uvicorn
            self.status = msg["status"]
            self.headers = headers
        elif t == "http.response.body":
            if self.status is None:
                raise RuntimeError("ASGI app sent a body before http.response.start")
            chunk = msg.get("body", b"")
            more = msg.get("more_body", False)
            stream = self.stream
            if stream is not None:
                if chunk:
                    await stream.put(bytes(chunk))
                if not more:
                    stream.end(END)
                return
            if more:
                # The app streams: answer with the head now, the body follows.
                stream = self.stream = BodyStream()
                if chunk or self.body:
                    await stream.put(b"".join(self.body) + bytes(chunk))
                self.body = []
                _settle(self.head, None)
                return
            self.body.append(chunk)
            _settle(self.head, None)

    def failed(self):
        if self.stream is not None:
            self.stream.end(FAILED)
        elif not self.head.done():
            # No complete answer went out yet: a 500 instead.
            self.status = 500
            self.headers = [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", b"%d" % len(_INTERNAL_ERROR))]
            self.body = [_INTERNAL_ERROR]

    def finish(self):
        if not self.head.done() and self.stream is None and self.status is None:
            self.failed()        # the app returned without answering
        if self.stream is not None:
            self.stream.end(END)
        _settle(self.head, None)
