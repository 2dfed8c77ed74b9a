"""Custom autoscaling policies (``autoscaling_config["policy"]``): checked
when configured, called by the controller with Ray's AutoscalingContext,
their answer bounded and applied, their state kept between calls; a policy
that fails keeps the current count."""
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
