"""Serve's logging, as Ray Serve's: each replica's ``"ray.serve"`` logger
writes to standard error (relayed to the driver's terminal with the replica's
prefix) and, with ``logs_dir``, to a file of its own there, in Ray Serve's
format: ``LEVEL time deployment replica [request_id] -- message`` (TEXT) or
one JSON object a record (JSON), with the application, route and request id
of the request being served.

``LoggingConfig`` is ``ray.serve.schema.LoggingConfig``; a deployment's
``logging_config`` wins over its application's (``serve.run(...,
logging_config=...)``), which wins over the default (INFO, TEXT), as in Ray.
The per-request access log is the proxies' (``HTTPOptions(access_log=True)``):
replicas write none, so ``enable_access_log`` changes nothing here.
"""
import logging
import os

SERVE_LOGGER_NAME = "ray.serve"
_ENCODINGS = ("TEXT", "JSON")
_FIELDS = ("encoding", "log_level", "logs_dir", "enable_access_log",
           "additional_log_standard_attrs")
_HANDLER_NAME = "ray_lite.serve.replica"


class LoggingConfig:
    """Ray Serve's logging config: ``encoding`` ("TEXT" or "JSON"),
    ``log_level`` ("INFO"), ``logs_dir`` (None: standard error only),
    ``enable_access_log`` (True), ``additional_log_standard_attrs`` ([])."""

    def __init__(self, encoding="TEXT", log_level="INFO", logs_dir=None,
                 enable_access_log=True, additional_log_standard_attrs=None):
        from ray_lite._private.job.logging_config import LOGRECORD_STANDARD_ATTRS
        if encoding not in _ENCODINGS:
            raise ValueError(f"Got invalid encoding type '{encoding}'. Valid encodings are "
                             f"{list(_ENCODINGS)}.")
        if isinstance(log_level, int):
            log_level = logging.getLevelName(log_level)
        if not isinstance(logging.getLevelName(log_level), int):
            raise ValueError(f'Got "{log_level}" for log_level. log_level must be one of '
                             f"['DEBUG', 'INFO', 'WARNING', 'ERROR', 'CRITICAL'].")
        if logs_dir is not None and not isinstance(logs_dir, str):
            raise TypeError(f"logs_dir must be a str, got {type(logs_dir).__name__}")
        if not isinstance(enable_access_log, bool):
            raise TypeError("enable_access_log must be a bool")
        attrs = list(additional_log_standard_attrs or [])
        for attr in attrs:
            if attr not in LOGRECORD_STANDARD_ATTRS:
                raise ValueError(f"Unknown attr `{attr}` for log_standard_attrs. Valid "
                                 f"attrs are: {sorted(LOGRECORD_STANDARD_ATTRS)}")
        self.encoding = encoding
        self.log_level = log_level
        self.logs_dir = logs_dir
        self.enable_access_log = enable_access_log
        self.additional_log_standard_attrs = attrs

    def dict(self, **_):
        return {k: getattr(self, k) for k in _FIELDS}

    model_dump = dict

    def __eq__(self, other):
        return isinstance(other, LoggingConfig) and self.dict() == other.dict()

    def __repr__(self):
        return "LoggingConfig(" + ", ".join(f"{k}={v!r}" for k, v in self.dict().items()) + ")"


def logging_config_dict(value, where="logging_config"):
    """``value`` (a dict, a ``LoggingConfig``, pydantic's, or None) as the
    checked dict a replica's config carries (None stays None)."""
    if value is None:
        return None
    if isinstance(value, LoggingConfig):
        return value.dict()
    if not isinstance(value, dict):
        dump = getattr(value, "model_dump", None) or getattr(value, "dict", None)
        if dump is None:
            raise TypeError(f"{where} must be a dict or a LoggingConfig, got "
                            f"{type(value).__name__}")
        value = dump()
    unknown = sorted(set(value) - set(_FIELDS))
    if unknown:
        raise ValueError(f"{where} has unknown fields {unknown}; Ray's are {list(_FIELDS)}")
    return LoggingConfig(**value).dict()


def configure_default_serve_logger():
    """Ray's: this process's ``"ray.serve"`` logger set up as Serve's own
    processes set theirs (the default ``LoggingConfig``, standard error)."""
    configure_replica_logger("", "serve", str(os.getpid()), None)


def configure_replica_logger(app_name, deployment, replica_id, config):
    """Set up this replica process's ``"ray.serve"`` logger (``config``: the
    dict of ``logging_config_dict``, or None for the default)."""
    cfg = LoggingConfig(**(config or {}))
    logger = logging.getLogger(SERVE_LOGGER_NAME)
    logger.propagate = False
    logger.setLevel(cfg.log_level)
    for old in [h for h in logger.handlers if h.get_name() == _HANDLER_NAME]:
        logger.removeHandler(old)
        old.close()
    formatter = (_JSONFormatter(deployment, replica_id, cfg) if cfg.encoding == "JSON"
                 else _TextFormatter(deployment, replica_id, cfg))
    handlers = [logging.StreamHandler()]
    if cfg.logs_dir:
        os.makedirs(cfg.logs_dir, exist_ok=True)
        name = f"replica_{app_name}_{deployment}_{replica_id}.log"
        handlers.append(logging.FileHandler(os.path.join(cfg.logs_dir, name)))
    for handler in handlers:
        handler.set_name(_HANDLER_NAME)
        handler.setFormatter(formatter)
        handler.addFilter(_add_request)
        logger.addHandler(handler)


def _add_request(record):
    """A filter (True): the request being served, when there is one."""
    from .context import _get_serve_request_context
    try:
        ctx = _get_serve_request_context()
        record.request_id, record.route = ctx.request_id, ctx.route
        record.application = ctx.app_name
    except Exception:   # noqa: BLE001 - outside a request
        record.request_id = record.route = record.application = ""
    return True


class _TextFormatter(logging.Formatter):
    def __init__(self, deployment, replica_id, cfg):
        super().__init__()
        self.prefix = f"{deployment} {replica_id} "
        self.attrs = cfg.additional_log_standard_attrs

    def format(self, record):
        record.message = record.getMessage()
        parts = [f"{record.levelname} {self.formatTime(record)} {self.prefix}"]
        if record.request_id:
            parts.append(f"{record.request_id} ")
        for attr in self.attrs:
            parts.append(f"{getattr(record, attr, '')} ")
        parts.append(f"-- {record.message}")
        text = "".join(parts)
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


class _JSONFormatter(logging.Formatter):
    def __init__(self, deployment, replica_id, cfg):
        super().__init__()
        self.fixed = {"deployment": deployment, "replica": replica_id,
                      "component_name": "replica"}
        self.attrs = cfg.additional_log_standard_attrs

    def format(self, record):
        import json
        out = {"levelname": record.levelname, "asctime": self.formatTime(record),
               **self.fixed, "message": record.getMessage(),
               "filename": record.filename, "lineno": record.lineno}
        if record.request_id:
            out.update(request_id=record.request_id, route=record.route,
                       application=record.application)
        for attr in self.attrs:
            out[attr] = getattr(record, attr, None)
        if record.exc_info:
            out["exc_text"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)
