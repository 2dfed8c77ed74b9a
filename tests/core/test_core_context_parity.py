"""get_runtime_context() where Ray's tests pin it down: the dashboard's URL,
the deprecated properties' warnings, an async actor call's function name."""
import warnings

import pytest

import ray_lite as ray
from ray_lite._private.process import state
from ray_lite.exceptions import RayDeprecationWarning

T = 60
MOD = __name__


def _deprecations(read):
    """``read()``'s value and the RayDeprecationWarning messages it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = read()
    return value, [str(w.message) for w in caught
                   if issubclass(w.category, RayDeprecationWarning)]


# -- the dashboard's URL ----------------------------------------------------------

def test_dashboard_url_is_empty_without_a_dashboard(rt, monkeypatch):
    monkeypatch.delenv("RAY_OVERRIDE_DASHBOARD_URL", raising=False)
    assert ray.get_runtime_context().get_dashboard_url() == ""


def test_dashboard_url_is_what_the_dashboard_set(rt, monkeypatch):
    monkeypatch.delenv("RAY_OVERRIDE_DASHBOARD_URL", raising=False)
    monkeypatch.setattr(state, "dashboard_url", "127.0.0.1:8265")
    assert ray.get_runtime_context().get_dashboard_url() == "127.0.0.1:8265"


@pytest.mark.parametrize("value", ["ray-dashboard.test:1234", "https://ray-dashboard.test:1234"])
def test_dashboard_url_override(rt, monkeypatch, value):
    # Ray's RAY_OVERRIDE_DASHBOARD_URL wins, without its scheme.
    monkeypatch.setenv("RAY_OVERRIDE_DASHBOARD_URL", value)
    assert ray.get_runtime_context().get_dashboard_url() == "ray-dashboard.test:1234"


# -- the deprecated properties warn, as Ray's ---------------------------------------

def test_deprecated_properties_warn_in_the_driver(rt):
    ctx = ray.get_runtime_context()
    node_id, messages = _deprecations(lambda: ctx.node_id)
    assert node_id.hex() == ctx.get_node_id()
    assert len(messages) == 1 and "Use get_node_id() instead" in messages[0]
    job_id, messages = _deprecations(lambda: ctx.job_id)
    assert job_id.hex() == ctx.get_job_id()
    assert len(messages) == 1 and "Use get_job_id() instead" in messages[0]
    pg_id, messages = _deprecations(lambda: ctx.current_placement_group_id)
    assert pg_id.is_nil()
    assert len(messages) == 1 and "Use get_placement_group_id() instead" in messages[0]
    ids, messages = _deprecations(ctx.get_resource_ids)
    assert ids == ctx.get_accelerator_ids()
    assert len(messages) == 1 and "Use get_accelerator_ids() instead" in messages[0]
    as_dict, messages = _deprecations(ctx.get)
    assert as_dict["node_id"].hex() == ctx.get_node_id()
    assert messages and "get_xxx_id()" in messages[0]
    # A DeprecationWarning, so the usual filters apply to it.
    assert issubclass(RayDeprecationWarning, DeprecationWarning)


def test_the_methods_do_not_warn(rt):
    ctx = ray.get_runtime_context()
    _, messages = _deprecations(lambda: (ctx.get_node_id(), ctx.get_job_id(),
                                         ctx.get_placement_group_id(),
                                         ctx.get_accelerator_ids(), ctx.namespace))
    assert messages == []


@ray.remote
def task_ids():
    ctx = ray.get_runtime_context()
    task_id, messages = _deprecations(lambda: ctx.task_id)
    return task_id.hex() == ctx.get_task_id(), messages


@ray.remote
class IdActor:
    def ids(self):
        ctx = ray.get_runtime_context()
        actor_id, messages = _deprecations(lambda: ctx.actor_id)
        return actor_id.hex() == ctx.get_actor_id(), messages


def test_deprecated_properties_warn_in_a_task_and_an_actor(rt):
    same, messages = ray.get(task_ids.remote(), timeout=T)
    assert same and len(messages) == 1 and "Use get_task_id() instead" in messages[0]
    same, messages = ray.get(IdActor.remote().ids.remote(), timeout=T)
    assert same and len(messages) == 1 and "Use get_actor_id() instead" in messages[0]


# -- an async actor's call is named by the method's qualified name, as on Ray ------------

def test_task_function_names_of_locally_defined_actors(rt):
    @ray.remote
    class SyncActor:
        def name(self):
            return ray.get_runtime_context().get_task_function_name()

    @ray.remote
    class AsyncActor:
        async def name(self):
            return ray.get_runtime_context().get_task_function_name()

    here = "test_task_function_names_of_locally_defined_actors"
    assert ray.get(SyncActor.remote().name.remote(), timeout=T) == f"{MOD}.SyncActor.name"
    assert ray.get(AsyncActor.remote().name.remote(), timeout=T) == \
        f"{MOD}.{here}.<locals>.AsyncActor.name"
