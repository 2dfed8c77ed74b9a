"""Per-process Serve state: the controller's handle, and which replica we are."""
import contextvars
import dataclasses
import threading

from . import _core
from ._request_calls import current_request_calls, scope_request_id
from .multiplex import get_multiplexed_model_id

CONTROLLER_NAME = "SERVE_CONTROLLER"
SERVE_NAMESPACE = "serve"


@dataclasses.dataclass(frozen=True)
class DeploymentID:
    """A deployment's name and its application's (Ray's ``DeploymentID``)."""
    name: str
    app_name: str = "default"


@dataclasses.dataclass(frozen=True)
class ReplicaID:
    """A replica: its id, unique within its deployment, and the deployment."""
    unique_id: str
    deployment_id: DeploymentID

    def to_full_id_str(self):
        s = f"{self.deployment_id.name}#{self.unique_id}"
        if self.deployment_id.app_name:
            s = f"{self.deployment_id.app_name}#{s}"
        return f"SERVE_REPLICA::{s}"

    def __str__(self):
        return (f"Replica(id='{self.unique_id}', deployment='{self.deployment_id.name}', "
                f"app='{self.deployment_id.app_name}')")

    __repr__ = __str__


@dataclasses.dataclass(frozen=True)
class ReplicaRank:
    """Which of its deployment's replicas this one is: ``rank`` in
    ``range(world_size)``, kept by a replacement; one machine, so
    ``node_rank`` is 0 and ``local_rank`` is ``rank``."""
    rank: int
    node_rank: int = 0
    local_rank: int = 0


class ReplicaContext:
    """What ``serve.get_replica_context()`` returns inside a replica."""

    def __init__(self, replica_id, servable_object=None, rank=None, world_size=1,
                 code_version=None, gang_context=None):
        self.replica_id = replica_id
        self.gang_context = gang_context    # a GangContext with gang_scheduling_config
        self.servable_object = servable_object
        self.rank = rank if rank is not None else ReplicaRank(0)
        self.world_size = world_size
        # The id of its deployment's version (names the deployment actors).
        self.code_version = code_version

    @property
    def app_name(self):
        return self.replica_id.deployment_id.app_name

    @property
    def deployment(self):
        return self.replica_id.deployment_id.name

    @property
    def replica_tag(self):
        return self.replica_id.unique_id

    def __repr__(self):
        return (f"ReplicaContext(replica_id={self.replica_id!r}, rank={self.rank.rank}, "
                f"world_size={self.world_size})")


class _RequestContext:
    """What ``_get_serve_request_context()`` returns: the HTTP request this
    code runs for (Ray's private name, which applications use to log the
    request's id)."""

    __slots__ = ("route", "request_id", "app_name", "multiplexed_model_id",
                 "is_http_request", "_client")

    def __init__(self, route="", request_id="", app_name="", multiplexed_model_id="",
                 is_http_request=False, _client=""):
        self.route = route
        self.request_id = request_id
        self.app_name = app_name
        self.multiplexed_model_id = multiplexed_model_id
        self.is_http_request = is_http_request
        self._client = _client

    def __repr__(self):
        return f"_RequestContext(route={self.route!r}, request_id={self.request_id!r})"


# The ASGI scope of the HTTP request the running code serves (set per request
# in the replica: one context variable set; the context is made on demand).
http_scope = contextvars.ContextVar("serve_http_scope", default=None)


