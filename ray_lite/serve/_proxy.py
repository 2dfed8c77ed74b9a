"""The HTTP proxy: one of several processes sharing the port (SO_REUSEPORT).

Each proxy is an async actor of the core runtime, so it reaches replicas
over its own shared-memory links (no hop through the driver or another
proxy).  Its HTTP/1.1 connections (keep-alive, pipelining) are a hot path,
ray_lite._fast.http_conn (given what it needs from Serve in _proxy_conn).
Requests travel to the replica as str/bytes/int arguments (msgpack on the
ring): nothing from the network is ever unpickled.

A request goes to a replica of the route's ingress deployment chosen by
power of two choices on this proxy's in-flight counts (and each replica's
open streams, whichever proxy opened them), among replicas under
``max_ongoing_requests``; when all are at the limit it waits in the route's
queue, and beyond ``max_queued_requests`` waiting requests it gets a 503.
A deployment that autoscales is told how many wait (``_demand``); one scaled
to zero gets its requests queued while the controller starts a replica.
A request waits at most ``request_timeout_s`` from its arrival, queued or not
(else ``RAY_SERVE_REQUEST_PROCESSING_TIMEOUT_S``, as in Ray): then it gets a 408
and is cancelled in its replica.
"""
import asyncio
import collections
import math
import os
import socket
import sys
from asyncio.selector_events import BaseSelectorEventLoop
from time import monotonic as _monotonic
from urllib.parse import unquote

from ray_lite._config import SERVE_PROXY_HOLD_WAKES, SERVE_PROXY_SPIN_S
from ray_lite._fast import ring as _ring

from . import _core, _defaults, _demand, _memdebug, _metrics, _websocket, context
from ._defaults import STREAM_ITEMS_AHEAD, STREAM_WRITE_BATCH
from ._http import CONNECTION_CLOSE, REASONS, control_answer, status_line, text_answer
from ._listen import family_of, free_port, refuse_syns, shared_socket, take_syns
from ._proxy_conn import REQUEST_ID_HEADER, HttpConnection, bad_head_line, cancel_call
from ._request_calls import request_id_maker
from ._routing import (RouteSubset, ServiceTime, attach_replica_cell, choose_for_http,
                       for_model, full_beside_direct, set_proxy_rank, slots_for)
from ._spin import SpinPolicy
from .multiplex import MODEL_ID_HEADER, header_value

# While a proxy has a single client and a single request in flight, its loop
# has nothing else to do: it spins (bounded) for the replica's answer rather
# than sleeping in epoll.  On a VM, a wake-up from epoll costs the replica a
# descriptor write and the proxy tens of microseconds, a large part of a
# request's latency at low load.  It spins only for a route most of whose
# recent answers came within the budget, and not while its spins get
# preempted (see _spin.SpinPolicy), so a slow deployment or a busy CPU costs
# no CPU.  The budget (400 us) covers the wake-up of a replica that was
# asleep (150-200 us on a loaded VM), not just a warm replica's answer: with
# a budget below that, one sleeping replica made the proxy sleep too, which
# lengthened the client's cycle past the replica's own budget, so neither
# spun again (docs/performance.md, "Spinning at low load").
# RAY_LITE_SERVE_PROXY_SPIN_US=0 turns it off.
SPIN_BUDGET_S = SERVE_PROXY_SPIN_S

# A proxy's loop reads many connections' requests in one turn and sends each
# to its replica at once; the ring wakes a sleeping replica at the first, and
# the replica then takes a CPU from the proxy amid the turn, answers that one
# request and sleeps again before the next comes.  So the proxy holds its
# wake-ups (ring.hold_wakes) and gives them after the turn: each replica it
# sent to wakes once and finds all of the turn's requests.  At wrk -c100 that
# was 0.30 -> 0.17 replica wake-ups and 43.5 -> 37.3 us of CPU per request
# (docs/performance.md, "Held wake-ups").  Unlike a lower
# priority for replicas (SCHED_BATCH measured the same gain quiet), it costs
# nothing beside a busy process: the woken replica preempts that as before.
HOLD_WAKES = SERVE_PROXY_HOLD_WAKES


# ``b"<length in hex>\r\n"`` for the lengths of small chunks (most events
# and tokens are): a look-up instead of formatting each chunk's.
_CHUNK_HEADS = [b"%x\r\n" % n for n in range(1024)]


