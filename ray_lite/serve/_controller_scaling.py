"""The Serve controller's autoscaling (a base of ``ServeController``): each
autoscaling deployment's load sampled every ``metrics_interval_s`` (requests
running at its replicas plus those waiting at its callers, see _demand),
Ray's policy applied (_autoscaler), the cold start of a deployment scaled
to zero when a request waits for it, and the draining of the replicas (whole
gangs, see gang.py) taken out of service."""
import asyncio
import sys
import time
import traceback

from . import _autoscaler, _demand, gang
from ._autoscaling_policy import PolicyRunner


class Autoscaling:
    """The autoscaling methods of ``ServeController`` (its ``apps``, ``_dep``,
    ``_bring_up``, ``_drain_some``... are the controller's)."""

    async def report_waiting(self, app_name, dep_name, key, count):
        """A caller holds ``count`` requests for ``dep_name`` waiting for a
        replica (see _demand); answered ``REPORT_SPACING_S`` later, which
        paces the caller's reports."""
        dep = self._dep(app_name, dep_name)
        if dep is not None:
            if count > 0:
                dep.waiting[key] = count
                if not dep.replicas:
                    self._cold_start(dep)
            else:
                dep.waiting.pop(key, None)
        await asyncio.sleep(_demand.REPORT_SPACING_S)

    def _cold_start(self, dep):
        """A request waits for ``dep``, which runs no replica and starts none:
        start some at once (Ray's cold start: no upscale delay)."""
        cfg = dep.config.get("autoscaling_config")
        if cfg and dep.target == 0 and dep.starting == 0 and not self.shutting_down:
            self.scale(dep, _autoscaler.cold_start_replicas(cfg, dep.target))

    async def _autoscale(self, dep):
        """Sample ``dep``'s requests in flight every ``metrics_interval_s`` (at
        its replicas, and waiting at its callers) and apply the policy's
        decision (``_autoscaler``), while it autoscales."""
        state = _autoscaler.ScalingState()
        custom = PolicyRunner()         # for a custom policy (autoscaling_config["policy"])
        loop = asyncio.get_running_loop()
        try:
            while True:
                cfg = dep.config.get("autoscaling_config")
                if not cfg:
                    return
                await asyncio.sleep(cfg["metrics_interval_s"])
                if self.shutting_down:
                    continue
                rids, reps = list(dep.replicas), list(dep.replicas.values())
                # A custom policy also gets its replicas' custom metrics.
                ask = "autoscaling_stats" if cfg.get("policy") else "num_ongoing"
                answers = await asyncio.gather(*[asyncio.wait_for(
                    getattr(h, ask).remote(), cfg["metrics_interval_s"] + 5.0) for h in reps],
                    return_exceptions=True)
                if cfg.get("policy"):
                    custom.record(dict(zip(rids, answers)), time.time(),
                                  cfg["look_back_period_s"])
                counts = [a[0] if isinstance(a, (tuple, list)) else a for a in answers]
                _demand.prune_dead(dep.waiting)
                queued = sum(dep.waiting.values())
                _autoscaler.record(state, cfg, loop.time(),
                                   sum(c for c in counts if isinstance(c, int)) + queued)
                if cfg.get("policy"):
                    n = custom.decide(dep, cfg, _autoscaler.load(state, cfg), queued,
                                      dep.target)
                else:
                    n = _autoscaler.decide(cfg, state, loop.time(), len(reps), dep.target)
                self.scale(dep, n)
        finally:
            dep.autoscaler = None

    def scale(self, dep, n):
        """Run ``n`` replicas of ``dep`` from now on (the autoscaler's decision,
        in whole gangs)."""
        n = gang.whole(dep, n)
        app = self.apps.get(dep.app)
        if self.shutting_down or app is None or app.deps.get(dep.name) is not dep or \
                n == dep.target:
            return
        print(f"Serve: scaling {dep.app}/{dep.name} from {dep.target} to {n} replicas",
              file=sys.stderr, flush=True)
        dep.target = n
        self._save()
        missing = n - len(dep.replicas) - dep.starting
        if missing > 0:
            self._task(dep, self._bring_up_logged(dep, missing))
        elif len(dep.replicas) > n:
            self._drain_some(dep, len(dep.replicas) - n)

    def _drain_some(self, dep, n):
        """Take the ``n`` newest replicas out of service and stop each once its
        requests in flight have ended (``_drain_one``)."""
        for rid in gang.newest_gangs(dep, n):      # whole gangs
            h = dep.replicas.pop(rid)
            dep.gang_of.pop(rid, None)
            dep.pids.pop(rid, None)
            dep.ranks.pop(rid, None)
            dep.listening.discard(rid)
            dep.stopping.add(rid)
            dep.draining[rid] = h
            asyncio.ensure_future(self._drain_one(dep, rid, h))
        self._top_up_listeners(dep)
        self._bump()

    async def _drain_one(self, dep, rid, h):
        """Stop a replica taken out of service without losing its requests:
        once every proxy routes without it, it gets
        ``graceful_shutdown_wait_loop_s`` (Ray's wait before a replica checks
        for work; a handle that had not yet seen the change may still send it
        a request meanwhile), then up to ``graceful_shutdown_timeout_s`` for
        its requests in flight to end."""
        cfg = dep.config
        timeout = cfg.get("graceful_shutdown_timeout_s") or 0
        try:
            await self._proxies_caught_up()
            await asyncio.sleep(min(cfg.get("graceful_shutdown_wait_loop_s") or 0, timeout))
            if timeout > 0:
                await quiet(asyncio.wait_for(h.drain.remote(timeout), timeout + 1.0))
        finally:
            self._kill(h)
            dep.draining.pop(rid, None)
            self._bump()

    async def _bring_up_logged(self, dep, n):
        errors = await self._bring_up(dep, n)
        if errors:
            dep.message = f"starting a replica failed: {error_text(errors[0])}"
            print(f"Serve: {dep.app}/{dep.name}: {dep.message}", file=sys.stderr, flush=True)
        self._bump()


def error_text(err):
    """An error as one line for a status message (its type when it has no text)."""
    s = str(err)
    return s if s else "".join(traceback.format_exception_only(type(err), err))


def from_zero(auto):
    """Whether an autoscaling config lets its deployment run no replica."""
    return bool(auto) and auto["min_replicas"] == 0


def kept_target(dep, new_cfg):
    """The replica count of a deployment updated in place: an autoscaling one
    keeps what it scaled to (within the new bounds), else the new count."""
    auto = new_cfg.get("autoscaling_config")
    if auto and dep.config.get("autoscaling_config"):
        low, high = _autoscaler.bounds(auto)
        return max(low, min(high, dep.target))
    return new_cfg["num_replicas"]


async def quiet(aw):
    """``await aw``; None if it raised (a replica or proxy that is going anyway)."""
    try:
        return await aw
    except BaseException:   # noqa: BLE001
        return None
