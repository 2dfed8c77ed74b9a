"""Ray-shaped ids of this runtime's things, in hex as Ray prints them.

Internally a process, an actor and a call are small integers; Ray programs
see hex strings of Ray's lengths (a job 4 bytes, an actor 16, a task 24, a
node or a worker 28), made from those integers without any table.
"""
import os

from ray_lite._lazy import lazy_module

hashlib = lazy_module("hashlib", globals())     # for ids asked for, not at import
datetime = lazy_module("datetime", globals())

# One driver, one job: Ray numbers the first job of a cluster 1.
JOB_ID_HEX = "01000000"
NODE_IP = "127.0.0.1"


def actor_id_hex(actor_id):
    """An actor's id: 12 bytes of its number, then the job's 4 (as in Ray)."""
    return f"{actor_id:024x}{JOB_ID_HEX}"


def task_id_hex(oid):
    """A call's id (the id of its first result): 20 bytes, then the job's 4."""
    return f"{oid:040x}{JOB_ID_HEX}"


def node_id_hex(driver_pid):
    """The node's 28-byte id: the same in every process of one runtime."""
    return hashlib.sha224(f"ray_lite-node-{driver_pid}".encode()).hexdigest()


def session_name(driver_pid):
    """The runtime's session name, in Ray's form
    (``session_2026-12-03_12-00-00_000000_<driver pid>``): the driver's start
    time, read from ``/proc``, so every process of one runtime says the same."""
    try:
        with open(f"/proc/{driver_pid}/stat", "rb") as f:
            ticks = int(f.read().rsplit(b")", 1)[1].split()[19])     # starttime
        with open("/proc/stat", "rb") as f:
            boot = next(int(ln.split()[1]) for ln in f if ln.startswith(b"btime"))
        start = boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        start = 0.0     # (no /proc: still one name per driver)
    stamp = datetime.datetime.fromtimestamp(start).strftime("%Y-%m-%d_%H-%M-%S_%f")
    return f"session_{stamp}_{driver_pid}"


def worker_id_hex(node_hex, process_id):
    """A process's 28-byte worker id."""
    return hashlib.sha224(f"{node_hex}/{process_id}".encode()).hexdigest()


class BaseID:
    """Ray's id objects (``ray.NodeID``, ``ray.TaskID``...): fixed-size bytes
    shown in hex.  What ``get_runtime_context().node_id`` and the like return
    (the ``get_*_id()`` methods return the hex strings)."""

    __slots__ = ("_bytes",)
    SIZE = 28

    def __init__(self, id_bytes):
        if not isinstance(id_bytes, bytes):
            raise TypeError(f"Unsupported type: {type(id_bytes)}")
        if len(id_bytes) != self.SIZE:
            raise ValueError(f"ID string needs to have length {self.SIZE}, "
                             f"got {len(id_bytes)}")
        self._bytes = id_bytes

    @classmethod
    def size(cls):
        return cls.SIZE

    @classmethod
    def from_binary(cls, id_bytes):
        return cls(id_bytes)

    @classmethod
    def from_hex(cls, hex_id):
        try:
            id_bytes = bytes.fromhex(hex_id)
        except (TypeError, ValueError):
            raise ValueError(f"{cls.__name__}.from_hex: not a hex string: {hex_id!r}") from None
        return cls(id_bytes)

    @classmethod
    def from_random(cls):
        return cls(os.urandom(cls.SIZE))

    @classmethod
    def nil(cls):
        return cls(b"\xff" * cls.SIZE)

    def binary(self):
        return self._bytes

    def hex(self):
        return self._bytes.hex()

    def is_nil(self):
        return self._bytes == b"\xff" * self.SIZE

    def __eq__(self, other):
        return type(other) is type(self) and other._bytes == self._bytes

    def __ne__(self, other):
        return not self.__eq__(other)

    def __hash__(self):
        return hash((type(self).__name__, self._bytes))

    def __repr__(self):
        return f"{type(self).__name__}({self.hex()})"

    __str__ = __repr__

    def __reduce__(self):
        return (type(self), (self._bytes,))


class UniqueID(BaseID):
    __slots__ = ()


class NodeID(BaseID):
    __slots__ = ()


class WorkerID(BaseID):
    __slots__ = ()


class FunctionID(BaseID):
    __slots__ = ()


class ActorClassID(BaseID):
    __slots__ = ()


class JobID(BaseID):
    __slots__ = ()
    SIZE = 4

    @classmethod
    def from_int(cls, value):
        return cls(value.to_bytes(4, "little"))

    def int(self):
        return int.from_bytes(self._bytes, "little")


class ActorID(BaseID):
    __slots__ = ()
    SIZE = 16


class TaskID(BaseID):
    __slots__ = ()
    SIZE = 24

    def job_id(self):
        """The job this task belongs to: its id's last 4 bytes, as in Ray."""
        return JobID(self._bytes[-JobID.SIZE:])


class PlacementGroupID(BaseID):
    __slots__ = ()
    SIZE = 18


ID_TYPES = (UniqueID, NodeID, WorkerID, FunctionID, ActorClassID, JobID, ActorID,
            TaskID, PlacementGroupID)