def _framed(chunks):
    """``chunks`` as one run of HTTP/1.1 chunks, each its own; an empty one
    is left out (it would end the body)."""
    heads = _CHUNK_HEADS
    frames = [(heads[len(c)] if len(c) < 1024 else b"%x\r\n" % len(c)) + c
              for c in chunks if c]
    return b"\r\n".join(frames) + b"\r\n" if frames else b""


def framed(item, chunked):
    """One item of a replica's streamed body (a chunk, or a list of the
    chunks that queued up there) as the bytes to write: each chunk its own
    HTTP/1.1 chunk when ``chunked``, as it was yielded (Ray Serve's framing)."""
    if type(item) is list:
        return _framed(item) if chunked else b"".join(item)
    if chunked and item:
        return b"%x\r\n%b\r\n" % (len(item), item)
    return item


class _Route:
    __slots__ = ("prefix", "root_path", "app", "deployment", "replicas", "max_ongoing",
                 "max_queued", "waiting", "spin", "service", "multiplexed", "report",
                 "from_zero", "refusal", "local", "retry", "retry_s")

    def __init__(self, prefix, app, deployment, replicas, max_ongoing, max_queued,
                 multiplexed=False):
        self.prefix = prefix
        self.root_path = "" if prefix == "/" else prefix
        self.app = app
        self.deployment = deployment
        self.replicas = replicas
        self.max_ongoing = max_ongoing
        self.max_queued = max_queued
        self.waiting = collections.deque()
        self.spin = SpinPolicy(SPIN_BUDGET_S)   # learns from answers with nothing else in flight
        self.service = ServiceTime()    # the replicas' time per request (packs a fast route)
        self.multiplexed = multiplexed   # route by the serve_multiplexed_model_id header
        self.report = None      # a WaitingReport when the deployment autoscales
        self.from_zero = False  # it may run no replica: requests wait for one
        self.refusal = _refusal(None)   # (status, headers, body) beyond max_queued
        self.local = None       # direct ingress: the slot of the replica serving in this process
        self.retry = None       # direct ingress: the timer of the waiting requests' next look
        self.retry_s = 0.0      # (its delay, doubled while nothing frees)

    def set_scaling(self, autoscaling, from_zero):
        report = self.report
        if report is not None and (not autoscaling or (report.app, report.deployment) !=
                                   (self.app, self.deployment)):
            report.changed(0)       # what it told goes with it
            report = None
        if autoscaling and report is None:
            report = _demand.WaitingReport(self.app, self.deployment)
        elif report is not None:
            report.retell()     # (routes came: a report lost with the controller goes again)
        self.report = report
        self.from_zero = from_zero

    def waiting_changed(self):
        if self.report is not None:
            self.report.changed(len(self.waiting))

    def matches(self, path):
        p = self.prefix
        return p == "/" or path == p or (path.startswith(p) and path[len(p)] == "/")


def _refusal(backpressure):
    """The answer to a request beyond ``max_queued_requests``: 503, or the
    deployment's ``backpressure_config`` (429, a Retry-After header)."""
    status = backpressure["status_code"] if backpressure else 503
    headers, body = text_answer(status, f"{REASONS[status]}: too many queued requests")
    retry = backpressure.get("retry_after_s") if backpressure else None
    if retry is not None:
        headers += b"retry-after: %d\r\n" % math.ceil(retry)
    return status, headers, body


# How late a request's timeout may be answered: the deadlines due within
# this of each other expire in one turn of the timer (under load, one turn
# of the loop would otherwise run the timer for every request).
DEADLINE_SLACK_S = 0.01
# The deadline queue drops answered requests' entries when it grows past
# twice its live entries, and never below this many.
DEADLINE_COMPACT_AT = 1024


def request_timeout_s(options):
    """The HTTP options' ``request_timeout_s``, else Ray Serve's variables
    ``RAY_SERVE_REQUEST_PROCESSING_TIMEOUT_S`` and
    ``SERVE_REQUEST_PROCESSING_TIMEOUT_S`` (None: no timeout)."""
    t = options.get("request_timeout_s")
    if t:
        return float(t)
    return (_defaults.env_number("RAY_SERVE_REQUEST_PROCESSING_TIMEOUT_S", 0.0, float)
            or _defaults.env_number("SERVE_REQUEST_PROCESSING_TIMEOUT_S", 0.0, float)
            or None)


def _pending(entry):
    deadline, conn = entry
    req = conn.current
    return req is not None and req.timer is deadline and not req.finished


