"""Every error ``ray_lite.serve`` raises: Ray Serve's under Ray Serve's names,
and ``ConfigError`` for a config file or option that does not follow Serve's
schema.  The core's errors (a replica's ``RayTaskError``, ``ActorDiedError``)
are in ``ray_lite.exceptions``."""
from ray_lite.exceptions import RayError, TaskCancelledError

__all__ = ["RayServeException", "BackPressureError", "DeploymentUnavailableError",
           "RequestCancelledError", "ReplicaUnavailableError", "ConfigError",
           "ClientDisconnected"]


class RayServeException(RayError):
    """Base of Serve's errors."""


class ConfigError(ValueError, RayServeException):
    """A Serve config file (``ray-lite serve run/deploy config.yaml``) or a
    Serve option that does not follow Serve's schema; the message names the
    key at fault and where it is.  A ``ValueError``."""


class ClientDisconnected(OSError):
    """An ingress app's ASGI ``send`` after its client closed the connection
    (ASGI spec version 2.4: an ``OSError``); the request is being cancelled."""


class BackPressureError(RayServeException):
    """A deployment's queue is full (``max_queued_requests``)."""

    def __init__(self, *, num_queued_requests=0, max_queued_requests=0, message=""):
        self.num_queued_requests = num_queued_requests
        self.max_queued_requests = max_queued_requests
        super().__init__(message or f"Request dropped due to backpressure "
                                    f"(num_queued_requests={num_queued_requests}, "
                                    f"max_queued_requests={max_queued_requests}).")

    def __reduce__(self):
        return (BackPressureError, (), {"num_queued_requests": self.num_queued_requests,
                                        "max_queued_requests": self.max_queued_requests,
                                        "args": self.args})

    def __setstate__(self, st):
        self.num_queued_requests = st["num_queued_requests"]
        self.max_queued_requests = st["max_queued_requests"]
        self.args = st["args"]


class DeploymentUnavailableError(RayServeException):
    """No replica of the deployment can take the call: its deploy failed, or
    none is left running (``handle.broadcast``)."""


class RequestCancelledError(RayServeException, TaskCancelledError):
    """The request was cancelled (``DeploymentResponse.cancel()``, or its
    HTTP client went away); Ray Serve's words, with its id when known."""

    def __init__(self, request_id=None):
        Exception.__init__(self, request_id)    # args: what pickling rebuilds it from
        self._request_id = request_id

    def __str__(self):
        if self._request_id:
            return f"Request {self._request_id} was cancelled."
        return "Request was cancelled."


class ReplicaUnavailableError(RayServeException):
    """The replica chosen for a request is no longer there (Ray Serve's; here
    a request whose replica died is sent to another one or fails with the
    replica's error)."""

    def __init__(self, replica_id=None):
        Exception.__init__(self, replica_id)
        self.replica_id = replica_id

    def __str__(self):
        return f"Replica {self.replica_id} is unavailable."
