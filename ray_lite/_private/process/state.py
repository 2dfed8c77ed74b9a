"""The runtime of this process: ``node`` is the driver's or the worker's Node.

This module imports nothing of the runtime: everything else imports it.  The
driver's first use starts the runtime, as Ray does, through ``auto_start``,
which ``api`` sets to its ``init`` when it is imported; ``runtime_context``
(``get_runtime_context``, set by ``api/runtime_context.py``) is read by the
layers below ``api`` that need it (the job's log records).
"""
import os
import threading

node = None
_lock = threading.RLock()
auto_start = None
runtime_context = None
# "host:port" of the dashboard this driver serves, set by the dashboard while it
# serves and None otherwise (read by ``RuntimeContext.get_dashboard_url``).
dashboard_url = None


def get_node():
    """The running Node; the driver starts the runtime on first use, as Ray does."""
    n = node
    if n is None:
        if auto_start is None:
            raise RuntimeError("ray_lite is not initialized (call ray_lite.init())")
        if os.environ.get("RAY_ENABLE_AUTO_CONNECT", "") == "0":
            from ray_lite.exceptions import RaySystemError     # (no import at load: see above)
            raise RaySystemError("Ray has not been started yet. You can start Ray with "
                                 "'ray.init()'.")
        auto_start()
        n = node
    return n
