"""What ``serve.start`` and ``serve.run`` take besides HTTP's options, as
Ray 2.60 checks it: ``ControllerOptions`` (Ray's ``ray.serve.config``) and
``TracingConfig`` (Ray's ``ray.serve.schema``), and the check of the rest of
``start``'s arguments."""
import os
import warnings

from ._plain_config import PlainConfig, normalized

__all__ = ["ControllerOptions", "TracingConfig", "controller_env_vars", "check_tracing_config",
           "check_start_options"]

_CONTROLLER_RUNTIME_ENV_KEYS = ("env_vars",)


class ControllerOptions(PlainConfig):
    """Options for the Serve controller: ``runtime_env``, in which only
    ``env_vars`` is accepted, as in Ray.  Given to ``serve.start``,
    ``serve.run`` or ``serve.run_many`` (``controller_options=``), or as a
    config file's top-level ``controller_options:``.  They apply when the
    controller starts; once it runs, new ones are ignored with a warning.
    The controller is where a deployment's custom autoscaling policy runs:
    it sees these variables in ``os.environ``."""

    FIELDS = ("runtime_env",)

    def __init__(self, runtime_env=None):
        self.runtime_env = _checked_runtime_env(runtime_env)


def _checked_runtime_env(value):
    # Ray's words (its validator's), ValueError for each.
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f"runtime_env must be a dict, got {type(value).__name__}.")
    disallowed = sorted(str(k) for k in value if k not in _CONTROLLER_RUNTIME_ENV_KEYS)
    if disallowed:
        raise ValueError(
            f"ControllerOptions.runtime_env only supports {list(_CONTROLLER_RUNTIME_ENV_KEYS)} "
            f"in this version; got disallowed keys {disallowed}. Per-replica runtime_env "
            f"belongs on the deployment (``serve.deployment(runtime_env=...)``), not on the "
            f"controller actor.")
    if "env_vars" not in value:
        return {}
    env_vars = value["env_vars"]
    if not isinstance(env_vars, dict):
        raise ValueError(f"runtime_env.env_vars must be a dict[str, str], got "
                         f"{type(env_vars).__name__}.")
    for k, v in env_vars.items():
        if not isinstance(k, str) or not k:
            raise ValueError(f"env_vars key must be a non-empty str, got {k!r}.")
        if not isinstance(v, str):
            raise ValueError(f"env_vars[{k!r}] must be str (got {type(v).__name__}); "
                             f"coerce explicitly.")
    return {"env_vars": dict(env_vars)}


def controller_env_vars(controller_options):
    """The controller's ``env_vars`` that ``controller_options`` (None, a
    dict, a ``ControllerOptions`` or Ray's own) gives, or None when it gives none."""
    if controller_options is None:
        return None
    if not isinstance(controller_options, dict) and \
            not callable(getattr(controller_options, "model_dump", None)):
        raise TypeError(f"controller_options must be a dict, ControllerOptions, or None; "
                        f"got {type(controller_options).__name__}.")
    fields = normalized(ControllerOptions, controller_options, "controller_options")
    return ((fields["runtime_env"] or {}).get("env_vars")) or None


def _env_sampling_ratio():
    raw = os.environ.get("RAY_SERVE_TRACING_SAMPLING_RATIO", "0.01")
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"RAY_SERVE_TRACING_SAMPLING_RATIO={raw!r} is not a number") from None


class TracingConfig(PlainConfig):
    """Ray Serve's tracing settings (``serve.start(tracing_config=...)``),
    with Ray's defaults from ``RAY_SERVE_TRACING_EXPORTER_IMPORT_PATH`` and
    ``RAY_SERVE_TRACING_SAMPLING_RATIO``.  ray_lite.serve exports no traces:
    a config with tracing off is accepted, one that turns it on is refused."""

    FIELDS = ("enabled", "exporter_import_path", "sampling_ratio")

    def __init__(self, enabled=None, exporter_import_path=None, sampling_ratio=None):
        env_path = os.environ.get("RAY_SERVE_TRACING_EXPORTER_IMPORT_PATH", "")
        self.exporter_import_path = env_path if exporter_import_path is None \
            else exporter_import_path
        self.enabled = env_path != "" if enabled is None else bool(enabled)
        ratio = _env_sampling_ratio() if sampling_ratio is None else float(sampling_ratio)
        if not 0.0 <= ratio <= 1.0:
            raise ValueError(f"sampling_ratio must be between 0.0 and 1.0, got {ratio}.")
        self.sampling_ratio = ratio


def check_tracing_config(tracing_config, where="tracing_config"):
    """Refuse a ``tracing_config`` that turns tracing on (or is not one)."""
    tracing = normalized(TracingConfig, tracing_config, where)
    if tracing is not None and tracing["enabled"]:
        raise ValueError(f"{where}: ray_lite.serve exports no traces; only "
                         f"TracingConfig(enabled=False) is accepted")


def check_start_options(grpc_options, logging_config, tracing_config, kwargs):
    """Refuse, naming it, what ``serve.start`` cannot honour here."""
    if grpc_options is not None and _option(grpc_options, "grpc_servicer_functions"):
        raise ValueError("serve.start(grpc_options=...): ray_lite.serve has no gRPC ingress "
                         "(HTTP only); drop grpc_servicer_functions")
    check_tracing_config(tracing_config, "serve.start(tracing_config=...)")
    unknown = sorted(k for k in kwargs if k != "detached")    # detached: Ray's older keyword
    if unknown:
        raise TypeError(f"serve.start() got unexpected keyword arguments: {', '.join(unknown)}")
    if logging_config is not None:
        warnings.warn("serve.start(logging_config=...) is not applied by ray_lite.serve: "
                      "Serve logs to standard error", stacklevel=3)


def _option(config, name):
    return config.get(name) if isinstance(config, dict) else getattr(config, name, None)
