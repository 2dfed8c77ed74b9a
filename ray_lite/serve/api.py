"""``serve.run``, ``run_many``, ``start``, ``status``, ``delete``, ``shutdown``
(and ``shutdown_async``) and the handle getters."""
import dataclasses
import inspect
import sys
import threading
import warnings

import cloudpickle

from ray_lite._private.process import backend
from ray_lite._private.api.call_options import _user_stacklevel

from . import _controller_checkpoint, _core, _defaults, _metrics, context
from ._http import HTTPOptions, check_listeners, check_route_prefix
from .deployment import Application, Deployment
from .handle import DeploymentHandle
from ._asgi import asgi_app_of_class, pickle_deployment_class
from ._autoscaling_policy import ship as ship_policy
from ._deployment_actors import pickled as pickled_actors
from ._start_options import check_start_options, controller_env_vars
from .multiplex import is_multiplexed
from .schema import ServeStatus

_lock = threading.RLock()

# The longest graceful_shutdown_timeout_s of what this process deployed: how
# long shutdown() lets requests in flight end before it forces the stop.
_longest_graceful_s = 0.0

# What the controller, proxies and replicas import: loaded once in the zygote
# (which forks them) instead of once in each of possibly dozens of replicas.
# Optional ones (uvloop: the async actors' loop when installed) are skipped
# when missing.
_WORKER_MODULES = ("ray_lite.serve", "ray_lite.serve._controller", "ray_lite.serve._replica",
                   "ray_lite.serve._proxy", "starlette.requests", "starlette.responses",
                   "httptools", "uvloop")


def _controller_or_none():
    if _core.current_node() is None:
        return None
    try:
        return context.get_controller()
    except Exception:   # noqa: BLE001 - not running
        return None


def _ensure_controller(http_options=None, controller_options=None):
    env_vars = controller_env_vars(controller_options)     # checked first, even when it runs
    if not _core.is_initialized():
        _core.init()
    ctl = _controller_or_none()
    if ctl is not None:
        if env_vars:
            warnings.warn("controller_options apply when the Serve controller starts; it "
                          "already runs, so these are ignored", stacklevel=_user_stacklevel())
        return ctl
    if not _core.is_driver():
        from .exceptions import RayServeException
        raise RayServeException("Serve is not running; start it from the driver")
    _core.preload(_WORKER_MODULES)
    _metrics.prepare(http_options)
    from ._controller import ServeController
    _controller_checkpoint.create_store()
    # Restarted whenever its process dies (until serve.shutdown kills it): the
    # new one recovers Serve from the store's checkpoint (see _controller).
    cls = _core.remote(ServeController).options(name=context.CONTROLLER_NAME,
                                               namespace=context.SERVE_NAMESPACE,
                                               get_if_exists=True, max_restarts=-1,
                                               runtime_env={"env_vars": env_vars or {}})
    ctl = cls.remote(http_options or {})
    context.set_controller(ctl)
    return ctl


def _ask(ctl, method, *args, sent=None, timeout=None):
    """The answer of the controller's ``method``; a call that its death
    failed is made again, to the controller the runtime restarts, for
    ``CONTROLLER_RESTART_WAIT_S`` at most (``sent``: the first call's ref,
    already made).  An error the method raised is the answer, even one
    about another actor's death (a proxy's, a replica's)."""
    from ray_lite.exceptions import RayActorError, RayTaskError
    wait = context.ControllerRestartWait(_defaults.CONTROLLER_RESTART_WAIT_S)
    while True:
        ref = sent if sent is not None else getattr(ctl, method).remote(*args)
        sent = None
        try:
            return _core.get(ref, timeout=timeout)
        except RayActorError as exc:
            if isinstance(exc, RayTaskError) or not wait.again():
                raise


