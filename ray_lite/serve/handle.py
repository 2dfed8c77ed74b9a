"""``DeploymentHandle``, ``DeploymentResponse``, ``DeploymentResponseGenerator``.

A handle routes each call to one replica of a deployment, chosen by power of
two choices on the calls this process has in flight to each replica.  The
replica set comes from the controller and is kept current by a long poll:
one ``listen`` call is always outstanding, and each call first looks whether
it has completed (a readiness check, no message), so the driver, a replica or
a proxy all see changes without a background thread.
"""
import random

from ray_lite._private import api as _api
from ray_lite._private.refs import ObjectRef

from . import _compat, context


class _Replica:
    __slots__ = ("handle", "actor_id", "inflight", "call", "stream", "http")

    def __init__(self, handle):
        self.handle = handle
        self.actor_id = handle._info.actor_id
        self.inflight = 0
        self.call = handle.handle_request
        self.stream = handle.handle_request_streaming
        self.http = handle.handle_http


class Router:
    """The replicas of one deployment as this process sees them."""

    def __init__(self, app_name, deployment_name):
        self.app_name = app_name
        self.deployment_name = deployment_name
        self.version = -1
        self.replicas = []
        self.config = {}
        self.listen_ref = None
        self.exists = True

    # ------------------------------------------------------------- updates
    def apply(self, snap):
        version, exists, handles, config = snap
        if version < self.version:
            return
        old = {r.actor_id: r for r in self.replicas}
        reps = []
        for h in handles:
            r = old.get(h._info.actor_id)
            reps.append(r if r is not None else _Replica(h))
        self.replicas = reps
        self.version = version
        self.config = config
        self.exists = exists

    def _listen(self):
        ctl = context.get_controller()
        self.listen_ref = ctl.listen_deployment.remote(self.app_name, self.deployment_name,
                                                       self.version)

    def poll_update(self):
        ref = self.listen_ref
        if ref is None:
            self._listen()
            return
        r = _compat.peek(ref)
        if r is None:
            return
        self.listen_ref = None
        if r[0]:
            self.apply(r[1])
        self._listen()

    def refresh_blocking(self, timeout=60.0):
        ctl = context.get_controller()
        snap = _api.get(ctl.wait_replicas.remote(
            self.app_name, self.deployment_name, self.version), timeout=timeout)
        self.apply(snap)

    # ------------------------------------------------------------- choice
    def choose(self):
        self.poll_update()
        reps = self.replicas
        if reps:
            dead = [r for r in reps if _compat.actor_is_dead(r.handle)]
            if dead:
                reps = self.replicas = [r for r in reps if r not in dead]
        if not reps:
            self.refresh_blocking()
            reps = self.replicas
            if not reps:
                from .exceptions import DeploymentUnavailableError
                raise DeploymentUnavailableError(
                    f"deployment {self.deployment_name!r} of application {self.app_name!r} "
                    f"has no running replica")
        n = len(reps)
        if n == 1:
            return reps[0]
        a = reps[random.randrange(n)]
        b = reps[random.randrange(n)]
        return a if a.inflight <= b.inflight else b


def get_router(app_name, deployment_name):
    key = (app_name, deployment_name)
    with context._lock:
        context._reset_if_new_runtime()
        r = context.routers.get(key)
        if r is None:
            r = context.routers[key] = Router(app_name, deployment_name)
        return r


def _unwrap(value):
    if type(value) is DeploymentResponse:
        return value._ref
    return value


class DeploymentHandle:
    """Calls a deployment: ``handle.remote(...)``, ``handle.method.remote(...)``."""

    __slots__ = ("deployment_name", "app_name", "_method", "_stream", "_router")

    def __init__(self, deployment_name, app_name, method_name="__call__", stream=False):
        self.deployment_name = deployment_name
        self.app_name = app_name
        self._method = method_name
        self._stream = stream
        self._router = None

    @property
    def handle_options(self):
        return {"method_name": self._method, "stream": self._stream}

    def options(self, *, method_name=None, stream=None, multiplexed_model_id="",
                use_new_handle_api=True, **_ignored):
        return DeploymentHandle(self.deployment_name, self.app_name,
                                self._method if method_name is None else method_name,
                                self._stream if stream is None else bool(stream))

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return DeploymentHandle(self.deployment_name, self.app_name, name, self._stream)

    def remote(self, *args, **kwargs):
        router = self._router
        if router is None or context._controller_node is not _compat._state.node:
            router = self._router = get_router(self.app_name, self.deployment_name)
        if args:
            args = [_unwrap(a) for a in args]
        if kwargs:
            kwargs = {k: _unwrap(v) for k, v in kwargs.items()}
        rep = router.choose()
        rep.inflight += 1
        if self._stream:
            gen = rep.stream.remote(self._method, args, kwargs)
            _compat.on_ready(gen.completed(), lambda _x: _done(rep))
            return DeploymentResponseGenerator(gen)
        ref = rep.call.remote(self._method, args, kwargs)
        _compat.on_ready(ref, lambda _x: _done(rep))
        return DeploymentResponse(ref)

    def __reduce__(self):
        return (DeploymentHandle, (self.deployment_name, self.app_name, self._method,
                                   self._stream))

    def __repr__(self):
        return (f"DeploymentHandle(deployment={self.deployment_name!r}, "
                f"app={self.app_name!r})")


def _done(rep):
    rep.inflight -= 1


class DeploymentResponse:
    """The future result of a handle call: ``.result()``, ``await``, or pass it on."""

    __slots__ = ("_ref",)

    def __init__(self, ref):
        self._ref = ref

    def result(self, *, timeout_s=None, _skip_asyncio_check=False):
        return _api.get(self._ref, timeout=timeout_s)

    def __await__(self):
        r = _compat.peek(self._ref)
        if r is not None:
            if r[0]:
                return r[1]
            raise r[1]
        return (yield from self._ref.__await__())

    def cancel(self):
        _api.cancel(self._ref)

    async def _to_object_ref(self):
        return self._ref

    def _to_object_ref_sync(self, **_):
        return self._ref

    def __repr__(self):
        return f"DeploymentResponse({self._ref!r})"


class DeploymentResponseGenerator:
    """The items a streaming handle call yields, in order (sync or async iteration)."""

    __slots__ = ("_gen",)

    def __init__(self, gen):
        self._gen = gen

    def __iter__(self):
        return self

    def __next__(self):
        ref = next(self._gen)
        return _api.get(ref)

    def __aiter__(self):
        return self

    async def __anext__(self):
        ref = await self._gen.__anext__()
        r = _compat.peek(ref)
        if r is None:
            return await ref
        if r[0]:
            return r[1]
        raise r[1]

    def cancel(self):
        _api.cancel(self._gen)

    def _to_object_ref_gen(self):
        return self._gen


_ = ObjectRef
