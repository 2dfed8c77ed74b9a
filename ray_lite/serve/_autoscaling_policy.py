"""A deployment's ``autoscaling_config``: Ray Serve's fields and defaults
(``normalize_autoscaling``, ``AutoscalingConfig``), and its custom policies
(``autoscaling_config["policy"]``).

``AutoscalingPolicy(policy_function=..., policy_kwargs=...)`` names a
function, or a class (made once with ``policy_kwargs``, then called), that
the controller calls every ``metrics_interval_s`` with an
``AutoscalingContext`` (the deployment, its replicas, its requests over the
look-back window, its bounds, the state the policy returned last time) and
that returns ``(replicas, state)``: the count, clipped to
``min_replicas``/``max_replicas``, is applied at once (delays are the
policy's business, as in Ray).  A policy that raises or returns something
else keeps the current count and says why on standard error.

The driver pickles the policy with its module by value (as Ray does), so
the controller need not import it.
"""
import collections
import dataclasses
import inspect
import json
import math
import sys
import time

from . import context
from ._options import ConfigError, check_keys, check_number, import_attr

DEFAULT_POLICY_NAME = "ray.serve.autoscaling_policy:default_autoscaling_policy"


class AutoscalingPolicy:
    """Ray Serve's ``AutoscalingPolicy``: ``policy_function`` a callable or an
    import path ``"module:function"``, ``policy_kwargs`` (JSON-serialisable)
    for a class."""

    def __init__(self, policy_function=DEFAULT_POLICY_NAME, policy_kwargs=None):
        if not (callable(policy_function) or isinstance(policy_function, str)):
            raise TypeError(f"policy_function must be a callable or an import path, got "
                            f"{type(policy_function).__name__}")
        kwargs = dict(policy_kwargs or {})
        try:
            json.dumps(kwargs)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"policy_kwargs is not JSON-serializable: {exc}.") from None
        self.policy_function = policy_function
        self.policy_kwargs = kwargs

    def is_default_policy_function(self):
        return self.policy_function == DEFAULT_POLICY_NAME

    def dict(self, **_):
        return {"policy_function": self.policy_function, "policy_kwargs": self.policy_kwargs}

    model_dump = dict

    def __eq__(self, other):
        return isinstance(other, AutoscalingPolicy) and self.dict() == other.dict()

    __hash__ = None

    def __repr__(self):
        return f"AutoscalingPolicy(policy_function={self.policy_function!r})"


def normalize(value, where):
    """``autoscaling_config["policy"]`` -> None (Ray's default policy) or
    ``{"policy_function", "policy_kwargs"}``; errors name ``where``."""
    if value is None:
        return None
    if isinstance(value, AutoscalingPolicy):
        value = value.dict()
    elif not isinstance(value, dict):
        dump = getattr(value, "model_dump", None)    # Ray's own AutoscalingPolicy
        if not callable(dump):
            raise ConfigError(f"{where}: expected an AutoscalingPolicy or a mapping, got "
                              f"{type(value).__name__}")
        value = dump()
    check_keys(where, value, ("policy_function", "policy_kwargs", "policy_blob"))
    if "policy_blob" in value:
        return dict(value)          # shipped already (see ship)
    try:
        policy = AutoscalingPolicy(value.get("policy_function", DEFAULT_POLICY_NAME),
                                   value.get("policy_kwargs"))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return None if policy.is_default_policy_function() else policy.dict()


def _resolve(function):
    if callable(function):
        return function
    target = import_attr(function, None, "autoscaling policy")
    if not callable(target):
        raise ValueError(f"autoscaling policy {function!r} is not callable")
    return target


def ship(policy):
    """The normalized ``policy`` as the controller gets it: the callable (an
    import path imported here, where the application's modules import)
    pickled with its module by value."""
    if policy is None or "policy_blob" in policy:
        return policy
    from ._deployment_actors import dumps_by_value
    fn = _resolve(policy["policy_function"])
    name = policy["policy_function"] if isinstance(policy["policy_function"], str) else \
        f"{fn.__module__}:{getattr(fn, '__qualname__', fn)}"
    return {"policy_function": name, "policy_kwargs": policy["policy_kwargs"],
            "policy_blob": dumps_by_value(fn, [fn])}


class AutoscalingContext:
    """What a custom policy is called with (Ray Serve's fields)."""

    def __init__(self, deployment_id, deployment_name, app_name, current_num_replicas,
                 target_num_replicas, running_replicas, total_num_requests,
                 total_queued_requests, aggregated_metrics, raw_metrics,
                 capacity_adjusted_min_replicas, capacity_adjusted_max_replicas,
                 policy_state, last_scale_up_time, last_scale_down_time, current_time,
                 config):
        self.deployment_id = deployment_id
        self.deployment_name = deployment_name
        self.app_name = app_name
        self.current_num_replicas = current_num_replicas
        self.target_num_replicas = target_num_replicas
        self.running_replicas = running_replicas
        self.total_num_requests = total_num_requests
        self.total_queued_requests = total_queued_requests
        self.aggregated_metrics = aggregated_metrics
        self.raw_metrics = raw_metrics
        self.capacity_adjusted_min_replicas = capacity_adjusted_min_replicas
        self.capacity_adjusted_max_replicas = capacity_adjusted_max_replicas
        self.policy_state = policy_state
        self.last_scale_up_time = last_scale_up_time
        self.last_scale_down_time = last_scale_down_time
        self.current_time = current_time
        self.config = config

    def __repr__(self):
        return (f"AutoscalingContext(deployment={self.deployment_name!r}, "
                f"replicas={self.current_num_replicas}, target={self.target_num_replicas}, "
                f"requests={self.total_num_requests})")


