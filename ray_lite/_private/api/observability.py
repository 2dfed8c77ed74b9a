"""What ``init`` and ``shutdown`` start and stop so that a person can see what
runs: the state socket (``node/state_socket.py``, always, in the driver),
the dashboard (``init(include_dashboard=True)``), and ``ray_lite.timeline``.

The dashboard is a package above the core: it is imported here by its name
(``DASHBOARD_MODULE``), only when asked for, so a program that does not open
it imports nothing of it.
"""
import importlib

from ..process import backend as _backend
from ..process import state

__all__ = ["DASHBOARD_MODULE", "on_init", "on_shutdown", "timeline"]

DASHBOARD_MODULE = "ray_lite.dashboard"
DEFAULT_DASHBOARD_HOST = "127.0.0.1"
DEFAULT_DASHBOARD_PORT = 8265        # Ray's

_dashboard = None       # the dashboard this driver serves, if any


def on_init(options):
    """In ``init`` once the driver runs: listen on the state socket, and serve
    the dashboard when ``options`` (init's keywords) ask for it.  Returns the
    dashboard's "host:port", or None."""
    global _dashboard
    # Imported here, not at the top: only a driver listens, and every
    # worker imports this module at start (B10).
    from ..node import state_socket
    state_socket.start()
    if not options.get("include_dashboard"):
        return None
    host = options.get("dashboard_host") or DEFAULT_DASHBOARD_HOST
    port = options.get("dashboard_port")
    port = DEFAULT_DASHBOARD_PORT if port is None else int(port)
    _dashboard = importlib.import_module(DASHBOARD_MODULE).serve_in_process(host, port)
    return state.dashboard_url


def on_shutdown():
    """In ``shutdown``: stop the dashboard and the state socket."""
    global _dashboard
    dashboard, _dashboard = _dashboard, None
    if dashboard is not None:
        dashboard.stop()
    from ..node import state_socket
    state_socket.stop()


def timeline(filename=None):
    """Ray's ``ray.timeline(filename=None)``: the tasks and actor calls of the
    recent past as Chrome trace events (``chrome://tracing``, Perfetto), a
    list, or written to ``filename`` as JSON.  Recorded only while
    ``RAY_LITE_TIMELINE=1`` (see the manual's observability page)."""
    if _backend.RAY:
        return _backend.require_ray().timeline(filename=filename)
    from ..node import timeline as _timeline
    return _timeline.timeline(filename)
