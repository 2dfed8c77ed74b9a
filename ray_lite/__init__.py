"""ray_lite: a Cython-accelerated, single-machine runtime with Ray's API.

The Ray-compatible API (``init``, ``remote``, ``get``, ...) is being built on
the hot paths in :mod:`ray_lite._fast`; see the README's status table.
"""
__version__ = "0.1.0.dev0"

from ray_lite.message_queue import MessageQueue

__all__ = ["__version__", "MessageQueue"]
