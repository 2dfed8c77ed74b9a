"""``DeploymentHandle``, ``DeploymentResponse``, ``DeploymentResponseGenerator``,
``DeploymentBroadcastResponse``.

A handle's call goes to one replica of the deployment, picked by the
process's ``Router`` of it (``_router``: which replica, the calls held
while every one is busy, the replica set kept current).  A response is the
call's ref; waiting on it from a running event loop is refused, as in Ray.
``broadcast`` calls every running replica once, as Ray Serve's does (for
control work: a cache reset, a configuration reload): it bypasses
``max_ongoing_requests`` and ``max_queued_requests``, skips a replica found
dead when the call reaches it, and raises ``DeploymentUnavailableError``
when none is left; ``results()`` / ``results_async()`` give one result per
replica, in the order the calls went out.  A call given another call's
response as an argument, whose upstream replica died before answering,
raises ``RayServeException`` naming both deployments, as in Ray.
"""
import asyncio
import time
from asyncio import _get_running_loop    # (C: a look at a thread-local, per call)

from ray_lite.exceptions import (ActorDiedError, GetTimeoutError, RayActorError, RayTaskError,
                                 TaskCancelledError)

from . import _core, _defaults, context
from ._request_calls import _noted, _request_calls
from ._router import get_router, send_call
from .exceptions import DeploymentUnavailableError, RequestCancelledError

# Replicas a call may be sent to that turn out dead before seeing it (each
# then leaves the handle's set) before its error is the caller's.
_SEND_ATTEMPTS = _defaults.SEND_ATTEMPTS


def _call_meta(model_id):
    """What a handle call passes on besides its arguments: None (a call from
    outside any request, without a model id: the common case from a driver),
    else ``(model_id, request_id, route)``: a call made while a replica
    serves a request carries that request's id and route, as in Ray (where
    one request's calls through several deployments share its id)."""
    calls = _request_calls.get()
    if calls is None:
        return (model_id, None, "") if model_id else None
    request_id, route = calls.ids()
    return (model_id, request_id, route)


def _refuse_sync_wait(instead):
    # Ray's refusal: a wait there would stall the loop that may have to run
    # the very thing waited for.
    raise RuntimeError(f"Sync methods should not be called from within an `asyncio` event "
                       f"loop. Use {instead} instead.")


def _raise_serve_cause(exc):
    """Serve's own error (a nested ``DeploymentResponse``'s refusal) when an
    argument that could not be serialised was refused because of it."""
    from .exceptions import RayServeException
    cause = exc.__cause__
    while cause is not None:
        if isinstance(cause, RayServeException):
            raise cause from None
        cause = cause.__cause__


def _unwrap(value):
    if type(value) is DeploymentResponse:
        return value._ref
    return value


def _unwrap_args(args, kwargs):
    """``args`` and ``kwargs`` with each ``DeploymentResponse`` among them
    replaced by its ref, and the responses so replaced (None: none was)."""
    upstream = None
    if args:
        args = list(args)
        for i, a in enumerate(args):
            if type(a) is DeploymentResponse:
                args[i] = a._ref
                upstream = [a] if upstream is None else upstream + [a]
    if kwargs:
        for k, v in kwargs.items():
            if type(v) is DeploymentResponse:
                kwargs[k] = v._ref      # (the call's own dict: **kwargs made it)
                upstream = [v] if upstream is None else upstream + [v]
    return args, kwargs, upstream


class _Chain:
    """What a call that took other calls' responses as arguments needs to
    say, if it fails, that one of those died: its deployment, and the
    responses (kept until it succeeds)."""

    __slots__ = ("deployment", "app", "upstream")

    def __init__(self, handle, upstream):
        self.deployment = handle.deployment_name
        self.app = handle.app_name
        self.upstream = upstream

    def drop_if_ok(self, ref):
        # (upstream results are not kept alive past a call that used them)
        r = _core.peek(ref)
        if r is not None and r[0]:
            self.upstream = ()

    def upstream_death(self, exc):
        """Ray Serve's error for ``exc``, the call's failure, when it failed
        because an upstream replica died (the argument it was to compute
        could not be had); None otherwise.  The downstream replica itself
        did not die: its error is a ``RayTaskError``, not the core's."""
        if not (isinstance(exc, RayTaskError) and isinstance(exc, ActorDiedError)):
            return None
        from .exceptions import RayServeException
        for response in self.upstream:
            r = _core.peek(response._ref)
            if r is not None and not r[0] and isinstance(r[1], RayActorError):
                source = response._source
                up = (f"deployment '{source.deployment_name}' of application "
                      f"'{source.app_name}'" if source is not None else "another deployment")
                err = RayServeException(
                    f"The call to deployment '{self.deployment}' of application '{self.app}' "
                    f"failed: its argument was the response of {up}, whose replica died "
                    f"before answering ({r[1]})")
                err.__cause__ = exc
                return err
        return None


