"""Custom autoscaling policies (``autoscaling_config["policy"]``): checked
when configured, called by the controller with Ray's AutoscalingContext,
their answer bounded and applied, their state kept between calls; a policy
that fails keeps the current count."""
import asyncio
import os
import types

import pytest

from ray_lite import serve
from ray_lite.serve import _autoscaling_policy as policy_mod
from ray_lite.serve.config import (AutoscalingConfig, AutoscalingContext, AutoscalingPolicy,
                                   ConfigError, normalize_autoscaling)
from serve_helpers import wait_until

T = 60


def count_calls(ctx):
    """Asks one replica more than the target; its state says how often it ran
    and what it saw (the controller's copy of this function runs, not this one)."""
    calls = ctx.policy_state.get("calls", 0) + 1
    seen = {"type": type(ctx).__name__, "names": (ctx.deployment_name, ctx.app_name,
                                                  ctx.deployment_id.name),
            "replicas": (ctx.current_num_replicas, ctx.target_num_replicas),
            "ids": [r.unique_id for r in ctx.running_replicas],
            "requests": (ctx.total_num_requests, ctx.total_queued_requests),
            "bounds": (ctx.capacity_adjusted_min_replicas, ctx.capacity_adjusted_max_replicas),
            "state": dict(ctx.policy_state), "up": ctx.last_scale_up_time,
            "down": ctx.last_scale_down_time, "max": ctx.config.max_replicas}
    return ctx.target_num_replicas + 1, {"calls": calls, "seen": seen}


def half_up(ctx):
    return 2.2, {}          # a float: rounded up, as in Ray


class FromKwargs:
    def __init__(self, replicas):
        self.replicas = replicas
        self.calls = 0

    def __call__(self, ctx):
        self.calls += 1         # one instance for every call: it counts them all
        return self.replicas, {"calls": self.calls}


def raises(ctx):
    raise RuntimeError("policy bug")


def wrong_type(ctx):
    return "three", {}


def scale_to_two(ctx):
    return 2, {"pid": os.getpid()}


def _cfg(policy, **kw):
    return normalize_autoscaling({"min_replicas": 1, "max_replicas": 4, **kw,
                                  "policy": policy})


def _shipped(policy, **kw):
    cfg = _cfg(policy, **kw)
    return dict(cfg, policy=policy_mod.ship(cfg["policy"]))


def _dep(n):
    return types.SimpleNamespace(name="Model", app="app",
                                 replicas={f"Model#{i}": None for i in range(n)})


def test_the_policy_gets_rays_context_and_its_state_back():
    cfg = _shipped(AutoscalingPolicy(policy_function=count_calls))
    runner = policy_mod.PolicyRunner()
    assert runner.decide(_dep(1), cfg, 3.5, 1, 1) == 2
    assert runner.decide(_dep(2), cfg, 3.5, 1, 2) == 3
    seen = runner.state["seen"]
    assert seen["type"] == AutoscalingContext.__name__
    assert seen["names"] == ("Model", "app", "Model")
    assert seen["replicas"] == (2, 2) and seen["ids"] == ["0", "1"]
    assert seen["requests"] == (3.5, 1) and seen["bounds"] == (1, 4)
    assert seen["state"]["calls"] == 1              # what the first call returned
    assert seen["up"] is not None and seen["down"] is None
    assert seen["max"] == 4
    # Bounded by max_replicas.
    assert runner.decide(_dep(4), cfg, 0, 0, 4) == 4


def test_floats_are_rounded_up_and_classes_made_once_with_their_kwargs():
    assert policy_mod.PolicyRunner().decide(_dep(1), _shipped({"policy_function": half_up}),
                                            0, 0, 1) == 3
    cfg = _shipped({"policy_function": f"{__name__}:FromKwargs",
                    "policy_kwargs": {"replicas": 3}})
    runner = policy_mod.PolicyRunner()
    assert [runner.decide(_dep(1), cfg, 0, 0, 1) for _ in range(3)] == [3, 3, 3]
    assert runner.state == {"calls": 3}
    assert cfg["policy"]["policy_function"] == f"{__name__}:FromKwargs"


