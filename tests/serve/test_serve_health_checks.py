"""Replica health checks, as Ray Serve runs them: a replica passes its
``check_health`` before it serves (a deployment whose replicas never pass
fails to deploy); then each is checked every ``health_check_period_s``,
each check bounded by ``health_check_timeout_s``; one that fails
``REPLICA_HEALTH_CHECK_UNHEALTHY_THRESHOLD`` checks in a row, or whose
process dies, is stopped and replaced, and meanwhile its deployment and
application say UNHEALTHY (the message names the replica and why), then
HEALTHY and RUNNING again."""
import asyncio
import os
import signal

import pytest

from ray_lite import serve
from ray_lite.serve import _core, context

from serve_helpers import process_gone, wait_until


def _replica_pids(app, dep):
    ids = _core.get(context.get_controller().process_ids.remote(), timeout=30)
    return ids["replicas"].get(f"{app}/{dep}", [])


def _statuses(app, dep):
    a = serve.status().applications[app]
    d = a.deployments[dep]
    return a.status, a.message, d.status, d.message


@serve.deployment(health_check_period_s=0.1, health_check_timeout_s=5)
class NeverHealthy:
    def check_health(self):
        raise RuntimeError("this replica is never healthy")

    def __call__(self, request=None):
        return "unreachable"


def test_a_deployment_whose_replicas_never_pass_fails_to_deploy(serve_runtime):
    with pytest.raises(RuntimeError, match="this replica is never healthy"):
        serve.run(NeverHealthy.bind(), name="never", route_prefix=None)
    app_status, _, dep_status, dep_message = _statuses("never", "NeverHealthy")
    assert (app_status, dep_status) == ("DEPLOY_FAILED", "DEPLOY_FAILED")
    assert "health check" in dep_message and "this replica is never healthy" in dep_message
    assert _replica_pids("never", "NeverHealthy") == []


@serve.deployment(health_check_period_s=0.1, health_check_timeout_s=5,
                  graceful_shutdown_timeout_s=1)
class FlagChecked:
    """Unhealthy while the file ``flag`` exists."""

    def __init__(self, flag):
        self.flag = flag

    def check_health(self):
        if os.path.exists(self.flag):
            raise RuntimeError("the flag says sick")

    def __call__(self, request=None):
        return os.getpid()


def test_a_replica_that_fails_its_checks_is_replaced_and_the_status_says_so(
        serve_runtime, tmp_path):
    flag = tmp_path / "sick"
    handle = serve.run(FlagChecked.bind(str(flag)), name="chk", route_prefix=None)
    (first,) = _replica_pids("chk", "FlagChecked")
    assert _statuses("chk", "FlagChecked")[::2] == ("RUNNING", "HEALTHY")
    flag.touch()
    # Until the flag goes, no replica passes: the status stays UNHEALTHY.
    wait_until(lambda: _statuses("chk", "FlagChecked")[::2] == ("UNHEALTHY", "UNHEALTHY"),
               "the UNHEALTHY status")
    app_status, app_message, _, dep_message = _statuses("chk", "FlagChecked")
    assert "FlagChecked#" in dep_message and "the flag says sick" in dep_message
    assert "FlagChecked" in app_message and "UNHEALTHY" in app_message
    wait_until(lambda: process_gone(first), "the unhealthy replica's end")
    flag.unlink()
    wait_until(lambda: _statuses("chk", "FlagChecked")[::2] == ("RUNNING", "HEALTHY"),
               "HEALTHY again")
    assert _statuses("chk", "FlagChecked")[1::2] == ("", "")
    (second,) = _replica_pids("chk", "FlagChecked")
    assert second != first
    assert handle.remote().result(timeout_s=30) == second


@serve.deployment(health_check_period_s=0.1, health_check_timeout_s=0.3,
                  graceful_shutdown_timeout_s=0)