def _get_serve_request_context():
    """The request the running code serves (an empty context outside one).
    ``request_id`` is the client's ``x-request-id``, else the one the proxy
    made for it (the answer's ``x-request-id`` header), as in Ray; a handle
    call made while serving a request carries that request's id and route
    (a call from a driver gets a fresh id)."""
    scope = http_scope.get()
    replica = _replica_context
    app_name = replica.app_name if replica is not None else ""
    if scope is None:
        calls = current_request_calls()
        if calls is None:
            return _RequestContext(multiplexed_model_id=get_multiplexed_model_id())
        request_id, route = calls.ids()
        return _RequestContext(route=route, request_id=request_id, app_name=app_name,
                               multiplexed_model_id=get_multiplexed_model_id())
    client = scope.get("client")
    return _RequestContext(route=scope.get("root_path") or "/",
                           request_id=scope_request_id(scope), app_name=app_name,
                           multiplexed_model_id=get_multiplexed_model_id(),
                           is_http_request=True,
                           _client=f"{client[0]}:{client[1]}" if client else "")


_lock = threading.RLock()
_controller = None
_controller_node = None
_replica_context = None
routers = {}          # (app, deployment) -> Router, for this process's runtime
handles = {}          # (app, deployment) -> the DeploymentHandle the getters return


def _reset_if_new_runtime():
    global _controller, _controller_node
    node = _core.current_node()
    if _controller_node is not node:
        _controller = None
        _controller_node = node
        routers.clear()
        handles.clear()


def per_runtime(table, key, make):
    """``table[key]`` (``routers`` or ``handles``), made by ``make()`` the first
    time it is asked for in this process's runtime."""
    with _lock:
        _reset_if_new_runtime()
        value = table.get(key)
        if value is None:
            value = table[key] = make()
        return value


def set_controller(handle):
    global _controller
    with _lock:
        _reset_if_new_runtime()
        _controller = handle


def get_controller(create=False):
    """The controller's handle; RayServeException when Serve is not running."""
    from .exceptions import RayServeException
    with _lock:
        _reset_if_new_runtime()
        if _controller is not None:
            return _controller
        if _core.current_node() is None and not create:
            raise RayServeException("Serve is not running (call serve.run or serve.start)")
        try:
            h = _core.get_actor(CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
        except ValueError:
            raise RayServeException("Serve is not running (call serve.run or serve.start)") \
                from None
        set_controller(h)
        return h


def controller_named():
    """Whether the controller's name leads to it (the runtime restarts it
    under its name; one killed by ``serve.shutdown`` loses it)."""
    try:
        _core.get_actor(CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
        return True
    except ValueError:
        return False


# A controller's name missing this long after its death: it is not restarting.
NAME_GONE_S = 2.0


class ControllerRestartWait:
    """For a caller whose call the controller's death failed: ``again()``
    waits a backoff and says whether to make the call again, to the
    controller the runtime restarts, until ``timeout`` s have passed or its
    name has been missing for ``NAME_GONE_S`` (between its death and its
    restart the name may briefly lead nowhere)."""

    def __init__(self, timeout):
        import time
        self._clock = time.monotonic
        self._sleep = time.sleep
        self.end = self._clock() + timeout
        self.gone_since = None
        self.delay = 0.02

    def again(self):
        now = self._clock()
        if now + self.delay >= self.end:
            return False
        if controller_named():
            self.gone_since = None
        elif self.gone_since is None:
            self.gone_since = now
        elif now - self.gone_since > NAME_GONE_S:
            return False
        self._sleep(self.delay)
        self.delay = min(self.delay * 2, 0.5)
        return True


def clear_controller():
    global _controller
    with _lock:
        _controller = None
        routers.clear()
        handles.clear()


def set_replica_context(ctx):
    global _replica_context
    _replica_context = ctx


def _get_internal_replica_context():
    """The replica's context, or None outside a replica (Ray's private name,
    which custom request routers and libraries use)."""
    return _replica_context


def get_replica_context():
    if _replica_context is None:
        from .exceptions import RayServeException
        raise RayServeException("`serve.get_replica_context()` may only be called from within "
                                "a Ray Serve deployment.")
    return _replica_context


def get_trace_context():
    """Ray Serve's OpenTelemetry trace context of the running request: None,
    as in Ray when tracing is not enabled (ray_lite has no tracing)."""
    return None
