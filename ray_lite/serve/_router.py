"""How this process routes handle calls to a deployment's replicas: one
``Router`` per deployment and runtime, shared by every handle to it.

A call goes to one replica, chosen by power of two choices on the calls this
process has in flight to each replica, among those under
``max_ongoing_requests`` (a multiplexed model's calls: rendezvous hashing,
``_routing.for_model``).  When every replica is at the limit the call waits
in the router's queue (its response is a ref this process owns, filled when
the call has run), and beyond ``max_queued_requests`` waiting calls it fails
with ``BackPressureError``, as in Ray: both limits are per caller.
Streaming calls are not held: the least loaded replica queues them.

The replica set comes from the controller and is kept current by a long poll:
one ``listen`` call is always outstanding, renewed from its answer's callback
(on the thread that reads the links: the driver's service thread, a replica's
event loop), so even an idle handle sees changes as they come, without a
thread of its own.  A call that a replica refuses unseen (dead when it was
sent) is sent to another; one it was running fails as in Ray.  For a
deployment that autoscales the router tells the controller how many calls it
holds (``_demand``); one scaled to zero gets its calls held while the
controller starts a replica.
"""
import collections
import threading

from ray_lite.exceptions import TaskCancelledError

from . import _core, _defaults, _demand, context
from ._routing import for_model, least_loaded, power_of_two, slots_for
from .exceptions import BackPressureError, DeploymentUnavailableError, RequestCancelledError

_SENDING = object()


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
            report = self.report
            if report is not None:
                report.retell()     # one lost while the controller was down
            self.poll_update()

    def refresh_blocking(self, held=False, timeout=_defaults.HANDLE_REFRESH_TIMEOUT_S):
        """Ask the controller for the replicas (at least one, or until it gives
        up); a controller that dies meanwhile is asked again once the runtime
        has restarted it, within ``timeout``."""
        import time
        from ray_lite.exceptions import RayActorError
        wait = context.ControllerRestartWait(timeout)
        dead = ()
        while True:
            ctl = context.get_controller()
            try:
                snap = _core.get(ctl.wait_replicas.remote(
                    self.app_name, self.deployment_name, self.version,
                    _defaults.WAIT_REPLICAS_TIMEOUT_S, held, dead),
                    timeout=max(0.0, wait.end - time.monotonic()))
            except RayActorError:
                if not wait.again():
                    raise
                continue
            self.apply(snap)
            if dead or self._live_replicas() or not snap[2]:
                return
            # Every replica the controller named died, as this process
            # already knows and the controller may not yet: ask once more,
            # naming them, and it waits for their replacement.
            known = _core.dead_actor_ids()
            dead = [i for i in map(_core.actor_id, snap[2]) if i in known]
            if not dead:
                return

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
            ref = send_call(rep, q.meta, q.method, q.args, q.kwargs)
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

    def send_to_all(self, method, args, kwargs, meta):
        """``method(*args, **kwargs)`` sent to every replica listed now,
        bypassing ``max_ongoing_requests`` and ``max_queued_requests`` (a
        broadcast: control work, not the request path); the refs of the
        calls, without those of replicas found dead before they saw it."""
        self.poll_update()
        reps = self._live_replicas()
        if not reps:
            self.refresh_blocking()
            reps = self._live_replicas()
        refs = []
        for rep in reps:
            with self.lock:
                rep.inflight += 1       # seen by the routing of other calls meanwhile
            try:
                ref = send_call(rep, meta, method, args, kwargs)
            except BaseException:
                self.release(rep)
                raise
            if _core.never_sent(ref):
                self.drop(rep)          # dead before it saw the call: skipped
                continue
            _core.on_ready(ref, lambda _x, rep=rep: self.release(rep))
            refs.append(ref)
        return refs


def get_router(app_name, deployment_name):
    return context.per_runtime(context.routers, (app_name, deployment_name),
                               lambda: Router(app_name, deployment_name))


def send_call(rep, meta, method, args, kwargs):
    if meta is None:
        return rep.call.remote(method, args, kwargs)
    return rep.call.remote(method, args, kwargs, meta)