class Hangs:
    """Its check never answers while the file ``flag`` exists."""

    def __init__(self, flag):
        self.flag = flag

    async def check_health(self):
        if os.path.exists(self.flag):
            await asyncio.Event().wait()

    def __call__(self, request=None):
        return os.getpid()


def test_a_check_that_does_not_answer_in_time_fails(serve_runtime, tmp_path):
    flag = tmp_path / "hang"
    serve.run(Hangs.bind(str(flag)), name="hang", route_prefix=None)
    (first,) = _replica_pids("hang", "Hangs")
    flag.touch()
    wait_until(lambda: _statuses("hang", "Hangs")[2] == "UNHEALTHY", "the UNHEALTHY status")
    assert "Hangs#" in _statuses("hang", "Hangs")[3]
    assert "0.3 s" in _statuses("hang", "Hangs")[3]
    wait_until(lambda: process_gone(first), "the hung replica's end")
    flag.unlink()
    wait_until(lambda: _statuses("hang", "Hangs")[::2] == ("RUNNING", "HEALTHY"),
               "HEALTHY again")
    assert _replica_pids("hang", "Hangs") != [first]


def test_a_first_check_that_does_not_answer_in_time_is_a_failed_start(serve_runtime,
                                                                       tmp_path):
    flag = tmp_path / "hang"
    flag.touch()
    with pytest.raises(RuntimeError, match="no answer within 0.3 s"):
        serve.run(Hangs.options(max_constructor_retry_count=1).bind(str(flag)),
                  name="hang", route_prefix=None)
    assert _statuses("hang", "Hangs")[2] == "DEPLOY_FAILED"


def test_checks_that_fail_now_and_then_do_not_replace_the_replica(serve_runtime):
    # As Ray: only REPLICA_HEALTH_CHECK_UNHEALTHY_THRESHOLD failures in a row count.
    @serve.deployment(health_check_period_s=0.05, health_check_timeout_s=5)
    class Flaky:
        def __init__(self):
            self.checks = 0

        def check_health(self):
            self.checks += 1
            if self.checks % 2 == 0:
                raise RuntimeError("every other check fails")

        def count(self):
            return os.getpid(), self.checks

    handle = serve.run(Flaky.bind(), name="flaky", route_prefix=None)
    pid, _ = handle.count.remote().result(timeout_s=30)
    wait_until(lambda: handle.count.remote().result(timeout_s=30)[1] >= 12,
               "a dozen checks")
    assert handle.count.remote().result(timeout_s=30)[0] == pid
    assert _statuses("flaky", "Flaky")[::2] == ("RUNNING", "HEALTHY")


@serve.deployment(health_check_period_s=60, health_check_timeout_s=5)
class StartsWhenAllowed:
    """Passes its first check only while the file ``flag`` does not exist."""

    def __init__(self, flag):
        self.flag = flag

    def check_health(self):
        if os.path.exists(self.flag):
            raise RuntimeError("not allowed to start")

    def __call__(self, request=None):
        return os.getpid()


def test_a_replica_that_died_makes_its_deployment_unhealthy_until_replaced(
        serve_runtime, tmp_path):
    flag = tmp_path / "hold"
    handle = serve.run(StartsWhenAllowed.bind(str(flag)), name="dies", route_prefix=None)
    (first,) = _replica_pids("dies", "StartsWhenAllowed")
    flag.touch()        # its replacement cannot start until the flag goes
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: _statuses("dies", "StartsWhenAllowed")[::2] ==
               ("UNHEALTHY", "UNHEALTHY"), "the UNHEALTHY status")
    message = _statuses("dies", "StartsWhenAllowed")[3]
    assert "StartsWhenAllowed#" in message and "died" in message
    flag.unlink()
    wait_until(lambda: _statuses("dies", "StartsWhenAllowed")[::2] == ("RUNNING", "HEALTHY"),
               "HEALTHY again")
    (second,) = _replica_pids("dies", "StartsWhenAllowed")
    assert second != first
    assert handle.remote().result(timeout_s=30) == second
