"""``ray-lite serve``: run, start, deploy, status, shutdown (Ray Serve's CLI).

- ``run module:app|module:builder [key=value ...]`` or ``run config.yaml``:
  deploy and serve until interrupted.  The target is an ``Application``, a
  ``Deployment``, a builder function called with the ``key=value`` arguments
  as a dict (as ``serve run`` does in Ray), or a Serve config file.
- ``start``: Serve with no application yet (``serve deploy`` adds them).
- ``deploy config.yaml``: apply a config file to a running instance.
- ``status``: its applications, deployments and replicas, as Ray prints them.
- ``shutdown -y``: stop a running instance.

``run`` and ``start`` listen on a local control socket (``_control``) that
the other commands reach.  Ctrl-C, SIGTERM or SIGHUP shuts Serve down cleanly
(draining requests in flight); a second one stops it at once.
"""
import argparse
import concurrent.futures
import os
import queue
import signal
import sys

from ._defaults import HTTP_HOST, HTTP_PORT


def _parser():
    p = argparse.ArgumentParser(prog="ray-lite serve", description="Run Serve applications.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    r = sub.add_parser("run", help="deploy an application (or a config file) and serve it "
                                   "until interrupted")
    r.add_argument("target", help="module:attribute (an Application, a Deployment, or a "
                                  "builder function taking a dict of arguments), or a "
                                  "Serve config file (.yaml)")
    r.add_argument("args", nargs="*", metavar="key=value", help="arguments of a builder")
    r.add_argument("--route-prefix", default="/", help="route prefix (default /)")
    r.add_argument("--name", default="default", help="application name (default: default)")
    s = sub.add_parser("start", help="start Serve with no application (see deploy)")
    for q in (r, s):
        q.add_argument("--app-dir", "-d", default=".",
                       help="directory to import modules from (default: the current one)")
        q.add_argument("--host", default=None,
                       help=f"address to bind (default {HTTP_HOST}, or the config file's)")
        q.add_argument("--port", "-p", type=int, default=None,
                       help=f"port (default {HTTP_PORT}, or the config file's)")
        q.add_argument("--proxies", type=int, default=0,
                       help="HTTP proxy processes sharing the port (default: one per core, and 2)")
        q.add_argument("--num-cpus", type=int, default=None, help="ray_lite.init(num_cpus=...)")
        q.add_argument("--metrics-export-port", "--metrics-port", type=int, default=None,
                       help="serve Prometheus metrics on this port (default: none)")
        q.add_argument("--access-log", action="store_true",
                       help="a line per request on standard error")
    d = sub.add_parser("deploy", help="apply a config file to a running instance")
    d.add_argument("config", help="a Serve config file (.yaml)")
    d.add_argument("--app-dir", "-d", default=None,
                   help="directory to import modules from (default: the current one)")
    st = sub.add_parser("status", help="print the applications of a running instance")
    sh = sub.add_parser("shutdown", help="stop a running instance")
    sh.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    for q in (r, s, d, st, sh):
        q.add_argument("--address", "-a", default=None,
                       help="the instance's control socket (default: run/start make one in "
                            "the user's runtime directory; the others use the one running "
                            "there)")
    return p


def load_target(target, args, app_dir="."):
    """The ``Application`` that ``target`` ("module:attr") names, built with ``args``."""
    from .config import application_of, import_attr
    if ":" not in target:
        raise ValueError(f"target must be module:attribute, got {target!r}")
    return application_of(import_attr(target, app_dir), args, target)


def _parse_kv(items):
    out = []
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise ValueError(f"arguments must be key=value, got {item!r}")
        out.append((k, v))
    return out


def _is_config_file(target):
    return target.endswith((".yaml", ".yml", ".json")) or \
        (":" not in target and os.path.isfile(target))


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _as_sigint(signum, frame):
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)


def _say(msg, err=False):
    print(f"ray-lite serve: {msg}", file=sys.stderr if err else sys.stdout, flush=True)


def main(argv=None):
    args = _parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    if args.command in ("run", "start"):
        return _run(args)
    from . import _control
    try:
        address = _control.find_address(args.address)
        if args.command == "status":
            return _status(address)
        if args.command == "deploy":
            return _deploy(address, args)
        return _shutdown(address, args.yes)
    except _control.ControlError as exc:
        _say(str(exc), err=True)
        return 1


