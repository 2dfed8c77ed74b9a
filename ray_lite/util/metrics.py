"""Ray's ``ray.util.metrics`` for ray_lite: ``Counter``, ``Gauge``, ``Histogram``.

Application metrics, declared and recorded as in Ray::

    from ray_lite.util import metrics

    requests = metrics.Counter("app_requests", "Requests served.", tag_keys=("route",))
    requests.inc(tags={"route": "/predict"})
    latency = metrics.Histogram("app_latency_ms", boundaries=[1, 10, 100])
    latency.observe(4.2)

The arguments are checked as Ray checks them, with Ray's errors: an empty
name, ``tag_keys`` that is not a tuple of str, a tag value that is not a
str, a missing tag value, a counter increment that is not positive, a
histogram without positive boundaries.  A name Prometheus cannot take
draws a ``UserWarning`` and the metric records nothing (Ray discards it).

Where the values go: while Serve exports metrics (``serve.start(
http_options={"metrics_export_port": N})``, ``ray-lite serve run
--metrics-export-port N``), every process of the runtime (replicas, tasks,
actors, the driver) adds them to what the port serves, under Ray's exported
names: ``ray_<name>_total`` for a counter, ``ray_<name>`` for a gauge (one
series per process, labelled ``pid``: the gauge's last value there, gone
when the process ends) and ``ray_<name>_bucket``/``_sum``/``_count`` for a
histogram, labelled with the tag keys (characters a Prometheus label
cannot hold become ``_``).  Without an export they are checked and
dropped, as in a Ray cluster nobody scrapes (a process that recorded while
nothing was exported looks again a second later).

A metric passed to a task or an actor (pickled) is rebuilt there from its
name, description, tag keys (and boundaries), without its default tags, as
Ray's.  On the Ray backend each class makes Ray's metric.
"""
import os
import re
import threading
import warnings
from time import monotonic as _monotonic

from ray_lite._private.process import backend as _backend
from ray_lite._private.job import metrics_files

__all__ = ["Counter", "Gauge", "Histogram"]

# What Prometheus accepts as a metric name and as a label name.
_VALID_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_BAD_CHARS = re.compile(r"[^a-zA-Z0-9_]")

# Ray's exporter puts its namespace before the user's names.
_EXPORT_PREFIX = "ray_"


def _check_tag_values(tags):
    for value in tags.values():
        if not isinstance(value, str):
            raise TypeError(f"Tag values must be str, got {type(value)}.")


def _label_name(key):
    name = _LABEL_BAD_CHARS.sub("_", key)
    if not name or name[0].isdigit() or name.startswith("__"):
        name = "tag_" + name
    return name


class _Export:
    """Whether this process exports metrics: while the runtime's metric
    directory exists (Serve exports), the Prometheus client writing there."""

    lock = threading.Lock()
    path = None          # the directory the answer below is for...
    generation = -1      # ...and its metrics_files.generation
    client = None        # prometheus_client in multiprocess mode, or None
    recheck_at = 0.0     # a "no" is looked at again after RECHECK_S

    RECHECK_S = 1.0

    @classmethod
    def get(cls):
        path = metrics_files.metrics_dir()
        if path == cls.path and cls.generation == metrics_files.generation and (
                cls.client is not None or _monotonic() < cls.recheck_at):
            return cls.client
        with cls.lock:
            client = None
            if path is not None and os.path.isdir(path):
                try:
                    client = metrics_files.multiprocess_client(path)
                except ImportError:
                    client = None
            cls.path, cls.generation, cls.client = path, metrics_files.generation, client
            cls.recheck_at = _monotonic() + cls.RECHECK_S
            return client


