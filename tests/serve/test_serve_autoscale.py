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


def test_a_deployment_version_is_refused_as_ray_2_60_does():
    with pytest.raises(ValueError, match=r"`version` in `@serve.deployment` has been removed"):
        serve.deployment(version="1")

    @serve.deployment
    class Plain:
        pass
    with pytest.raises(ValueError, match=r"`version` in `Deployment.options\(\)` has been"):
        Plain.options(version="2")


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
    # (Versioned, as a config file's deploy: the second run is then an
    # update in place; serve.run's own would replace every replica.)
    h = serve.run(fixed.bind(gate), name="fixed", route_prefix=None, _code_version="v1")
    calls = [h.remote(i) for i in range(2)]         # one on each replica
    _wait_for("both requests in flight",
              lambda: ray.get(gate.num_waiting.remote(), timeout=T) == 2)
    serve.run(fixed.options(num_replicas=1).bind(gate), name="fixed", route_prefix=None,
              _code_version="v1")
    states = _states("fixed", "Gated")[0]
    assert states.get("RUNNING") == 1 and states.get("STOPPING") == 1
    ray.get(gate.release.remote(2), timeout=T)
    assert sorted(c.result(timeout_s=T) for c in calls) == [0, 1]
    _wait_for("the drained replica gone",
              lambda: _states("fixed", "Gated")[0] == {"RUNNING": 1})


# ------------------------------------------------- scale to zero (policy)
def test_policy_cold_start_skips_the_upscale_delay():
    cfg = _cfg(min_replicas=0, upscale_delay_s=60)
    # No replica runs and a request waits: one starts at once.
    assert _decide(cfg, 1, 0, 0) == 1
    assert _decide(_cfg(min_replicas=0, upscaling_factor=2.5), 1, 0, 0) == 3
    # Nothing waits: none starts; one already starting is not started twice.
    assert _decide(cfg, 0, 0, 0) == 0
    assert _decide(cfg, 5, 0, 1) == 1


def test_policy_goes_to_zero_only_from_one_after_its_delay():
    cfg = _cfg(min_replicas=0, downscale_delay_s=5)
    state = _autoscaler.ScalingState()
    _autoscaler.record(state, cfg, 0.0, 0)
    assert _autoscaler.decide(cfg, state, 0.0, 3, 3) == 3
    _autoscaler.record(state, cfg, 5.0, 0)
    assert _autoscaler.decide(cfg, state, 5.0, 3, 3) == 1        # not straight to zero
    state = _autoscaler.ScalingState()
    _autoscaler.record(state, cfg, 0.0, 0)
    assert _autoscaler.decide(cfg, state, 0.0, 1, 1) == 1
    _autoscaler.record(state, cfg, 5.0, 0)
    assert _autoscaler.decide(cfg, state, 5.0, 1, 1) == 0
    # downscale_to_zero_delay_s, when set, is the last step's delay.
    cfg = _cfg(min_replicas=0, downscale_delay_s=5, downscale_to_zero_delay_s=20)
    state = _autoscaler.ScalingState()
    for now in (0.0, 5.0, 19.0):
        _autoscaler.record(state, cfg, now, 0)
        assert _autoscaler.decide(cfg, state, now, 1, 1) == 1
    _autoscaler.record(state, cfg, 20.0, 0)
    assert _autoscaler.decide(cfg, state, 20.0, 1, 1) == 0


def test_min_replicas_zero_starts_with_initial_replicas():
    @serve.deployment(autoscaling_config={"min_replicas": 0, "max_replicas": 2})
    class Cold:
        pass
    assert Cold.num_replicas == 0
    assert Cold.options(autoscaling_config={"min_replicas": 0, "max_replicas": 2,
                                            "initial_replicas": 1}).num_replicas == 1


# --------------------------------------------- queued requests count (controller)
# Gated, one request at a time per replica, scaling up only.
OneAtATime = Gated.options(
    name="OneAtATime", max_ongoing_requests=1,
    autoscaling_config=dict(Gated.full_config()["autoscaling_config"], downscale_delay_s=600))


