"""The replica: an async actor hosting one instance of the user's class or function.

Calls arrive from handles (``handle_request``/``handle_request_streaming``)
and from the HTTP proxies (``handle_http``, then ``http_stream`` for a
streamed body).  HTTP requests arrive as plain str/bytes/int arguments that
the codec carries as msgpack: nothing from the network is ever unpickled.
"""
import asyncio
import contextvars
import gc
import inspect
import logging
import os
import sys
import traceback
import types
from time import monotonic as _monotonic

from ray_lite._config import SERVE_REPLICA_NICE, SERVE_REPLICA_SPIN_S, SERVE_SYNC_OFF_LOOP_S
from ray_lite._private.objects.shipping import unship

from . import _core, _defaults, _metrics, _websocket, context
from ._asgi_scope import Receive, StoredReply, header_block, http_scope, stored_if_large
from ._request_calls import calls_of_this_request, cancel_calls, cancel_requested
from ._routing import ReplicaCell
from ._body import pumped
from ._json import json_body
from .gang import GangContext
from ._logging import configure_replica_logger
from .multiplex import _model_id
from ._core import ObjectRef
from ._http import JSON as _JSON
from ._http import OCTET as _OCTET
from ._http import TEXT as _TEXT
from ._http import sized as _sized
from ._spin import SpinPolicy, cpu_free

logger = logging.getLogger("ray_lite.serve")

# Replicas may run below the proxies' priority (RAY_LITE_SERVE_REPLICA_NICE):
# a proxy that wakes a replica is then not preempted by it at once.  That
# saved ~20 % of the CPU per HTTP request while requests were spread over
# all 48 replicas of the benchmark; since a proxy packs a fast route's
# requests onto few replicas, it costs instead: those few wait behind any
# other program at nice 0, and behind the proxies (docs/performance.md,
# "Replicas' priority": wrk -c4/-c8 +25-30 % requests/s at nice 0, -c100 the
# same or better, quiet and beside a CPU hog).  So the default is 0: the
# priority the runtime's other processes have.
_NICE = SERVE_REPLICA_NICE

# A replica whose HTTP requests come from a lone client (the proxy says so:
# it had no other request in flight and one connection) in quick succession
# (most arriving within this long of the previous one's answer) spins,
# bounded, for the next one after answering, instead of sleeping in epoll:
# on a VM, waking a sleeping process and its idle CPU costs tens of
# microseconds on each side, which at low load was half of a request's
# latency.  It spins on the thread that waits and yields the CPU every few
# microseconds.  It does not spin when its requests come further apart,
# when its spins get preempted (a busy CPU, see _spin.SpinPolicy), when it
# serves several clients, or while more threads run than the machine has
# CPUs (``_spin.cpu_free``).  In those cases the proxies and the other
# replicas need the CPU that the spin would take, and the next request comes
# anyway: packed replicas that spun after every request cost 20-70 % of the
# requests/s at wrk -c4 to -c100 (docs/performance.md).  The budget
# (1 ms) covers a lone client's whole cycle between two requests (ab -c 1
# on a VM: 200-600 us), since the gap it must bridge is the client's, not
# ours.  RAY_LITE_SERVE_REPLICA_SPIN_US=0 turns it off.
_SPIN_S = SERVE_REPLICA_SPIN_S

_COROUTINE = types.CoroutineType
_set_http_scope = context.http_scope.set     # per request: a bound method, looked up once