class DeploymentHandle:
    """Calls a deployment: ``handle.remote(...)``, ``handle.method.remote(...)``."""

    __slots__ = ("deployment_name", "app_name", "_method", "_stream", "_router", "_model_id")

    def __init__(self, deployment_name, app_name, method_name="__call__", stream=False,
                 multiplexed_model_id=""):
        self.deployment_name = deployment_name
        self.app_name = app_name
        self._method = method_name
        self._stream = stream
        self._model_id = multiplexed_model_id
        self._router = None

    @property
    def handle_options(self):
        return {"method_name": self._method, "stream": self._stream,
                "multiplexed_model_id": self._model_id}

    def options(self, *, method_name=None, stream=None, multiplexed_model_id=None,
                use_new_handle_api=True, **_ignored):
        if multiplexed_model_id is not None and not isinstance(multiplexed_model_id, str):
            raise TypeError("multiplexed_model_id must be a str")
        return DeploymentHandle(self.deployment_name, self.app_name,
                                self._method if method_name is None else method_name,
                                self._stream if stream is None else bool(stream),
                                self._model_id if multiplexed_model_id is None
                                else multiplexed_model_id)

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return DeploymentHandle(self.deployment_name, self.app_name, name, self._stream,
                                self._model_id)

    def remote(self, *args, **kwargs):
        router = self._router
        if router is None or context._controller_node is not _core.current_node():
            router = self._router = get_router(self.app_name, self.deployment_name)
        chain = None
        if args or kwargs:
            args, kwargs, upstream = _unwrap_args(args, kwargs)
            if upstream is not None:
                chain = _Chain(self, upstream)
        model_id = self._model_id
        meta = _call_meta(model_id)
        for attempt in range(_SEND_ATTEMPTS):
            rep = router.reserve(not self._stream, model_id)
            if rep is None:
                q, ref = router.enqueue(self._method, args, kwargs, model_id, meta)
                if chain is not None:
                    _core.on_ready(ref, lambda _x: chain.drop_if_ok(ref))
                return _noted(DeploymentResponse(ref, router, q, self, chain))
            try:
                if self._stream:
                    if meta is None:
                        gen = rep.stream.remote(self._method, args, kwargs)
                    else:
                        gen = rep.stream.remote(self._method, args, kwargs, meta)
                    ref = gen.completed()     # fails at once, like a call's ref, if refused
                else:
                    ref = send_call(rep, meta, self._method, args, kwargs)
            except BaseException as exc:
                router.release(rep)
                _raise_serve_cause(exc)
                raise
            if attempt + 1 == _SEND_ATTEMPTS or not _core.never_sent(ref):
                break
            # Dead before it saw the call (its death not yet in this
            # handle's set): certain not to have run it, so another may.
            router.drop(rep)
        if chain is not None:
            _core.on_ready(ref, lambda _x: chain.drop_if_ok(ref))
        if self._stream:
            _core.on_ready(ref, lambda _x: router.release(rep))
            return _noted(DeploymentResponseGenerator(gen, chain))
        _core.on_ready(ref, lambda _x: router.release(rep))
        return _noted(DeploymentResponse(ref, None, None, self, chain))

    def broadcast(self, method_name, *args, **kwargs):
        """Call ``method_name`` on every running replica (Ray's): a
        ``DeploymentBroadcastResponse``."""
        if not isinstance(method_name, str):
            raise TypeError(f"broadcast: method_name must be a str, got "
                            f"{type(method_name).__name__}")
        router = self._router
        if router is None or context._controller_node is not _core.current_node():
            router = self._router = get_router(self.app_name, self.deployment_name)
        refs = router.send_to_all(method_name, [_unwrap(a) for a in args],
                                  {k: _unwrap(v) for k, v in kwargs.items()},
                                  _call_meta(self._model_id))
        if not refs:
            raise DeploymentUnavailableError(
                f"deployment {self.deployment_name!r} of application {self.app_name!r} has "
                f"no running replica to broadcast to")
        return DeploymentBroadcastResponse([DeploymentResponse(ref) for ref in refs])

    def shutdown(self):
        """Ray's: release what this handle holds.  Its calls go through the
        process's router of the deployment, shared by every handle to it
        (and kept for them): this handle lets go of it and would find it
        again on a later call."""
        self._router = None

    async def shutdown_async(self):
        self.shutdown()

    def __reduce__(self):
        return (DeploymentHandle, (self.deployment_name, self.app_name, self._method,
                                   self._stream, self._model_id))

    def __repr__(self):
        return (f"DeploymentHandle(deployment={self.deployment_name!r}, "
                f"app={self.app_name!r})")