# --------------------------------------------------------------- clients
def _status(address):
    from . import _control
    answer = _control.request(address, {"op": "status"}, timeout=60)
    if "error" in answer:
        _say(answer["error"], err=True)
        return 1
    print(format_status(answer["status"]), end="")
    return 0


def _deploy(address, args):
    from . import _control, config
    try:
        raw = config.read(args.config)
        config.parse(raw)       # refused here, before reaching the instance
    except config.ConfigError as exc:
        _say(f"{args.config}: {exc}", err=True)
        return 1
    answer = _control.request(address, {"op": "deploy", "config": raw,
                                        "app_dir": os.path.abspath(args.app_dir or ".")})
    for note in answer.get("notes") or []:
        _say(f"note: {note}")
    if "error" in answer:
        _say(f"{args.config}: {answer['error']}", err=True)
        return 1
    _say(f"deployed {args.config}: {', '.join(answer['applications']) or 'no applications'}")
    return 0


def _shutdown(address, yes):
    from . import _control
    if not yes:
        if not sys.stdin.isatty():
            _say("refusing to shut down without confirmation: pass -y", err=True)
            return 1
        if input(f"Shut down the Serve instance at {address}? [y/N] ").strip().lower() \
                not in ("y", "yes"):
            return 1
    answer = _control.request(address, {"op": "shutdown"})
    if "error" in answer:
        _say(answer["error"], err=True)
        return 1
    _say("shut down the instance at " + address)
    return 0


def format_status(st):
    """The controller's ``status()`` as Ray's ``serve status`` prints it."""
    lines = ["proxies:"]
    lines += [f"  {node}: {status}" for node, status in (st.get("proxies") or {}).items()] \
        or ["  {}"]       # Ray's: node id -> the node's proxy status
    apps = st.get("applications") or {}
    if not apps:
        lines.append("applications: {}")
    else:
        lines.append("applications:")
    for name, a in apps.items():
        lines += [f"  {name}:", f"    status: {a['status']}",
                  f"    message: {_quote(a['message'])}",
                  f"    route_prefix: {a['route_prefix'] or 'null'}", "    deployments:"]
        for dname, d in a["deployments"].items():
            lines += [f"      {dname}:", f"        status: {d['status']}"]
            states = d["replica_states"]
            lines.append("        replica_states:" + ("" if states else " {}"))
            lines += [f"          {k}: {v}" for k, v in states.items()]
            lines.append(f"        message: {_quote(d['message'])}")
    lines.append("target_capacity: null")
    return "\n".join(lines) + "\n"


def _quote(text):
    return "''" if not text else repr(str(text).replace("\n", " "))


def _error_line(exc):
    """What a failed start says: Serve's own error (the port is taken, a bad
    option) as its message alone; anything else (a deployment's constructor
    raised) with the remote traceback that locates it."""
    from .exceptions import RayServeException
    cause = getattr(exc, "cause", None)
    if isinstance(cause, RayServeException):
        exc = cause
    return f"{type(exc).__name__}: {exc}"