@dataclasses.dataclass(order=True)
class TimeStampedValue:
    """One sample of a custom metric (Ray Serve's, in ``raw_metrics``)."""
    timestamp: float
    value: float = dataclasses.field(compare=False)


class PolicyRunner:
    """One deployment's custom policy in the controller: loaded once (again
    when a new one is deployed in place), its state kept between calls, and
    the custom metrics its replicas' ``record_autoscaling_stats`` report."""

    def __init__(self):
        self.blob = None
        self.call = None
        self.state = {}
        self.last_up = self.last_down = None
        self.series = {}        # replica id -> {metric: deque of TimeStampedValue}

    def record(self, answers, now, look_back_s):
        """Keep the custom metrics of ``answers`` (replica id -> what its
        ``autoscaling_stats`` returned, or the error of the call) for
        ``look_back_s``; replicas not among them are gone."""
        for rid in [r for r in self.series if r not in answers]:
            del self.series[rid]
        horizon = now - look_back_s
        for rid, answer in answers.items():
            custom = answer[1] if isinstance(answer, (tuple, list)) else None
            per = self.series.setdefault(rid, {})
            for name, value in (custom or {}).items():
                per.setdefault(name, collections.deque()).append(
                    TimeStampedValue(now, float(value)))
            for name in list(per):
                points = per[name]
                while points and points[0].timestamp < horizon:
                    points.popleft()
                if not points:
                    del per[name]

    def _metrics(self, dep, how):
        """(aggregated_metrics, raw_metrics) of Ray's context: per metric, per
        running replica, its samples over the look-back window and their
        ``aggregation_function`` (the samples are evenly spaced, so their mean
        is the time-weighted mean Ray takes)."""
        aggregated, raw = {}, {}
        pick = {"max": max, "min": min}.get(how, lambda v: sum(v) / len(v))
        for rid in dep.replicas:
            replica = _replica_id(dep, rid)
            for name, points in self.series.get(rid, {}).items():
                raw.setdefault(name, {})[replica] = list(points)
                aggregated.setdefault(name, {})[replica] = pick([p.value for p in points])
        return aggregated, raw

    def _load(self, policy):
        import cloudpickle
        fn = cloudpickle.loads(policy["policy_blob"])
        self.call = fn(**policy["policy_kwargs"]) if inspect.isclass(fn) else fn
        self.blob, self.state = policy["policy_blob"], {}

    def decide(self, dep, cfg, total_requests, queued, target):
        """The replica count the policy asks for (``target`` if it fails)."""
        policy = cfg["policy"]
        where = f"autoscaling policy {policy['policy_function']} of {dep.app}/{dep.name}"
        try:
            if policy["policy_blob"] != self.blob:
                self._load(policy)
            low, high = cfg["min_replicas"], max(1, cfg["max_replicas"])
            aggregated, raw = self._metrics(dep, cfg.get("aggregation_function", "mean"))
            ctx = AutoscalingContext(
                deployment_id=context.DeploymentID(dep.name, dep.app),
                deployment_name=dep.name, app_name=dep.app,
                current_num_replicas=len(dep.replicas), target_num_replicas=target,
                running_replicas=[_replica_id(dep, rid) for rid in dep.replicas],
                total_num_requests=total_requests, total_queued_requests=queued,
                aggregated_metrics=aggregated, raw_metrics=raw,
                capacity_adjusted_min_replicas=low, capacity_adjusted_max_replicas=high,
                policy_state=dict(self.state), last_scale_up_time=self.last_up,
                last_scale_down_time=self.last_down, current_time=time.time(),
                # (Ray gives its config object.)
                config=AutoscalingConfig(**{k: v for k, v in cfg.items() if k != "policy"}))
            decision, state = self.call(ctx)
            if isinstance(decision, float):
                decision = math.ceil(decision)
            if not isinstance(decision, int) or isinstance(decision, bool):
                raise TypeError(f"it returned {decision!r} replicas: expected an int")
        except Exception as exc:   # noqa: BLE001 - the user's code: keep the count
            print(f"Serve: {where} failed ({type(exc).__name__}: {exc}); keeping "
                  f"{target} replicas", file=sys.stderr, flush=True)
            return target
        self.state = dict(state or {})
        n = max(low, min(high, decision))
        if n > target:
            self.last_up = ctx.current_time
        elif n < target:
            self.last_down = ctx.current_time
        return n


def _replica_id(dep, rid):
    """Ray's ReplicaID of the controller's replica id ``rid`` ("Model#3")."""
    return context.ReplicaID(rid.rpartition("#")[2], context.DeploymentID(dep.name, dep.app))


# ------------------------------------------------------ autoscaling_config
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
    check_keys(where, given, AUTOSCALING_DEFAULTS)
    out = dict(AUTOSCALING_DEFAULTS)
    if auto:
        out.update(AUTO_DEFAULTS)
    out.update(given)
    for key in ("min_replicas", "max_replicas"):
        check_number(f"{where}.{key}", out[key], integer=True, positive=key == "max_replicas")
    if out["initial_replicas"] is not None:
        check_number(f"{where}.initial_replicas", out["initial_replicas"], integer=True)
    for key in ("target_ongoing_requests", "metrics_interval_s", "look_back_period_s"):
        check_number(f"{where}.{key}", out[key], positive=True)
    for key in ("upscale_delay_s", "downscale_delay_s"):
        check_number(f"{where}.{key}", out[key])
    for key in ("smoothing_factor", "upscale_smoothing_factor", "downscale_smoothing_factor",
                "upscaling_factor", "downscaling_factor", "downscale_to_zero_delay_s"):
        if out[key] is not None:
            check_number(f"{where}.{key}", out[key], positive=key != "downscale_to_zero_delay_s")
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
    out["policy"] = normalize(out["policy"], f"{where}.policy")
    return out


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
