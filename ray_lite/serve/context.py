"""Per-process Serve state: the controller's handle, and which replica we are."""
import threading

from . import _core

CONTROLLER_NAME = "SERVE_CONTROLLER"
SERVE_NAMESPACE = "serve"


class ReplicaContext:
    """What ``serve.get_replica_context()`` returns inside a replica."""

    def __init__(self, app_name, deployment, replica_id, servable_object=None):
        self.app_name = app_name
        self.deployment = deployment
        self.replica_id = replica_id
        self.replica_tag = replica_id
        self.servable_object = servable_object

    def __repr__(self):
        return (f"ReplicaContext(app_name={self.app_name!r}, deployment={self.deployment!r}, "
                f"replica_id={self.replica_id!r})")


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


def clear_controller():
    global _controller
    with _lock:
        _controller = None
        routers.clear()
        handles.clear()


def set_replica_context(ctx):
    global _replica_context
    _replica_context = ctx


def get_replica_context():
    if _replica_context is None:
        from .exceptions import RayServeException
        raise RayServeException("`serve.get_replica_context()` may only be called from within "
                                "a Ray Serve deployment.")
    return _replica_context
