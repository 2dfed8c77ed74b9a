"""Ray Serve's config file (``serve run config.yaml`` / ``serve deploy``),
checked as Ray's ``ServeDeploySchema`` checks it.

    proxy_location: EveryNode          # accepted, ignored (one machine)
    http_options: {host: 127.0.0.1, port: 8000, request_timeout_s: 30, keep_alive_timeout_s: 90}
    applications:
      - name: app1
        route_prefix: /
        import_path: module:app        # or module.app; a builder function gets ``args``
        args: {word: hi}
        runtime_env: {env_vars: {K: V}}
        deployments:
          - name: Model
            num_replicas: 2            # or "auto"; or autoscaling_config: {...}
            user_config: {...}

A file with ``import_path`` at the top is one application (Ray's older
single-application form).  An unknown key is refused naming where it is
(``applications[0].deployments[1]: unknown key 'num_replica'``), and so is an
import path that does not import.

Applied again to a running instance (``serve deploy``), an application whose
``import_path``, ``args``, ``runtime_env`` and source files are as they were
is not imported again: the new deployment options go to its running
deployments in place, as Ray's lightweight update does (``num_replicas``
scaled, ``user_config`` given to the replicas' ``reconfigure``).  A change of
any of those imports it anew and rolls its replicas.
"""
import hashlib
import inspect
import json
import os
import sys

from ._defaults import DEPLOYMENT_OPTIONS
from ._http import HTTPOptions  # noqa: F401 - Ray's ray.serve.config.HTTPOptions
from ._autoscaling_policy import (AutoscalingConfig, AutoscalingContext,  # noqa: F401
                                  AutoscalingPolicy, normalize_autoscaling)   # (Ray's place)
from ._deployment_actors import DeploymentActorConfig  # noqa: F401 - Ray's place for it
from ._options import (BackpressureConfig, ConfigError, DeploymentMode,  # noqa: F401 - Ray's
                       ProxyLocation, RequestRouterConfig, check_keys, check_mapping,
                       check_number, gRPCOptions, import_attr, normalize_backpressure)
from ._start_options import ControllerOptions, check_tracing_config, controller_env_vars  # noqa: F401
from .gang import (GangPlacementStrategy, GangRuntimeFailurePolicy,  # noqa: F401 - Ray's
                   GangSchedulingConfig)
from .context import DeploymentID  # noqa: F401 - Ray's ray.serve.config.DeploymentID
from ._http import check_route_prefix


_TOP_KEYS = {"proxy_location", "http_options", "grpc_options", "logging_config",
             "applications", "target_capacity", "controller_options", "tracing_config"}
_HTTP_KEYS = {"host", "port", "root_path", "request_timeout_s", "keep_alive_timeout_s"}
_APP_KEYS = {"name", "route_prefix", "import_path", "args", "runtime_env", "deployments",
             "logging_config", "host", "port", "external_scaler_enabled"}
# A deployment's options a config file may override (Ray's DeploymentSchema).
_DEPLOYMENT_KEYS = (set(DEPLOYMENT_OPTIONS) | {"name", "logging_config", "max_replicas_per_node",
                                               "placement_group_bundles",
                                               "placement_group_strategy",
                                               "request_router_config", "deployment_actors"})
def _check_http_options(raw):
    opts = dict(check_mapping("http_options", raw))
    check_keys("http_options", opts, _HTTP_KEYS)
    if "port" in opts:
        check_number("http_options.port", opts["port"], integer=True)
    for key in ("request_timeout_s", "keep_alive_timeout_s"):
        if opts.get(key) is not None:
            check_number(f"http_options.{key}", opts[key], positive=True)
    return opts


def _check_deployment(where, raw):
    d = dict(check_mapping(where, raw))
    check_keys(where, d, _DEPLOYMENT_KEYS)
    if not isinstance(d.get("name"), str) or not d["name"]:
        raise ConfigError(f"{where}: every deployment needs a name")
    opts = {k: v for k, v in d.items() if k != "name"}
    if "autoscaling_config" in opts and opts["autoscaling_config"] is not None:
        opts["autoscaling_config"] = normalize_autoscaling(
            opts["autoscaling_config"], f"{where}.autoscaling_config",
            auto=opts.get("num_replicas") == "auto")
    # Import paths of deployment actors are imported once the application's
    # are (its folder is on sys.path then: see with_overrides); here, shape.
    actors = opts.pop("deployment_actors", None)
    if actors is not None:
        _check_actor_entries(f"{where}.deployment_actors", actors)
    from .deployment import _check_config
    try:
        _check_config(opts)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where} ({d['name']}): {exc}") from None
    if actors is not None:
        opts["deployment_actors"] = actors
    return d["name"], opts


