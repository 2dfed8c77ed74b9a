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
import enum
import hashlib
import importlib
import json
import os
import sys

from ._defaults import DEPLOYMENT_OPTIONS
from ._http import HTTPOptions  # noqa: F401 - Ray's ray.serve.config.HTTPOptions
from ._autoscaling_policy import (AutoscalingContext, AutoscalingPolicy,  # noqa: F401
                                  normalize as normalize_policy)   # (Ray's place for them)
from ._deployment_actors import DeploymentActorConfig  # noqa: F401 - Ray's place for it
from ._start_options import ControllerOptions, check_tracing_config, controller_env_vars  # noqa: F401
from ._plain_config import PlainConfig, normalized
from .gang import (GangPlacementStrategy, GangRuntimeFailurePolicy,  # noqa: F401 - Ray's
                   GangSchedulingConfig)
from .context import DeploymentID  # noqa: F401 - Ray's ray.serve.config.DeploymentID
from ._http import check_route_prefix


class ConfigError(ValueError):
    """A config file that does not follow Serve's schema (the message says where)."""


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
# Ray's AutoscalingConfig fields (2.60), with its defaults.
AUTOSCALING_DEFAULTS = {
    "min_replicas": 1, "initial_replicas": None, "max_replicas": 1,
    "target_ongoing_requests": 2.0, "metrics_interval_s": 10.0, "look_back_period_s": 30.0,
    "smoothing_factor": 1.0, "upscale_smoothing_factor": None,
    "downscale_smoothing_factor": None, "upscaling_factor": None, "downscaling_factor": None,
    "downscale_delay_s": 600.0, "downscale_to_zero_delay_s": None, "upscale_delay_s": 30.0,
    "aggregation_function": "mean", "policy": None,
}
# What num_replicas="auto" means, unless autoscaling_config says otherwise.
AUTO_DEFAULTS = {"target_ongoing_requests": 2.0, "min_replicas": 1, "max_replicas": 100}


def _unknown(where, given, allowed):
    extra = sorted(str(k) for k in given if k not in allowed)
    if extra:
        raise ConfigError(f"{where}: unknown key{'s' if len(extra) > 1 else ''} "
                          f"{', '.join(repr(k) for k in extra)} (allowed: "
                          f"{', '.join(sorted(allowed))})")


def _mapping(where, value):
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def _number(where, value, *, minimum=0.0, positive=False, integer=False):
    ok = isinstance(value, int if integer else (int, float)) and not isinstance(value, bool)
    if not ok or value < minimum or (positive and value <= 0):
        kind = "an integer" if integer else "a number"
        bound = "> 0" if positive else f">= {minimum}"
        raise ConfigError(f"{where}: expected {kind} {bound}, got {value!r}")
    return value


def _given_autoscaling(cfg, where):
    """The fields set in ``cfg``: a mapping, an ``AutoscalingConfig`` (this
    module's, or another pydantic-style one, as Ray's), or None."""
    if cfg is None:
        return {}
    if isinstance(cfg, dict):
        return dict(cfg)
    for dump in ("model_dump", "dict"):
        method = getattr(cfg, dump, None)
        if callable(method):
            return dict(method(exclude_unset=True))
    raise ConfigError(f"{where}: expected a mapping or an AutoscalingConfig, got "
                      f"{type(cfg).__name__}")


def normalize_autoscaling(cfg, where="autoscaling_config", auto=False):
    """``cfg`` (a dict, an ``AutoscalingConfig`` or None) with Ray's defaults
    filled in and checked; with ``auto`` (num_replicas="auto") the defaults
    of that mode first."""
    given = _given_autoscaling(cfg, where)
    _unknown(where, given, AUTOSCALING_DEFAULTS)
    out = dict(AUTOSCALING_DEFAULTS)
    if auto:
        out.update(AUTO_DEFAULTS)
    out.update(given)
    for key in ("min_replicas", "max_replicas"):
        _number(f"{where}.{key}", out[key], integer=True, positive=key == "max_replicas")
    if out["initial_replicas"] is not None:
        _number(f"{where}.initial_replicas", out["initial_replicas"], integer=True)
    for key in ("target_ongoing_requests", "metrics_interval_s", "look_back_period_s"):
        _number(f"{where}.{key}", out[key], positive=True)
    for key in ("upscale_delay_s", "downscale_delay_s"):
        _number(f"{where}.{key}", out[key])
    for key in ("smoothing_factor", "upscale_smoothing_factor", "downscale_smoothing_factor",
                "upscaling_factor", "downscaling_factor", "downscale_to_zero_delay_s"):
        if out[key] is not None:
            _number(f"{where}.{key}", out[key], positive=key != "downscale_to_zero_delay_s")
    if out["min_replicas"] > out["max_replicas"]:
        raise ConfigError(f"{where}: min_replicas ({out['min_replicas']}) is greater than "
                          f"max_replicas ({out['max_replicas']})")
    init = out["initial_replicas"]
    if init is not None and not out["min_replicas"] <= init <= out["max_replicas"]:
        raise ConfigError(f"{where}: initial_replicas ({init}) must be between min_replicas "
                          f"and max_replicas")
    if out["aggregation_function"] not in ("mean", "max", "min"):
        raise ConfigError(f"{where}.aggregation_function: expected mean, max or min, got "
                          f"{out['aggregation_function']!r}")
    out["policy"] = normalize_policy(out["policy"], f"{where}.policy")
    return out


