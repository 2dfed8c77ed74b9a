"""``ray-lite serve run module:app|module:builder [key=value ...]``.

The target is an ``Application`` (``Deployment.bind()``), a ``Deployment``,
or a builder function called with the ``key=value`` arguments as a dict (as
``serve run`` does in Ray).  Ctrl-C, SIGTERM or SIGHUP shuts Serve down
cleanly (draining requests in flight); a second one stops it at once.
"""
import argparse
import importlib
import os
import signal
import sys
import threading

from ._defaults import HTTP_HOST, HTTP_PORT


def _parser():
    p = argparse.ArgumentParser(prog="ray-lite serve", description="Run Serve applications.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    r = sub.add_parser("run", help="deploy an application and serve it until interrupted")
    r.add_argument("target", help="module:attribute: an Application, a Deployment, or a "
                                   "builder function taking a dict of arguments")
    r.add_argument("args", nargs="*", metavar="key=value", help="arguments of a builder")
    r.add_argument("--app-dir", "-d", default=".", help="directory to import the module from "
                                                        "(default: the current directory)")
    r.add_argument("--host", default=HTTP_HOST, help=f"address to bind (default {HTTP_HOST})")
    r.add_argument("--port", "-p", type=int, default=HTTP_PORT,
                   help=f"port (default {HTTP_PORT})")
    r.add_argument("--route-prefix", default="/", help="route prefix (default /)")
    r.add_argument("--name", default="default", help="application name (default: default)")
    r.add_argument("--proxies", type=int, default=0,
                   help="HTTP proxy processes sharing the port (default: one per core)")
    r.add_argument("--num-cpus", type=int, default=None, help="ray_lite.init(num_cpus=...)")
    r.add_argument("--metrics-export-port", "--metrics-port", type=int, default=None,
                   help="serve Prometheus metrics on this port (default: none)")
    r.add_argument("--access-log", action="store_true",
                   help="a line per request on standard error")
    return p


def load_target(target, args, app_dir="."):
    """The ``Application`` that ``target`` ("module:attr") names, built with ``args``."""
    from .deployment import Application, Deployment
    if ":" not in target:
        raise ValueError(f"target must be module:attribute, got {target!r}")
    module_name, attr = target.split(":", 1)
    path = os.path.abspath(app_dir)
    if path not in sys.path:
        sys.path.insert(0, path)
    obj = getattr(importlib.import_module(module_name), attr)
    if isinstance(obj, Application):
        if args:
            raise ValueError("arguments were given but the target is an Application, not a "
                             "builder function")
        return obj
    if isinstance(obj, Deployment):
        return obj.bind()
    if callable(obj):
        app = obj(dict(args))
        if isinstance(app, Deployment):
            app = app.bind()
        if not isinstance(app, Application):
            raise TypeError(f"the builder {target} returned {type(app).__name__}, "
                            f"not an Application")
        return app
    raise TypeError(f"{target} is a {type(obj).__name__}, not an Application or a builder")


def _parse_kv(items):
    out = []
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise ValueError(f"arguments must be key=value, got {item!r}")
        out.append((k, v))
    return out


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _as_sigint(signum, frame):
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)


def main(argv=None):
    args = _parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    import ray_lite as ray
    from ray_lite import serve
    try:
        app = load_target(args.target, _parse_kv(args.args), args.app_dir)
    except Exception as exc:   # noqa: BLE001 - a user error: say it, exit non-zero
        print(f"ray-lite serve: cannot load {args.target}: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return 1

    # Whatever was inherited (a script that starts us in the background
    # leaves SIGINT ignored): Ctrl-C, SIGTERM and SIGHUP stop Serve.  SIGINT
    # gets Python's handler, which init() then makes safe for the runtime;
    # the others go through whatever handles SIGINT.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in _STOP_SIGNALS[1:]:
        signal.signal(signum, _as_sigint)
    stop = threading.Event()
    try:
        ray.init(num_cpus=args.num_cpus)
        opts = {"host": args.host, "port": args.port}
        if args.proxies:
            opts["proxies"] = args.proxies
        if args.metrics_export_port is not None:
            opts["metrics_export_port"] = args.metrics_export_port
        if args.access_log:
            opts["access_log"] = True
        from .api import _ensure_controller, _http_port
        prefix = None if args.route_prefix in ("None", "none", "") else args.route_prefix
        if prefix is None:
            serve.start(http_options=opts)
        else:
            # serve.run starts the proxies (with these options) while it
            # starts the replicas, instead of one after the other.
            _ensure_controller(opts)
        serve.run(app, name=args.name, route_prefix=prefix)
        port = _http_port()
        print(f"ray-lite serve: application {args.name!r} running at "
              f"http://{args.host}:{port}{prefix or ''}", flush=True)
        while not stop.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        try:
            try:
                print("ray-lite serve: shutting down", flush=True)
                serve.shutdown()
            except KeyboardInterrupt:
                # Asked again while draining: stop at once.
                print("ray-lite serve: interrupted again, stopping without draining",
                      flush=True)
        finally:
            for signum in _STOP_SIGNALS:
                signal.signal(signum, signal.SIG_IGN)
            ray.shutdown()
        print("ray-lite serve: shut down", flush=True)
    return 0