def _check_actor_entries(where, actors):
    if not isinstance(actors, list):
        raise ConfigError(f"{where}: expected a list, got {type(actors).__name__}")
    for i, entry in enumerate(actors):
        entry = check_mapping(f"{where}[{i}]", entry)
        check_keys(f"{where}[{i}]", entry, ("name", "actor_class", "init_args", "init_kwargs",
                                          "actor_options"))
        for key in ("name", "actor_class"):
            if not isinstance(entry.get(key), str) or not entry[key]:
                raise ConfigError(f"{where}[{i}].{key}: expected a non-empty string")


def _check_app(where, raw, single):
    app = dict(check_mapping(where, raw))
    check_keys(where, app, _APP_KEYS)
    path = app.get("import_path")
    if not isinstance(path, str) or not path:
        raise ConfigError(f"{where}: import_path is required (module:attribute)")
    name = app.get("name", "default")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}.name: expected a non-empty string, got {name!r}")
    prefix = app.get("route_prefix", "/")
    try:
        check_route_prefix(prefix)
    except ValueError as exc:
        raise ConfigError(f"{where}.route_prefix: {exc}") from None
    args = app.get("args") or {}
    check_mapping(f"{where}.args", args)
    env = app.get("runtime_env") or {}
    check_mapping(f"{where}.runtime_env", env)
    check_keys(f"{where}.runtime_env", env, {"env_vars"})
    env_vars = check_mapping(f"{where}.runtime_env.env_vars", env.get("env_vars") or {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in env_vars.items()):
        raise ConfigError(f"{where}.runtime_env.env_vars: keys and values must be strings")
    from ._logging import logging_config_dict
    try:
        logging_config = logging_config_dict(app.get("logging_config"))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}.logging_config: {exc}") from None
    deps = {}
    raw_deps = app.get("deployments") or []
    if not isinstance(raw_deps, list):
        raise ConfigError(f"{where}.deployments: expected a list")
    for i, rd in enumerate(raw_deps):
        dname, opts = _check_deployment(f"{where}.deployments[{i}]", rd)
        if dname in deps:
            raise ConfigError(f"{where}.deployments: {dname!r} is listed twice")
        deps[dname] = opts
    external = app.get("external_scaler_enabled", False)
    if not isinstance(external, bool):
        raise ConfigError(f"{where}.external_scaler_enabled: expected true or false, got "
                          f"{external!r}")
    autoscaled = [d for d, o in deps.items() if o.get("autoscaling_config") is not None
                  or o.get("num_replicas") == "auto"]
    if external and autoscaled:
        names = ", ".join('"' + d + '"' for d in autoscaled)
        raise ConfigError(      # Ray's words
            f"{where}: external_scaler_enabled is set to True, but the following "
            f"deployment(s) have autoscaling configured: {names}. When using an external "
            f"autoscaler, Serve's built-in autoscaling must be disabled for all deployments "
            f"in the application.")
    return {"name": name, "route_prefix": prefix, "import_path": path, "args": dict(args),
            "env_vars": dict(env_vars), "deployments": deps, "logging_config": logging_config,
            "external_scaler_enabled": external}