def _request_cancelled(exc):
    # Serve reports a cancelled request as RequestCancelledError (a
    # TaskCancelledError too), as Ray Serve does; other errors pass as they are.
    if isinstance(exc, TaskCancelledError) and not isinstance(exc, RequestCancelledError):
        return RequestCancelledError()
    return exc


def _serve_error(exc, chain):
    """The error a response raises for ``exc``: Serve's for a cancelled call
    and for an upstream replica's death (``chain``: the call took other
    calls' responses), else ``exc``."""
    if chain is not None:
        died = chain.upstream_death(exc)
        if died is not None:
            return died
    return _request_cancelled(exc)


class DeploymentResponse:
    """The future result of a handle call: ``.result()``, ``await``, or pass it on."""

    __slots__ = ("_ref", "_router", "_queued", "_cancelled", "_source", "_chain")

    def __init__(self, ref, router=None, queued=None, source=None, chain=None):
        self._ref = ref
        self._router = router      # with _queued: a call the handle holds
        self._queued = queued
        self._cancelled = False
        self._source = source      # the handle that made the call (names its deployment)
        self._chain = chain        # a _Chain when it took other responses as arguments

    def result(self, *, timeout_s=None, _skip_asyncio_check=False):
        if not _skip_asyncio_check and _get_running_loop() is not None:
            _refuse_sync_wait("`await response`")
        try:
            return _core.get(self._ref, timeout=timeout_s)
        except TaskCancelledError as exc:
            raise _request_cancelled(exc) from None
        except ActorDiedError as exc:
            if self._chain is None:
                raise
            err = _serve_error(exc, self._chain)
            if err is exc:
                raise
            raise err from exc

    def __await__(self):
        r = _core.peek(self._ref)
        if r is not None:
            if r[0]:
                return r[1]
            raise _serve_error(r[1], self._chain)
        try:
            return (yield from self._ref.__await__())
        except TaskCancelledError as exc:
            raise _request_cancelled(exc) from None
        except ActorDiedError as exc:
            if self._chain is None:
                raise
            err = _serve_error(exc, self._chain)
            if err is exc:
                raise
            raise err from exc

    def cancel(self):
        self._cancelled = True
        if self._queued is not None:
            self._router.cancel(self._queued)
        else:
            _core.cancel(self._ref)

    def cancelled(self):
        """Ray's: whether ``cancel()`` was called (the call may have run to
        completion all the same)."""
        return self._cancelled

    def _done(self):
        return _core.peek(self._ref) is not None

    async def _to_object_ref(self):
        return self._ref

    def _to_object_ref_sync(self, _timeout_s=None, _allow_running_in_asyncio_loop=False):
        if not _allow_running_in_asyncio_loop and _get_running_loop() is not None:
            _refuse_sync_wait("`await response._to_object_ref()`")
        return self._ref

    def __reduce__(self):
        # As Ray's: only a top-level argument of a handle call is resolved.
        from .exceptions import RayServeException
        raise RayServeException(
            "`DeploymentResponse` is not serializable. If you are passing the "
            "`DeploymentResponse` in a nested object (e.g. a list or dictionary) to a "
            "downstream deployment handle call, that is no longer supported. Please only "
            "pass `DeploymentResponse` objects as top level arguments.")

    def __repr__(self):
        return f"DeploymentResponse({self._ref!r})"


