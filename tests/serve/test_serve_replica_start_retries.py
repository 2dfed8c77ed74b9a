"""A replica that fails to start (its constructor raises, or its first
``check_health`` fails) is started again, as Ray Serve does: failures are
counted across the deployment's replicas, and the deploy fails once they
reach min(max_constructor_retry_count, 3 x num_replicas) with no replica
started; meanwhile the deployment's message says how many tries are left."""
import pytest

from ray_lite import serve
from ray_lite.serve import _core, context


def _attempt(path):
    """Count one constructor call in the file ``path``; the count so far."""
    with open(path, "a") as f:
        f.write("x")
    with open(path) as f:
        return len(f.read())


def _attempts(path):
    with open(path) as f:
        return len(f.read())


def _replica_pids(app, dep):
    ids = _core.get(context.get_controller().process_ids.remote(), timeout=30)
    return ids["replicas"].get(f"{app}/{dep}", [])


@serve.deployment
class FailsTwice:
    def __init__(self, path):
        if _attempt(path) <= 2:
            raise RuntimeError("not yet")

    def __call__(self, request=None):
        return "started"


def test_a_constructor_that_fails_twice_then_succeeds_deploys(serve_runtime, tmp_path):
    path = str(tmp_path / "attempts")
    handle = serve.run(FailsTwice.bind(path), name="twice", route_prefix=None)
    assert handle.remote().result(timeout_s=30) == "started"
    assert _attempts(path) == 3
    app = serve.status().applications["twice"]
    assert (app.status, app.deployments["FailsTwice"].status) == ("RUNNING", "HEALTHY")
    assert app.deployments["FailsTwice"].message == ""


@serve.deployment
class AlwaysFails:
    def __init__(self, path):
        raise RuntimeError(f"constructor attempt {_attempt(path)} failed")


def test_a_constructor_that_always_fails_ends_deploy_failed_after_the_retries(
        serve_runtime, tmp_path):
    path = str(tmp_path / "attempts")
    with pytest.raises(RuntimeError, match="constructor attempt 3 failed"):
        serve.run(AlwaysFails.bind(path), name="always", route_prefix=None)
    # One replica: min(20, 3 x 1) attempts in all, then no more.
    assert _attempts(path) == 3
    app = serve.status().applications["always"]
    dep = app.deployments["AlwaysFails"]
    assert (app.status, dep.status) == ("DEPLOY_FAILED", "DEPLOY_FAILED")
    assert dep.message.startswith("The deployment failed to start 3 times in a row. "
                                  "This may be due to a problem with its constructor or "
                                  "initial health check failing.")
    assert dep.message.endswith("constructor attempt 3 failed")
    assert "constructor attempt 3 failed" in app.message
    assert _replica_pids("always", "AlwaysFails") == []


def test_failures_count_across_replicas_and_max_constructor_retry_count_bounds_them(
        serve_runtime, tmp_path):
    path = str(tmp_path / "attempts")
    # Two replicas would allow 6 failures; the option lowers it to 2, and
    # both first attempts fail: nothing is started again.
    with pytest.raises(RuntimeError, match="failed to start 2 times in a row"):
        serve.run(AlwaysFails.options(num_replicas=2, max_constructor_retry_count=2)
                  .bind(path), name="bounded", route_prefix=None)
    assert _attempts(path) == 2


def test_max_constructor_retry_count_must_be_a_positive_int():
    for bad in (0, -1, 1.5, "3", True):
        with pytest.raises(ValueError, match="max_constructor_retry_count"):
            AlwaysFails.options(max_constructor_retry_count=bad)