@pytest.mark.parametrize("fn, words", [(raises, "policy bug"), (wrong_type, "expected an int")])
def test_a_failing_policy_keeps_the_count_and_says_why(fn, words, capsys):
    runner = policy_mod.PolicyRunner()
    assert runner.decide(_dep(2), _shipped({"policy_function": fn}), 0, 0, 2) == 2
    assert words in capsys.readouterr().err


@pytest.mark.parametrize("policy, words", [
    ({"policy_function": count_calls, "policy_kwargs": {"x": object()}}, "JSON"),
    ({"policy_function": 42}, "callable or an import path"),
    ({"function": count_calls}, "unknown key"),
    ("not a policy", "expected an AutoscalingPolicy"),
])
def test_bad_policies_are_refused(policy, words):
    with pytest.raises(ConfigError, match=words):
        _cfg(policy)


def test_the_default_policy_is_none_and_an_import_path_must_import():
    assert _cfg(AutoscalingPolicy())["policy"] is None
    assert _cfg({"policy_function": policy_mod.DEFAULT_POLICY_NAME})["policy"] is None
    with pytest.raises(ValueError, match="cannot import"):
        policy_mod.ship(_cfg({"policy_function": "no_such_module_q:f"})["policy"])
    assert AutoscalingConfig(policy=AutoscalingPolicy(policy_function=half_up)).policy == \
        {"policy_function": half_up, "policy_kwargs": {}}


@serve.deployment(autoscaling_config={"min_replicas": 1, "max_replicas": 3,
                                      "metrics_interval_s": 0.1,
                                      "policy": {"policy_function":
                                                 f"{__name__}:scale_to_two"}})
class Scaled:
    def __call__(self):
        return os.getpid()


def test_the_controller_applies_it(serve_runtime):
    serve.run(Scaled.bind(), name="scaled", route_prefix=None)

    def replicas():
        return serve.status().applications["scaled"].deployments["Scaled"] \
            .replica_states.get("RUNNING", 0)
    wait_until(lambda: replicas() == 2, "the policy's two replicas", T)


def from_controller_env(ctx):
    # Runs in the controller: what its environment says.
    return int(os.environ.get("RL_CONTROLLER_WANT", "1")), {}


@serve.deployment(autoscaling_config={"min_replicas": 1, "max_replicas": 3,
                                      "metrics_interval_s": 0.1,
                                      "policy": {"policy_function":
                                                 f"{__name__}:from_controller_env"}})
class FromEnv:
    def __call__(self):
        return os.getpid()


def test_controller_options_env_vars_reach_the_policy(serve_runtime):
    assert "RL_CONTROLLER_WANT" not in os.environ
    serve.run(FromEnv.bind(), name="env", route_prefix=None,
              controller_options=serve.ControllerOptions(
                  runtime_env={"env_vars": {"RL_CONTROLLER_WANT": "3"}}))

    def replicas():
        return serve.status().applications["env"].deployments["FromEnv"] \
            .replica_states.get("RUNNING", 0)
    wait_until(lambda: replicas() == 3, "the three replicas the controller's env asks for", T)
    # Once the controller runs, new options are not applied: Ray warns too.
    with pytest.warns(UserWarning, match="controller_options apply when the Serve "
                                         "controller starts") as warned:
        serve.start(controller_options={"runtime_env": {"env_vars": {"RL_CONTROLLER_WANT": "1"}}})
    assert warned[0].filename == __file__


# ----------------------------------------------- custom autoscaling metrics