class DeploymentResponseGenerator:
    """The items a streaming handle call yields, in order (sync or async iteration)."""

    __slots__ = ("_gen", "_cancelled", "_chain")

    def __init__(self, gen, chain=None):
        self._gen = gen
        self._cancelled = False
        self._chain = chain        # a _Chain when it took other responses as arguments

    def __iter__(self):
        return self

    def __next__(self):
        if _get_running_loop() is not None:
            _refuse_sync_wait("`async for` or `await response.__anext__()`")
        ref = next(self._gen)
        try:
            return _core.get(ref)
        except ActorDiedError as exc:
            err = self._upstream_error(exc)
            if err is None:
                raise
            raise err from exc

    def __aiter__(self):
        return self

    async def __anext__(self):
        ref = await self._gen.__anext__()
        # The item's ref never leaves this method, so nobody reads it again:
        # the value itself, with no copy kept for later readers (a mutable
        # item's first read leaves one, an encoding as costly as its decoding).
        r = _core.peek_unshared(ref)
        if r is None:
            try:
                return await ref
            except ActorDiedError as exc:
                err = self._upstream_error(exc)
                if err is None:
                    raise
                raise err from exc
        if r[0]:
            return r[1]
        err = self._upstream_error(r[1])
        raise r[1] if err is None else err

    def _upstream_error(self, exc):
        """Serve's error when ``exc`` is the death of a replica upstream of
        this call (it took other calls' responses), else None."""
        return None if self._chain is None else self._chain.upstream_death(exc)

    def cancel(self):
        self._cancelled = True
        _core.cancel(self._gen)

    def cancelled(self):
        """Ray's: whether ``cancel()`` was called."""
        return self._cancelled

    def _done(self):
        return _core.peek(self._gen.completed()) is not None

    async def _to_object_ref_gen(self):
        return self._gen

    def _to_object_ref_gen_sync(self, _timeout_s=None, _allow_running_in_asyncio_loop=False):
        if not _allow_running_in_asyncio_loop and _get_running_loop() is not None:
            _refuse_sync_wait("`await response._to_object_ref_gen()`")
        return self._gen


_TIMED_OUT = "Timed out waiting for broadcast results."     # Ray's words


def _check_timeout(timeout_s):
    if timeout_s is not None and timeout_s < 0:
        raise ValueError("timeout_s must be None or non-negative.")


class DeploymentBroadcastResponse:
    """The results of ``handle.broadcast(...)``: one per replica called."""

    __slots__ = ("_responses",)

    def __init__(self, responses):
        self._responses = responses

    def results(self, *, timeout_s=None, return_exceptions=False):
        """Each replica's result; the first error raises unless
        ``return_exceptions``, where errors take their replica's place.
        ``TimeoutError`` when ``timeout_s`` passes first."""
        if _get_running_loop() is not None:
            _refuse_sync_wait("`await response.results_async()`")
        _check_timeout(timeout_s)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        out = []
        for response in self._responses:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                out.append(response.result(timeout_s=left, _skip_asyncio_check=True))
            except GetTimeoutError:
                raise TimeoutError(_TIMED_OUT) from None
            except Exception as exc:    # noqa: BLE001 - the replica's error, kept or raised
                if not return_exceptions:
                    raise
                out.append(exc)
        return out

    async def results_async(self, *, timeout_s=None, return_exceptions=False):
        """``results()`` for asyncio code."""
        _check_timeout(timeout_s)

        async def one(response):
            return await response
        gathered = asyncio.gather(*(one(r) for r in self._responses),
                                  return_exceptions=return_exceptions)
        if timeout_s is None:
            return list(await gathered)
        try:
            return list(await asyncio.wait_for(gathered, timeout_s))
        except asyncio.TimeoutError:
            raise TimeoutError(_TIMED_OUT) from None

    def __repr__(self):
        return "DeploymentBroadcastResponse()"