def start(proxy_location=None, http_options=None, grpc_options=None, logging_config=None,
          tracing_config=None, controller_options=None, **kwargs):
    """Start Serve and its HTTP proxies (``http_options``: host, port, proxies,
    request_timeout_s, keep_alive_timeout_s, max_body_size), with Ray's signature.

    ``controller_options`` (a ``ControllerOptions``: the controller's
    ``env_vars``) apply if Serve was not running yet.  What ray_lite cannot
    honour is refused, naming the option: a gRPC ingress (``grpc_options``
    with servicer functions), a ``tracing_config`` that turns tracing on.
    ``logging_config`` is accepted and not applied (Serve logs to standard
    error), with a warning.
    """
    if backend.RAY:
        from . import _on_ray
        return _on_ray.start(proxy_location, http_options, grpc_options, logging_config,
                             tracing_config, controller_options, **kwargs)
    check_start_options(grpc_options, logging_config, tracing_config, kwargs)
    with _lock:
        opts = _http_options(http_options)
        ctl = _ensure_controller(opts, controller_options)
        _metrics.prepare(opts)
        if proxy_location in ("Disabled", "disabled"):
            return
        _ask(ctl, "start_proxies", opts)


def _http_options(http_options):
    if http_options is None:
        return {}
    if isinstance(http_options, dict):
        check_listeners(http_options.get("direct_ingress_listeners"))
        return dict(http_options)
    if isinstance(http_options, HTTPOptions):
        return http_options.to_dict()
    return {k: getattr(http_options, k) for k in HTTPOptions.FIELDS
            if getattr(http_options, k, None) is not None}


def _as_is(value):
    return value


class _BoundPickler(cloudpickle.Pickler):
    """Pickles a deployment's arguments with each bound deployment in them,
    at any depth (inside the user's own objects too, as Ray does), replaced
    by ``replace(app)``: its handle."""

    def __init__(self, file, replace):
        super().__init__(file, protocol=5)
        self._replace = replace

    def reducer_override(self, obj):
        if isinstance(obj, Application):
            return _as_is, (self._replace(obj),)
        return super().reducer_override(obj)


def _bound_args_blob(app, replace):
    import io
    buf = io.BytesIO()
    _BoundPickler(buf, replace).dump((list(app._args), dict(app._kwargs)))
    return buf.getvalue()


def _build(app, app_name, code_version=None, logging_config=None):
    """The deployment specs of ``app``: nested bound deployments become handles.
    ``code_version`` (a config file's: see config.apply) tells the controller
    whether the code changed where the pickled class, by reference, cannot.
    ``logging_config``: the application's, for its deployments without one."""
    from ._logging import logging_config_dict
    app_logging = logging_config_dict(logging_config, "serve.run(logging_config=...)")
    specs = {}
    seen = {}
    seen_apps = {}      # deployment name -> whether it is an @serve.ingress one

    def visit(a):
        if id(a) in seen:
            return seen[id(a)]
        dep = a.deployment
        name = dep.name
        if name in specs:
            i = 1
            while f"{name}_{i}" in specs:
                i += 1
            name = f"{name}_{i}"
        specs[name] = None
        handle = DeploymentHandle(name, app_name)
        seen[id(a)] = handle
        try:
            args_blob = _bound_args_blob(a, visit)
        except _NotSerializableError:
            raise       # a bound deployment's, named already
        except Exception as exc:   # noqa: BLE001 - the pickler's refusal, whatever its type
            refusal = _not_serializable_args(name, a)
            if refusal is None:
                raise       # not an argument's (a bound deployment's options, say)
            raise refusal from None
        args, kwargs = cloudpickle.loads(args_blob)
        config = dep.full_config()
        auto = config.get("autoscaling_config")
        if auto and auto.get("policy"):
            config["autoscaling_config"] = dict(auto, policy=ship_policy(auto["policy"]))
        if app_logging is not None and config.get("logging_config") is None:
            config["logging_config"] = app_logging
        if inspect.isclass(dep.func_or_class) and is_multiplexed(dep.func_or_class):
            config["multiplexed"] = True      # its callers route by model id
        seen_apps[name] = asgi_app_of_class(dep.func_or_class) is not None
        actors = dep._config.get("deployment_actors")
        try:
            cls_blob = pickle_deployment_class(dep.func_or_class)
        except Exception as exc:   # noqa: BLE001 - the pickler's refusal, whatever its type
            raise _not_serializable_code(name, dep.func_or_class, exc) from None
        specs[name] = {"cls_blob": cls_blob, "args": args,
                       "kwargs": kwargs, "args_blob": args_blob, "config": config,
                       "code_version": code_version,
                       "actors_blob": pickled_actors(actors) if actors else None}
        return handle

    ingress = visit(app)
    ingresses = [n for n, a in seen_apps.items() if a]
    if len(ingresses) > 1:
        from .exceptions import RayServeException
        raise RayServeException(   # Ray's words
            f'Found multiple FastAPI deployments in application "{app_name}". Please only '
            f"include one deployment with @serve.ingress in your application to avoid this "
            f"issue.")
    return ingress.deployment_name, specs


