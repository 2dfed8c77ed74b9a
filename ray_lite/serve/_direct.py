"""Direct ingress: the ingress deployment's replicas take HTTP themselves.

The default: ``http_options={"direct_ingress": False}`` or Ray's
``RAY_SERVE_ENABLE_DIRECT_INGRESS=0`` (set before the runtime starts) has
the proxies take every connection instead.  As many
replicas of an application's ingress deployment as the machine has cores
(``direct_ingress_listeners``; the controller picks them, and a replica
standing by takes a listener's place when it leaves) each run a
``DirectServer`` in their own process: it binds the application's port
beside the proxies (SO_REUSEPORT, the kernel spreading new connections over
every socket), parses with the proxies' compiled connection and runs a
request of its own route in this process, with no hop over a ring.  Fewer
listeners than replicas, because each listener is woken for its own
connections: one per core reads many requests per wake-up.  What it should
not take goes over the rings to the replica the router picks, exactly as
from a proxy (each listener links to every replica of its routes and sees
their load):

- a request for another application's route (each replica knows every
  route, as a proxy does);
- a request while this replica has no free slot of its
  ``max_ongoing_requests``;
- while it has a stream or WebSocket open, or runs a request of a route
  that is not fast (``ServiceTime``): where the router sends it, by load,
  which may be here;
- a request of a multiplexed model (its replica is the model's, by
  rendezvous hashing, as from a proxy);
- a WebSocket (relayed to the replica the router picks, which may be this one).

The queue beyond every replica's limit, ``max_queued_requests`` and its 503
(or ``backpressure_config``), the 408 of ``request_timeout_s``, the 404s,
``/-/healthz`` and ``/-/routes``, metrics and the access log are the proxy's
own code (``DirectServer`` is a ``ProxyActor`` living in the replica), so
they answer the same.  One proxy (``proxies`` sets how many) answers while
fewer than two replicas listen (before the first deployment, an application
scaled to zero or to one replica, a listener being replaced); while two or
more do, it steps aside: its socket stays bound but leaves the port's
listeners, so that no connection pays its hop (the controller's
``_proxies_accept``; the connections it holds stay open).
"""
import asyncio
import os
import sys

from ray_lite._fast import ring as _ring

from . import _core, _defaults
from ._listen import refuse_syns
from ._proxy import HOLD_WAKES, Deadlines, ProxyActor, framed
from ._proxy import _choose_beside_direct as _router_choice
from ._proxy_conn import REQUEST_ID_HEADER, HttpConnection, LocalCall
from ._routing import RouteSubset, load
from .multiplex import MODEL_ID_HEADER, header_value

ENV_SWITCH = "RAY_SERVE_ENABLE_DIRECT_INGRESS"
# How long a stopping replica waits for the first request of a connection it
# took that has sent none yet (a client sends it as soon as it connects).
FIRST_REQUEST_WAIT_S = 1.0


def direct_ingress_on(http_options):
    """Whether Serve runs in direct-ingress mode: the HTTP options'
    ``direct_ingress``, else Ray's ``RAY_SERVE_ENABLE_DIRECT_INGRESS`` (0,
    false or no: off), else on.  On by default because it won or tied every
    HTTP benchmark against the proxies (docs/benchmarks.md), where Ray's
    default is its proxies: the answers are the same either way."""
    v = (http_options or {}).get("direct_ingress")
    if v is not None:
        return bool(v)
    return os.environ.get(ENV_SWITCH, "").strip().lower() not in ("0", "false", "no")


class _OwnSlot:
    """This replica as its route's slot before the controller lists it."""

    __slots__ = ("handle", "actor_id", "inflight", "model_ranks", "streams")

    def __init__(self, actor_id):
        self.handle = None
        self.actor_id = actor_id
        self.inflight = 0
        self.model_ranks = {}
        self.streams = None