def _check_http_options(raw):
    opts = dict(_mapping("http_options", raw))
    _unknown("http_options", opts, _HTTP_KEYS)
    if "port" in opts:
        _number("http_options.port", opts["port"], integer=True)
    for key in ("request_timeout_s", "keep_alive_timeout_s"):
        if opts.get(key) is not None:
            _number(f"http_options.{key}", opts[key], positive=True)
    return opts


def _check_deployment(where, raw):
    d = dict(_mapping(where, raw))
    _unknown(where, d, _DEPLOYMENT_KEYS)
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
        entry = _mapping(f"{where}[{i}]", entry)
        _unknown(f"{where}[{i}]", entry, ("name", "actor_class", "init_args", "init_kwargs",
                                          "actor_options"))
        for key in ("name", "actor_class"):
            if not isinstance(entry.get(key), str) or not entry[key]:
                raise ConfigError(f"{where}[{i}].{key}: expected a non-empty string")


def _check_app(where, raw, single):
    app = dict(_mapping(where, raw))
    _unknown(where, app, _APP_KEYS)
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
    _mapping(f"{where}.args", args)
    env = app.get("runtime_env") or {}
    _mapping(f"{where}.runtime_env", env)
    _unknown(f"{where}.runtime_env", env, {"env_vars"})
    env_vars = _mapping(f"{where}.runtime_env.env_vars", env.get("env_vars") or {})
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
    _mapping("config", raw)
    notes = []
    if "import_path" in raw:       # one application at the top level
        http = {k: raw[k] for k in ("host", "port") if k in raw}
        app = {k: v for k, v in raw.items() if k not in ("host", "port")}
        apps = [_check_app("config", app, True)]
        return {"http_options": http, "applications": apps, "notes": notes}
    _unknown("config", raw, _TOP_KEYS)
    http = _check_http_options(raw.get("http_options") or {})
    if raw.get("proxy_location") not in (None, "EveryNode", "HeadOnly", "Disabled"):
        raise ConfigError(f"proxy_location: expected EveryNode, HeadOnly or Disabled, got "
                          f"{raw['proxy_location']!r}")
    if raw.get("proxy_location") is not None:
        notes.append(f"proxy_location {raw['proxy_location']} is ignored: one machine, "
                     f"the proxies share one port")
    if raw.get("grpc_options"):
        gopts = _mapping("grpc_options", raw["grpc_options"])
        if gopts.get("grpc_servicer_functions"):
            raise ConfigError("grpc_options.grpc_servicer_functions: ray_lite.serve has no "
                              "gRPC ingress (HTTP only)")
    if raw.get("target_capacity") is not None:
        raise ConfigError("target_capacity: not supported by ray_lite.serve")
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


def import_attr(import_path, app_dir=".", what="import_path"):
    """What ``module:attr`` (or ``module.attr``; ``attr`` may be dotted) names,
    ``app_dir`` (unless None) first put on ``sys.path``; ``ConfigError``
    naming ``what`` and the path if it does not import."""
    if ":" in import_path:
        module_name, _, attr = import_path.partition(":")
    else:
        module_name, _, attr = import_path.rpartition(".")
    if not module_name or not attr:
        raise ConfigError(f"{what} {import_path!r}: expected module:attribute")
    if app_dir is not None:
        path = os.path.abspath(app_dir)
        if path not in sys.path:
            sys.path.insert(0, path)
    try:
        target = importlib.import_module(module_name)
    except Exception as exc:   # noqa: BLE001 - the user's module: say what failed
        raise ConfigError(f"{what} {import_path!r}: cannot import {module_name!r}: "
                          f"{type(exc).__name__}: {exc}") from None
    try:
        for part in attr.split("."):
            target = getattr(target, part)
    except AttributeError:
        raise ConfigError(f"{what} {import_path!r}: module {module_name!r} has no "
                          f"attribute {attr!r}") from None
    return target


def build_app(app_cfg, app_dir="."):
    """The ``Application`` of one checked application entry, with its
    deployments' options overridden as the file says."""
    return with_overrides(imported_app(app_cfg, app_dir), app_cfg)


