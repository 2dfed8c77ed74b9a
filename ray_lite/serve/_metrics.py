"""Serve's metrics in Prometheus text format, and the access log.

``serve.start(http_options={"metrics_export_port": N})`` (``ray-lite serve
run --metrics-export-port N``; Ray spells the port ``--metrics-export-port``
too) exports, with Ray Serve's names and labels:

- per HTTP route (from the proxies): ``ray_serve_http_request_latency_ms``
  (histogram: method, route, application, status_code),
  ``ray_serve_num_http_requests_total`` (the same labels),
  ``ray_serve_num_http_error_requests_total`` (route, error_code, method,
  application) and ``ray_serve_num_deployment_http_error_requests_total``
  (with deployment).  A WebSocket counts as one request of method ``WS``
  when it ends, its close code as the status (an error unless 1000 or
  1001); one its app refused counts with its HTTP status (403...);
- per replica: ``ray_serve_deployment_processing_latency_ms`` (histogram:
  deployment, replica, route, application),
  ``ray_serve_deployment_request_counter_total``,
  ``ray_serve_deployment_error_counter_total``,
  ``ray_serve_replica_processing_queries`` (its requests in flight, sampled
  every ``SAMPLE_S``) and ``ray_serve_deployment_replica_starts_total``.

``prometheus_client`` keeps them in its multiprocess mode: each proxy and
replica writes its values to memory-mapped files in one directory of this
runtime; the first proxy serves the sum on the port.  A request costs one
histogram update in the proxy and one in the replica; each request counter
is that histogram's count (derived when scraped), errors add one counter
update.  With metrics off nothing is wrapped: the request path is unchanged.

``http_options={"access_log": True}`` (``--access-log``) writes one line
per request to standard error: client, method, path, status, latency in ms.
"""
import asyncio
import glob
import os
import shutil
import socket
import stat
import sys
import tempfile
import time
from time import monotonic as _monotonic

from ray_lite._fast import shm
from ray_lite._private.job import metrics_files


# Ray Serve's DEFAULT_LATENCY_BUCKET_MS.
LATENCY_BUCKETS_MS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000]
SAMPLE_S = 1.0            # how often a replica records its requests in flight
MAX_SCRAPE_REQUEST = 16 * 1024

_HTTP_LATENCY = "ray_serve_http_request_latency_ms"
_DEPLOYMENT_LATENCY = "ray_serve_deployment_processing_latency_ms"
# A counter each that is the count of a histogram, made when scraped.
_COUNTS_OF = {
    _HTTP_LATENCY: ("ray_serve_num_http_requests", "The number of HTTP requests processed."),
    _DEPLOYMENT_LATENCY: ("ray_serve_deployment_request_counter",
                          "The number of queries that have been processed in this replica."),
}


_DIR_PREFIX = metrics_files.DIR_PREFIX
metrics_dir = metrics_files.metrics_dir
_prometheus = metrics_files.multiprocess_client


def cleanup_stale_dirs():
    """Remove the metric directories of runtimes whose driver is dead: a
    driver killed before ``serve.shutdown`` could not remove its own.  The
    driver's pid is in the name (its shared-memory prefix); only this user's
    directories are touched (the temporary directory is everybody's)."""
    root = tempfile.gettempdir()
    try:
        entries = [e for e in os.listdir(root) if e.startswith(_DIR_PREFIX)]
    except OSError:
        return []
    removed = []
    for entry in entries:
        pid = shm.creator_pid(entry[len(_DIR_PREFIX):])
        if pid is None or shm.pid_alive(pid):
            continue
        path = os.path.join(root, entry)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def prepare(http_options):
    """In the driver, before Serve's processes start: the leftovers of killed
    drivers go, and a fresh directory for the metric files is made when
    metrics are asked for."""
    cleanup_stale_dirs()
    if not http_options or http_options.get("metrics_export_port") is None:
        return
    path = metrics_dir()
    if path is not None:
        made = not os.path.lexists(path)
        # In the temporary directory: another user must not plant or read it.
        shm.private_dir(path)
        if made:
            metrics_files.directory_changed()


def remove():
    """At ``serve.shutdown``: the metric files go with Serve."""
    path = metrics_dir()
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)
        metrics_files.directory_changed()


