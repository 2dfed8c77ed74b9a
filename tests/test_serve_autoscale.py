"""Autoscaling: Ray's default policy as a pure function (no processes), and the
controller scaling a deployment up under load and back down when idle,
draining the replicas it removes without losing a request."""
import asyncio
import concurrent.futures
import time

import pytest

import ray_lite as ray
from ray_lite import serve
from ray_lite.serve import _autoscaler
from ray_lite.serve.config import ConfigError, normalize_autoscaling
from serve_helpers import http

T = 60


# ------------------------------------------------------------------ policy
def _cfg(**kw):
    base = {"min_replicas": 1, "max_replicas": 10, "target_ongoing_requests": 2,
            "upscale_delay_s": 0, "downscale_delay_s": 0, "look_back_period_s": 10,
            "metrics_interval_s": 1}
    base.update(kw)
    return normalize_autoscaling(base)


def _decide(cfg, total, running, target, now=0.0, state=None):
    state = state or _autoscaler.ScalingState()
    _autoscaler.record(state, cfg, now, total)
    return _autoscaler.decide(cfg, state, now, running, target)


@pytest.mark.parametrize("total,running,expected", [
    (4, 2, 2),      # at the target: no change
    (8, 2, 4),      # twice the target per replica: twice the replicas
    (9, 2, 5),      # rounded up
    (100, 2, 10),   # bounded by max_replicas
    (1, 4, 1),      # idle: down to what the load needs
    (0, 4, 1),      # nothing: min_replicas
])
def test_policy_follows_the_load(total, running, expected):
    assert _decide(_cfg(), total, running, running) == expected


def test_policy_scaling_factors_move_part_of_the_way_and_never_stall():
    # Half of the way up: from 2 towards 6 -> 4.
    assert _decide(_cfg(upscaling_factor=0.5), 12, 2, 2) == 4
    # A tiny downscaling factor still removes one replica at a time.
    assert _decide(_cfg(downscaling_factor=0.01), 0, 4, 4) == 3
    # smoothing_factor is the fallback of both.
    assert _decide(_cfg(smoothing_factor=0.5), 12, 2, 2) == 4


def test_policy_waits_for_the_delays():
    cfg = _cfg(upscale_delay_s=3, downscale_delay_s=10)
    state = _autoscaler.ScalingState()
    for now in (0.0, 1.0, 2.0):
        _autoscaler.record(state, cfg, now, 20)
        assert _autoscaler.decide(cfg, state, now, 2, 2) == 2     # not yet
    _autoscaler.record(state, cfg, 3.0, 20)
    assert _autoscaler.decide(cfg, state, 3.0, 2, 2) == 10
    # A change of mind restarts the wait.
    state = _autoscaler.ScalingState()
    cfg = _cfg(upscale_delay_s=0, downscale_delay_s=5, look_back_period_s=0.5)
    _autoscaler.record(state, cfg, 0.0, 0)
    assert _autoscaler.decide(cfg, state, 0.0, 4, 4) == 4
    _autoscaler.record(state, cfg, 4.0, 8)                 # at the target again
    assert _autoscaler.decide(cfg, state, 4.0, 4, 4) == 4
    _autoscaler.record(state, cfg, 6.0, 0)
    assert _autoscaler.decide(cfg, state, 6.0, 4, 4) == 4  # 2 s into a new 5 s wait
    _autoscaler.record(state, cfg, 11.0, 0)
    assert _autoscaler.decide(cfg, state, 11.0, 4, 4) == 1


def test_policy_averages_over_the_look_back_period():
    cfg = _cfg(look_back_period_s=2)
    state = _autoscaler.ScalingState()
    for now, total in ((0.0, 100), (1.0, 4), (2.5, 4), (3.0, 4)):
        _autoscaler.record(state, cfg, now, total)
    # The sample at 0.0 is older than 2 s: only the three 4s count.
    assert _autoscaler.load(state, cfg) == 4
    assert _autoscaler.decide(cfg, state, 3.0, 2, 2) == 2
    mx = _cfg(look_back_period_s=10, aggregation_function="max")
    state = _autoscaler.ScalingState()
    for now, total in ((0.0, 10), (1.0, 2)):
        _autoscaler.record(state, mx, now, total)
    assert _autoscaler.load(state, mx) == 10


def test_autoscaling_config_is_checked_and_defaulted_as_in_ray():
    cfg = normalize_autoscaling({"max_replicas": 4})
    assert cfg["min_replicas"] == 1 and cfg["target_ongoing_requests"] == 2
    assert cfg["upscale_delay_s"] == 30 and cfg["downscale_delay_s"] == 600
    assert normalize_autoscaling(None, auto=True)["max_replicas"] == 100
    with pytest.raises(ConfigError, match="max_replicass"):
        normalize_autoscaling({"max_replicass": 3})
    with pytest.raises(ConfigError, match="min_replicas"):
        normalize_autoscaling({"min_replicas": 5, "max_replicas": 2})
    with pytest.raises(ConfigError, match="target_ongoing_requests"):
        normalize_autoscaling({"target_ongoing_requests": 0})


