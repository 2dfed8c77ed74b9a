"""Ray-shaped ids of this runtime's things, in hex as Ray prints them.

Internally a process, an actor and a call are small integers; Ray programs
see hex strings of Ray's lengths (a job 4 bytes, an actor 16, a task 24, a
node or a worker 28), made from those integers without any table.
"""
import hashlib

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


def worker_id_hex(node_hex, process_id):
    """A process's 28-byte worker id."""
    return hashlib.sha224(f"{node_hex}/{process_id}".encode()).hexdigest()
