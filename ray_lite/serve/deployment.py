"""``@serve.deployment``, ``Deployment`` and ``Application`` (Ray Serve's names).

A ``Deployment`` is the user's class or function plus its configuration;
``.bind(*args)`` makes an ``Application``: the deployment with its constructor
arguments, where other bound deployments may appear (composition: they arrive
in the constructor as ``DeploymentHandle``s).
"""
import inspect

from ._defaults import DEPLOYMENT_OPTIONS as _DEFAULTS
from ._defaults import MAX_ONGOING_REQUESTS, MAX_QUEUED_REQUESTS
from .._private.scheduling.labels import check_label_options
from ..exceptions import NotOnThisMachineError
# Accepted as in Ray, without effect on one machine (the manual's compatibility page lists them).
_HARMLESS = {"route_prefix", "placement_group_bundles", "placement_group_strategy",
             "max_replicas_per_node", "request_router_config",
             "is_driver_deployment", "_internal"}
_ACTOR_OPTIONS_OK = {"num_cpus", "num_gpus", "memory", "resources", "accelerator_type",
                     "runtime_env", "object_store_memory", "label_selector",
                     "fallback_strategy"}


def _check_config(cfg):
    for key in cfg:
        if key not in _DEFAULTS and key not in _HARMLESS and \
                key not in ("name", "logging_config", "deployment_actors"):
            raise TypeError(f"deployment() got an unexpected keyword argument '{key}'")
    n = cfg.get("num_replicas", 1)
    if isinstance(n, str) and n.isdigit():
        n = cfg["num_replicas"] = int(n)     # "3": Ray's validation takes it as 3
    if n != "auto" and n is not None and (not isinstance(n, int) or isinstance(n, bool)
                                          or n < 0):
        raise ValueError(f"num_replicas must be a non-negative int or 'auto', got {n!r}")
    if cfg.get("autoscaling_config") and n not in ("auto", None) and "num_replicas" in cfg:
        raise ValueError("Manually setting num_replicas is not allowed when "
                         "autoscaling_config is provided.")
    if cfg.get("autoscaling_config") is not None or n == "auto":
        from ._autoscaling_policy import normalize_autoscaling
        normalize_autoscaling(cfg.get("autoscaling_config"), auto=n == "auto")
    if cfg.get("logging_config") is not None:
        from ._logging import logging_config_dict
        logging_config_dict(cfg["logging_config"], "deployment(logging_config=...)")
    if cfg.get("max_replicas_per_node") is not None and \
            cfg.get("placement_group_bundles") is not None:
        raise ValueError("Setting max_replicas_per_node is not allowed when "
                         "placement_group_bundles is provided.")
    m = cfg.get("max_ongoing_requests", MAX_ONGOING_REQUESTS)
    if not isinstance(m, int) or m < 1:
        raise ValueError(f"max_ongoing_requests must be a positive int, got {m!r}")
    q = cfg.get("max_queued_requests", MAX_QUEUED_REQUESTS)
    if not isinstance(q, int) or (q < 0 and q != -1):
        raise ValueError(f"max_queued_requests must be -1 or a non-negative int, got {q!r}")
    r = cfg.get("max_constructor_retry_count")
    if r is not None and (not isinstance(r, int) or isinstance(r, bool) or r < 1):
        raise ValueError(f"max_constructor_retry_count must be a positive int, got {r!r}")
    for key in ("health_check_period_s", "health_check_timeout_s",
                "graceful_shutdown_timeout_s", "graceful_shutdown_wait_loop_s"):
        v = cfg.get(key)
        if v is not None and (not isinstance(v, (int, float)) or v < 0):
            raise ValueError(f"{key} must be a non-negative number, got {v!r}")
    rao = cfg.get("ray_actor_options")
    if rao is not None:
        if not isinstance(rao, dict):
            raise TypeError("ray_actor_options must be a dict")
        for key in rao:
            if key not in _ACTOR_OPTIONS_OK:
                raise ValueError(f"ray_actor_options: invalid option {key!r}")
        check_label_options(rao)      # matched against the node's labels at deployment
        for key in ("num_gpus", "accelerator_type"):
            # As on tasks and actors: this machine's CPUs are all there is.
            if rao.get(key) not in (None, 0):
                raise NotOnThisMachineError.for_option(key, rao[key], "ray_actor_options")
    if cfg.get("backpressure_config") is not None:
        from ._options import normalize_backpressure
        cfg["backpressure_config"] = normalize_backpressure(cfg["backpressure_config"])
    if cfg.get("deployment_actors") is not None:
        from ._deployment_actors import check
        cfg["deployment_actors"] = check(cfg["deployment_actors"])
    if cfg.get("gang_scheduling_config") is not None:
        from . import gang
        gang.check(cfg)
    uc = cfg.get("user_config")
    if uc is not None:
        import json
        try:
            json.dumps(uc)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"user_config must be JSON-serializable: {exc}") from None


def autoscaling_of(cfg):
    """The deployment's autoscaling config with Ray's defaults filled in, or
    None when it runs a fixed number of replicas."""
    n = cfg.get("num_replicas", 1)
    if cfg.get("autoscaling_config") is None and n != "auto":
        return None
    from ._autoscaling_policy import normalize_autoscaling
    return normalize_autoscaling(cfg.get("autoscaling_config"), auto=n == "auto")


