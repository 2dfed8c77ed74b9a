"""Ray's ``DAGContext``: the Compiled Graphs' settings, one per process,
from ``RAY_CGRAPH_<name>`` environment variables or set in Python.  Those
that concern Ray's channels (buffer sizes, read iterations, GPU overlap) are
kept for programs that set them, and have no effect here."""
import dataclasses
import os
import threading

_default_context = None
_context_lock = threading.Lock()


def _env(name, default, kind=int):
    raw = os.environ.get(f"RAY_CGRAPH_{name}", default)
    try:
        return kind(raw)
    except ValueError:
        raise ValueError(f"RAY_CGRAPH_{name}={raw!r} is not a valid "
                         f"{getattr(kind, '__name__', 'value')}") from None


@dataclasses.dataclass
class DAGContext:
    """``submit_timeout``, ``get_timeout`` (a ``get`` of a ``CompiledDAGRef``
    without a timeout waits this long), ``teardown_timeout``,
    ``read_iteration_timeout``, ``buffer_size_bytes``,
    ``max_inflight_executions`` (the default of ``experimental_compile``),
    ``max_buffered_results``, ``overlap_gpu_communication``: Ray's."""

    submit_timeout: int = _env("submit_timeout", 10)
    get_timeout: int = _env("get_timeout", 10)
    teardown_timeout: int = _env("teardown_timeout", 30)
    read_iteration_timeout: float = _env("read_iteration_timeout_s", 0.1, float)
    buffer_size_bytes: int = _env("buffer_size_bytes", 1_000_000, lambda v: int(float(v)))
    max_inflight_executions: int = _env("max_inflight_executions", 10)
    max_buffered_results: int = _env("max_buffered_results", 1000)
    overlap_gpu_communication: bool = _env("overlap_gpu_communication", "0",
                                           lambda v: v.lower() in ("1", "true"))

    def __post_init__(self):
        if self.read_iteration_timeout > self.get_timeout:
            raise ValueError(f"RAY_CGRAPH_read_iteration_timeout_s "
                             f"({self.read_iteration_timeout}) must be less than or equal to "
                             f"RAY_CGRAPH_get_timeout ({self.get_timeout})")

    @staticmethod
    def get_current():
        """This process's context (made with the defaults on first use)."""
        global _default_context
        with _context_lock:
            if _default_context is None:
                _default_context = DAGContext()
            return _default_context
