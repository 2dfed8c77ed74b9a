"""The dashboard: a page on ``127.0.0.1:8265`` (Ray's port) showing the
runtime's processes, actors, tasks, Serve applications and the timeline.

``ray_lite.init(include_dashboard=True)`` serves it from the driver
(``serve_in_process``); ``ray-lite dashboard`` serves it from another
terminal, asking the running program through its state socket.  Nothing of
this package is imported by a program that does not open it.
"""
from .server import DashboardError, DashboardServer, serve_in_process

__all__ = ["DashboardError", "DashboardServer", "serve_in_process"]
