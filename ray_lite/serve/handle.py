"""``DeploymentHandle``, ``DeploymentResponse``, ``DeploymentResponseGenerator``.

A handle routes each call to one replica of a deployment, chosen by power of
two choices on the calls this process has in flight to each replica, among
those under ``max_ongoing_requests``.  When every replica is at the limit the
call waits in the handle's queue (its response is a ref this process owns,
filled when the call has run), and beyond ``max_queued_requests`` waiting
calls it fails with ``BackPressureError``, as in Ray: both limits are per
caller.  Streaming calls are not held: the least loaded replica queues them.

The replica set comes from the controller and is kept current by a long poll:
one ``listen`` call is always outstanding, renewed from its answer's callback
(on the thread that reads the links: the driver's service thread, a replica's
event loop), so even an idle handle sees changes as they come, without a
thread of its own.  A call that a replica refuses unseen (dead when it was
sent) is sent to another; one it was running fails as in Ray.  For a
deployment that autoscales the handle tells the controller how many calls it
holds (``_demand``); one scaled to zero gets its calls held while the
controller starts a replica.
"""
import collections
from asyncio import _get_running_loop    # (C: a look at a thread-local, per call)
import threading

from ray_lite.exceptions import TaskCancelledError

from . import _core, _defaults, _demand, context
from ._broadcast import broadcast
from ._request_calls import _noted, _request_calls
from ._routing import for_model, least_loaded, power_of_two, slots_for
from .exceptions import BackPressureError, DeploymentUnavailableError, RequestCancelledError

_SENDING = object()
# Replicas a call may be sent to that turn out dead before seeing it (each
# then leaves the handle's set) before its error is the caller's.
_SEND_ATTEMPTS = _defaults.SEND_ATTEMPTS