class _NotSerializableError(TypeError):
    """A deployment's code or constructor arguments cannot be serialised
    (a ``TypeError``, as Ray Serve raises; the message names the deployment)."""


def _not_serializable_code(name, func_or_class, exc):
    what = "class" if inspect.isclass(func_or_class) else "function"
    return _NotSerializableError(
        f"Could not serialize deployment {name!r}: its {what} "
        f"{getattr(func_or_class, '__qualname__', func_or_class)!r} captures something that "
        f"cannot be pickled ({exc}){_culprits(func_or_class, name)}. Create it inside the "
        f"{what} (in __init__, say) instead of capturing it.")


def _not_serializable_args(name, app):
    """The error for ``app``'s constructor arguments, naming each that fails
    (a bound deployment in them counts as its handle); None if none does."""
    import io
    failing = []
    named = [(f"argument {i}", v) for i, v in enumerate(app._args)] + \
        [(f"keyword argument {k!r}", v) for k, v in app._kwargs.items()]
    for label, value in named:
        try:
            _BoundPickler(io.BytesIO(), _as_none).dump(value)
        except Exception as err:   # noqa: BLE001 - this one fails
            failing.append(f"{label} ({err}){_culprits(value, label.rsplit(' ', 1)[-1])}")
    if not failing:
        return None
    return _NotSerializableError(
        f"Could not serialize the init args of deployment {name!r}: {'; '.join(failing)}. "
        f"Pass what the deployment needs to create it instead (a lock, a connection, an "
        f"open file cannot be sent to its replicas).")


def _as_none(app):
    return None


def _culprits(obj, name):
    """``": found in: a -> b"``: the parts of ``obj`` that do not pickle
    (``inspect_serializability``), or "" when none is singled out."""
    import io
    from ray_lite.util.check_serialize import inspect_serializability
    try:
        _, failures = inspect_serializability(obj, name=name, print_file=io.StringIO())
    except Exception:   # noqa: BLE001 - the message goes without it
        return ""
    paths = sorted(" -> ".join(str(p) for p in f.path) for f in failures if len(f.path) > 1)
    return f"; found in: {', '.join(paths)}" if paths else ""


@dataclasses.dataclass
class RunTarget:
    """One application of ``run_many``: Ray's fields."""
    target: Application
    name: str = "default"
    route_prefix: "str | None" = "/"
    logging_config: object = None
    external_scaler_enabled: bool = False


def run(target, blocking=False, name="default", route_prefix="/", logging_config=None,
        _local_testing_mode=False, external_scaler_enabled=False, controller_options=None, *,
        _code_version=None):
    """Deploy ``target`` (an ``Application``) as ``name``; return its ingress
    handle (Ray's signature).  ``controller_options`` apply if this starts Serve."""
    if backend.RAY:
        from . import _on_ray
        return _on_ray.run(target, blocking=blocking, name=name, route_prefix=route_prefix,
                           logging_config=logging_config,
                           external_scaler_enabled=external_scaler_enabled,
                           controller_options=controller_options)
    (handle,) = _deploy([RunTarget(target, name, route_prefix, logging_config,
                                   external_scaler_enabled)],
                        _code_version, controller_options=controller_options)
    if blocking:
        _block_forever()
    return handle


