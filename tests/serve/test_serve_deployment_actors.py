"""Deployment-scoped actors (``deployment(deployment_actors=[...])``): shared by
a deployment's replicas, found with ``serve.get_deployment_actor``, kept by an
in-place update, new with new code, recreated when they die, ended with
their deployment; bad configs refused at once, a failing constructor fails
the deploy."""
import os
import signal

import pytest

import ray_lite as ray
from ray_lite import serve
from ray_lite.serve.config import DeploymentActorConfig
from ray_lite.serve.exceptions import RayServeException
from serve_helpers import process_gone, wait_until

T = 60


@ray.remote
class Registry:
    def __init__(self, start=0):
        self.items = []
        self.start = start

    def add(self, x):
        self.items.append(x)
        return self.start + len(self.items)

    def pid(self):
        return os.getpid()

    def context(self):
        c = serve.get_deployment_actor_context()
        return {"app": c.app_name, "deployment": c.deployment, "actor": c.actor_name,
                "code_version": c.code_version, "inherited": os.environ.get("FROM_DEPLOYMENT"),
                "own": os.environ.get("FROM_ACTOR")}


@ray.remote
class Broken:
    def __init__(self):
        raise ValueError("no registry today")


class Plain:
    pass


def _registry(start=0, **extra):
    return DeploymentActorConfig(name="registry", actor_class=Registry,
                                 init_kwargs={"start": start}, **extra)


@serve.deployment(num_replicas=2)
class Model:
    def __call__(self, x):
        return ray.get(serve.get_deployment_actor("registry").add.remote(x))

    def who(self):
        return os.getpid()

    def actor_pid(self):
        return ray.get(serve.get_deployment_actor("registry").pid.remote())

    def actor_context(self):
        ctx = serve.get_replica_context()
        return ctx.code_version, ray.get(
            serve.get_deployment_actor("registry").context.remote())

    def missing(self):
        try:
            serve.get_deployment_actor("nope")
        except ValueError as exc:
            return str(exc)
        return None

    def actor_context_here(self):
        try:
            serve.get_deployment_actor_context()
        except RayServeException as exc:
            return str(exc)
        return None


@pytest.fixture
def fast_checks(monkeypatch, request):
    """``serve_runtime`` whose controller checks deployment actors every 0.1 s
    (the variable is read by the controller, forked after it is set)."""
    monkeypatch.setenv("RAY_SERVE_DEPLOYMENT_ACTOR_HEALTH_CHECK_PERIOD_S", "0.1")
    monkeypatch.setenv("RAY_SERVE_DEPLOYMENT_ACTOR_HEALTH_CHECK_TIMEOUT_S", "5")
    request.getfixturevalue("serve_runtime")


def test_replicas_share_the_actor(serve_runtime):
    app = Model.options(deployment_actors=[_registry(start=100)]).bind()
    h = serve.run(app, name="shared")
    seen_replicas, counts = set(), []
    deadline_calls = 200
    while len(seen_replicas) < 2 and deadline_calls:
        deadline_calls -= 1
        counts.append(h.remote("x").result(timeout_s=T))
        seen_replicas.add(h.who.remote().result(timeout_s=T))
    assert len(seen_replicas) == 2, "the two replicas never both answered"
    # One actor behind both replicas: one count, no gap, no repeat.
    assert counts == list(range(101, 101 + len(counts)))


def test_context_names_and_env(serve_runtime):
    app = Model.options(
        num_replicas=1,
        ray_actor_options={"runtime_env": {"env_vars": {"FROM_DEPLOYMENT": "d"}}},
        deployment_actors=[_registry(actor_options={
            "runtime_env": {"env_vars": {"FROM_ACTOR": "a"}}, "num_cpus": 0})]).bind()
    h = serve.run(app, name="ctxapp")
    replica_version, ctx = h.actor_context.remote().result(timeout_s=T)
    assert ctx == {"app": "ctxapp", "deployment": "Model", "actor": "registry",
                   "code_version": replica_version, "inherited": "d", "own": "a"}
    assert replica_version
    assert "nope" in h.missing.remote().result(timeout_s=T)
    assert "deployment actor" in h.actor_context_here.remote().result(timeout_s=T)


def test_outside_a_replica_is_refused(serve_runtime, monkeypatch):
    # (A test that ran a replica in this process may have left its context.)
    from ray_lite.serve import context
    monkeypatch.setattr(context, "_replica_context", None)
    with pytest.raises(RayServeException, match="deployment replica"):
        serve.get_deployment_actor("registry")
    with pytest.raises(RayServeException, match="deployment actor"):
        serve.get_deployment_actor_context()


def test_in_place_update_keeps_it_new_code_replaces_it(serve_runtime):
    # (A versioned redeploy, as a config file's: serve.run's has no code
    # version, and each one replaces the deployment.)
    h = serve.run(Model.options(deployment_actors=[_registry()]).bind(), name="upd",
                  _code_version="v1")
    assert h.remote("a").result(timeout_s=T) == 1
    first = h.actor_pid.remote().result(timeout_s=T)
    # num_replicas only: the same actor, its state kept.
    h = serve.run(Model.options(num_replicas=1, deployment_actors=[_registry()]).bind(),
                  name="upd", _code_version="v1")
    assert h.actor_pid.remote().result(timeout_s=T) == first
    assert h.remote("b").result(timeout_s=T) == 2
    # Another constructor argument: a new version, a new actor; the old one ends.
    h = serve.run(Model.options(num_replicas=1, deployment_actors=[_registry(start=50)]).bind(),
                  name="upd", _code_version="v1")
    assert h.remote("c").result(timeout_s=T) == 51
    assert h.actor_pid.remote().result(timeout_s=T) != first
    wait_until(lambda: process_gone(first), "the old version's actor to end", T)