class _Queued:
    """A call the handle holds until a replica is under max_ongoing_requests."""

    __slots__ = ("method", "args", "kwargs", "ref", "sent", "cancelled", "model_id", "meta")

    def __init__(self, method, args, kwargs, ref, model_id, meta):
        self.method, self.args, self.kwargs, self.ref = method, args, kwargs, ref
        self.model_id = model_id
        self.meta = meta
        self.sent = None          # the replica call's ref, once sent (keeps it alive)
        self.cancelled = False


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
        self.queue = collections.deque()
        # In-flight counts and the queue change on the caller's thread and on
        # the thread that runs reply callbacks.  Never held while sending: a
        # send may wait on a full ring, driving the links (and so callbacks).
        self.lock = threading.RLock()
        self.listen_error = None      # why the last listen call failed, if it did
        self._listening = False       # a thread is sending the listen call
        self._listen_watched = None   # the listen ref a pump waits on
        self._pumping = False
        self._pump_again = False
        self.report = None            # a WaitingReport while the deployment autoscales

    # ------------------------------------------------------------- updates
    def apply(self, snap):
        version, exists, handles, config = snap
        with self.lock:
            if version < self.version:
                return
            self.replicas = slots_for(handles, self.replicas)[0]
            self.version = version
            self.config = config
            self.exists = exists
            if not config.get("autoscaling"):
                self.report = None
            elif self.report is None:
                self.report = _demand.WaitingReport(self.app_name, self.deployment_name)

    def _waiting_changed(self):
        """Tell the controller how many calls are held (outside ``lock``)."""
        report = self.report
        if report is not None:
            report.changed(len(self.queue))

    def poll_update(self):
        """Apply the outstanding listen call's answer if it has come, and keep
        one listen call outstanding (a readiness check, no message, when
        nothing changed)."""
        with self.lock:
            ref = self.listen_ref
            if ref is not None:
                r = _core.peek(ref)
                if r is None:
                    return
                self.listen_ref = None
                if r[0]:
                    self.apply(r[1])
                    self.listen_error = None
                else:
                    self.listen_error = r[1]     # the controller is gone or failing
            if self._listening:
                return                           # another thread is sending it
            self._listening = True
        ref = None
        try:
            ctl = context.get_controller()
            ref = ctl.listen_deployment.remote(self.app_name, self.deployment_name,
                                               self.version)
        except Exception as exc:   # noqa: BLE001 - Serve shut down meanwhile
            self.listen_error = exc
        finally:
            with self.lock:
                self.listen_ref = ref
                self._listening = False
        if ref is not None and self.exists:
            _core.on_ready(ref, self._on_listen_answer)

    def _on_listen_answer(self, _x):
        """Apply a change as it comes (on the thread that reads the links) and
        listen again, so that a handle idle meanwhile routes its next call
        with the replicas of now: with the set of its last call, it would send
        it to a replica scaled down or replaced since, being stopped.  A
        failed listen is not renewed here (the controller is gone or failing;
        the next call tries again): renewing it would loop at once."""
        ref = self.listen_ref
        r = _core.peek(ref) if ref is not None else None
        # Only with the controller's handle at hand: looking it up may wait
        # for an answer, which this thread (the one reading the links) is.
        if r is not None and r[0] and context._controller is not None:
            self.poll_update()

    def refresh_blocking(self, held=False, timeout=_defaults.HANDLE_REFRESH_TIMEOUT_S):
        ctl = context.get_controller()
        snap = _core.get(ctl.wait_replicas.remote(
            self.app_name, self.deployment_name, self.version,
            _defaults.WAIT_REPLICAS_TIMEOUT_S, held), timeout=timeout)
        self.apply(snap)

    # ------------------------------------------------------------- choice
    def _live_replicas(self):
        with self.lock:
            reps = self.replicas
            if reps:
                dead_ids = _core.dead_actor_ids()
                dead = [r for r in reps if r.actor_id in dead_ids]
                if dead:
                    reps = self.replicas = [r for r in reps if r not in dead]
            return reps

    def _reserve(self, reps, model_id=""):
        """Under ``lock``: a replica under max_ongoing_requests by power of two
        choices (for a multiplexed model's call: the model's replica, see
        ``for_model``), counted in flight; None when every one is at the limit."""
        limit = self.config.get("max_ongoing_requests") or 1 << 30
        a = for_model(reps, limit, model_id) if model_id else power_of_two(reps, limit)
        if a is not None:
            a.inflight += 1
        return a

    def reserve(self, hold, model_id=""):
        """A replica for a new call, counted in flight; or, when ``hold`` and
        every replica is at max_ongoing_requests (or calls already wait), None:
        the caller queues the call."""
        self.poll_update()
        reps = self._live_replicas()
        if not reps:
            self.refresh_blocking(held=hold)
            reps = self._live_replicas()
            if not reps:
                if hold and self.config.get("from_zero"):
                    return None     # held while the controller starts a replica
                raise DeploymentUnavailableError(
                    f"deployment {self.deployment_name!r} of application {self.app_name!r} "
                    f"has no running replica")
        with self.lock:
            if hold:
                # First come, first served: behind calls already held.
                return None if self.queue else self._reserve(reps, model_id)
            rep = self._reserve(reps, model_id)
            if rep is None:
                # A stream is never held: the least loaded replica queues it.
                rep = least_loaded(reps)
                rep.inflight += 1
            return rep

    def release(self, rep):
        with self.lock:
            rep.inflight -= 1
        if self.queue:
            self.pump()

    def drop(self, rep):
        """``rep`` refused a call (it was dead when the call was sent): out of
        this handle's set until the controller's next set, and released."""
        with self.lock:
            rep.inflight -= 1
            if rep in self.replicas:
                self.replicas = [r for r in self.replicas if r is not rep]
        self.poll_update()

    # -------------------------------------------------------------- queue
    def enqueue(self, method, args, kwargs, model_id="", meta=None):
        """Hold a call; its ref, or a ref to a BackPressureError when
        max_queued_requests calls already wait."""
        with self.lock:
            limit = self.config.get("max_queued_requests", _defaults.MAX_QUEUED_REQUESTS)
            if limit != -1 and len(self.queue) >= limit:
                return None, _core.error_ref(BackPressureError(
                    num_queued_requests=len(self.queue), max_queued_requests=limit))
            q = _Queued(method, args, kwargs, _core.pending_ref(), model_id, meta)
            self.queue.append(q)
        self._waiting_changed()
        # A slot may have freed meanwhile (its release saw no queue yet).
        self.pump()
        return q, q.ref

    def cancel(self, q):
        """Cancel a held call: dropped at once if not sent yet, else cancelled
        in the replica as soon as it is sent; its result raises
        ``RequestCancelledError`` either way."""
        with self.lock:
            if q.cancelled:
                return
            q.cancelled = True
            sent = q.sent
            if sent is None:
                try:
                    self.queue.remove(q)
                except ValueError:
                    pass
        if sent is None:
            self._waiting_changed()
            _core.set_error(q.ref, RequestCancelledError(q.meta and q.meta[1]))
        elif sent is not _SENDING:
            _core.cancel(sent)
        # else: _send_held cancels it once the call is out.

    def pump(self):
        """Send held calls while replicas have room.  Any thread may call it,
        a reply callback included; a call that comes while another pumps
        (this thread re-entering, or another thread) leaves it to that one,
        which goes round once more: no recursion, no lost turn."""
        with self.lock:
            if self._pumping:
                self._pump_again = True
                return
            self._pumping = True
        try:
            while True:
                with self.lock:
                    self._pump_again = False
                watch = self._pump_round()
                if watch is not None:
                    # Nothing free: a change of the replica set (a new or a
                    # replaced replica) must send the held calls too, not only
                    # a finished call.  Registered outside the lock, and a
                    # callback that fires at once only asks for another round.
                    _core.on_ready(watch, lambda _x: self.pump())
                with self.lock:
                    if not self._pump_again:
                        self._pumping = False
                        return
        except BaseException:
            with self.lock:
                self._pumping = False
            raise

    def _pump_round(self):
        """Send what can be sent; the listen ref to watch if calls remain held."""
        while True:
            self.poll_update()
            reps = self._live_replicas()
            with self.lock:
                if not self.queue:
                    return None
                rep = self._reserve(reps, self.queue[0].model_id)
                if rep is None:
                    failure = self._held_calls_failure(reps)
                    if failure is None:
                        ref = self.listen_ref
                        if ref is None or self._listen_watched is ref:
                            return None
                        self._listen_watched = ref
                        return ref
                    held, self.queue = list(self.queue), collections.deque()
                else:
                    q = self.queue.popleft()
                    q.sent = _SENDING       # from here on, cancel() goes to the replica
            self._waiting_changed()
            if rep is None:
                for q in held:
                    _core.set_error(q.ref, failure)
                return None
            self._send_held(q, rep)

    def _held_calls_failure(self, reps):
        """Under ``lock``, nothing free: why the held calls can never be sent
        (the deployment deleted; the controller gone with no call in flight
        whose end could free a replica), or None."""
        if not self.exists:
            return DeploymentUnavailableError(
                f"deployment {self.deployment_name!r} of application {self.app_name!r} "
                f"was deleted")
        if self.listen_error is not None and not any(r.inflight for r in reps):
            return DeploymentUnavailableError(
                f"deployment {self.deployment_name!r} of application {self.app_name!r} "
                f"is unavailable: {self.listen_error}")
        return None

    def _send_held(self, q, rep):
        try:
            ref = _send_call(rep, q.meta, q.method, q.args, q.kwargs)
            if _core.never_sent(ref):
                # The replica died before it saw the call: hold it again, first.
                self.drop(rep)
                with self.lock:
                    q.sent = None
                    held_again = not q.cancelled
                    if held_again:
                        self.queue.appendleft(q)
                if held_again:
                    self._waiting_changed()
                    return
                _core.set_error(q.ref, RequestCancelledError(q.meta and q.meta[1]))
                return
        except Exception as exc:   # noqa: BLE001 - e.g. the replica just died
            _core.set_error(q.ref, exc)
            self.release(rep)
            return
        except BaseException:      # Ctrl-C while a full ring made the send wait
            _core.set_error(q.ref, RequestCancelledError(q.meta and q.meta[1]))
            self.release(rep)
            raise
        q.args = q.kwargs = None
        with self.lock:
            q.sent = ref
            cancelled = q.cancelled
        if cancelled:
            _core.cancel(ref)

        def done(_x):
            r = _core.peek(ref)
            if r[0]:
                _core.set_value(q.ref, r[1])
            elif q.cancelled and isinstance(r[1], TaskCancelledError):
                _core.set_error(q.ref, RequestCancelledError(q.meta and q.meta[1]))
            else:
                _core.set_error(q.ref, r[1])
            self.release(rep)
        _core.on_ready(ref, done)


