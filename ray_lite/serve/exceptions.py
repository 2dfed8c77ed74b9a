"""Serve's errors (Ray Serve's names)."""
from ray_lite.exceptions import RayError, TaskCancelledError


class RayServeException(RayError):
    pass


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
    pass


class RequestCancelledError(RayServeException, TaskCancelledError):
    """The request was cancelled (``DeploymentResponse.cancel()``)."""