def test_delete_ends_the_actor(serve_runtime):
    h = serve.run(Model.options(num_replicas=1, deployment_actors=[_registry()]).bind(),
                  name="gone")
    pid = h.actor_pid.remote().result(timeout_s=T)
    serve.delete("gone")
    wait_until(lambda: process_gone(pid), "the deleted deployment's actor to end", T)


def test_dead_actor_is_recreated(fast_checks):
    h = serve.run(Model.options(num_replicas=1, deployment_actors=[_registry()]).bind(),
                  name="crash")
    assert h.remote("a").result(timeout_s=T) == 1
    old = h.actor_pid.remote().result(timeout_s=T)
    os.kill(old, signal.SIGKILL)

    def recreated():
        try:
            return h.actor_pid.remote().result(timeout_s=T) != old
        except (ray.exceptions.RayActorError, ValueError):
            # (Ray's two answers meanwhile: the dead one's handle, or no
            # actor of that name yet.)
            return False
    wait_until(recreated, "the deployment actor to be recreated", T)
    assert h.remote("b").result(timeout_s=T) == 1     # a fresh actor: fresh state


def test_failing_constructor_fails_the_deploy(serve_runtime):
    app = Model.options(num_replicas=1, deployment_actors=[
        DeploymentActorConfig(name="broken", actor_class=Broken)]).bind()
    with pytest.raises(RuntimeError, match="(?s)deployment actor 'broken'.*no registry today"):
        serve.run(app, name="bad")
    assert serve.status().applications["bad"].status == "DEPLOY_FAILED"


def test_import_path_and_dict_forms():
    by_path = DeploymentActorConfig(name="r", actor_class=f"{__name__}:Registry")
    assert by_path.get_actor_class() is Registry
    d = Model.options(deployment_actors=[{"name": "r", "actor_class": Registry,
                                          "init_args": [1]}])
    (cfg,) = d._config["deployment_actors"]
    assert isinstance(cfg, DeploymentActorConfig) and cfg.init_args == (1,)


@pytest.mark.parametrize("kwargs, error, words", [
    ({"name": "", "actor_class": Registry}, ValueError, "non-empty string"),
    ({"name": "r", "actor_class": Plain}, TypeError, "@ray.remote actor class"),
    ({"name": "r", "actor_class": "no_such_module_xyz:Thing"}, ValueError, "cannot import"),
    ({"name": "r", "actor_class": "nodots"}, ValueError, "module:attribute"),
    ({"name": "r", "actor_class": Registry, "actor_options": {"namespace": "x"}}, ValueError,
     "namespace"),
    ({"name": "r", "actor_class": Registry, "init_kwargs": [1]}, TypeError, "init_kwargs"),
    ({"name": "r", "actor_class": Registry, "actor_options": {"runtime_env": {
        "env_vars": {"RAY_SERVE_INTERNAL_DEPLOYMENT_NAME": "x"}}}}, ValueError, "reserved"),
])
def test_bad_config_is_refused(kwargs, error, words):
    with pytest.raises(error, match=words):
        DeploymentActorConfig(**kwargs)


def test_bad_list_is_refused():
    with pytest.raises(ValueError, match="unique.*registry"):
        Model.options(deployment_actors=[_registry(), _registry()])
    with pytest.raises(TypeError, match="list of DeploymentActorConfig"):
        Model.options(deployment_actors=_registry())
    with pytest.raises(TypeError, match="DeploymentActorConfig or a dict"):
        serve.deployment(deployment_actors=["registry"])


ACTOR_MODULE = """
import ray_lite
from ray_lite import serve

@ray_lite.remote
class Counter:
    def __init__(self, start=0):
        self.n = start

    def bump(self):
        self.n += 1
        return self.n

@serve.deployment
class Front:
    def __call__(self):
        return ray_lite.get(serve.get_deployment_actor("counter").bump.remote())

app = Front.bind()
"""


def test_config_file_declares_them_by_import_path(serve_runtime, tmp_path):
    pytest.importorskip("yaml")
    (tmp_path / "da_cfg_mod.py").write_text(ACTOR_MODULE)
    entry = {"name": "filed", "route_prefix": None, "import_path": "da_cfg_mod:app",
             "deployments": [{"name": "Front", "deployment_actors": [
                 {"name": "counter", "actor_class": "da_cfg_mod:Counter",
                  "init_kwargs": {"start": 40}}]}]}
    # Checked for shape when parsed (the module is not importable yet) ...
    parsed = serve.config.parse({"applications": [entry]})
    bad = dict(entry, deployments=[{"name": "Front", "deployment_actors": [{"name": "c"}]}])
    with pytest.raises(serve.config.ConfigError, match=r"deployment_actors\[0\].actor_class"):
        serve.config.parse({"applications": [bad]})
    # ... and imported with the application.
    serve.config.apply(parsed, str(tmp_path))
    h = serve.get_app_handle("filed")
    assert [h.remote().result(timeout_s=T) for _ in range(2)] == [41, 42]