def run_many(targets, blocking=False, wait_for_ingress_deployment_creation=True,
             wait_for_applications_running=True, _local_testing_mode=False,
             controller_options=None):
    """Deploy several applications (``RunTarget``s) in one call; their ingress
    handles, in order (Ray's signature).  It returns once every application
    runs (the ``wait_for_*`` flags are accepted; the deployment is always
    waited for); ``blocking`` then waits for ever, as ``run``'s does."""
    targets = list(targets)
    if not targets:
        raise ValueError("No applications provided.")     # Ray's words
    for t in targets:
        if not isinstance(t, RunTarget):
            raise TypeError(f"serve.run_many expects RunTarget objects, got "
                            f"{type(t).__name__}")
    names = [t.name for t in targets]
    prefixes = [t.route_prefix for t in targets if t.route_prefix is not None]
    for what, values in (("name", names), ("route_prefix", prefixes)):
        twice = sorted({v for v in values if values.count(v) > 1})
        if twice:
            raise ValueError(f"serve.run_many got two applications with the same {what}: "
                             f"{', '.join(map(repr, twice))}")
    if backend.RAY:
        from . import _on_ray
        return _on_ray.run_many(targets, blocking, wait_for_ingress_deployment_creation,
                                wait_for_applications_running, controller_options)
    handles = _deploy(targets, caller="serve.run_many", controller_options=controller_options)
    if blocking:
        _block_forever()
    return handles


def _deploy(targets, code_version=None, caller="serve.run", controller_options=None):
    """Deploy ``targets`` (``RunTarget``s), one after the other; their handles."""
    apps = []
    for t in targets:
        app = t.target.bind() if isinstance(t.target, Deployment) else t.target
        if not isinstance(app, Application):
            raise TypeError(f"{caller} expects an Application (deployment.bind(...)), got "
                            f"{type(app).__name__}")
        check_route_prefix(t.route_prefix)
        apps.append(app)
    global _longest_graceful_s
    handles = []
    with _lock:
        ctl = _ensure_controller(controller_options=controller_options)
        built = [_build(app, t.name, code_version, t.logging_config)
                 for app, t in zip(apps, targets)]
        for ingress, specs in built:
            _longest_graceful_s = max([_longest_graceful_s] + [
                s["config"].get("graceful_shutdown_timeout_s") or 0 for s in specs.values()])
        # The proxies (if not up yet) start while the replicas do; each waits
        # until every proxy has the routes, so HTTP sees the app once both end.
        proxies = (ctl.start_proxies.remote({})
                   if any(t.route_prefix is not None for t in targets) else None)
        for t, (ingress, specs) in zip(targets, built):
            # The deployment's error, if any, is what the caller needs to see:
            # a proxy's error only when the deployment succeeded.
            _ask(ctl, "deploy_app", t.name, t.route_prefix, ingress, specs)
            handles.append(DeploymentHandle(ingress, t.name))
        if proxies is not None:
            _ask(ctl, "start_proxies", {}, sent=proxies)
    return handles


def _block_forever():
    ev = threading.Event()
    try:
        while not ev.wait(1.0):
            pass
    except KeyboardInterrupt:
        shutdown()
        raise


def status():
    """The state of every application (``ServeStatus``)."""
    if backend.RAY:
        from . import _on_ray
        return _on_ray.status()
    ctl = _controller_or_none()
    if ctl is None:
        return ServeStatus({}, None, 0)
    st = _ask(ctl, "status")
    return ServeStatus(st["applications"], st["http_port"], st["proxies"])


def delete(name, _blocking=True):
    """Delete application ``name``, draining its requests (graceful_shutdown_timeout_s)."""
    if backend.RAY:
        from . import _on_ray
        return _on_ray.delete(name, _blocking)
    ctl = _controller_or_none()
    if ctl is None:
        return
    _ask(ctl, "delete_apps", [name])