def parse(raw):
    """The checked, normalized form of a config file's content:
    ``{"http_options": {...}, "applications": [...], "notes": [...]}``."""
    if raw is None:
        raw = {}
    check_mapping("config", raw)
    notes = []
    if "import_path" in raw:       # one application at the top level
        http = {k: raw[k] for k in ("host", "port") if k in raw}
        app = {k: v for k, v in raw.items() if k not in ("host", "port")}
        apps = [_check_app("config", app, True)]
        return {"http_options": http, "applications": apps, "notes": notes}
    check_keys("config", raw, _TOP_KEYS)
    http = _check_http_options(raw.get("http_options") or {})
    if raw.get("proxy_location") not in (None, "EveryNode", "HeadOnly", "Disabled"):
        raise ConfigError(f"proxy_location: expected EveryNode, HeadOnly or Disabled, got "
                          f"{raw['proxy_location']!r}")
    if raw.get("proxy_location") is not None:
        notes.append(f"proxy_location {raw['proxy_location']} is ignored: one machine, "
                     f"the proxies share one port")
    if raw.get("grpc_options"):
        gopts = check_mapping("grpc_options", raw["grpc_options"])
        if gopts.get("grpc_servicer_functions"):
            raise ConfigError("grpc_options.grpc_servicer_functions: ray_lite.serve has no "
                              "gRPC ingress (HTTP only)")
    if raw.get("target_capacity") is not None:
        raise ConfigError("target_capacity: ray_lite.serve runs every deployment at full "
                          "capacity; remove target_capacity from the config")
    controller_options = raw.get("controller_options")
    for key, check in (("controller_options", controller_env_vars),
                       ("tracing_config", check_tracing_config)):
        try:
            check(raw.get(key))
        except (TypeError, ValueError) as exc:
            said = str(exc)
            raise ConfigError(said if said.startswith(key) else f"{key}: {said}") from None
    raw_apps = raw.get("applications") or []
    if not isinstance(raw_apps, list):
        raise ConfigError("applications: expected a list")
    apps = [_check_app(f"applications[{i}]", a, False) for i, a in enumerate(raw_apps)]
    seen_names, seen_prefixes = set(), set()
    for a in apps:
        if a["name"] in seen_names:
            raise ConfigError(f"applications: the name {a['name']!r} is used twice")
        seen_names.add(a["name"])
        if a["route_prefix"] is not None:
            if a["route_prefix"] in seen_prefixes:
                raise ConfigError(f"applications: the route_prefix {a['route_prefix']!r} is "
                                  f"used twice")
            seen_prefixes.add(a["route_prefix"])
    return {"http_options": http, "applications": apps, "notes": notes,
            "controller_options": controller_options}


def load(path):
    """``parse`` of the YAML (or JSON) file at ``path``."""
    return parse(read(path))


def read(path):
    """The content of the YAML (or JSON) file at ``path``, unchecked."""
    try:
        import yaml
    except ImportError:
        raise ConfigError("reading a config file needs PyYAML: pip install 'ray_lite[serve]'") \
            from None
    try:
        with open(path) as f:
            raw = yaml.safe_load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    return raw


def application_of(obj, args, target):
    """The ``Application`` that ``obj`` (what ``target`` names) makes with ``args``."""
    from .deployment import Application, Deployment
    if isinstance(obj, Application):
        if args:
            raise ValueError("arguments were given but the target is an Application, not a "
                             "builder function")
        return obj
    if isinstance(obj, Deployment):
        return obj.bind()
    if callable(obj):
        app = obj(_builder_argument(obj, dict(args)))
        if isinstance(app, Deployment):
            app = app.bind()
        if not isinstance(app, Application):
            raise TypeError(f"the builder {target} returned {type(app).__name__}, "
                            f"not an Application")
        return app
    raise TypeError(f"{target} is a {type(obj).__name__}, not an Application or a builder")


def _builder_argument(builder, args):
    """What a builder is called with, as in Ray: the arguments' dict, or the
    pydantic model its one parameter is annotated with, validated from it."""
    try:
        params = list(inspect.signature(builder).parameters.values())
    except (TypeError, ValueError):
        return args
    if len(params) != 1:
        raise TypeError("Application builder functions should take exactly one parameter, "
                        "a dictionary containing the passed arguments.")
    model = params[0].annotation
    if inspect.isclass(model) and any(c.__name__ == "BaseModel" and
                                      c.__module__.startswith("pydantic")
                                      for c in model.__mro__):
        validate = getattr(model, "model_validate", None) or model.parse_obj  # pydantic 2, 1
        return validate(args)
    return args


def build_app(app_cfg, app_dir="."):
    """The ``Application`` of one checked application entry, with its
    deployments' options overridden as the file says."""
    return with_overrides(imported_app(app_cfg, app_dir), app_cfg)


def imported_app(app_cfg, app_dir="."):
    """The ``Application`` the entry's import path names (a builder called
    with its ``args``), as the code has it."""
    target = import_attr(app_cfg["import_path"], app_dir)
    try:
        return application_of(target, app_cfg["args"], app_cfg["import_path"])
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"import_path {app_cfg['import_path']!r}: {exc}") from None