@pytest.mark.parametrize("caller", ["handle", "http"])
def test_requests_queued_at_callers_count_and_scale_up(serve_port, caller):
    # Each replica runs one request at a time (max_ongoing_requests=1): the
    # others wait at the caller.  Counting only those running would see one
    # request per replica, at the target: it would never scale up.
    gate = Gate.remote()
    h = serve.run(OneAtATime.bind(gate), name="q", route_prefix="/q")
    pool = concurrent.futures.ThreadPoolExecutor(6)
    try:
        if caller == "handle":
            calls = [h.remote(i) for i in range(6)]
        else:
            calls = [pool.submit(http, serve_port, "GET", f"/q?i={i}") for i in range(6)]
        _wait_for("three replicas", lambda: _states("q", "OneAtATime")[0].get("RUNNING") == 3)
        _wait_for("three requests in flight",
                  lambda: ray.get(gate.num_waiting.remote(), timeout=T) == 3)
        ray.get(gate.release.remote(6), timeout=T)
        if caller == "handle":
            got = sorted(c.result(timeout_s=T) for c in calls)
        else:
            got = sorted(int(c.result(timeout=T)[2]) for c in calls)
        assert got == list(range(6))
    finally:
        ray.get(gate.release.remote(6), timeout=T)
        pool.shutdown(wait=True)


# ----------------------------------------------- scale to zero (controller)
@serve.deployment(graceful_shutdown_wait_loop_s=0.1, graceful_shutdown_timeout_s=5,
                  autoscaling_config={"min_replicas": 0, "max_replicas": 2,
                                      "target_ongoing_requests": 1,
                                      "metrics_interval_s": 0.1, "look_back_period_s": 0.3,
                                      "upscale_delay_s": 60, "downscale_delay_s": 0.5})
class Cold:
    def __init__(self, gate):
        if gate is not None:
            ray.get(gate.enter.remote())      # a slow start, until the test allows it

    async def __call__(self, request=None):
        import os
        return f"warm {os.getpid()}"


def test_scale_to_zero_and_back_on_a_request(serve_port):
    h = serve.run(Cold.bind(None), name="cold", route_prefix="/cold")
    assert _states("cold", "Cold") == ({}, "HEALTHY")      # min_replicas 0: none yet
    # An HTTP request starts one (no upscale delay from zero) and gets its answer.
    status, _, body = http(serve_port, "GET", "/cold")
    assert status == 200 and body.startswith(b"warm ")
    assert _states("cold", "Cold")[0].get("RUNNING") == 1
    # No traffic for downscale_delay_s: back to zero.
    _wait_for("zero replicas", lambda: _states("cold", "Cold") == ({}, "HEALTHY"))
    # A handle call starts one too.
    assert h.remote().result(timeout_s=T).startswith("warm ")
    _wait_for("zero replicas again", lambda: _states("cold", "Cold") == ({}, "HEALTHY"))


def test_initial_replicas_is_honoured_with_min_replicas_zero(serve_port):
    warm = Cold.options(autoscaling_config=dict(
        Cold.full_config()["autoscaling_config"], initial_replicas=1))
    serve.run(warm.bind(None), name="warm", route_prefix="/warm")
    assert _states("warm", "Cold")[0] == {"RUNNING": 1}
    _wait_for("zero replicas", lambda: _states("warm", "Cold") == ({}, "HEALTHY"))


def test_a_request_waiting_for_a_cold_start_is_bounded_by_the_request_timeout(
        serve_runtime):
    from ray_lite.serve.api import _http_port
    serve.start(http_options={"port": 0, "proxies": 1, "request_timeout_s": 1})
    port = _http_port()
    gate = Gate.remote()
    serve.run(Cold.bind(gate), name="slow", route_prefix="/slow")
    # The replica it started is still in its __init__: 408 after the timeout.
    status, hdrs, body = http(port, "GET", "/slow")
    assert status == 408 and body.startswith(b"Request ")
    ray.get(gate.release.remote(1), timeout=T)
    _wait_for("the replica up", lambda: _states("slow", "Cold")[0].get("RUNNING") == 1)
    assert http(port, "GET", "/slow")[0] == 200