# ================================================================ the proxy
class ProxyObserver:
    """What a proxy records for each request: metrics, the access log line."""

    def __init__(self, proxy, index, options):
        self.proxy = proxy
        self.index = index
        self.port = options.get("metrics_export_port")
        self.access_log = bool(options.get("access_log"))
        self.dir = metrics_dir() if self.port is not None else None
        self.latency = None
        self.children = {}
        self.exporter = None
        if self.dir is not None:
            pc = _prometheus(self.dir)
            self.latency = pc.Histogram(
                _HTTP_LATENCY, "The end-to-end latency of HTTP requests (measured from the "
                "Serve HTTP proxy).", ("method", "route", "application", "status_code"),
                buckets=LATENCY_BUCKETS_MS, registry=None)
            self.errors = pc.Counter(
                "ray_serve_num_http_error_requests", "The number of non-200 HTTP responses.",
                ("route", "error_code", "method", "application"), registry=None)
            self.deployment_errors = pc.Counter(
                "ray_serve_num_deployment_http_error_requests",
                "The number of non-200 HTTP responses returned by each deployment.",
                ("deployment", "error_code", "method", "route", "application"), registry=None)
        # The proxy's own methods, wrapped on this instance only.
        dispatch = proxy.dispatch
        stream = proxy._stream

        def timed_dispatch(conn, req):
            req.t0 = _monotonic()
            dispatch(conn, req)

        async def observed_stream(conn, req, status, headers, token, first=None):
            try:
                await stream(conn, req, status, headers, token, first)
            finally:
                self.done(conn, req, status)
        proxy.dispatch = timed_dispatch
        proxy._stream = observed_stream

    def start(self, base):
        """The proxy starts serving: the first one serves the metrics of all of
        Serve's processes; the class of its connections is ``base`` (its
        HttpConnection) recording each answer."""
        if self.dir is not None and self.index == 0:
            # Bound now: a scrape right after serve.start() waits in the backlog.
            host = self.proxy.host
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            try:
                sock = socket.create_server((host, int(self.port)), family=family)
            except OSError as exc:
                print(f"Serve: cannot serve metrics on port {self.port}: {exc}",
                      file=sys.stderr, flush=True)
            else:
                self.proxy.loop.create_task(self._serve_metrics(sock))
        done = self.done

        class ObservedConnection(base):
            __slots__ = ()

            def respond(self, req, status, headers, body, close=False):
                done(self, req, status)
                base.respond(self, req, status, headers, body, close)
        return ObservedConnection

    def done(self, conn, req, status):
        """An HTTP answer went out (``status``, an int)."""
        self._record(conn, req, req.method, status, status >= 400)

    def websocket_ended(self, conn, req, code):
        """A WebSocket accepted by its app ended with close ``code``: a
        request of method "WS" whose status is that code, an error unless it
        is 1000 (normal) or 1001 (going away), as Ray's proxy counts them."""
        self._record(conn, req, "WS", code, code not in (1000, 1001))

    def _record(self, conn, req, method, status, error):
        t0 = req.t0
        ms = (_monotonic() - t0) * 1000.0 if t0 is not None else 0.0   # (None: not dispatched)
        route = req.route
        if self.latency is not None:
            # The error first: the request count is read off the latency
            # histogram, and a scrape (another process reading the metric
            # files meanwhile) must never find a request counted whose
            # error is not yet.
            if error:
                self._error(route, method, status)
            key = (route, method, status)
            child = self.children.get(key)
            if child is None:
                child = self.children[key] = self._child(route, method, status)
            child.observe(ms)
        if self.access_log:
            url = req.url
            path = url[0] if type(url) is tuple else url.decode("utf-8", "replace")
            print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} proxy {self.index} {conn.client} "
                  f"{method} {path} {status} {ms:.1f}ms", file=sys.stderr, flush=True)

    def _child(self, route, method, status):
        prefix, app = (route.prefix, route.app) if route is not None else ("", "")
        return self.latency.labels(method, prefix, app, str(status))

    def _error(self, route, method, status):
        prefix, app, dep = (route.prefix, route.app, route.deployment) if route is not None \
            else ("", "", "")
        self.errors.labels(prefix, str(status), method, app).inc()
        if route is not None:
            self.deployment_errors.labels(dep, str(status), method, prefix, app).inc()

    # ------------------------------------------------------- the exporter
    async def _serve_metrics(self, sock):
        self.exporter = await asyncio.start_server(self._scrape, sock=sock)

    async def _scrape(self, reader, writer):
        try:
            try:
                await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                    asyncio.TimeoutError, ConnectionError):
                return
            from prometheus_client import CONTENT_TYPE_LATEST
            try:
                body = scrape(self.dir)
                head = b"HTTP/1.1 200 OK\r\ncontent-type: " + CONTENT_TYPE_LATEST.encode()
            except Exception as exc:    # noqa: BLE001 - the scraper gets an answer, not a reset
                body = f"could not read the metric files: {exc!r}\n".encode()
                head = b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain"
            writer.write(head + b"\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
                         % len(body) + body)
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()


