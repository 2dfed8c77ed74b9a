"""Ray Serve's ``ray.serve.schema`` names that programs compare against:
the status enums, the objects ``serve.status()`` returns,
``LoggingConfig`` (a deployment's or application's ``logging_config``) and
``TracingConfig``.

    from ray_lite.serve.schema import ApplicationStatus
    if serve.status().applications["app"].status == ApplicationStatus.RUNNING: ...

Each enum is a ``str`` enum, as Ray's, so a status equals its name as text
too (``== "RUNNING"``).  Ray's pydantic config schemas (``ServeDeploySchema``
and the like) are not here: ``ray_lite.serve.config`` reads config files.
"""
import enum

from ._logging import LoggingConfig
from ._start_options import TracingConfig
from .context import ReplicaRank  # noqa: F401 - Ray's ray.serve.schema.ReplicaRank

__all__ = ["ApplicationStatus", "DeploymentStatus", "ReplicaState", "ProxyStatus",
           "ServeStatus", "ApplicationStatusOverview", "DeploymentStatusOverview",
           "LoggingConfig", "ReplicaRank", "TracingConfig"]


class ApplicationStatus(str, enum.Enum):
    NOT_STARTED = "NOT_STARTED"
    DEPLOYING = "DEPLOYING"
    DEPLOY_FAILED = "DEPLOY_FAILED"
    RUNNING = "RUNNING"
    UNHEALTHY = "UNHEALTHY"
    DELETING = "DELETING"


class DeploymentStatus(str, enum.Enum):
    UPDATING = "UPDATING"
    HEALTHY = "HEALTHY"
    UNHEALTHY = "UNHEALTHY"
    DEPLOY_FAILED = "DEPLOY_FAILED"
    UPSCALING = "UPSCALING"
    DOWNSCALING = "DOWNSCALING"


class ReplicaState(str, enum.Enum):
    STARTING = "STARTING"
    UPDATING = "UPDATING"
    RECOVERING = "RECOVERING"
    RUNNING = "RUNNING"
    STOPPING = "STOPPING"
    PENDING_MIGRATION = "PENDING_MIGRATION"


class ProxyStatus(str, enum.Enum):
    STARTING = "STARTING"
    HEALTHY = "HEALTHY"
    UNHEALTHY = "UNHEALTHY"
    DRAINING = "DRAINING"
    DRAINED = "DRAINED"


def _as(kind, value):
    """``value`` as a member of ``kind``; a state ray_lite has and Ray's enum
    has not (a deployment being deleted) stays text."""
    try:
        return kind(value)
    except ValueError:
        return value


class _Overview:
    def __init__(self, **kw):
        self.__dict__.update(kw)

    def __repr__(self):
        return f"{type(self).__name__}({self.__dict__!r})"


class DeploymentStatusOverview(_Overview):
    """``status`` (a ``DeploymentStatus``), ``message``, ``replica_states``
    (``{state: count}``)."""


class ApplicationStatusOverview(_Overview):
    """``status`` (an ``ApplicationStatus``), ``message``, ``route_prefix``,
    ``deployments`` (name -> ``DeploymentStatusOverview``)."""


class ServeStatus:
    """What ``serve.status()`` returns: ``applications`` (name ->
    ``ApplicationStatusOverview``)."""

    def __init__(self, apps, http_port, proxies):
        self.applications = {}
        for name, a in apps.items():
            deps = {dn: DeploymentStatusOverview(
                        status=_as(DeploymentStatus, d["status"]), message=d["message"],
                        replica_states={_as(ReplicaState, k): v
                                        for k, v in d["replica_states"].items()})
                    for dn, d in a["deployments"].items()}
            self.applications[name] = ApplicationStatusOverview(
                status=_as(ApplicationStatus, a["status"]), message=a["message"],
                route_prefix=a["route_prefix"], deployments=deps)
        self.http_port = http_port
        self.proxies = proxies

    def __repr__(self):
        return f"ServeStatus(applications={self.applications!r})"
