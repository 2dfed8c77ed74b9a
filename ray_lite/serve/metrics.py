"""Ray Serve's ``ray.serve.metrics``: ``Counter``, ``Gauge`` and ``Histogram``.

They are ``ray_lite.util.metrics``' (the same checks, the same export), with
Serve's tags added inside a replica, as in Ray: ``deployment``, ``replica``
and, in an application, ``application`` on every record, and ``route`` (the
request's) on a record that does not give it, when the metric declares that
key.  The first three are Serve's there: a metric that declares one of them
is refused.  Outside a replica nothing is added.  On the Ray backend each
class makes Ray Serve's metric.
"""
from ray_lite._private.process import backend as _backend
from ray_lite.util import metrics as _metrics

from . import context

__all__ = ["Counter", "Gauge", "Histogram"]

DEPLOYMENT_TAG = "deployment"
REPLICA_TAG = "replica"
APPLICATION_TAG = "application"
ROUTE_TAG = "route"
_RESERVED = (DEPLOYMENT_TAG, REPLICA_TAG, APPLICATION_TAG)


def _refuse_reserved(keys):
    for key in _RESERVED:
        if key in keys:
            raise ValueError(f"'{key}' tag is reserved for Ray Serve metrics")


def _with_serve_keys(tag_keys):
    if tag_keys and not isinstance(tag_keys, tuple):
        raise TypeError(f"tag_keys should be a tuple type, got: {type(tag_keys)}")
    tag_keys = tag_keys or ()
    replica = context._replica_context
    if replica is None:
        return tag_keys
    _refuse_reserved(tag_keys)
    serve_keys = (DEPLOYMENT_TAG, REPLICA_TAG)
    if replica.app_name:
        serve_keys += (APPLICATION_TAG,)
    return serve_keys + tag_keys


def _with_serve_tags(default_tags):
    replica = context._replica_context
    if replica is None:
        return default_tags
    _refuse_reserved(default_tags)
    tags = {**default_tags, DEPLOYMENT_TAG: replica.deployment, REPLICA_TAG: replica.replica_tag}
    if replica.app_name:
        tags[APPLICATION_TAG] = replica.app_name
    return tags


class _ServeTags:
    """What the three share: Serve's tag keys and values around the util metric."""

    def __new__(cls, *args, **kwargs):
        if _backend.RAY:
            from ray.serve import metrics as ray_serve_metrics   # (Ray is the backend)
            return getattr(ray_serve_metrics, cls.__name__)(*args, **kwargs)
        return object.__new__(cls)

    def _serve_init(self, tag_keys):
        self._user_tag_keys = tag_keys or ()
        return _with_serve_keys(tag_keys)

    def set_default_tags(self, default_tags):
        return super().set_default_tags(_with_serve_tags(default_tags))

    def _record(self, value, tags):
        if ROUTE_TAG in self._tag_keys and (not tags or ROUTE_TAG not in tags):
            tags = {**(tags or {}), ROUTE_TAG: context._get_serve_request_context().route}
        super()._record(value, tags)

    def __reduce__(self):
        # Rebuilt from the user's tag keys: the process it goes to adds its own.
        return type(self), (self._name, self._description, self._user_tag_keys)


class Counter(_ServeTags, _metrics.Counter):
    def __init__(self, name, description="", tag_keys=None):
        super().__init__(name, description, self._serve_init(tag_keys))
        self.set_default_tags({})


class Gauge(_ServeTags, _metrics.Gauge):
    def __init__(self, name, description="", tag_keys=None):
        super().__init__(name, description, self._serve_init(tag_keys))
        self.set_default_tags({})


class Histogram(_ServeTags, _metrics.Histogram):
    def __init__(self, name, description="", boundaries=None, tag_keys=None):
        super().__init__(name, description, boundaries, self._serve_init(tag_keys))
        self.set_default_tags({})

    def __reduce__(self):
        return Histogram, (self._name, self._description, self.boundaries, self._user_tag_keys)