def scrape(path):
    """The Prometheus text of every process's metric files in ``path``."""
    pc = _prometheus(path)
    from prometheus_client import multiprocess
    from prometheus_client.core import CounterMetricFamily
    _forget_dead_processes(path, multiprocess)
    # A process that is starting (a replica, a proxy) creates its file and
    # then sizes it: a scrape in between finds it empty, which
    # prometheus_client cannot read.  Such a file holds no sample yet.
    files = [f for f in glob.glob(os.path.join(path, "*.db")) if _has_header(f)]

    class WithCounts:
        def collect(self):
            for family in multiprocess.MultiProcessCollector.merge(files, accumulate=True):
                yield family
                derived = _COUNTS_OF.get(family.name)
                if derived is None:
                    continue
                counts = CounterMetricFamily(derived[0], derived[1],
                                             labels=None)
                for s in family.samples:
                    if s.name.endswith("_count"):
                        counts.add_sample(derived[0] + "_total", s.labels, s.value)
                yield counts

    registry = pc.CollectorRegistry()
    registry.register(WithCounts())
    return pc.generate_latest(registry)


def _has_header(f):
    try:
        return os.path.getsize(f) >= 8
    except OSError:     # gone meanwhile (a dead process's file)
        return False


def _forget_dead_processes(path, multiprocess):
    """A dead replica's gauges ("live" modes) leave the sum: its files go."""
    for name in os.listdir(path):
        if name.startswith("gauge_live") and name.endswith(".db"):
            try:
                pid = int(name[:-3].rsplit("_", 1)[1])
                os.kill(pid, 0)
            except ProcessLookupError:
                multiprocess.mark_process_dead(pid, path)
            except (ValueError, PermissionError):
                pass


# ============================================================== the replica
class ReplicaObserver:
    """A replica's metrics: its start, its requests' latency and errors, and
    (sampled) how many it runs at once."""

    def __init__(self, replica, path):
        self.replica = replica
        pc = _prometheus(path)
        labels = (replica._deployment, replica._id, replica._app)
        pc.Counter("ray_serve_deployment_replica_starts",
                   "The number of times this replica has been restarted due to failure.",
                   ("deployment", "replica", "application"), registry=None).labels(*labels).inc()
        self.processing = pc.Gauge(
            "ray_serve_replica_processing_queries", "The current number of queries being "
            "processed.", ("deployment", "replica", "application"), registry=None,
            multiprocess_mode="livesum").labels(*labels)
        self.processing.set(0)
        self.latency = pc.Histogram(
            _DEPLOYMENT_LATENCY, "The latency for queries to be processed.",
            ("deployment", "replica", "route", "application"), buckets=LATENCY_BUCKETS_MS,
            registry=None)
        self.errors = pc.Counter(
            "ray_serve_deployment_error_counter",
            "The number of exceptions that have occurred in this deployment.",
            ("deployment", "replica", "route", "application"), registry=None)
        self.labels = labels
        self.children = {}
        self.sampled = 0
        self.timer = None

    def child(self, route):
        c = self.children.get(route)
        if c is None:
            d, r, a = self.labels
            c = self.children[route] = (self.latency.labels(d, r, route, a),
                                        self.errors.labels(d, r, route, a))
        return c

    def sample(self):
        n = self.replica._inflight
        if n != self.sampled:
            self.sampled = n
            self.processing.set(n)
        self.timer = asyncio.get_running_loop().call_later(SAMPLE_S, self.sample)

    def wrap(self):
        """Wrap the replica's HTTP and handle entry points on its instance."""
        rep = self.replica
        http = rep.handle_http
        call = rep.handle_request

        async def handle_http(method, path, query, headers, body, client, root_path,
                              http_version, server, lone=False):
            latency, errors = self.child(root_path or "/")
            t0 = _monotonic()
            try:
                r = await http(method, path, query, headers, body, client, root_path,
                               http_version, server, lone)
            except BaseException:
                errors.inc()
                raise
            latency.observe((_monotonic() - t0) * 1000.0)
            if r[0] >= 500:
                errors.inc()
            return r

        async def handle_request(method, args, kwargs, meta=None):
            latency, errors = self.child("")
            t0 = _monotonic()
            try:
                r = await call(method, args, kwargs, meta)
            except BaseException:
                errors.inc()
                raise
            latency.observe((_monotonic() - t0) * 1000.0)
            return r
        rep.handle_http = handle_http
        rep.handle_request = handle_request


def observe_replica(replica):
    """Metrics for ``replica`` if Serve exports them (its directory exists),
    else None: one look at the file system when a replica starts."""
    path = metrics_dir()
    if path is None or not os.path.isdir(path):
        return None
    try:
        obs = ReplicaObserver(replica, path)
    except ImportError:
        return None
    obs.wrap()
    try:
        asyncio.get_event_loop().call_soon(obs.sample)
    except RuntimeError:
        pass
    return obs


def observe_proxy(proxy, index, options):
    """A ``ProxyObserver`` if metrics or the access log are asked for, else None."""
    if options.get("metrics_export_port") is None and not options.get("access_log"):
        return None
    return ProxyObserver(proxy, index, options)
