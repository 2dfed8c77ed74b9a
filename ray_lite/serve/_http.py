"""HTTP's fixed text, in one place: status lines, reason phrases, and the
header lines the replica puts on the answers it builds, and the log line of
an answer refused for a header that may not be sent."""
import sys

REASONS = {100: "Continue", 200: "OK", 201: "Created", 202: "Accepted", 204: "No Content",
           301: "Moved Permanently", 302: "Found", 304: "Not Modified",
           307: "Temporary Redirect", 400: "Bad Request", 401: "Unauthorized",
           403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
           408: "Request Timeout", 413: "Content Too Large", 414: "URI Too Long",
           422: "Unprocessable Entity", 429: "Too Many Requests",
           431: "Request Header Fields Too Large", 500: "Internal Server Error",
           503: "Service Unavailable", 505: "HTTP Version Not Supported"}

_STATUS_LINES = {}


def status_line(status):
    """``HTTP/1.1 <status> <reason>\\r\\n`` as bytes (made once per status)."""
    line = _STATUS_LINES.get(status)
    if line is None:
        line = _STATUS_LINES[status] = (
            f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}\r\n".encode())
    return line


TEXT = b"content-type: text/plain; charset=utf-8\r\n"
JSON = b"content-type: application/json\r\n"
OCTET = b"content-type: application/octet-stream\r\n"
CONNECTION_CLOSE = b"connection: close\r\n"
CONNECTION_KEEP_ALIVE = b"connection: keep-alive\r\n"


def sized(ctype, body):
    """The content-type line ``ctype`` and the content-length of ``body``."""
    return ctype + b"content-length: " + str(len(body)).encode() + b"\r\n"


def text_answer(status, text=None):
    """``(header block, body)`` of a plain-text answer (the reason phrase by default)."""
    body = (text or REASONS.get(status, "Error")).encode()
    return sized(TEXT, body), body


# ------------------------------------------------------------ HTTPOptions
class HTTPOptions:
    """Ray Serve's ``HTTPOptions`` (``serve.start(http_options=HTTPOptions(...))``
    or the same keys in a dict).  Ray's fields: ``host``, ``port``,
    ``request_timeout_s`` (a request not answered by then gets 408 and is
    cancelled in its replica), ``keep_alive_timeout_s``.  ray_lite's own:
    ``proxies`` (processes sharing the port), ``max_body_size``,
    ``metrics_export_port`` (Prometheus text on that port, as Ray's
    ``--metrics-export-port``), ``access_log`` (a line per request on
    standard error), ``direct_ingress`` (the ingress replicas take HTTP
    themselves, see _direct; Ray's switch is ``RAY_SERVE_ENABLE_DIRECT_INGRESS``)
    and ``direct_ingress_listeners`` (how many of them listen; default: the
    cores)."""

    FIELDS = ("host", "port", "request_timeout_s", "keep_alive_timeout_s", "proxies",
              "max_body_size", "metrics_export_port", "access_log", "direct_ingress",
              "direct_ingress_listeners")

    def __init__(self, host=None, port=None, request_timeout_s=None,
                 keep_alive_timeout_s=None, proxies=None, max_body_size=None,
                 metrics_export_port=None, access_log=None, direct_ingress=None,
                 direct_ingress_listeners=None, **ray_only):
        # Ray's fields that mean nothing on one machine (location, num_cpus,
        # root_url, middlewares...) are accepted and ignored.
        from ._defaults import HTTP_HOST, HTTP_PORT, KEEP_ALIVE_TIMEOUT_S
        self.host = HTTP_HOST if host is None else host
        self.port = HTTP_PORT if port is None else int(port)
        self.request_timeout_s = request_timeout_s
        self.keep_alive_timeout_s = (KEEP_ALIVE_TIMEOUT_S if keep_alive_timeout_s is None
                                     else keep_alive_timeout_s)
        self.proxies = proxies
        self.max_body_size = max_body_size
        self.metrics_export_port = metrics_export_port
        self.access_log = access_log
        self.direct_ingress = direct_ingress
        self.direct_ingress_listeners = check_listeners(direct_ingress_listeners)
        for name in ray_only:
            if name not in _RAY_ONLY_FIELDS:
                raise TypeError(f"HTTPOptions got an unexpected field {name!r}")

    def to_dict(self):
        return {k: getattr(self, k) for k in self.FIELDS if getattr(self, k) is not None}

    def __repr__(self):
        return f"HTTPOptions({self.to_dict()!r})"


def check_listeners(n):
    """``direct_ingress_listeners``: None (the default) or a whole number >= 1."""
    if n is None:
        return None
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"http_options: direct_ingress_listeners must be a whole number "
                         f">= 1, not {n!r}")
    return n


_RAY_ONLY_FIELDS = ("location", "num_cpus", "root_url", "root_path", "middlewares",
                    "ssl_keyfile", "ssl_certfile", "ssl_keyfile_password", "ssl_ca_certs")


# --------------------------------------------- the proxy's own /-/ paths
NO_ROUTES = "Route table is not populated yet."
DRAINING = "This node is being drained."


def control_answer(proxy, conn, req, path):
    """Answer the proxy's ``/-/healthz`` and ``/-/routes`` as Ray does (True);
    False for any other path, which goes to the applications like every other."""
    answer = _control_answer(proxy, path)
    if answer is None:
        return False
    conn.respond(req, *answer)
    return True


def _control_answer(proxy, path):
    if path == "/-/healthz":
        if proxy.stopping:
            return (503,) + text_answer(503, DRAINING)
        if not proxy.routes:
            return (503,) + text_answer(503, NO_ROUTES)
        return (200,) + text_answer(200, "success")
    if path == "/-/routes":
        if proxy.version < 0:
            return (503,) + text_answer(503, NO_ROUTES)
        import json
        body = json.dumps({r.prefix: r.app for r in proxy.routes}).encode()
        return 200, sized(JSON, body), body
    return None


def check_route_prefix(route_prefix):
    """Refuse a route prefix Ray Serve refuses (``ValueError``): one that does
    not start with '/', ends with '/' (but "/" itself), or holds a wildcard."""
    if route_prefix is None:
        return
    # Ray Serve's words, which programs and tests match.
    if not isinstance(route_prefix, str) or not route_prefix.startswith("/"):
        raise ValueError(f"Invalid route_prefix '{route_prefix}', must start with a forward "
                         f"slash ('/').")
    if route_prefix != "/" and route_prefix.endswith("/"):
        raise ValueError(f"Invalid route_prefix '{route_prefix}', may not end with a "
                         f"trailing '/'.")
    if "{" in route_prefix or "}" in route_prefix:
        raise ValueError(f"Invalid route_prefix '{route_prefix}', may not contain wildcards.")


def refused_header(req, name):
    """An answer held a header that may not be sent: the client gets a 500,
    the log says which header (as uvicorn and h11 refuse one)."""
    print(f"proxy: the answer to {req.method} {_target(req)} was refused: invalid HTTP "
          f"header {name!r} (a name that is not a token, or a control byte such as CR, "
          f"LF or NUL in its value); answered 500 instead", file=sys.stderr, flush=True)


def _target(req):
    url = req.url
    if type(url) is tuple:      # (path, query) once routed
        return url[0]
    return bytes(url[:200]).decode("latin-1")