class Deadlines:
    """The deadlines of the requests routed and not yet answered, each
    ``timeout`` after it was routed.  All share one timeout, so the order they
    were routed in is the order they fall due in: a FIFO holds them and one
    loop timer, at the first, serves them all.  A timer per request cost
    2 us of a proxy's CPU per request; an entry here costs an append.

    An entry is ``(deadline, conn)``, and stands for ``conn.current`` while
    that request holds the same deadline object in ``timer``: an answered
    request needs no removal, and no entry keeps a request's body alive."""

    __slots__ = ("loop", "timeout", "expire", "entries", "timer", "limit", "slack")

    def __init__(self, loop, timeout, expire):
        self.loop = loop
        self.timeout = timeout
        self.expire = expire    # expire(conn, req): answers a request that fell due
        self.entries = collections.deque()
        self.timer = None
        self.limit = DEADLINE_COMPACT_AT
        self.slack = min(DEADLINE_SLACK_S, timeout / 10)

    def add(self, conn, req):
        deadline = req.timer = self.loop.time() + self.timeout
        entries = self.entries
        entries.append((deadline, conn))
        if self.timer is None:
            self.timer = self.loop.call_at(deadline + self.slack, self._expire_due)
        elif len(entries) > self.limit:
            live = self.entries = collections.deque(filter(_pending, entries))
            self.limit = max(DEADLINE_COMPACT_AT, 2 * len(live))

    def _expire_due(self):
        self.timer = None
        now = self.loop.time()
        while True:
            # (self.entries each time: expiring a request may route the
            # connection's next one, which adds, and may compact, the queue)
            entries = self.entries
            if not entries or entries[0][0] > now:
                break
            entry = entries.popleft()
            if _pending(entry):
                conn = entry[1]
                self.expire(conn, conn.current)
        entries = self.entries
        while entries and not _pending(entries[0]):
            entries.popleft()
        if entries and self.timer is None:
            self.timer = self.loop.call_at(entries[0][0] + self.slack, self._expire_due)


def _choose(route, req):
    """The replica for ``req`` on ``route`` (None: all are at the limit)."""
    if route.multiplexed:
        model_id = header_value(req.headers, MODEL_ID_HEADER)
        if model_id:
            return for_model(route.replicas, route.max_ongoing, model_id)
    return choose_for_http(route.replicas, route.max_ongoing, route.service)


def _choose_beside_direct(route, req):
    """``_choose`` while replicas listen themselves (direct ingress): a
    replica whose own listener's requests fill its ``max_ongoing_requests``
    beside this caller's is full too (its cell says how many it took)."""
    rep = _choose(route, req)
    if rep is None or not full_beside_direct(rep, route.max_ongoing):
        return rep
    limit = route.max_ongoing
    free = [s for s in route.replicas if not full_beside_direct(s, limit)]
    return _choose(RouteSubset(route, free), req) if free else None


#: Direct ingress: how soon requests waiting here for a replica look again
#: (doubling up to the second figure while none frees).  A replica's own
#: listener frees its slots without a word to the other callers.
DIRECT_RETRY_S = (0.001, 0.016)
_LOOKING = object()
# Turns of asyncio's loop from accepting a connection to its connection_made
# (the task that makes it, then the call it schedules), and one to spare.
_ACCEPTED_TURNS = 3


def _close_unclaimed(rep, token):
    """Close stream ``token`` in replica ``rep`` if no call took it (none
    will: its request ended); a stream that was taken ends with its call."""
    try:
        rep.handle.http_stream_cancel.remote(token)
    except Exception:   # noqa: BLE001 - a dead replica's streams went with it
        pass