def with_overrides(app, app_cfg):
    """``app`` with its deployments' options overridden as the entry says."""
    from .deployment import Application
    overrides = dict(app_cfg["deployments"])
    env_vars = app_cfg["env_vars"]
    rebuilt = {}

    def visit(a):
        if id(a) in rebuilt:
            return rebuilt[id(a)]
        dep = a.deployment
        opts = dict(overrides.pop(dep.name, {}))
        if env_vars:
            rao = dict(opts.get("ray_actor_options", dep.ray_actor_options) or {})
            renv = dict(rao.get("runtime_env") or {})
            renv["env_vars"] = {**env_vars, **(renv.get("env_vars") or {})}
            rao["runtime_env"] = renv
            opts["ray_actor_options"] = rao
        if opts:
            try:
                dep = dep.with_overrides(opts)
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"application {app_cfg['name']!r}, deployment "
                                  f"{dep.name!r}: {exc}") from None
        new = Application(dep, tuple(convert(x) for x in a._args),
                          {k: convert(v) for k, v in a._kwargs.items()})
        rebuilt[id(a)] = new
        return new

    def convert(x):
        if isinstance(x, Application):
            return visit(x)
        if isinstance(x, (list, tuple)):
            return type(x)(convert(v) for v in x)
        if isinstance(x, dict):
            return {k: convert(v) for k, v in x.items()}
        return x
    out = visit(app)
    if overrides:
        raise ConfigError(f"application {app_cfg['name']!r}: no deployment named "
                          f"{', '.join(repr(n) for n in sorted(overrides))} in "
                          f"{app_cfg['import_path']}")
    return out


# What this process deployed from config files, by application name:
# (code key, the application its import path built, its source files'
# stats, code version).
_deployed = {}


def apply(parsed, app_dir="."):
    """Make the running Serve instance run what ``parsed`` says: every
    application is built first (a bad import path changes nothing), the
    applications the file no longer lists are deleted, and each listed one is
    deployed or updated in place (``serve.run``: a changed ``num_replicas``
    adds or drains replicas; an unchanged code version keeps the replicas).
    The names of the applications deployed."""
    from . import api
    built = [(a, _build_once(a, app_dir)) for a in parsed["applications"]]
    wanted = {a["name"] for a in parsed["applications"]}
    for name in list(api.status().applications):
        if name not in wanted:
            api.delete(name)
            _deployed.pop(name, None)
    for a, (app, record) in built:
        api.run(app, name=a["name"], route_prefix=a["route_prefix"],
                logging_config=a.get("logging_config"),
                external_scaler_enabled=a.get("external_scaler_enabled", False),
                _code_version=record[3])
        _deployed[a["name"]] = record
    return [a["name"] for a in parsed["applications"]]


def _build_once(app_cfg, app_dir):
    """``(application, record)`` of an entry: imported (or imported anew
    when its sources changed), or the one built before when neither the
    entry's code key nor its sources changed."""
    key = json.dumps([app_cfg["import_path"], app_cfg["args"], app_cfg["env_vars"],
                      os.path.abspath(app_dir)], sort_keys=True, default=repr)
    record = _deployed.get(app_cfg["name"])
    if record is not None and record[0] == key and _stats(record[2]) == record[2]:
        return with_overrides(record[1], app_cfg), record
    if record is not None:
        _forget_modules(record[2])      # edited code: read it again
    base = imported_app(app_cfg, app_dir)
    files = _stats(_user_sources(app_dir))
    version = hashlib.sha256(json.dumps([key, sorted(files.items())]).encode()).hexdigest()
    return with_overrides(base, app_cfg), (key, base, files, version)


def _user_sources(app_dir):
    """The files of the modules this process loaded from ``app_dir`` (the
    application's code; not ray_lite's, not installed packages')."""
    root = os.path.join(os.path.abspath(app_dir), "")
    out = []
    for name, mod in list(sys.modules.items()):
        path = getattr(mod, "__file__", None)
        if not path or name.partition(".")[0] == "ray_lite":
            continue
        path = os.path.abspath(path)
        if path.startswith(root) and "site-packages" not in path:
            out.append(path)
    return out


def _stats(paths):
    """{path: (mtime_ns, size)}, None for a file that is gone."""
    out = {}
    for path in paths:
        try:
            st = os.stat(path)
            out[path] = (st.st_mtime_ns, st.st_size)
        except OSError:
            out[path] = None
    return out


def _forget_modules(files):
    """Drop the modules loaded from ``files``: the next import reads them anew
    (their bytecode caches too, which know a file's time only to the second)."""
    import importlib.util
    for name, mod in list(sys.modules.items()):
        path = getattr(mod, "__file__", None)
        if path and os.path.abspath(path) in files:
            del sys.modules[name]
    for path in files:
        try:
            os.remove(importlib.util.cache_from_source(path))
        except (OSError, ValueError, NotImplementedError):
            pass
    importlib.invalidate_caches()