class DirectServer(ProxyActor):
    """The HTTP server of one ingress replica (see the module's docstring)."""

    def __init__(self, replica, controller, rank, options):
        # A negative index: the controller does not wait for it as for a proxy,
        # and it never serves the metrics port (the first proxy does).
        super().__init__(controller, -1 - rank, dict(options, replacing=True))
        self.listen_key = "direct:" + replica._id    # (see the controller's _caught_up_keys)
        self.replica = replica
        self.local_id = _core.current_node().id
        self.own = (replica._app, replica._deployment)
        self.own_slot = _OwnSlot(self.local_id)

    async def start(self):
        self.loop = loop = asyncio.get_running_loop()
        if self.request_timeout is not None:
            self.deadlines = Deadlines(loop, self.request_timeout, self._on_timeout)
        if HOLD_WAKES:      # as a proxy: the replicas it sends to woken once a turn
            release = _ring.release_wakes
            _ring.hold_wakes(lambda: loop.call_soon(release))
        version, routes, _ = await self.controller.listen_routes.remote(self.listen_key, -1)
        await self._apply(version, routes)
        self.conn_cls = self.observer.start(HttpConnection) if self.observer else HttpConnection
        await self._serve()
        self._route_task = asyncio.ensure_future(self._route_loop())
        return self.port

    async def stop(self, timeout_s=_defaults.PROXY_DRAIN_TIMEOUT_S):
        """Stop listening and drain, as a proxy does, without dropping the
        connections that came meanwhile: closing a listening socket resets
        those the kernel queued on it and the handshakes under way, and
        ending a connection before its first request was read resets that
        one.  So the queued ones are taken in the same step as the close (no
        turn of the loop between), while no new connection starts on the
        socket (``_listen.refuse_syns``: its client's SYN, sent again, goes
        to another listener), and those that sent no request yet get
        ``FIRST_REQUEST_WAIT_S`` to send one; each such request is answered,
        then its connection ends."""
        if self.stopping or self.server is None:
            return await ProxyActor.stop(self, timeout_s)
        await self._stop_accepting()
        refuse_syns(self.sock)
        queued = self._take_queued()
        self._close_listening()
        await self._adopt(queued)
        await self._accepted_turns()
        loop = self.loop
        start = loop.time()
        end = start + min(FIRST_REQUEST_WAIT_S, timeout_s)
        while loop.time() < end and any(c.seq == 0 and c.current is None and not c.closed
                                        for c in self.conns):
            await asyncio.sleep(0.005)
        return await ProxyActor.stop(self, max(0.0, start + timeout_s - loop.time()))

    async def _follow(self, accept):
        """(A proxy's: it keeps listening while it serves.)"""

    # ------------------------------------------------------------ routing
    def _replica_cell_of(self, rep):
        # Its own through its own process; the others' as a proxy maps them
        # (a link to each replica: affordable for as many listeners as
        # cores), so that its choices see their open streams and the
        # requests their own listeners took.
        if rep.actor_id == self.local_id:
            return self.replica.replica_cell()
        return ProxyActor._replica_cell_of(self, rep)

    def _mark_local(self, routes):
        for r in routes:
            if (r.app, r.deployment) == self.own:
                r.local = next((s for s in r.replicas if s.actor_id == self.local_id),
                               self.own_slot)
            else:
                r.local = None

    def _choose_beside_direct(self, route, req):
        local = route.local
        if local is None:
            return _router_choice(route, req)
        if route.multiplexed and header_value(req.headers, MODEL_ID_HEADER):
            return _router_choice(route, req)    # the model's replica, wherever it is
        rep = self.replica
        slots = rep._slots
        if slots.free > 0 and not slots.waiters:
            if slots.free == slots.capacity and rep._open_streams == 0:
                return local        # idle (a stream's slot is free once its head is out)
            if rep.http_calls_queue():
                # Its synchronous handler runs apart, one call at a time: a
                # request here would wait behind the one running.
                return _router_choice(route, req)
            service = route.service
            if service.streams:
                # Streams run side by side on the loop, but one must not
                # pile onto this replica while another has fewer: the
                # router's pick among the others, unless it is as loaded as
                # this one (then here: no hop).
                others = [s for s in route.replicas if s is not local]
                pick = _router_choice(RouteSubset(route, others), req) if others else None
                return local if pick is None or load(pick) >= load(local) else pick
            if service.fast():
                return local
            # Not fast (a handler that keeps its replica busy): where the
            # router sends it, by load, which may be here.
            return _router_choice(route, req)
        # This replica is at its limit, whoever sent what it runs: another,
        # else the route's queue here (pumped when a slot of it frees).
        others = [s for s in route.replicas if s is not local]
        if not others:
            return None
        return _router_choice(RouteSubset(route, others), req)

    def slot_freed(self):
        """One of this replica's slots freed: the requests waiting here for
        one may go."""
        for r in self.routes:
            if r.local is not None and r.waiting:
                self._pump(r)

    # ------------------------------------------------- requests run here
    def _send(self, conn, req, route, rep):
        if rep is not route.local:
            return ProxyActor._send(self, conn, req, route, rep)
        rep.inflight += 1
        self.inflight += 1
        self.replica.taken_directly_changed(1)      # (the other callers see it)
        req.rep = rep
        path, query = req.url
        if req.request_id is None:
            req.request_id = self.new_request_id()
            header = REQUEST_ID_HEADER + b":" + req.request_id
            req.headers = req.headers + b"\r\n" + header if req.headers else header
        body = req.body
        if type(body) is memoryview:
            body = bytes(body)      # (a large body: the app reads bytes)
        args = (req.method, path, query, req.headers, body, conn.client, route.root_path,
                req.version, self.server_addr)
        req.ref = LocalCall(self.loop.create_task(self._run_local(conn, req, route, args)))

    def release(self, req):
        if req.rep is not None and type(req.ref) is LocalCall:
            self.replica.taken_directly_changed(-1)
        ProxyActor.release(self, req)

    async def _run_local(self, conn, req, route, args):
        try:
            r = await self.replica.handle_http(*args)
        except asyncio.CancelledError:
            return      # its client left, or it timed out: answered there
        except Exception as exc:   # noqa: BLE001 - the replica's own failure
            if req.finished:
                return
            req.finished = True
            self.release(req)
            print(f"direct ingress: request to {route.app}/{route.deployment} failed: "
                  f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            conn.respond_text(req, 500, "Internal Server Error")
            return
        status, headers, body, token, service_s = r
        if req.finished:
            if token:
                await self.replica.http_stream_cancel(token)
            return
        if token:
            route.service.observe_stream()
            req.gen = req.ref       # cancelling the task closes the stream
            await self._stream(conn, req, status, headers, token, body)
            return
        route.service.observe(service_s)
        req.finished = True
        self.release(req)
        conn.respond(req, status, headers, body)

    async def _stream(self, conn, req, status, headers, token, first=None):
        if type(req.ref) is not LocalCall:
            return await ProxyActor._stream(self, conn, req, status, headers, token, first)
        head = self._stream_head(conn, req, status, headers, first)
        if head is None:
            await self.replica.http_stream_cancel(token)
            return
        chunked, keep = head
        write = conn.transport.write
        head_only = req.method == "HEAD"
        ok = False
        chunks = self.replica.http_stream(token)
        try:
            async for chunk in chunks:
                if conn.closed:
                    break
                if head_only:
                    continue
                data = framed(chunk, chunked)
                if data:
                    write(data)
                if conn.write_paused:
                    await conn.drained()
            else:
                ok = True
        except asyncio.CancelledError:
            raise
        except Exception as exc:   # noqa: BLE001 - the status line is gone: close
            if not req.finished:
                print(f"direct ingress: streamed response failed: {type(exc).__name__}",
                      file=sys.stderr, flush=True)
        finally:
            await chunks.aclose()
        self._stream_end(conn, req, ok, chunked, keep)
