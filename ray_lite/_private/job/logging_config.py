"""Ray's ``LoggingConfig`` (``init(logging_config=...)``): the root logger of
the driver and of every worker and actor process of the job writes each
record, at ``log_level`` and above, to standard error (relayed to the
driver's terminal with the process's prefix) as TEXT or JSON, with the
runtime context of the record: job, worker, node, task and actor, as Ray's.

Applied in the driver by ``init`` and in each worker before it runs
anything (the spawn spec carries it: ``worker.worker_main``).
"""
import logging
import time
from dataclasses import asdict, dataclass, field, fields

__all__ = ["LoggingConfig"]

ENCODINGS = ("TEXT", "JSON")

# The attributes of a ``logging.LogRecord`` that
# ``additional_log_standard_attrs`` may name (Python's documented ones).
LOGRECORD_STANDARD_ATTRS = frozenset({
    "args", "asctime", "created", "exc_info", "exc_text", "filename", "funcName",
    "levelname", "levelno", "lineno", "message", "module", "msecs", "msg", "name",
    "pathname", "process", "processName", "relativeCreated", "stack_info", "taskName",
    "thread", "threadName"})

# The runtime context each record carries (Ray's keys), in this order.
_CONTEXT_KEYS = ("job_id", "worker_id", "node_id", "actor_id", "actor_name", "task_id",
                 "task_name", "task_func_name")
_HANDLER_NAME = "ray_lite.logging_config"


@dataclass
class LoggingConfig:
    encoding: str = "TEXT"
    log_level: str = "INFO"
    additional_log_standard_attrs: list = field(default_factory=list)

    def __post_init__(self):
        # Ray's checks and words.
        if self.encoding not in ENCODINGS:
            raise ValueError(f"Invalid encoding type: {self.encoding}. Valid encoding types "
                             f"are: {list(ENCODINGS)}")
        for attr in self.additional_log_standard_attrs:
            if attr not in LOGRECORD_STANDARD_ATTRS:
                raise ValueError(f"Unknown python logging standard attribute: {attr}. The "
                                 f"valid attributes are: {set(LOGRECORD_STANDARD_ATTRS)}")
        level = self.log_level
        if not isinstance(level, int) and not isinstance(logging.getLevelName(level), int):
            raise ValueError(f"Invalid log_level {level!r}: a name logging knows "
                             f"(DEBUG, INFO, WARNING, ERROR, CRITICAL) or a number")

    def to_dict(self):
        return asdict(self)

    @classmethod
    def from_dict(cls, d):
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    def _apply(self):
        """Configure this process's root logger (and ``ray_lite``'s) as the
        config says; applied again, it replaces its own handler."""
        handler = logging.StreamHandler()
        handler.set_name(_HANDLER_NAME)
        handler.setLevel(self.log_level)
        handler.setFormatter(_JSONFormatter(self) if self.encoding == "JSON"
                             else _TextFormatter(self))
        handler.addFilter(_add_context)
        for logger in (logging.getLogger(), logging.getLogger("ray_lite")):
            for old in [h for h in logger.handlers if h.get_name() == _HANDLER_NAME]:
                logger.removeHandler(old)
            logger.setLevel(self.log_level)
            logger.addHandler(handler)
        # ray_lite's own records go to this handler once, not again via the root.
        logging.getLogger("ray_lite").propagate = False

    def _to_ray(self):
        import ray
        return ray.LoggingConfig(**self.to_dict())


def _add_context(record):
    """A filter (returns True) setting the record's runtime context: the
    job, worker and node everywhere; the task and actor in a worker."""
    from ..process import state
    values = {}
    node = state.node
    if node is not None and state.runtime_context is not None:
        ctx = state.runtime_context()
        getters = [("job_id", ctx.get_job_id), ("worker_id", ctx.get_worker_id),
                   ("node_id", ctx.get_node_id)]
        if node.id != 0:
            # (Task and actor getters warn in the driver: a warning logged
            # from this filter would come back to it.)
            getters += [("actor_id", ctx.get_actor_id), ("actor_name", ctx.get_actor_name),
                        ("task_id", ctx.get_task_id), ("task_name", ctx.get_task_name),
                        ("task_func_name", ctx.get_task_function_name)]
        for key, getter in getters:
            try:
                value = getter()
            except Exception:   # noqa: BLE001 - no such context here
                value = None
            if value is not None:
                values[key] = value
    values["timestamp_ns"] = time.time_ns()
    record.ray_context = values
    return True


def _extra(record, config):
    out = dict(getattr(record, "ray_context", {}))
    for attr in config.additional_log_standard_attrs:
        out[attr] = getattr(record, attr, None)
    return out


class _TextFormatter(logging.Formatter):
    def __init__(self, config):
        super().__init__("%(asctime)s\t%(levelname)s %(filename)s:%(lineno)s -- %(message)s")
        self.config = config

    def format(self, record):
        text = super().format(record)
        extra = _extra(record, self.config)
        if not extra:
            return text
        return text + " " + " ".join(f"{k}={v}" for k, v in extra.items())


class _JSONFormatter(logging.Formatter):
    def __init__(self, config):
        super().__init__()
        self.config = config

    def format(self, record):
        import json
        out = {"asctime": self.formatTime(record), "levelname": record.levelname,
               "message": record.getMessage(), "filename": record.filename,
               "lineno": record.lineno}
        if record.exc_info:
            out["exc_text"] = self.formatException(record.exc_info)
        out.update(_extra(record, self.config))
        return json.dumps(out, default=str)