def resolved_num_replicas(cfg):
    """The replicas a deployment starts with: ``num_replicas``, or under
    autoscaling ``initial_replicas`` else ``min_replicas`` (zero with
    ``min_replicas: 0``: the first request starts one)."""
    auto = autoscaling_of(cfg)
    if auto is None:
        return 1 if cfg.get("num_replicas") is None else cfg.get("num_replicas", 1)
    init = auto["initial_replicas"]
    return auto["min_replicas"] if init is None else init


class Deployment:
    """A class or function made into a deployment; ``bind`` it to deploy it."""

    def __init__(self, func_or_class, name, config):
        self.func_or_class = func_or_class
        self._name = name
        self._config = config

    @property
    def name(self):
        return self._name

    @property
    def num_replicas(self):
        return resolved_num_replicas(self._config)

    @property
    def user_config(self):
        return self._config.get("user_config")

    @property
    def max_ongoing_requests(self):
        return self._config.get("max_ongoing_requests", MAX_ONGOING_REQUESTS)

    @property
    def max_queued_requests(self):
        return self._config.get("max_queued_requests", MAX_QUEUED_REQUESTS)

    @property
    def ray_actor_options(self):
        return self._config.get("ray_actor_options")

    def full_config(self):
        cfg = dict(_DEFAULTS)
        cfg.update({k: v for k, v in self._config.items() if k in _DEFAULTS})
        cfg["num_replicas"] = resolved_num_replicas(self._config)
        cfg["autoscaling_config"] = autoscaling_of(self._config)
        if self._config.get("logging_config") is not None:
            # (A plain dict: the replica sets its "ray.serve" logger with it.)
            from ._logging import logging_config_dict
            cfg["logging_config"] = logging_config_dict(self._config["logging_config"])
        return cfg

    def with_overrides(self, opts):
        """A copy with a config file's options: its ``num_replicas`` or
        ``autoscaling_config`` replaces how the code scales (as in Ray)."""
        base = dict(self._config)
        if "num_replicas" in opts or "autoscaling_config" in opts:
            base.pop("num_replicas", None)
            base.pop("autoscaling_config", None)
        merged = {**base, **opts}
        _check_config(merged)
        return Deployment(self.func_or_class, self._name, merged)

    def options(self, **kwargs):
        """A copy with some options changed (``name=`` renames it)."""
        name = kwargs.pop("name", self._name)
        if "version" in kwargs and not kwargs.pop("_internal", False):
            raise ValueError("`version` in `Deployment.options()` has been removed. "
                             "Serve manages deployment versions internally.")
        kwargs.pop("version", None)
        merged = {**self._config, **kwargs}
        _check_config(merged)
        return Deployment(self.func_or_class, name, merged)

    def bind(self, *args, **kwargs):
        return Application(self, args, kwargs)

    def __call__(self, *args, **kwargs):
        raise RuntimeError("Deployments cannot be constructed directly. Use "
                           "`deployment.bind()` instead.")

    def __repr__(self):
        return f"Deployment(name={self._name})"


class Application:
    """A bound deployment: what ``serve.run`` deploys (the ingress and what it binds)."""

    def __init__(self, deployment, args, kwargs):
        self._deployment = deployment
        self._args = args
        self._kwargs = kwargs

    @property
    def deployment(self):
        return self._deployment

    def bound_args(self, replace):
        """The constructor's ``(args, kwargs)`` with every bound deployment in
        them (also inside lists, tuples and dicts) replaced by ``replace(app)``."""
        def convert(x):
            if isinstance(x, Application):
                return replace(x)
            if isinstance(x, list):
                return [convert(v) for v in x]
            if isinstance(x, tuple):
                return tuple(convert(v) for v in x)
            if isinstance(x, dict):
                return {k: convert(v) for k, v in x.items()}
            return x
        return [convert(a) for a in self._args], {k: convert(v) for k, v in self._kwargs.items()}

    def __repr__(self):
        return f"Application({self._deployment.name})"


def deployment(_func_or_class=None, name=None, **config):
    """``@serve.deployment`` or ``@serve.deployment(num_replicas=..., ...)``.

    ``max_ongoing_requests`` bounds the requests a replica runs at once;
    beyond it requests wait at their caller, and ``max_queued_requests``
    bounds that wait per caller (each HTTP proxy, each handle), as in Ray
    Serve: with several proxies the deployment can hold up to that many
    waiting requests in each (an HTTP 503 beyond it).
    """
    if "version" in config:     # Ray 2.60 refuses it: a program using it breaks there
        raise ValueError("`version` in `@serve.deployment` has been removed. "
                         "Serve manages deployment versions internally.")
    _check_config(config)

    def decorate(obj):
        if not (inspect.isclass(obj) or callable(obj)):
            raise TypeError("@serve.deployment must decorate a class or a function")
        return Deployment(obj, name or obj.__name__, dict(config))
    # As Ray: a first argument that is no function or class (an old-style
    # name, ``@serve.deployment("counter")``) is ignored.
    return decorate(_func_or_class) if callable(_func_or_class) else decorate