# --------------------------------------------------------------- servers
def _run(args):
    import ray_lite as ray
    from ray_lite import serve

    from . import _control, config
    parsed = app = None
    try:
        if args.command == "start":
            pass
        elif _is_config_file(args.target):
            if args.args:
                raise config.ConfigError("key=value arguments go into the config file's args")
            parsed = config.load(args.target)
        else:
            app = load_target(args.target, _parse_kv(args.args), args.app_dir)
    except Exception as exc:   # noqa: BLE001 - a user error: say it, exit non-zero
        what = getattr(args, "target", "")
        _say(f"cannot load {what}: {type(exc).__name__}: {exc}", err=True)
        return 1
    opts = dict(parsed["http_options"]) if parsed else {}
    for note in (parsed or {}).get("notes", []):
        _say(f"note: {note}")
    opts["host"] = args.host or opts.get("host") or HTTP_HOST
    opts["port"] = args.port if args.port is not None else opts.get("port", HTTP_PORT)
    if args.proxies:
        opts["proxies"] = args.proxies
    if args.metrics_export_port is not None:
        opts["metrics_export_port"] = args.metrics_export_port
    if args.access_log:
        opts["access_log"] = True

    # Whatever was inherited (a script that starts us in the background
    # leaves SIGINT ignored): Ctrl-C, SIGTERM and SIGHUP stop Serve.  SIGINT
    # gets Python's handler, which init() then makes safe for the runtime;
    # the others go through whatever handles SIGINT.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in _STOP_SIGNALS[1:]:
        signal.signal(signum, _as_sigint)
    requests = queue.Queue()
    server = None
    shutdown_reply = None
    code = 0
    try:
        server = _control.ControlServer(args.address or _control.default_address(),
                                        lambda msg: _ask_main(requests, msg))
        ray.init(num_cpus=args.num_cpus)
        from .api import _ensure_controller, _http_port
        if app is not None and args.route_prefix not in ("None", "none", ""):
            # serve.run starts the proxies (with these options) while it
            # starts the replicas, instead of one after the other.
            _ensure_controller(opts)
            prefix = args.route_prefix
            serve.run(app, name=args.name, route_prefix=prefix)
            where = f"application {args.name!r} running at http://{opts['host']}:" \
                    f"{_http_port()}{prefix}"
        else:
            serve.start(http_options=opts,
                        controller_options=(parsed or {}).get("controller_options"))
            if app is not None:
                serve.run(app, name=args.name, route_prefix=None)
            elif parsed is not None:
                config.apply(parsed, args.app_dir)
            names = [a["name"] for a in parsed["applications"]] if parsed else \
                [args.name] if app is not None else []
            where = (f"applications {', '.join(names)} " if names else "Serve ") + \
                f"running at http://{opts['host']}:{_http_port()}"
        _say(f"{where} (control: {server.address})")
        shutdown_reply = _serve_requests(requests)
    except KeyboardInterrupt:
        pass
    except Exception as exc:   # noqa: BLE001 - the deployment's or the port's error
        _say(_error_line(exc), err=True)
        code = 1
    finally:
        try:
            try:
                _say("shutting down")
                if server is not None:
                    server.close()
                _refuse_waiting(requests)
                serve.shutdown()
            except KeyboardInterrupt:
                # Asked again while draining: stop at once.
                _say("interrupted again, stopping without draining")
        finally:
            for signum in _STOP_SIGNALS:
                signal.signal(signum, signal.SIG_IGN)
            ray.shutdown()
            if shutdown_reply is not None:
                shutdown_reply.set_result({"ok": True})
                server.join()       # the answer is sent before this process exits
        _say("shut down")
    return code


def _ask_main(requests, msg):
    """On the control server's thread: have the main thread answer ``msg``
    (the runtime's calls are made from the thread that started it)."""
    fut = concurrent.futures.Future()
    requests.put((msg, fut))
    return fut.result()


def _refuse_waiting(requests):
    while True:
        try:
            _, fut = requests.get_nowait()
        except queue.Empty:
            return
        fut.set_result({"error": "the Serve instance is shutting down"})


def _serve_requests(requests):
    """Answer control requests until one asks to shut down (its reply future)."""
    while True:
        try:
            msg, fut = requests.get(timeout=1.0)     # wakes for Ctrl-C too
        except queue.Empty:
            continue
        op = msg.get("op") if isinstance(msg, dict) else None
        if op == "shutdown":
            return fut
        try:
            fut.set_result(_answer(op, msg))
        except Exception as exc:   # noqa: BLE001 - the client prints it
            fut.set_result({"error": f"{type(exc).__name__}: {exc}"})


def _answer(op, msg):
    from . import api, config
    if op == "status":
        ctl = api._controller_or_none()
        # (_ask: asked again if the controller is restarting.)
        st = api._ask(ctl, "status") if ctl is not None else \
            {"applications": {}, "http_port": None, "proxies": {}}
        return {"status": st}
    if op == "deploy":
        try:
            parsed = config.parse(msg.get("config"))
            notes = list(parsed["notes"])
            if parsed["http_options"]:
                notes.append("http_options are set when Serve starts: a running instance "
                             "keeps its own")
            names = config.apply(parsed, msg.get("app_dir") or ".")
        except config.ConfigError as exc:
            return {"error": str(exc)}
        return {"ok": True, "applications": names, "notes": notes}
    return {"error": f"unknown request {op!r}"}