def test_custom_metrics_are_kept_over_the_look_back_window_per_running_replica():
    runner = policy_mod.PolicyRunner()
    dep = _dep(2)
    runner.record({"Model#0": (1, {"load": 2}), "Model#1": (0, {"load": 4.5})}, 100.0, 10)
    runner.record({"Model#0": (1, {"load": 6}), "Model#1": RuntimeError("no answer")},
                  105.0, 10)
    aggregated, raw = runner._metrics(dep, "mean")
    by_id = {r.unique_id: v for r, v in aggregated["load"].items()}
    assert by_id == {"0": 4.0, "1": 4.5}        # a failed sample adds nothing
    assert [(p.timestamp, p.value) for p in raw["load"][
        next(r for r in raw["load"] if r.unique_id == "0")]] == [(100.0, 2.0), (105.0, 6.0)]
    assert {r.unique_id: v for r, v in runner._metrics(dep, "max")[0]["load"].items()} == \
        {"0": 6.0, "1": 4.5}
    # Past the window the old samples go; a replica no longer answering is gone.
    runner.record({"Model#0": (0, {"load": 1})}, 111.0, 10)
    aggregated, raw = runner._metrics(_dep(1), "min")
    assert {r.unique_id: v for r, v in aggregated["load"].items()} == {"0": 1.0}
    assert set(runner.series) == {"Model#0"}
    # Replicas the controller no longer runs are not in the context.
    runner.record({"Model#0": (0, None), "Model#5": (0, {"load": 9})}, 112.0, 10)
    assert [r.unique_id for r in runner._metrics(_dep(1), "mean")[1]["load"]] == ["0"]


def _replica_with(obj):
    from ray_lite.serve._replica import ServeReplica
    fake = types.SimpleNamespace(_obj=obj, _custom_stats_off=False, _deployment="Model",
                                 _inflight=3)
    return lambda: asyncio.run(ServeReplica.autoscaling_stats(fake)), fake


def test_a_replica_reports_record_autoscaling_stats_sync_or_async():
    class Sync:
        def record_autoscaling_stats(self):
            return {"queue": 5, "ratio": 0.5}

    class Async:
        async def record_autoscaling_stats(self):
            return {"queue": 1}

    assert _replica_with(Sync())[0]() == (3, {"queue": 5, "ratio": 0.5})
    assert _replica_with(Async())[0]() == (3, {"queue": 1})
    assert _replica_with(object())[0]() == (3, None)


def test_a_bad_record_autoscaling_stats_gives_no_sample_and_says_why(caplog):
    class Raises:
        def record_autoscaling_stats(self):
            raise ValueError("stats bug")

    class WrongValue:
        def record_autoscaling_stats(self):
            return {"queue": "five"}

    ask, fake = _replica_with(Raises())
    assert ask() == (3, None) and not fake._custom_stats_off   # tried again next time
    assert "stats bug" in caplog.text
    ask, fake = _replica_with(WrongValue())
    assert ask() == (3, None) and fake._custom_stats_off        # off for good, as in Ray
    assert "str for 'queue'" in caplog.text
    assert ask() == (3, None)


def scale_on_custom_load(ctx):
    """Two replicas only once the replicas' own metric came through, with Ray's
    shapes (per replica: its aggregate, and its samples)."""
    agg = ctx.aggregated_metrics.get("load", {})
    raw = ctx.raw_metrics.get("load", {})
    ok = agg and set(agg) == set(ctx.running_replicas) and all(v == 7.0 for v in agg.values()) \
        and all(p.value == 7.0 and p.timestamp > 0 for ts in raw.values() for p in ts)
    return (2 if ok else 1), {}


@serve.deployment(autoscaling_config={"min_replicas": 1, "max_replicas": 3,
                                      "metrics_interval_s": 0.1,
                                      "policy": {"policy_function":
                                                 f"{__name__}:scale_on_custom_load"}})
class Reports:
    async def record_autoscaling_stats(self):
        return {"load": 7}

    def __call__(self):
        return os.getpid()


def test_a_policy_sees_the_replicas_custom_metrics(serve_runtime):
    serve.run(Reports.bind(), name="reports", route_prefix=None)

    def replicas():
        return serve.status().applications["reports"].deployments["Reports"] \
            .replica_states.get("RUNNING", 0)
    wait_until(lambda: replicas() == 2, "two replicas, from the custom metric", T)


def test_a_bad_stats_timeout_in_the_environment_falls_back_to_rays_default(monkeypatch):
    from ray_lite.serve._defaults import env_number
    name = "RAY_SERVE_RECORD_AUTOSCALING_STATS_TIMEOUT_S"
    for raw, expected in (("abc", 10.0), ("-1", 10.0), ("", 10.0), ("2.5", 2.5)):
        monkeypatch.setenv(name, raw)
        assert env_number(name, 10.0, float) == expected
