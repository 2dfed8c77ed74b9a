"""The runtime of this process: ``node`` is the driver's or the worker's Node."""
import threading

node = None
_lock = threading.RLock()


def get_node():
    """The running Node; the driver starts the runtime on first use, as Ray does."""
    n = node
    if n is None:
        from ray_lite._private import api
        api.init()
        n = node
    return n