def test_deployment_options_resolve_the_initial_count():
    @serve.deployment(autoscaling_config={"min_replicas": 2, "max_replicas": 5})
    class Scaled:
        pass
    assert Scaled.num_replicas == 2
    assert Scaled.options(num_replicas="auto",
                          autoscaling_config={"initial_replicas": 3}).num_replicas == 3
    auto = Scaled.options(num_replicas="auto", autoscaling_config=None).full_config()
    assert auto["autoscaling_config"]["max_replicas"] == 100
    assert Scaled.options(autoscaling_config=None, num_replicas=4).full_config()[
        "autoscaling_config"] is None
    with pytest.raises(ValueError, match="initial_replicas"):
        Scaled.options(autoscaling_config={"min_replicas": 2, "max_replicas": 3,
                                           "initial_replicas": 9})


# ------------------------------------------------------------- controller
@ray.remote
class Gate:
    """Requests wait here until the test lets some through."""

    def __init__(self):
        self.sem = asyncio.Semaphore(0)
        self.waiting = 0

    async def enter(self):
        self.waiting += 1
        try:
            await self.sem.acquire()
        finally:
            self.waiting -= 1

    def release(self, n):
        for _ in range(n):
            self.sem.release()

    def num_waiting(self):
        return self.waiting


@serve.deployment(max_ongoing_requests=2, graceful_shutdown_wait_loop_s=0.1,
                  graceful_shutdown_timeout_s=30,
                  autoscaling_config={"min_replicas": 1, "max_replicas": 3,
                                      "target_ongoing_requests": 1,
                                      "metrics_interval_s": 0.1, "look_back_period_s": 0.3,
                                      "upscale_delay_s": 0, "downscale_delay_s": 0.5})
class Gated:
    def __init__(self, gate):
        self.gate = gate

    async def __call__(self, i):
        if not isinstance(i, int):              # over HTTP: a Request
            i = int(i.query_params["i"])
        await self.gate.enter.remote()
        return i


def _wait_for(what, cond, timeout=T):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


def _states(app, dep):
    d = serve.status().applications[app].deployments[dep]
    return d.replica_states, d.status


def test_scales_up_under_load_and_down_when_idle_without_losing_requests(serve_port):
    gate = Gate.remote()
    h = serve.run(Gated.bind(gate), name="gated", route_prefix="/gated")
    assert _states("gated", "Gated")[0] == {"RUNNING": 1}
    calls = [h.remote(i) for i in range(6)]
    # Two requests in flight per replica against a target of one: up to max_replicas.
    _wait_for("three replicas", lambda: _states("gated", "Gated")[0].get("RUNNING") == 3)
    _wait_for("all six requests in flight",
              lambda: ray.get(gate.num_waiting.remote(), timeout=T) == 6)
    # Four finish; two stay in flight while the deployment scales down: the
    # replicas removed end what they run before they stop.
    ray.get(gate.release.remote(4), timeout=T)
    _wait_for("fewer replicas", lambda: _states("gated", "Gated")[0].get("RUNNING", 3) < 3)
    ray.get(gate.release.remote(2), timeout=T)
    assert sorted(c.result(timeout_s=T) for c in calls) == list(range(6))
    _wait_for("one replica, none stopping",
              lambda: _states("gated", "Gated") == ({"RUNNING": 1}, "HEALTHY"))
    # Still serving (over HTTP: the proxies route by the list they acknowledged
    # before any replica was drained).
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        more = [pool.submit(http, serve_port, "GET", f"/gated?i={i}") for i in range(2)]
        _wait_for("two requests in flight",
                  lambda: ray.get(gate.num_waiting.remote(), timeout=T) == 2)
        ray.get(gate.release.remote(2), timeout=T)
        assert sorted((r.result(timeout=T)[0], r.result(timeout=T)[2]) for r in more) == \
            [(200, b"0"), (200, b"1")]


def test_fewer_replicas_drain_the_requests_they_run(serve_runtime):
    gate = Gate.remote()
    fixed = Gated.options(autoscaling_config=None, num_replicas=2, max_ongoing_requests=1)
    h = serve.run(fixed.bind(gate), name="fixed", route_prefix=None)
    calls = [h.remote(i) for i in range(2)]         # one on each replica
    _wait_for("both requests in flight",
              lambda: ray.get(gate.num_waiting.remote(), timeout=T) == 2)
    serve.run(fixed.options(num_replicas=1).bind(gate), name="fixed", route_prefix=None)
    states = _states("fixed", "Gated")[0]
    assert states.get("RUNNING") == 1 and states.get("STOPPING") == 1
    ray.get(gate.release.remote(2), timeout=T)
    assert sorted(c.result(timeout_s=T) for c in calls) == [0, 1]
    _wait_for("the drained replica gone",
              lambda: _states("fixed", "Gated")[0] == {"RUNNING": 1})