class ProxyActor:
    _choose = staticmethod(_choose)
    # The choice while replicas listen too (direct ingress); a replica's own
    # server (_direct.DirectServer) prefers its replica.
    _choose_beside_direct = staticmethod(_choose_beside_direct)

    def __init__(self, controller, index, options):
        context.set_controller(controller)
        self.controller = controller
        self.index = index
        self.listen_key = index     # how the controller knows which listener applied a version
        set_proxy_rank(index)
        self.host = options.get("host") or _defaults.HTTP_HOST
        self.port = int(options.get("port", _defaults.HTTP_PORT))
        self.max_body = int(options.get("max_body_size") or _defaults.MAX_BODY_SIZE)
        self.request_timeout = request_timeout_s(options)
        self.deadlines = None   # a Deadlines when there is a request timeout
        self.keep_alive_timeout = float(options.get("keep_alive_timeout_s")
                                        or _defaults.KEEP_ALIVE_TIMEOUT_S)
        self.idle_sweep = None      # the timer of the next sweep, while connections are open
        self.routes = []
        self.inflight = 0
        self.version = -1
        self.conns = set()
        self.server = None
        self.server_fd = -1     # its listening socket's descriptor (a duplicate of sock's)
        self.aside = False      # stepped aside: not accepting while replicas listen
        self.stopping = False
        self.loop = None
        # Direct ingress: replicas take requests this caller does not see.
        self.beside_direct = bool(options.get("direct_ingress"))
        if self.beside_direct:
            self._choose = self._choose_beside_direct
        family = family_of(self.host)
        if index == 0 and not options.get("replacing"):
            # The first proxy of this Serve: the port must be free.  The
            # proxies share it through SO_REUSEPORT, which would as well let
            # this Serve share a port another program (another `serve run`)
            # serves, the kernel splitting the connections between them.
            self.port = free_port(family, self.host, self.port)
        self.sock = shared_socket(family, self.host, self.port)
        self.server_addr = f"{self.host}:{self.port}"
        self.observer = _metrics.observe_proxy(self, index, options)   # None: not asked for
        self.new_request_id = request_id_maker()

    async def start(self):
        self.loop = loop = asyncio.get_running_loop()
        if self.request_timeout is not None:
            self.deadlines = Deadlines(loop, self.request_timeout, self._on_timeout)
        _memdebug.install(loop, "proxy")
        if HOLD_WAKES:
            release = _ring.release_wakes
            _ring.hold_wakes(lambda: loop.call_soon(release))
        version, routes, accept = await self.controller.listen_routes.remote(self.listen_key,
                                                                             -1)
        await self._apply(version, routes)
        self.conn_cls = self.observer.start(HttpConnection) if self.observer else HttpConnection
        if accept or not self.beside_direct:
            await self._serve()
        else:
            self.aside = True
        self._route_task = asyncio.ensure_future(self._route_loop())
        return self.port

    async def _serve(self):
        """Accept connections: a server on a duplicate of the bound socket,
        so that closing the server (``_step_aside``) keeps the port."""
        sock = self.sock.dup()
        self.server_fd = sock.fileno()
        conn_cls = self.conn_cls
        self.server = await self.loop.create_server(lambda: conn_cls(self), sock=sock,
                                                    backlog=4096)
        if self.stopping:           # (stopped meanwhile)
            self.server.close()

    async def _follow(self, accept):
        """Step aside while replicas listen, back when they stop (direct
        ingress; the controller decides: ``_proxies_accept``)."""
        if not self.beside_direct or self.stopping or accept != self.aside:
            return
        if accept:
            take_syns(self.sock)
            self.sock.listen(4096)      # back among the port's listeners
            try:
                await self._serve()
            except BaseException:
                self.sock.shutdown(socket.SHUT_RD)     # (not listening unserved)
                raise
            self.aside = False
        else:
            await self._step_aside()

    async def _step_aside(self):
        """Take no new connections, keeping the port bound and every
        connection open: the ones the kernel queued here are taken first
        (leaving the port's listeners resets those it still holds), then the
        socket leaves the listeners (``shutdown``: it stays bound, and
        ``listen`` takes it back).  From the last ``accept`` to the
        ``shutdown`` no connection starts on it (``_listen.refuse_syns``)."""
        await self._stop_accepting()
        if self.stopping:
            return
        refuse_syns(self.sock)
        queued = self._take_queued()
        self.aside = True
        self.sock.shutdown(socket.SHUT_RD)
        server, self.server = self.server, None
        server.close()
        await self._adopt(queued)

    def _take_queued(self):
        """The connections the kernel queued on the listening socket."""
        queued = []
        while True:
            try:
                sock, _ = self.sock.accept()
            except OSError:         # BlockingIOError: none left
                return queued
            queued.append(sock)

    async def _adopt(self, queued):
        """Serve connections taken with ``_take_queued``."""
        conn_cls = self.conn_cls
        for sock in queued:
            sock.setblocking(False)
            try:
                await self.loop.connect_accepted_socket(lambda: conn_cls(self), sock=sock)
            except OSError:
                sock.close()

    async def _route_loop(self):
        while not self.stopping:
            try:
                version, routes, accept = await self.controller.listen_routes.remote(
                    self.listen_key, self.version)
            except asyncio.CancelledError:
                return
            except Exception:   # noqa: BLE001 - the controller is going away
                if self.stopping:
                    return
                await asyncio.sleep(0.5)
                continue
            try:
                await self._apply(version, routes)
                await self._follow(accept)
            except Exception as exc:   # noqa: BLE001 - the loop must outlive a bug
                # Its death would leave this proxy deaf to every later change
                # and each change 15 s late ("proxies did not apply").
                self.version = version
                print(f"proxy: applying routes version {version} failed: {exc!r}",
                      file=sys.stderr, flush=True)

    async def _apply(self, version, routes):
        known = [rep for r in self.routes for rep in r.replicas]
        new_routes = []
        fresh = []
        for prefix, (app, dep, handles, max_ongoing, max_queued, multiplexed, autoscaling,
                     from_zero, backpressure) in routes.items():
            reps, new = slots_for(handles, known)
            known += new
            fresh += new
            route = next((r for r in self.routes if r.prefix == prefix), None)
            if route is None:
                route = _Route(prefix, app, dep, reps, max_ongoing, max_queued, multiplexed)
            else:
                # The same object: requests in flight and waiting refer to it.
                if (route.app, route.deployment) != (app, dep):
                    route.service = ServiceTime()   # another deployment's handler
                route.app, route.deployment, route.replicas = app, dep, reps
                route.max_ongoing, route.max_queued = max_ongoing, max_queued
                route.multiplexed = multiplexed
            route.set_scaling(autoscaling, from_zero)
            route.refusal = _refusal(backpressure)
            new_routes.append(route)
        if fresh:
            # Open the links to new replicas now, so that the first request
            # does not wait for them (and the driver need not be driving),
            # and map where each keeps its counts (open streams, direct requests).
            cells = await asyncio.gather(*[self._replica_cell_of(rep) for rep in fresh],
                                         return_exceptions=True)
            for rep, name in zip(fresh, cells):
                if type(name) is str:
                    rep.streams = attach_replica_cell(name)
        new_routes.sort(key=lambda r: len(r.prefix), reverse=True)
        self._mark_local(new_routes)
        old_routes = self.routes
        self.routes = new_routes
        self.version = version
        for r in old_routes:
            if r not in new_routes and r.waiting:
                # A route gone with requests waiting: each goes where its path
                # leads now (another route, or a 404).
                waiting, r.waiting = r.waiting, collections.deque()
                r.waiting_changed()
                for conn, req in waiting:
                    if not conn.closed:
                        self.route_request(conn, req, *req.url)
        for r in new_routes:
            self._pump(r)

    def _replica_cell_of(self, rep):
        return rep.handle.replica_cell.remote()

    def _mark_local(self, routes):
        """(Direct ingress: which routes this process's replica serves.)"""

    def sweep_idle_later(self):
        # A quarter of the timeout apart: a connection is closed between one
        # and one and a quarter timeouts after it fell idle.  No timer runs
        # while no connection is open.
        self.idle_sweep = self.loop.call_later(self.keep_alive_timeout / 4, self._sweep_idle)

    def _sweep_idle(self):
        """Close the keep-alive connections idle for ``keep_alive_timeout_s``
        (no request in flight and nothing received meanwhile)."""
        self.idle_sweep = None
        for conn in list(self.conns):
            if conn.current is None and not conn.queue and not conn.closed:
                conn.idle_sweeps += 1
                if conn.idle_sweeps > 4:
                    conn.closed = True
                    conn.transport.close()
        if self.conns:
            self.sweep_idle_later()

    async def pid(self):
        return os.getpid()

    async def wait_forever(self):
        # The controller keeps one such call outstanding: its failure is how
        # it learns, at once, that this proxy died.
        await asyncio.get_running_loop().create_future()

    async def _stop_accepting(self):
        """Accept no more connections, and let those accepted become
        connections of this proxy (in ``conns``) before the server closes."""
        if self.server is not None and isinstance(self.loop, BaseSelectorEventLoop):
            # asyncio's own loop accepts in one turn and makes the connection
            # in a task in the next; a server closed between the two drops
            # that connection unread (its transport cannot attach to a closed
            # server): a reset.  So stop accepting first, and give the
            # accepted ones the turns they need.  (uvloop makes the transport
            # in the same step as it accepts it; its connection_made may
            # still come a turn later: see _accepted_turns.)
            self.loop.remove_reader(self.server_fd)
            await self._accepted_turns()

    async def _accepted_turns(self):
        """Let the connections accepted before the listening socket closed
        run their ``connection_made`` (a loop may call it a turn later), so
        that a stop sees them in ``conns``: one it missed would have its
        request run after the drain and be killed unanswered."""
        for _ in range(_ACCEPTED_TURNS):
            await asyncio.sleep(0)

    def _close_listening(self):
        self.stopping = True
        if self.server is not None:
            self.server.close()
        self.sock.close()       # (the server's is a duplicate)

    async def stop(self, timeout_s=_defaults.PROXY_DRAIN_TIMEOUT_S):
        """Take no new connections; let requests in flight end (``timeout_s`` at most)."""
        if not self.stopping:
            await self._stop_accepting()
        self._close_listening()
        await self._accepted_turns()
        _websocket.close_all()
        for conn in list(self.conns):
            if conn.closed:
                continue
            if conn.current is None:
                conn.closed = True
                conn.transport.close()
            else:
                conn.end_after_answers()    # no more requests on it
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        while any(c.current is not None for c in self.conns) and loop.time() < end:
            await asyncio.sleep(0.02)
        return True

    # ----------------------------------------------------------- routing
    def match(self, path):
        for r in self.routes:
            if r.matches(path):
                return r
        return None

    def dispatch(self, conn, req):
        url = req.url
        q = url.find(b"?")
        if q >= 0:
            raw_path, query = url[:q], url[q + 1:]
        else:
            raw_path, query = url, b""
        path = raw_path.decode("utf-8", "surrogateescape")
        if "%" in path:
            path = unquote(path)
        if path[:1] != "/":
            # absolute-form request targets ("http://host/path").
            i = path.find("/", path.find("//") + 2) if "//" in path else -1
            path = path[i:] if i >= 0 else "/"
        if path[:3] == "/-/" and control_answer(self, conn, req, path):
            return      # /-/healthz or /-/routes
        self.route_request(conn, req, path, query)

    def route_request(self, conn, req, path, query):
        routes = self.routes
        if len(routes) == 1 and routes[0].prefix == "/":
            route = routes[0]
        else:
            route = self.match(path)
        if route is None:
            conn.respond_text(req, 404, f"Path '{path}' not found. Ping http://.../-/routes "
                                        f"for available routes.")    # Ray Serve's words
            return
        req.route = route
        req.url = (path, query)
        if self.deadlines is not None and req.timer is None:
            self.deadlines.add(conn, req)
        rep = self._choose(route, req)
        if rep is None:
            if route.max_queued != -1 and len(route.waiting) >= route.max_queued:
                conn.respond(req, *route.refusal)
                return
            if not route.replicas and not route.from_zero:
                conn.respond_text(req, 503, f"Deployment(name='{route.deployment}', "
                                            f"app='{route.app}') is unavailable: no replica "
                                            f"of it runs (it failed to deploy, or is stopping).")
                return
            route.waiting.append((conn, req))
            route.waiting_changed()
            if self.beside_direct:
                self._look_again_later(route)
            return
        self._send(conn, req, route, rep)

    def _send(self, conn, req, route, rep):
        rep.inflight += 1
        self.inflight += 1
        req.rep = rep
        path, query = req.url
        if req.request_id is None:
            # Made now, so that the replica sees the id the answer will carry
            # (serve.context._get_serve_request_context().request_id, as Ray's).
            req.request_id = self.new_request_id()
            header = REQUEST_ID_HEADER + b":" + req.request_id
            req.headers = req.headers + b"\r\n" + header if req.headers else header
        try:
            # The last argument, ``lone`` (one client, nothing else in flight),
            # lets the replica spin for this client's next request (_replica._SPIN_S).
            ref = rep.http.remote(req.method, path, query, req.headers, req.body, conn.client,
                                  route.root_path, req.version, self.server_addr,
                                  self.inflight == 1 and len(self.conns) == 1)
        except Exception as exc:   # noqa: BLE001
            rep.inflight -= 1
            self.inflight -= 1
            req.rep = None
            print(f"proxy: could not send a request: {exc!r}", file=sys.stderr, flush=True)
            conn.respond_text(req, 500, "Internal Server Error")
            return
        req.ref = ref
        _core.on_ready(ref, lambda _e: self._on_reply(conn, req))
        if self.inflight == 1 and SPIN_BUDGET_S > 0:
            req.sent = _monotonic()
            if route.spin.worth_it() and len(self.conns) == 1:
                # After this callback: the request's bytes are on the ring
                # (and the replica woken) already.
                self.loop.call_soon(self._wait_for_reply, req)

    def _wait_for_reply(self, req):
        if self.inflight == 1 and len(self.conns) == 1 and not req.finished:
            req.route.spin.run(_core.wait_briefly, req.ref, SPIN_BUDGET_S)

    def release(self, req):
        rep = req.rep
        if rep is None:
            return
        req.rep = None
        rep.inflight -= 1
        self.inflight -= 1
        if req.route is not None:
            self._pump(req.route)

    def _pump(self, route):
        waiting = route.waiting
        if not waiting:
            return
        while waiting:
            conn, req = waiting[0]
            if conn.closed:
                waiting.popleft()
                continue
            rep = self._choose(route, req)
            if rep is None:
                break
            waiting.popleft()
            ws_headers = req.ws_headers
            if ws_headers is None:
                self._send(conn, req, route, rep)
            else:       # a WebSocket that waited for a replica (scaled to zero)
                _websocket.start(self, conn, req, route, rep, ws_headers)
        route.waiting_changed()
        if self.beside_direct:
            if waiting:
                self._look_again_later(route)
            else:
                route.retry_s = 0.0

    def _look_again_later(self, route):
        """Direct ingress: a timer for the requests waiting on ``route``,
        which a replica's own listener may let go without a word here."""
        if route.retry is None and self.loop is not None:
            lo, hi = DIRECT_RETRY_S
            route.retry_s = min(route.retry_s * 2, hi) if route.retry_s else lo
            route.retry = self.loop.call_later(route.retry_s, self._look_again, route)

    def _look_again(self, route):
        route.retry = _LOOKING      # (no timer is set while it looks)
        before = len(route.waiting)
        try:
            self._pump(route)
        finally:
            route.retry = None
        if route.waiting:
            if len(route.waiting) < before:
                route.retry_s = 0.0     # one went: the next look comes soon
            self._look_again_later(route)

    def _on_timeout(self, conn, req):
        req.timer = None
        if req.finished or conn.current is not req:
            return      # (answered meanwhile: a 503 or 404 after it waited, say)
        req.finished = True
        target = req.gen if req.gen is not None else req.ref
        if target is not None:
            try:
                cancel_call(target)
            except Exception:   # noqa: BLE001
                pass
        elif req.route is not None:     # still waiting for a replica
            try:
                req.route.waiting.remove((conn, req))
            except ValueError:
                pass
            req.route.waiting_changed()
        self.release(req)
        if req.gen is None:
            self._answer_timed_out(conn, req)
        elif not conn.closed:
            conn.closed = True
            conn.transport.close()

    def _answer_timed_out(self, conn, req):
        # Ray's answer, which names the request (by the id its x-request-id
        # header carries: the client's, else one made now).
        if req.request_id is None:
            req.request_id = self.new_request_id()
        headers, body = text_answer(
            408, f"Request {req.request_id.decode('latin-1')} timed out after "
                 f"{self.request_timeout}s.")
        conn.respond(req, 408, headers, body, close=True)

    def _on_reply(self, conn, req):
        if req.finished:
            return
        if req.sent:
            req.route.spin.observe(_monotonic() - req.sent)
        r = _core.peek_unshared(req.ref)      # written out, never kept or changed
        if r[0]:
            status, headers, body, token, service_s = r[1]
            if token:
                req.route.service.observe_stream()
                self.loop.create_task(
                    self._stream_next_turn(conn, req, req.rep, status, headers, token, body))
                return
            req.route.service.observe(service_s)
            req.finished = True
            self.release(req)
            conn.respond(req, status, headers, body)
            return
        err = r[1]
        if getattr(err, "never_sent", False) and self._send_elsewhere(conn, req):
            return
        req.finished = True
        self.release(req)
        print(f"proxy: request to {req.route.app}/{req.route.deployment} failed: "
              f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}",
              file=sys.stderr, flush=True)
        conn.respond_text(req, 500, "Internal Server Error")

    def _send_elsewhere(self, conn, req):
        """The replica was dead when the request was sent to it (this proxy
        not yet told): certain it never saw the request, drop it from the
        route (until the controller's next set) and route the request again,
        ``SEND_ATTEMPTS`` sends at most.  False when out of attempts."""
        if req.sends >= _defaults.SEND_ATTEMPTS:
            return False
        req.sends += 1
        route, rep = req.route, req.rep
        if rep in route.replicas:
            route.replicas = [r for r in route.replicas if r is not rep]
        self.release(req)
        # On the next turn of the loop: a refused send fails at once, so this
        # may run inside _send, which has not finished with the request.
        self.loop.call_soon(self._route_again, conn, req)
        return True

    def _route_again(self, conn, req):
        if not req.finished:    # (else its client left meanwhile)
            req.ref = None
            req.sent = 0.0
            self.route_request(conn, req, *req.url)

    def _stream_head(self, conn, req, status, headers, first):
        """Write the head of a streamed answer and ``first``, the chunks
        that came with it (a chunk, a list, or None): ``(chunked, keep)``,
        or None when the head may not be sent (then ``req`` is answered 500)."""
        if bad_head_line(headers) is not None:
            # Not one byte of this head: conn.respond logs it and answers
            # 500 instead; _stream closes the replica's stream.
            req.finished = True
            self.release(req)
            conn.respond(req, status, headers, b"")
            return None
        chunked = req.version == "1.1"
        keep = req.keep_alive and chunked
        head = status_line(status) + headers + REQUEST_ID_HEADER + b": " + (
            req.request_id or self.new_request_id()) + b"\r\n"
        if chunked:
            head += b"transfer-encoding: chunked\r\n"
        if not keep:
            head += CONNECTION_CLOSE
        head += b"\r\n"
        if first and req.method != "HEAD":
            head += framed(first, chunked)
        conn.transport.write(head)
        return chunked, keep

    def _stream_end(self, conn, req, ok, chunked, keep):
        """A streamed answer ended (``ok``: its body is whole)."""
        if req.finished:
            return
        req.finished = True
        self.release(req)
        if conn.closed:
            return
        if ok and chunked:
            conn.transport.write(b"0\r\n\r\n")
        conn.current = None
        if ok and keep:
            conn.next()
        else:
            conn.closed = True
            conn.transport.close()

    async def _stream_next_turn(self, conn, req, rep, status, headers, token, first):
        """``_stream``, run as a task of its own: if the request timed out or
        its client left before the task ran, its stream is closed in
        replica ``rep`` at once (the request no longer names its replica),
        instead of running there unclaimed for ``UNCLAIMED_STREAM_S``."""
        if req.finished:
            _close_unclaimed(rep, token)
        await self._stream(conn, req, status, headers, token, first)

    async def _stream(self, conn, req, status, headers, token, first=None):
        if req.finished:
            return      # (timed out, or its client left, before this task ran)
        rep = req.rep       # (release, when the client leaves, forgets it)
        head = self._stream_head(conn, req, status, headers, first)
        if head is None:
            _close_unclaimed(rep, token)
            return
        chunked, keep = head
        write = conn.transport.write
        ok = False
        try:
            gen = req.gen = rep.handle.http_stream.options(
                _generator_backpressure_num_objects=STREAM_ITEMS_AHEAD).remote(token)
            head_only = req.method == "HEAD"
            pending = []    # chunks read but not yet written
            async for ref in gen:
                # The items already reported go out in one write: a replica
                # that yields faster than this proxy writes (many small
                # events: server-sent events, tokens) costs one system call
                # per batch instead of one per item.  Nothing waits for a
                # batch to fill: it is what has come.
                while True:
                    r = _core.peek_unshared(ref)
                    if r is not None and r[0]:
                        chunk = r[1]
                    else:
                        if pending:
                            write(b"".join(pending))
                            pending.clear()
                        chunk = await ref
                    if conn.closed:
                        break
                    if not head_only and chunk:
                        data = framed(chunk, chunked)
                        if data:
                            pending.append(data)
                    if len(pending) >= STREAM_WRITE_BATCH or not gen.next_ready():
                        break
                    ref = next(gen)     # reported already: a look-up
                if conn.closed:
                    break
                if pending:
                    write(b"".join(pending) if len(pending) > 1 else pending[0])
                    pending.clear()
                if conn.write_paused:
                    await conn.drained()
            else:
                ok = True
        except asyncio.CancelledError:
            raise
        except Exception as exc:   # noqa: BLE001 - the status line is gone: close
            if not req.finished:
                print(f"proxy: streamed response failed: {type(exc).__name__}",
                      file=sys.stderr, flush=True)
        if not ok:
            # A stream call cancelled before it started in the replica (its
            # client left at once) never took the stream: close it there now,
            # or it would count as open until it expired unclaimed.
            _close_unclaimed(rep, token)
        self._stream_end(conn, req, ok, chunked, keep)