def get_router(app_name, deployment_name):
    return context.per_runtime(context.routers, (app_name, deployment_name),
                               lambda: Router(app_name, deployment_name))


def _send_call(rep, meta, method, args, kwargs):
    if meta is None:
        return rep.call.remote(method, args, kwargs)
    return rep.call.remote(method, args, kwargs, meta)


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
        if args:
            args = [_unwrap(a) for a in args]
        if kwargs:
            kwargs = {k: _unwrap(v) for k, v in kwargs.items()}
        model_id = self._model_id
        meta = _call_meta(model_id)
        for attempt in range(_SEND_ATTEMPTS):
            rep = router.reserve(not self._stream, model_id)
            if rep is None:
                q, ref = router.enqueue(self._method, args, kwargs, model_id, meta)
                return _noted(DeploymentResponse(ref, router, q))
            try:
                if self._stream:
                    if meta is None:
                        gen = rep.stream.remote(self._method, args, kwargs)
                    else:
                        gen = rep.stream.remote(self._method, args, kwargs, meta)
                    ref = gen.completed()     # fails at once, like a call's ref, if refused
                else:
                    ref = _send_call(rep, meta, self._method, args, kwargs)
            except BaseException as exc:
                router.release(rep)
                _raise_serve_cause(exc)
                raise
            if attempt + 1 == _SEND_ATTEMPTS or not _core.never_sent(ref):
                break
            # Dead before it saw the call (its death not yet in this
            # handle's set): certain not to have run it, so another may.
            router.drop(rep)
        if self._stream:
            _core.on_ready(ref, lambda _x: router.release(rep))
            return _noted(DeploymentResponseGenerator(gen))
        _core.on_ready(ref, lambda _x: router.release(rep))
        return _noted(DeploymentResponse(ref))

    def broadcast(self, method_name, *args, **kwargs):
        """Call ``method_name`` on every running replica (Ray's; see
        ``_broadcast``): a ``DeploymentBroadcastResponse``."""
        router = self._router
        if router is None or context._controller_node is not _core.current_node():
            router = self._router = get_router(self.app_name, self.deployment_name)
        return broadcast(self, router, method_name, args, kwargs, _call_meta(self._model_id))

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


