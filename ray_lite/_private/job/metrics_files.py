"""Where this runtime's Prometheus metric files live, shared by Serve's own
metrics (``serve/_metrics.py``) and the user's (``util/metrics.py``).

While Serve exports metrics (``metrics_export_port``), every process of the
runtime writes its values with ``prometheus_client`` in multiprocess mode
into one directory, named after the runtime's shared-memory prefix; the
first proxy serves their sum.  Core only: nothing here imports Serve.
"""
import os
import tempfile

from ..process import state

DIR_PREFIX = "ray_lite_serve_metrics_"

# Moves when this process made or removed the directory (Serve's start and
# shutdown, in the driver): what was decided for the old one is looked at
# again, and values go into fresh files.
generation = 0


def directory_changed():
    global generation
    generation += 1


def metrics_dir():
    """This runtime's directory of metric files (None before ``init``); it
    exists only while Serve exports metrics."""
    node = state.node
    if node is None:
        return None
    return os.path.join(tempfile.gettempdir(), DIR_PREFIX + node.shm_prefix)


_configured_for = None


def multiprocess_client(path):
    """``prometheus_client`` in multiprocess mode, writing into ``path``
    (ImportError when it is not installed).

    Switched once per directory: each switch makes a new value class, whose
    values open this process's files again, and two open copies of one file
    in a process do not see each other's new entries."""
    global _configured_for
    import prometheus_client
    if _configured_for != (path, generation):
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
        from prometheus_client import values
        # Chosen when it was imported: a process that imported it before
        # the variable was set would keep its values to itself.
        values.ValueClass = values.get_value_class()
        _configured_for = (path, generation)
    return prometheus_client