class Metric:
    """What the three metric kinds share: name, description, tag keys,
    default tags; see the module docstring."""

    def __init__(self, name, description="", tag_keys=None):
        if not isinstance(name, str):
            raise TypeError(f"A metric's name must be a str, got {type(name)}.")
        if len(name) == 0:
            raise ValueError("Empty name is not allowed. Please provide a metric name.")
        self._discard = _VALID_NAME.match(name) is None
        if self._discard:
            warnings.warn(f"Invalid metric name: {name}. Metric will be discarded and data "
                          f"will not be collected or published. Metric names can only "
                          f"contain letters, numbers, _, and :, and cannot start with a "
                          f"number.", UserWarning,
                          # (at the user's line, past a subclass's __init__)
                          stacklevel=2 if type(self).__init__ is Metric.__init__ else 3)
        self._name = name
        self._description = description
        self._default_tags = {}
        self._tag_keys = tag_keys or ()
        if not isinstance(self._tag_keys, tuple):
            raise TypeError(f"tag_keys should be a tuple type, got: {type(self._tag_keys)}")
        for key in self._tag_keys:
            if not isinstance(key, str):
                raise TypeError(f"Tag keys must be str, got {type(key)}.")
        self._exported = None       # the Prometheus metric, made at the first record...
        self._exported_to = None    # ...into this directory (a new runtime has another)
        self._children = {}         # tag values -> its labelled child

    def set_default_tags(self, default_tags):
        """Tags used by every record that does not give its own; returns the metric."""
        for key, value in default_tags.items():
            if key not in self._tag_keys:
                raise ValueError(f"Unrecognized tag key {key}.")
            if not isinstance(value, str):
                raise TypeError(f"Tag values must be str, got {type(value)}.")
        self._default_tags = default_tags
        return self

    @property
    def info(self):
        return {"name": self._name, "description": self._description,
                "tag_keys": self._tag_keys, "default_tags": self._default_tags}

    def _record(self, value, tags):
        if self._discard:
            return
        if tags:
            _check_tag_values(tags)
            final = {**self._default_tags, **tags}
        else:
            final = self._default_tags
        missing = [k for k in self._tag_keys if k not in final]
        if missing:
            raise ValueError(f"Missing value for tag key(s): {','.join(missing)}.")
        client = _Export.get()
        if client is None:
            return
        where = (_Export.path, _Export.generation)
        if self._exported_to != where:
            self._exported, self._exported_to, self._children = None, where, {}
        key = tuple(final[k] for k in self._tag_keys)
        child = self._children.get(key)
        if child is None:
            if self._exported is None:
                labels = [_label_name(k) for k in self._tag_keys]
                self._exported = self._make(client, _EXPORT_PREFIX + self._name,
                                            self._description, labels)
            child = self._exported.labels(*key) if self._tag_keys else self._exported
            self._children[key] = child
        self._apply(child, value)

    def __reduce__(self):
        return type(self), (self._name, self._description, self._tag_keys)


def _check_number(value):
    # (a bool is an int here, as in Ray)
    if not isinstance(value, (int, float)):
        raise TypeError(f"value must be int or float, got {type(value)}.")


@_backend.ray_counterpart("Counter")
class Counter(Metric):
    """A count that only goes up (Prometheus' counter)."""

    def inc(self, value=1.0, tags=None):
        """Add ``value`` (> 0; default 1); ``tags`` override the default tags."""
        _check_number(value)
        if value <= 0:
            raise ValueError(f"value must be >0, got {value}")
        self._record(value, tags)

    @staticmethod
    def _make(client, name, description, labels):
        return client.Counter(name, description, labels, registry=None)

    @staticmethod
    def _apply(child, value):
        child.inc(value)


@_backend.ray_counterpart("Gauge")
class Gauge(Metric):
    """The last value set (Prometheus' gauge)."""

    def set(self, value, tags=None):
        """Set the gauge to ``value``; ``None`` does nothing."""
        if value is None:
            return
        _check_number(value)
        self._record(value, tags)

    @staticmethod
    def _make(client, name, description, labels):
        # One series per process (labelled pid), while the process lives.
        return client.Gauge(name, description, labels, registry=None,
                            multiprocess_mode="liveall")

    @staticmethod
    def _apply(child, value):
        child.set(value)


@_backend.ray_counterpart("Histogram")
class Histogram(Metric):
    """Observations counted in buckets (Prometheus' histogram)."""

    def __init__(self, name, description="", boundaries=None, tag_keys=None):
        super().__init__(name, description, tag_keys)
        if boundaries is None or len(boundaries) == 0:
            raise ValueError("boundaries argument should be provided when using the "
                             "Histogram class. e.g., Histogram(\"name\", boundaries=[1.0, 2.0])")
        for i, boundary in enumerate(boundaries):
            if not isinstance(boundary, (int, float)) or isinstance(boundary, bool):
                raise TypeError(f"Invalid `boundaries` argument at index {i}, {boundaries}: "
                                f"boundaries must be int or float.")
            if boundary <= 0:
                raise ValueError(f"Invalid `boundaries` argument at index {i}, {boundaries}. "
                                 f"Use positive values for the arguments.")
        self.boundaries = boundaries

    def observe(self, value, tags=None):
        """Count ``value`` in its bucket; ``tags`` override the default tags."""
        _check_number(value)
        self._record(value, tags)

    def _make(self, client, name, description, labels):
        buckets = sorted(set(float(b) for b in self.boundaries))
        return client.Histogram(name, description, labels, registry=None, buckets=buckets)

    @staticmethod
    def _apply(child, value):
        child.observe(value)

    @property
    def info(self):
        return {**super().info, "boundaries": self.boundaries}

    def __reduce__(self):
        return Histogram, (self._name, self._description, self.boundaries, self._tag_keys)