class DeploymentResponse:
    """The future result of a handle call: ``.result()``, ``await``, or pass it on."""

    __slots__ = ("_ref", "_router", "_queued", "_cancelled")

    def __init__(self, ref, router=None, queued=None):
        self._ref = ref
        self._router = router      # with _queued: a call the handle holds
        self._queued = queued
        self._cancelled = False

    def result(self, *, timeout_s=None, _skip_asyncio_check=False):
        if not _skip_asyncio_check and _get_running_loop() is not None:
            _refuse_sync_wait("`await response`")
        try:
            return _core.get(self._ref, timeout=timeout_s)
        except TaskCancelledError as exc:
            raise _request_cancelled(exc) from None

    def __await__(self):
        r = _core.peek(self._ref)
        if r is not None:
            if r[0]:
                return r[1]
            raise _request_cancelled(r[1])
        try:
            return (yield from self._ref.__await__())
        except TaskCancelledError as exc:
            raise _request_cancelled(exc) from None

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

    __slots__ = ("_gen", "_cancelled")

    def __init__(self, gen):
        self._gen = gen
        self._cancelled = False

    def __iter__(self):
        return self

    def __next__(self):
        if _get_running_loop() is not None:
            _refuse_sync_wait("`async for` or `await response.__anext__()`")
        ref = next(self._gen)
        return _core.get(ref)

    def __aiter__(self):
        return self

    async def __anext__(self):
        ref = await self._gen.__anext__()
        r = _core.peek(ref)
        if r is None:
            return await ref
        if r[0]:
            return r[1]
        raise r[1]

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