def _http_entry(fn):
    """``fn`` as called with an HTTP request: a deployment (a function, or a
    class's ``__call__``) that takes no argument is called without the
    request, as Ray Serve does."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):     # no signature to read (a builtin): pass it
        return fn
    if any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
           for p in params):
        return fn

    def without_request(request):
        return fn()
    return without_request


_Request = None


def _load_request():
    # Imported on the first HTTP request: a replica serving handles only
    # never pays for Starlette.
    global _Request
    from starlette.requests import Request
    _Request = Request
    return Request


async def _resolve_args(args, kwargs):
    # Responses passed into a call travel as refs; wait for them here, without
    # blocking the replica's loop.
    if any(type(a) is ObjectRef for a in args):
        args = [await a if type(a) is ObjectRef else a for a in args]
    if kwargs and any(type(v) is ObjectRef for v in kwargs.values()):
        kwargs = {k: (await v if type(v) is ObjectRef else v) for k, v in kwargs.items()}
    return args, kwargs


class ServeReplica:
    # Replaced on the instance (the ASGI app's entry, multiplexing, metrics
    # wrap them): calls take the instance's (see _private/method_lookup.py).
    __ray_lite_instance_methods__ = ("handle_http", "handle_request")

    def __init__(self, controller, app_name, deployment_name, replica_id, cls_blob, init_args,
                 init_kwargs, config, rank=0, world_size=1):
        context.set_controller(controller)
        self._controller = controller
        self._direct = None     # a _direct.DirectServer: this replica takes HTTP itself
        self._draining = False  # drain() began: it takes no more work
        self._listen_starting = False
        self._rank = rank
        self._app = app_name
        self._deployment = deployment_name
        self._id = replica_id
        self._config = config
        self._inflight = 0
        self._custom_stats_off = False      # see autoscaling_stats
        self._idle = None
        self._idle_since = 0.0      # when _inflight last fell to 0 (see _SPIN_S)
        self._spin = SpinPolicy(_SPIN_S)    # learns from the idle time before each request
        self._streams = {}
        self._stream_seq = 0
        self._open_streams = 0      # streamed answers begun and not ended (HTTP and handles)
        self._taken_directly = 0    # requests of its own listener in flight (direct ingress)
        self._cell = None           # where callers read those two (replica_cell)
        self._destructed = False    # __del__ ran (see _call_destructor)
        self._slow_sync = set()     # synchronous handlers run off the loop (_off_loop)
        self._user_thread = None    # where they run: a ThreadPoolExecutor of one thread
        self._port_host = None
        self._slots = _core.Slots(config.get("max_ongoing_requests",
                                              _defaults.MAX_ONGOING_REQUESTS))
        self._http_fn = None
        self._niced = False
        # replica_id is "<deployment>#<n>"; Ray's unique_id is the part after it.
        ctx = context.ReplicaContext(
            context.ReplicaID(replica_id.rpartition("#")[2],
                              context.DeploymentID(deployment_name, app_name)),
            rank=context.ReplicaRank(rank, 0, rank), world_size=world_size,
            code_version=config.get("code_version"),
            gang_context=GangContext(**config["gang_context"])
            if config.get("gang_context") else None)
        context.set_replica_context(ctx)
        # Before the user's constructor, whose logs take the format too.
        configure_replica_logger(app_name, deployment_name, ctx.replica_id.unique_id,
                                 config.get("logging_config"))
        target = unship(cls_blob)
        self._is_function = not inspect.isclass(target)
        self._init_task = None
        self._asgi = None
        async_init = None
        if self._is_function:
            self._obj = None
            self._fn = target
        else:
            from .handle import DeploymentHandle  # noqa: F401 (arguments may hold handles)
            if inspect.iscoroutinefunction(target.__init__):
                # async def __init__ (as Ray allows): the instance is made now
                # and initialised before the replica reports ready.
                self._obj = target.__new__(target)
                async_init = self._obj.__init__(*init_args, **init_kwargs)
            else:
                self._obj = target(*init_args, **init_kwargs)
            self._fn = None
            from ._asgi import AsgiIngress, asgi_app_of
            app = asgi_app_of(self._obj)
            if app is not None:
                # @serve.ingress: HTTP goes to the app (the proxies call
                # handle_http by name; this replica's is the app's).
                self._asgi = AsgiIngress(self, app)
                self.handle_http = self._asgi.handle_http
            from . import multiplex
            if multiplex.is_multiplexed(target):
                self.handle_http = multiplex.http_with_model_id(self.handle_http)
        ctx.servable_object = self._obj
        self._rank_in_reconfigure = self._wants_rank()
        uc = config.get("user_config")
        if async_init is not None or self._asgi is not None or uc is not None or \
                self._rank_in_reconfigure:
            self._init_task = asyncio.ensure_future(self._start(async_init, uc))
        self._metrics = _metrics.observe_replica(self)   # None unless Serve exports metrics

    # ------------------------------------------------------------ control
    async def ready(self):
        if self._init_task is not None:
            t, self._init_task = self._init_task, None
            await t
        if not self._niced:
            # As Ray: a replica serves once it has passed a first health
            # check; its failure is the replica's failure to start.
            timeout = self._config.get("health_check_timeout_s") or \
                _defaults.HEALTH_CHECK_TIMEOUT_S
            try:
                # Bounded as every later check is: a check that never answers
                # is a failed start (retried by the controller), not a hang.
                await asyncio.wait_for(self.check_health(), timeout)
            except asyncio.TimeoutError:
                raise RuntimeError(f"replica {self._id} failed its initial health check: "
                                   f"no answer within {timeout} s") from None
            except Exception as exc:   # noqa: BLE001 - the user's check, whatever it raised
                raise RuntimeError(f"replica {self._id} failed its initial health check: "
                                   f"{type(exc).__name__}: {exc}") from exc
            # Not before: starting many replicas at once is not slowed.
            self._niced = True
            if _NICE > 0:
                try:
                    os.nice(_NICE)
                except OSError:
                    pass
            await self._start_direct_ingress()
            if _defaults.freeze_gc_on_startup():
                # As Ray Serve: what the start-up made (the user's instance,
                # the app, the modules it imported) lives as long as the
                # replica, yet every full collection would walk it again:
                # 10-50 ms with the interpreter stopped, a pause in every
                # request and stream then in flight.  Collected first, so no
                # start-up garbage is kept for good.
                gc.collect()
                gc.freeze()
        return os.getpid()

    async def _start_direct_ingress(self):
        """In direct-ingress mode, an ingress replica listens on its
        application's port itself (see _direct), if the controller says so:
        as many listen as the machine has cores, the others stand by."""
        options = await self._controller.direct_ingress.remote(self._app, self._deployment,
                                                               self._id)
        if options is not None:
            await self._listen(options)

    async def listen_direct(self, options):
        """The controller's call to a replica standing by: a listener left,
        take its place (True; False if this replica is stopping)."""
        if self._direct is not None:
            return True
        if self._draining:
            return False
        await self._listen(options)
        return True

    async def _listen(self, options):
        if self._direct is not None or self._listen_starting:
            return
        from ._direct import DirectServer
        self._listen_starting = True
        try:
            server = DirectServer(self, self._controller, self._rank, options)
            try:
                await server.start()
            except BaseException:
                server.sock.close()
                raise
        finally:
            self._listen_starting = False
        self._direct = server
        if self._draining:      # drain() began while it started: it found no server to stop
            await server.stop(0.0)

    async def _start(self, async_init, user_config):
        if async_init is not None:
            await async_init
        if self._asgi is not None:
            await self._asgi.startup()
        if user_config is not None or self._rank_in_reconfigure:
            await self._reconfigure(user_config)

    def _wants_rank(self):
        """Whether the user's ``reconfigure`` takes ``rank`` (Ray then calls it
        at start with the replica's ``ReplicaRank``, user_config or not)."""
        fn = getattr(self._obj, "reconfigure", None)
        try:
            return fn is not None and "rank" in inspect.signature(fn).parameters
        except (TypeError, ValueError):
            return False

    async def _reconfigure(self, user_config):
        fn = getattr(self._obj, "reconfigure", None)
        if fn is None:
            raise AttributeError(f"user_config was given but {self._deployment} has no "
                                 f"reconfigure method")
        if self._rank_in_reconfigure:
            r = fn(user_config, rank=context.get_replica_context().rank)
        else:
            r = fn(user_config)
        if inspect.isawaitable(r):
            await r

    async def reconfigure(self, user_config):
        self._config["user_config"] = user_config
        await self._reconfigure(user_config)

    async def set_max_ongoing_requests(self, n):
        """A lightweight update: the limit changes, the replica stays."""
        self._config["max_ongoing_requests"] = n
        self._slots.resize(n)

    async def check_health(self):
        fn = getattr(self._obj, "check_health", None)
        if fn is not None:
            r = fn()
            if inspect.isawaitable(r):
                await r
        return True

    async def wait_forever(self):
        # The controller keeps one such call outstanding: its failure is how
        # the controller learns, at once, that this replica died.
        await asyncio.get_running_loop().create_future()

    async def num_ongoing(self):
        return self._inflight

    async def replica_cell(self):
        """The shared-memory cell where this replica keeps how many streams
        it has open and how many requests its own listener took, for its
        callers' routing (``_routing.ReplicaCell``)."""
        if self._cell is None:
            self._cell = ReplicaCell()
            self._cell.set_streams(self._open_streams)
            self._cell.set_taken_directly(self._taken_directly)
        return self._cell.name

    def _streams_changed(self, delta):
        self._open_streams += delta
        if self._cell is not None:
            self._cell.set_streams(self._open_streams)

    def taken_directly_changed(self, delta):
        """A request of this replica's own listener began (1) or ended (-1)."""
        self._taken_directly += delta
        if self._cell is not None:
            self._cell.set_taken_directly(self._taken_directly)

    async def autoscaling_stats(self):
        """``num_ongoing`` and what the user's ``record_autoscaling_stats()``
        returns (Ray's custom autoscaling metrics), None when it has none or
        failed; sampled by the controller for a custom policy."""
        fn = getattr(self._obj, "record_autoscaling_stats", None)
        if fn is None or self._custom_stats_off:
            return self._inflight, None
        where = f"record_autoscaling_stats of {self._deployment}"
        try:
            r = fn()
            if inspect.isawaitable(r):
                r = await asyncio.wait_for(r, _defaults.AUTOSCALING_STATS_TIMEOUT_S)
        except asyncio.TimeoutError:
            logger.error("%s timed out after %s s", where, _defaults.AUTOSCALING_STATS_TIMEOUT_S)
            return self._inflight, None
        except Exception as exc:   # noqa: BLE001 - the user's code: this sample has none
            logger.error("%s failed: %r", where, exc)
            return self._inflight, None
        bad = (f"returned {type(r).__name__}" if not isinstance(r, dict) else
               next((f"returned {type(v).__name__} for {k!r}" for k, v in r.items()
                     if not isinstance(k, str) or not isinstance(v, (int, float))), None))
        if bad is not None:
            # As Ray: checked once, then off for good.
            logger.error("%s %s, expected a dict of str to int or float: custom "
                         "autoscaling metrics are off for this replica", where, bad)
            self._custom_stats_off = True
            return self._inflight, None
        return self._inflight, r

    async def drain(self, timeout_s):
        """Wait (up to ``timeout_s``) until no request is in flight, then run
        the ASGI app's lifespan shutdown, if any; True if drained."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        self._draining = True
        if self._direct is not None:
            # No new connection; those open end after their answers.
            await self._direct.stop(timeout_s)
        drained = await self._wait_idle(max(0.0, end - loop.time()))
        if self._asgi is not None:
            # Within the controller's patience (timeout_s and a second).
            await self._asgi.shutdown(max(0.0, end - loop.time()) + 0.5)
        await self._call_destructor(max(0.0, end - loop.time()) + 0.5)
        if self._cell is not None:
            self._cell.unlink()
        return drained

    async def _call_destructor(self, timeout_s):
        """As Ray: the deployment's ``__del__`` (sync or ``async def``) runs
        when its replica stops, once; the process is killed right after.
        The multiplexed models it keeps are dropped first, as in Ray."""
        from .multiplex import unload_models
        unload_models()
        obj = self._obj
        fn = getattr(type(obj), "__del__", None) if obj is not None else None
        if fn is None or self._destructed:
            return
        # Once.  The object stays referenced (here and in the context) until
        # the process is killed, so Python does not call it again.
        self._destructed = True
        try:
            result = fn(obj)
            if inspect.isawaitable(result):
                await asyncio.wait_for(result, timeout_s)
        except Exception:   # noqa: BLE001 - the replica stops anyway; say why it did not clean up
            traceback.print_exc()

    async def _wait_idle(self, timeout_s):
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        while self._inflight > 0:
            if loop.time() >= end:
                return False
            self._idle = loop.create_future()
            try:
                await asyncio.wait_for(self._idle, max(0.0, end - loop.time()))
            except asyncio.TimeoutError:
                return False
        return True

    async def admit(self):
        """Count a request in and wait for one of the replica's slots (a
        cancelled wait counts it out again); ``_slots.release()`` and
        ``_leave()`` when it is done."""
        self._inflight += 1
        try:
            await self._slots.__aenter__()
        except BaseException:
            self._leave()
            raise

    def _leave(self):
        self._inflight -= 1
        if self._inflight == 0 and self._idle is not None and not self._idle.done():
            self._idle.set_result(None)
        if self._direct is not None:
            self._direct.slot_freed()

    def _callable(self, method):
        if self._is_function:
            if method == "__call__":
                return self._fn
            methods = ["__call__"]
        else:
            try:
                return getattr(self._obj, method)
            except AttributeError:
                pass
            methods = [m for m in dir(self._obj)
                       if not m.startswith("__") and callable(getattr(self._obj, m, None))]
        from .exceptions import RayServeException
        raise RayServeException(f"Tried to call a method '{method}' that does not exist. "
                                f"Available methods: {methods}.")

    def http_calls_queue(self):
        """Whether this replica's HTTP handler runs apart from the loop
        (``_off_loop``): its requests run one after another."""
        return self._http_fn is not None and self._http_fn in self._slow_sync

    async def _off_loop(self, key, fn, args, kwargs):
        """Call synchronous handler ``fn`` on the replica's user-code thread.

        A synchronous handler blocks the event loop while it runs: the
        replica's other requests, its health checks and (direct ingress) its
        listener, which would hand new requests to a free replica, all wait.
        So one that took ``RAY_LITE_SERVE_SYNC_OFF_LOOP_US`` or longer runs
        from then on on a thread of its own, as Ray runs user code on a
        thread apart from the replica's loop; a quick one stays on the loop,
        where it costs no hand-off (and goes back there once it runs quick).
        One thread: a replica's synchronous calls still run one at a time."""
        ex = self._user_thread
        if ex is None:
            from concurrent.futures import ThreadPoolExecutor
            ex = self._user_thread = ThreadPoolExecutor(1, thread_name_prefix="serve-user-code")
        ctx = contextvars.copy_context()     # (the request's scope, model id, calls)
        slow = self._slow_sync

        def run():
            t0 = _monotonic()
            try:
                return ctx.run(fn, *args, **kwargs)
            finally:
                if _monotonic() - t0 < SERVE_SYNC_OFF_LOOP_S / 4:
                    slow.discard(key)
        r = await asyncio.get_running_loop().run_in_executor(ex, run)
        if inspect.isawaitable(r) and not inspect.isasyncgen(r):
            r = await r
        return r

    # ----------------------------------------------------------- handles
    async def handle_request(self, method, args, kwargs, meta=None):
        """A handle call; ``meta``: ``(model_id, request_id, route)`` of a call
        with a multiplexed model id or made while serving a request."""
        self._inflight += 1
        calls = calls_of_this_request(meta)
        token = _model_id.set(meta[0]) if meta is not None and meta[0] else None
        try:
            async with self._slots:
                args, kwargs = await _resolve_args(args, kwargs)
                fn = self._callable(method)
                key = getattr(fn, "__func__", fn)
                if key in self._slow_sync:
                    r = await self._off_loop(key, fn, args, kwargs)
                else:
                    t0 = _monotonic()
                    r = fn(*args, **kwargs)
                    if inspect.isawaitable(r):
                        r = await r
                    elif _monotonic() - t0 >= SERVE_SYNC_OFF_LOOP_S:
                        self._slow_sync.add(key)
                if inspect.isgenerator(r) or inspect.isasyncgen(r):
                    raise TypeError(f"Method '{getattr(fn, '__name__', method)}' returned a "
                                    f"generator. You must use `handle.options(stream=True)` "
                                    f"to call generators on a deployment.")
                return r
        except asyncio.CancelledError:
            cancel_calls(calls)     # the handle calls it made go with it
            raise
        finally:
            if token is not None:
                _model_id.reset(token)
            if calls and cancel_requested():
                cancel_calls(calls)     # (it caught its cancellation and returned)
            self._leave()

    async def handle_request_streaming(self, method, args, kwargs, meta=None):
        self._inflight += 1
        self._streams_changed(1)
        calls_of_this_request(meta)     # (this call's own task: nothing to reset)
        if meta is not None and meta[0]:
            _model_id.set(meta[0])
        try:
            async with self._slots:
                args, kwargs = await _resolve_args(args, kwargs)
                r = self._callable(method)(*args, **kwargs)
                if inspect.isawaitable(r) and not inspect.isasyncgen(r):
                    r = await r
                if inspect.isasyncgen(r):
                    async for item in r:
                        yield item
                elif inspect.isgenerator(r):
                    for item in r:
                        yield item
                else:
                    raise TypeError(f"Called method '{method}' with "
                                    f"`handle.options(stream=True)` but it did not return a "
                                    f"generator.")
        finally:
            self._streams_changed(-1)
            self._leave()

    # WebSockets (see _websocket): a streamed call each way.
    handle_websocket = _websocket.serve
    websocket_receive = _websocket.receive

    # -------------------------------------------------------------- HTTP
    async def handle_http(self, method, path, query, headers, body, client, root_path,
                          http_version, server, lone=False):
        """One HTTP request: ``(status, header block, body, stream token, the
        seconds it took once it had a slot)`` (the proxy packs the requests of
        a fast route: _routing.choose_for_http).  ``lone``: the proxy had no
        other request in flight and one client (see ``_SPIN_S``)."""
        # The per-request path is kept flat (one coroutine for the common
        # case): with dozens of replicas sharing two cores, each request's
        # Python work is most of what a replica costs.
        if self._idle_since:
            self._spin.observe(_monotonic() - self._idle_since)
            self._idle_since = 0.0
        slots = self._slots
        if slots.free > 0 and not slots.waiters:
            self._inflight += 1
            slots.free -= 1
        else:
            await self.admit()
        t0 = _monotonic()
        try:
            scope = http_scope(method, path, query, headers, client, root_path, http_version,
                               server)
            receive = Receive(body)
            _set_http_scope(scope)
            calls = calls_of_this_request(scope=scope)
            try:
                fn = self._http_fn
                if fn is None:
                    fn = self._http_fn = _http_entry(self._callable("__call__"))
                request = (_Request or _load_request())(scope, receive)
                if fn in self._slow_sync:
                    r = await self._off_loop(fn, fn, (request,), {})
                else:
                    r = fn(request)
                    if type(r) is _COROUTINE:
                        r = await r
                    elif inspect.isawaitable(r) and not inspect.isasyncgen(r):
                        r = await r
                    elif _monotonic() - t0 >= SERVE_SYNC_OFF_LOOP_S:
                        self._slow_sync.add(fn)
                t = type(r)
                if t is str:
                    b = r.encode()
                    return (200, _TEXT + b"content-length: %d\r\n" % len(b), b, 0,
                            _monotonic() - t0)
                if t is bytes:
                    if len(r) >= _core.LARGE_BYTES:
                        return StoredReply((200, _sized(_OCTET, r), r, 0, _monotonic() - t0))
                    return (200, _OCTET + b"content-length: %d\r\n" % len(r), r, 0,
                            _monotonic() - t0)
                return stored_if_large(await self._to_http(r, scope, receive)
                                       + (_monotonic() - t0,))
            except asyncio.CancelledError:
                cancel_calls(calls)     # the handle calls it made go with it
                raise
            except Exception:
                tb = traceback.format_exc()
                print(f"Replica {self._deployment}#{self._id}: {method} {path} failed:\n"
                      f"{tb}", file=sys.stderr, end="", flush=True)
                msg = b"Internal Server Error"
                return (500, _sized(_TEXT, msg), msg, 0, _monotonic() - t0)
            finally:
                if calls and cancel_requested():
                    cancel_calls(calls)     # (it caught its cancellation and returned)
        finally:
            slots.release()
            self._leave()
            if self._inflight == 0 and _SPIN_S > 0:
                self._idle_since = _monotonic()
                if lone and self._spin.worth_it():
                    # After this step, which sends the answer.
                    asyncio.get_running_loop().call_soon(self._spin_for_next)

    def _spin_for_next(self):
        if self._inflight == 0 and cpu_free():
            self._spin.run(_core.spin_for_messages, _SPIN_S)

    async def _to_http(self, r, scope, receive):
        """The reply for a result other than str or bytes (handled inline),
        ``(status, header block, body, stream token)``."""
        t = type(r)
        if t is dict or t is list or r is None or t in (int, float, bool):
            b = json_body(r)
            return (200, _sized(_JSON, b), b, 0)
        if inspect.isasyncgen(r):
            return await self._streamed(200, _TEXT, pumped(r))
        if inspect.isgenerator(r):
            # No turn for its producer first: a generator that blocks would
            # hold the head back.
            return (200, _TEXT, None, self._new_stream(pumped(r)))
        try:
            from starlette.responses import Response, StreamingResponse
        except ImportError:  # pragma: no cover
            Response = StreamingResponse = ()
        if isinstance(r, StreamingResponse):
            hb = header_block(r.raw_headers, None)
            return await self._streamed(r.status_code, hb, pumped(r.body_iterator))
        if isinstance(r, Response):
            if type(r).__call__ is Response.__call__ and r.background is None:
                return (r.status_code, header_block(r.raw_headers), bytes(r.body), 0)
            return await _run_asgi_response(r, scope, receive)
        if isinstance(r, (bytearray, memoryview)):
            b = bytes(r)
            return (200, _sized(_OCTET, b), b, 0)
        b = json_body(r)
        return (200, _sized(_JSON, b), b, 0)

    async def _streamed(self, status, head, stream):
        """The reply of a streamed answer whose producer is asynchronous: it
        gets one turn first, and what it yields at once goes with the head
        (the first event reaches the client without the proxy's call for
        the stream)."""
        try:
            await asyncio.sleep(0)
        except asyncio.CancelledError:
            await stream.aclose()
            raise
        return (status, head, stream.take_queued(), self._new_stream(stream))

    def _new_stream(self, agen):
        self._stream_seq += 1
        token = self._stream_seq
        # A proxy that never asks for it (its client left) must not leak it:
        # a timer closes it.  The timer runs in a context of its own, and the
        # request's context (its scope, the handle calls it made) stays in
        # the entry, which the proxy's claim drops: a timer keeps its context
        # until it fires (asyncio's even once cancelled), and a busy replica
        # would hold every streamed request of the last UNCLAIMED_STREAM_S.
        expiry = asyncio.get_running_loop().call_later(
            _defaults.UNCLAIMED_STREAM_S, self._expire_stream, token,
            context=contextvars.Context())
        self._streams[token] = (agen, expiry, contextvars.copy_context())
        self._streams_changed(1)
        return token

    def _claim_stream(self, token):
        """The stream ``token``'s entry, taken out (None if it is gone), its
        expiry cancelled."""
        entry = self._streams.pop(token, None)
        if entry is not None:
            entry[1].cancel()
        return entry

    def _expire_stream(self, token):
        entry = self._claim_stream(token)
        if entry is not None:
            agen, _, request_context = entry
            self._streams_changed(-1)
            request_context.run(asyncio.ensure_future, agen.aclose())

    async def http_stream(self, token):
        """The body of the streamed response ``token``: each item a chunk (bytes),
        or a list of the chunks that queued up meanwhile (see ``_body``)."""
        entry = self._claim_stream(token)
        if entry is None:
            return
        agen = entry[0]
        self._inflight += 1
        try:
            async for chunk in agen:
                if chunk:
                    yield chunk
        except asyncio.CancelledError:
            raise
        except Exception:
            print(f"Replica {self._deployment}#{self._id}: streamed response failed:\n"
                  f"{traceback.format_exc()}", file=sys.stderr, end="", flush=True)
            raise
        finally:
            self._streams_changed(-1)   # (before the user's generator sees its end)
            await agen.aclose()
            self._leave()

    async def http_stream_cancel(self, token):
        entry = self._claim_stream(token)
        if entry is not None:
            agen = entry[0]
            self._streams_changed(-1)
            await agen.aclose()


async def _run_asgi_response(response, scope, receive):
    status = [500]
    headers = [b""]
    body = []

    async def send(msg):
        if msg["type"] == "http.response.start":
            status[0] = msg["status"]
            headers[0] = header_block(msg.get("headers") or [])
        elif msg["type"] == "http.response.body":
            body.append(msg.get("body", b""))
    await response(scope, receive, send)
    return (status[0], headers[0], b"".join(body), 0)
