"""Ray Serve's option types that deployments and ``serve.start`` take
(``BackpressureConfig``, ``ProxyLocation``, ...; ``ray_lite.serve.config``
names them, as ``ray.serve.config`` does), ``ConfigError`` and the checks
that name where a value is wrong, and ``import_attr``, which imports what a
``module:attr`` path names."""
import enum
import importlib
import os
import sys

from ._plain_config import PlainConfig, normalized
from .exceptions import ConfigError  # noqa: F401 - with Serve's other errors


def check_keys(where, given, allowed):
    extra = sorted(str(k) for k in given if k not in allowed)
    if extra:
        raise ConfigError(f"{where}: unknown key{'s' if len(extra) > 1 else ''} "
                          f"{', '.join(repr(k) for k in extra)} (allowed: "
                          f"{', '.join(sorted(allowed))})")


def check_mapping(where, value):
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def check_number(where, value, *, minimum=0.0, positive=False, integer=False):
    ok = isinstance(value, int if integer else (int, float)) and not isinstance(value, bool)
    if not ok or value < minimum or (positive and value <= 0):
        kind = "an integer" if integer else "a number"
        bound = "> 0" if positive else f">= {minimum}"
        raise ConfigError(f"{where}: expected {kind} {bound}, got {value!r}")
    return value


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
            check_number("BackpressureConfig.retry_after_s", retry_after_s)
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
    proxies and handles choose replicas by their own rules)."""

    def __init__(self, request_router_class=None, request_router_kwargs=None,
                 request_routing_stats_period_s=10, request_routing_stats_timeout_s=30):
        self.request_router_class = request_router_class
        self.request_router_kwargs = dict(request_router_kwargs or {})
        self.request_routing_stats_period_s = request_routing_stats_period_s
        self.request_routing_stats_timeout_s = request_routing_stats_timeout_s
