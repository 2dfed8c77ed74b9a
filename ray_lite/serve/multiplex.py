"""Model multiplexing: ``@serve.multiplexed`` and ``serve.get_multiplexed_model_id()``.

A replica keeps up to ``max_num_models_per_replica`` models, evicting the
least recently used.  Requests carry their model id (the HTTP header
``serve_multiplexed_model_id``, or ``handle.options(multiplexed_model_id=)``)
and every caller (each proxy, each handle) sends a model's requests to the
same replica: the first under ``max_ongoing_requests`` in an order of the
replicas that depends on the model id only (rendezvous hashing,
``_routing.for_model``).  So the replica that holds a model gets its
requests without anyone telling the callers which models it holds, and a
change of the replica set moves only the models of the replicas that came
or went.
"""
import asyncio
import collections
import contextvars
import functools
import inspect

from ray_lite._private.process import backend

MODEL_ID_HEADER = b"serve_multiplexed_model_id"
_MARK = "__serve_multiplexed__"

_model_id = contextvars.ContextVar("serve_multiplexed_model_id", default="")


def get_multiplexed_model_id():
    """The model id of the request this replica is serving ("" if it has none)."""
    if backend.RAY:
        backend.require_ray()
        from ray import serve as ray_serve
        return ray_serve.get_multiplexed_model_id()
    return _model_id.get()


def header_value(blob, name):
    """The value of header ``name`` (lower case) in a request's header block, or ""."""
    for line in blob.split(b"\r\n"):
        k, _, v = line.partition(b":")
        if k.strip().lower() == name:
            return v.strip().decode("latin-1")
    return ""


def http_with_model_id(handle_http):
    """A replica's ``handle_http`` that makes the request's model id (its
    ``serve_multiplexed_model_id`` header) current while it runs: only a
    multiplexed deployment's replicas pay for reading the header."""
    async def handle(method, path, query, headers, *rest):
        token = _model_id.set(header_value(headers, MODEL_ID_HEADER))
        try:
            return await handle_http(method, path, query, headers, *rest)
        finally:
            _model_id.reset(token)
    return handle


def multiplexed(func=None, max_num_models_per_replica=3):
    """``@serve.multiplexed(max_num_models_per_replica=3)`` on an async method
    (or function) taking a model id: the model it returns is kept, and
    returned again for that id, until it is the least recently used of more
    than ``max_num_models_per_replica`` (-1: no limit)."""
    if func is not None:
        if not callable(func):
            raise TypeError("The `multiplexed` decorator must be used with a function or "
                            "method.")
        if not inspect.iscoroutinefunction(func):
            raise TypeError("@serve.multiplexed can only be used to decorate async "
                            "functions or methods.")
        n = len(inspect.signature(func).parameters)
        if n == 0 or n > 2:
            raise TypeError("@serve.multiplexed can only be used to decorate functions or "
                            "methods with at least one 'model_id: str' argument.")
    if type(max_num_models_per_replica) is not int:
        raise TypeError("max_num_models_per_replica must be an integer.")
    if max_num_models_per_replica != -1 and max_num_models_per_replica <= 0:
        raise ValueError("max_num_models_per_replica must be positive.")

    def decorate(fn):
        if func is None:
            return multiplexed(fn, max_num_models_per_replica)
        caches = {}      # per instance (one per replica); None: a function

        @functools.wraps(fn)
        async def load(*args):
            owner = args[0] if len(args) == 2 else None
            cache = caches.get(id(owner))
            if cache is None:
                cache = caches[id(owner)] = _ModelCache(fn, owner, max_num_models_per_replica)
                # (This function reaches the replica pickled by value: the
                # registry is the replica's module's, imported here.)
                from ray_lite.serve import multiplex
                multiplex.live_caches.append(cache)
            return await cache.get(args[-1])
        setattr(load, _MARK, True)
        return load
    return decorate(func) if func is not None else decorate


live_caches = []     # the model caches made in this process


def unload_models():
    """Drop every model this process keeps (its replica stops, as in Ray):
    a model's ``__del__`` runs unless something else still holds it."""
    for cache in live_caches:
        cache.unload()


def is_multiplexed(cls):
    """Whether the deployment's class has a ``@serve.multiplexed`` method."""
    return any(getattr(v, _MARK, False) for k in cls.__mro__ for v in vars(k).values())


class _ModelCache:
    """One replica's models of one ``@serve.multiplexed`` function, LRU first."""

    def __init__(self, load, owner, capacity):
        self._load = load
        self._owner = owner
        self._capacity = capacity
        self._models = collections.OrderedDict()
        self._loading = {}      # model id -> the future of its load in progress

    def unload(self):
        while self._models:
            self._models.popitem(last=False)

    async def get(self, model_id):
        if not isinstance(model_id, str):
            raise TypeError(f"the model id must be a str, got {type(model_id).__name__}")
        models = self._models
        if model_id in models:
            models.move_to_end(model_id)
            return models[model_id]
        pending = self._loading.get(model_id)
        if pending is not None:
            # Loaded once for all the requests that asked for it meanwhile.
            return await asyncio.shield(pending)
        fut = self._loading[model_id] = asyncio.get_running_loop().create_future()
        try:
            model = await (self._load(self._owner, model_id) if self._owner is not None
                           else self._load(model_id))
        except BaseException as exc:
            # A model that fails to load fails its own requests only.
            fut.set_exception(exc)
            fut.exception()      # retrieved: the waiters, if any, get it too
            raise
        finally:
            del self._loading[model_id]
        if self._capacity != -1:
            while len(models) >= self._capacity:
                # Dropping the last reference runs the model's __del__.
                models.popitem(last=False)
        models[model_id] = model
        fut.set_result(model)
        return model
