"""The machine as Ray describes a cluster of one node: resources and ``nodes()``."""
import os

from ray_lite.exceptions import RaySystemError


from ..links import protocol as P
from ..process import backend as _backend
from ..process import state
from ..process.ids import NODE_IP, node_id_hex

CPU = "CPU"


def _memory_bytes():
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def _shm_bytes():
    try:
        st = os.statvfs("/dev/shm")
        return st.f_frsize * st.f_blocks
    except OSError:
        return 0


def memory_resource():
    """Ray's logical ``memory`` resource: 70 % of the machine's memory (what
    tasks and actors asking for ``memory=`` are scheduled against)."""
    return int(_memory_bytes() * 0.7)


def _static_resources():
    # As Ray reckons them at start: 30% of the memory (at most what /dev/shm
    # holds) for the object store; the node's own keys.  (``memory`` is the
    # scheduler's: see memory_resource.)
    store = int(_memory_bytes() * 0.3)
    shm = _shm_bytes()
    if shm:
        store = min(store, shm)
    return {"object_store_memory": float(store),
            f"node:{NODE_IP}": 1.0, "node:__internal_head__": 1.0}


def cpu_and_custom(driver):
    """``(total, available)`` CPUs and custom resources, as the scheduler sees them."""
    ledger = driver.resources
    return ledger.cluster_resources(), ledger.available_resources()


def resources(driver):
    """``(cluster_resources(), available_resources())`` with Ray's keys and floats."""
    total, free = cpu_and_custom(driver)
    static = _static_resources()
    if "memory" not in total:       # (a driver whose scheduler does not count it)
        total = {**total, "memory": memory_resource()}
        free = {**free, "memory": memory_resource()}
    total = {**{k: float(v) for k, v in total.items()}, **static}
    free = {**{k: float(v) for k, v in free.items() if v > 0}, **static}
    return total, free


def node_labels(node_id):
    """This node's labels: Ray's default one (what label strategies match)."""
    return {"ray.io/node-id": node_id}


def node_table(driver):
    """``nodes()``: this machine, alive, with Ray's keys."""
    total, _ = resources(driver)
    node_id = node_id_hex(driver.driver_pid)
    return [{
        "NodeID": node_id, "Alive": True, "NodeManagerAddress": NODE_IP,
        "NodeManagerHostname": os.uname().nodename, "NodeManagerPort": 0,
        "ObjectManagerPort": 0, "ObjectStoreSocketName": "", "RayletSocketName": "",
        "MetricsExportPort": 0, "NodeName": NODE_IP, "RuntimeEnvAgentPort": 0,
        "DeathReason": 0, "DeathReasonMessage": "", "alive": True, "Resources": total,
        "Labels": node_labels(node_id),
    }]


# ------------------------------------------------- the public API (any process)
def cluster_resources():
    """Every resource of the machine: ``CPU`` (``init(num_cpus=...)``), ``memory``,
    ``object_store_memory`` and the node's ``node:<ip>`` keys."""
    if _backend.RAY:
        return _backend.ENGINE.core.ray.cluster_resources()
    return _ask()[0]


def available_resources():
    """What is free now: as ``cluster_resources()``, less what running tasks and
    actors hold (a resource with nothing left is absent, as in Ray)."""
    if _backend.RAY:
        return _backend.ENGINE.core.ray.available_resources()
    return _ask()[1]


def nodes():
    """The nodes of the cluster: this machine, alive."""
    if _backend.RAY:
        return _backend.ENGINE.core.ray.nodes()
    return _running().request(P.OP_INTROSPECT, "nodes")


def get_gpu_ids():
    """The GPUs assigned to this worker: none (ray_lite schedules no GPU)."""
    if _backend.RAY:
        return _backend.ENGINE.core.ray.get_gpu_ids()
    _running()
    return []


def _ask():
    return _running().request(P.OP_INTROSPECT, "resources")


def _running():
    # As in Ray, these do not start the runtime: they describe a running one.
    node = state.node
    if node is None:
        raise RaySystemError("Ray has not been started yet. You can start Ray with "
                             "'ray.init()'.")
    return node


def node_ip_address(address="8.8.8.8:53"):
    """The address this machine uses to reach ``address`` (the one node's IP).

    A UDP ``connect`` sends nothing; it only asks the kernel which local
    address routes there.  Without a route (an offline machine) the node is
    reached at the loopback address, ``127.0.0.1``.
    """
    import socket
    host, _, port = address.rpartition(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.connect((host, int(port)))
        return sock.getsockname()[0]
    except (OSError, ValueError):
        return "127.0.0.1"
    finally:
        sock.close()