def imported_app(app_cfg, app_dir="."):
    """The ``Application`` the entry's import path names (a builder called
    with its ``args``), as the code has it."""
    from .cli import application_of
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


# ------------------------------------------------- Ray's ray.serve.config names
class AutoscalingConfig:
    """Ray Serve's ``AutoscalingConfig``: ``deployment(autoscaling_config=
    AutoscalingConfig(min_replicas=1, max_replicas=4))`` is the dict with
    those keys.  Checked when made, as the dict is when deployed (an unknown
    field, a bad number or min above max: ``ConfigError``, a ValueError as
    pydantic's errors are); every field reads back with Ray's default filled
    in, and ``dict()``/``model_dump()`` give them (``exclude_unset=True``:
    only those given)."""

    def __init__(self, **fields):
        full = normalize_autoscaling(fields, "AutoscalingConfig")
        self.__dict__["_given"] = dict(fields)
        self.__dict__.update(full)

    def __setattr__(self, name, value):
        fields = {**self._given, name: value}
        full = normalize_autoscaling(fields, "AutoscalingConfig")
        self.__dict__["_given"] = fields
        self.__dict__.update(full)

    def dict(self, exclude_unset=False):
        if exclude_unset:
            return dict(self._given)
        return {k: self.__dict__[k] for k in AUTOSCALING_DEFAULTS}

    model_dump = dict

    def __eq__(self, other):
        return isinstance(other, AutoscalingConfig) and self.dict() == other.dict()

    def __repr__(self):
        return "AutoscalingConfig(" + ", ".join(f"{k}={v!r}" for k, v in self._given.items()) + ")"


class BackpressureConfig(PlainConfig):
    """Ray Serve's ``BackpressureConfig``: the HTTP answer to a request refused
    because ``max_queued_requests`` already wait, ``status_code`` 503 (the
    default) or 429, and with ``retry_after_s`` a ``Retry-After`` header (its
    seconds rounded up).  A deployment that is unavailable still answers 503;
    handles still raise ``BackPressureError``."""

    def __init__(self, status_code=503, retry_after_s=None):
        if status_code not in (503, 429) or isinstance(status_code, bool):
            raise ConfigError(f"BackpressureConfig.status_code must be 503 or 429, got "
                              f"{status_code!r}")
        if retry_after_s is not None:
            _number("BackpressureConfig.retry_after_s", retry_after_s)
            if retry_after_s == float("inf"):
                raise ConfigError("BackpressureConfig.retry_after_s must be finite")
        self.status_code = status_code
        self.retry_after_s = retry_after_s

    FIELDS = ("status_code", "retry_after_s")

    def __repr__(self):
        return f"BackpressureConfig({self.status_code}, retry_after_s={self.retry_after_s})"


def normalize_backpressure(value, where="backpressure_config"):
    """A deployment's ``backpressure_config`` (a ``BackpressureConfig``, a dict
    of its fields, or None) as a plain dict, or None."""
    return normalized(BackpressureConfig, value, where, ConfigError)


class ProxyLocation(str, enum.Enum):
    """Where Ray Serve runs proxies (``serve.start(proxy_location=...)``).  On
    one machine ``HeadOnly`` and ``EveryNode`` are the same; ``Disabled``
    starts none."""

    Disabled = "Disabled"
    HeadOnly = "HeadOnly"
    EveryNode = "EveryNode"


class DeploymentMode(str, enum.Enum):
    """Ray's older spelling of ``ProxyLocation`` (``HTTPOptions(location=...)``,
    accepted and ignored)."""

    NoServer = "NoServer"
    HeadOnly = "HeadOnly"
    EveryNode = "EveryNode"
    FixedNumber = "FixedNumber"


class gRPCOptions:  # noqa: N801 - Ray's name
    """Ray Serve's ``gRPCOptions``.  ray_lite.serve has no gRPC ingress:
    ``serve.start`` refuses options that list servicer functions."""

    def __init__(self, port=9000, grpc_servicer_functions=None, request_timeout_s=None):
        self.port = port
        self.grpc_servicer_functions = list(grpc_servicer_functions or [])
        self.request_timeout_s = request_timeout_s


class RequestRouterConfig:
    """Ray Serve's ``RequestRouterConfig``: accepted and not used (ray_lite's
    proxies route by their own rules; see the README)."""

    def __init__(self, request_router_class=None, request_router_kwargs=None,
                 request_routing_stats_period_s=10, request_routing_stats_timeout_s=30):
        self.request_router_class = request_router_class
        self.request_router_kwargs = dict(request_router_kwargs or {})
        self.request_routing_stats_period_s = request_routing_stats_period_s
        self.request_routing_stats_timeout_s = request_routing_stats_timeout_s