def shutdown():
    """Delete every application and stop the proxies and the controller.

    Requests in flight get the longest ``graceful_shutdown_timeout_s`` of the
    deployments to end; then the replicas and proxies are killed."""
    if backend.RAY:
        from . import _on_ray
        return _on_ray.shutdown()
    with _lock:
        ctl = _controller_or_none()
        if ctl is None:
            return
        from ray_lite.exceptions import RayActorError
        # A controller that died is asked again once the runtime restarted it.
        pids, stopped = None, False
        try:
            pids = _ask(ctl, "process_ids", timeout=_defaults.SHUTDOWN_ASK_S)
            gone = False
        except RayActorError:   # dead, and not restarted
            gone = True
        except Exception:   # noqa: BLE001 - a stuck controller
            gone = False
        if not gone:
            try:
                # The controller drains for at most the graceful timeout
                # itself; this bound holds even when it cannot.
                _ask(ctl, "shutdown", timeout=_longest_graceful_s + _defaults.SHUTDOWN_MARGIN_S)
                stopped = True
            except Exception:   # noqa: BLE001 - a dead or stuck controller: force the stop
                _kill_processes(pids)
        try:
            store = _controller_checkpoint.find_store()
            if store is not None:
                _kill_and_wait(store, "load")
            _kill_and_wait(ctl, "num_apps")
        except Exception:   # noqa: BLE001
            pass
        if not stopped:
            # What that controller did not name (it may never have come back
            # from a restart to say): every replica, proxy and deployment actor.
            try:
                _core.kill_serve_processes(named_in=context.SERVE_NAMESPACE)
            except Exception:   # noqa: BLE001 - the runtime is ending
                pass
        context.clear_controller()
        _metrics.remove()


def _kill_and_wait(handle, probe):
    """Kill ``handle``'s actor and wait, 10 s at most, until the runtime has
    seen it die (its method ``probe`` raises ``RayActorError``): until then
    its name still resolves to it, and the state API lists it alive."""
    from ray_lite.exceptions import RayActorError
    _core.kill(handle)
    for _ in range(100):
        try:
            _core.get(getattr(handle, probe).remote(), timeout=0.1)
        except RayActorError:
            return
        except Exception:   # noqa: BLE001 - timeout: not yet
            pass


async def shutdown_async():
    """``shutdown()`` without blocking the caller's event loop (it runs in a thread)."""
    if backend.RAY:
        from . import _on_ray
        return await _on_ray.shutdown_async()
    import asyncio
    await asyncio.get_running_loop().run_in_executor(None, shutdown)


def _kill_processes(pids):
    """SIGKILL Serve's proxies and replicas (``process_ids()``'s answer)."""
    import os
    import signal
    if not pids:
        return
    print("Serve: did not stop within the graceful shutdown timeout; killing its processes",
          file=sys.stderr, flush=True)
    for pid in pids["proxies"] + [p for ps in pids["replicas"].values() for p in ps]:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def get_app_handle(name):
    if backend.RAY:
        from . import _on_ray
        return _on_ray.get_app_handle(name)
    ctl = context.get_controller()
    ingress = _ask(ctl, "ingress_of", name)
    if ingress is None:
        from .exceptions import RayServeException
        raise RayServeException(f"Application '{name}' does not exist.")
    return _shared_handle(ingress, name)


def get_deployment_handle(deployment_name, app_name=None):
    if backend.RAY:
        from . import _on_ray
        return _on_ray.get_deployment_handle(deployment_name, app_name)
    if app_name is None:
        try:
            app_name = context.get_replica_context().app_name
        except Exception:   # noqa: BLE001
            app_name = "default"
    return _shared_handle(deployment_name, app_name)


def _shared_handle(deployment_name, app_name):
    """The same handle for each call with the same names, as in Ray."""
    return context.per_runtime(context.handles, (app_name, deployment_name),
                               lambda: DeploymentHandle(deployment_name, app_name))


def get_replica_context():
    if backend.RAY:
        from . import _on_ray
        return _on_ray.get_replica_context()
    return context.get_replica_context()


def get_deployment_actor(actor_name):
    """A handle to the deployment-scoped actor ``actor_name`` of the replica
    this runs in (see ``deployment(deployment_actors=...)``); RayServeException
    outside a replica, ValueError when no such actor runs."""
    if backend.RAY:
        from . import _on_ray
        return _on_ray.get_deployment_actor(actor_name)
    from ._deployment_actors import get_deployment_actor as get
    return get(actor_name)


def get_deployment_actor_context():
    """The deployment, actor name and code version of the deployment actor
    this runs in; RayServeException elsewhere."""
    if backend.RAY:
        from . import _on_ray
        return _on_ray.get_deployment_actor_context()
    from ._deployment_actors import get_deployment_actor_context as get
    return get()


def _http_port():
    """The port the proxies listen on (useful with ``http_options={"port": 0}``)."""
    ctl = context.get_controller()
    return _ask(ctl, "http_address")[1]
