"""Serve config files (Ray's ServeDeploySchema): what is accepted, what is
refused (naming the key or the import path), and how a file's deployment
options override the code's."""
import textwrap

import pytest

from ray_lite.serve import config
from ray_lite.serve.config import ConfigError

yaml = pytest.importorskip("yaml")

MODULE = textwrap.dedent("""
    from ray_lite import serve

    @serve.deployment(num_replicas=2, user_config={"k": 1})
    class Inner:
        def __call__(self):
            return "inner"

    @serve.deployment(autoscaling_config={"min_replicas": 1, "max_replicas": 4})
    class Outer:
        def __init__(self, inner, word="hi"):
            self.inner, self.word = inner, word

    def build(args):
        return Outer.bind(Inner.bind(), args.get("word", "hi"))

    app = Outer.bind(Inner.bind())
    not_an_app = 42
""")

GOOD = textwrap.dedent("""
    proxy_location: EveryNode
    http_options:
      host: 127.0.0.1
      port: 0
      request_timeout_s: 30
      keep_alive_timeout_s: 5
    applications:
      - name: one
        route_prefix: /one
        import_path: cfg_mod:build
        args: {word: hello}
        runtime_env: {env_vars: {A: "1"}}
        deployments:
          - name: Inner
            num_replicas: 3
            user_config: {k: 2}
            max_ongoing_requests: 7
          - name: Outer
            num_replicas: auto
            autoscaling_config: {max_replicas: 6, upscale_delay_s: 1}
      - name: two
        route_prefix: /two
        import_path: cfg_mod.app
""")


@pytest.fixture
def cfg_dir(tmp_path):
    (tmp_path / "cfg_mod.py").write_text(MODULE)
    return tmp_path


def _parse(text):
    return config.parse(yaml.safe_load(text))


def test_a_good_file_parses_with_ray_defaults():
    parsed = _parse(GOOD)
    assert parsed["http_options"] == {"host": "127.0.0.1", "port": 0, "request_timeout_s": 30,
                                      "keep_alive_timeout_s": 5}
    one, two = parsed["applications"]
    assert (one["name"], one["route_prefix"], one["args"], one["env_vars"]) == \
        ("one", "/one", {"word": "hello"}, {"A": "1"})
    assert one["deployments"]["Inner"]["num_replicas"] == 3
    auto = one["deployments"]["Outer"]["autoscaling_config"]
    # num_replicas: auto, with the file's values over auto's defaults
    assert (auto["max_replicas"], auto["target_ongoing_requests"], auto["upscale_delay_s"]) == \
        (6, 2.0, 1)
    assert (two["name"], two["route_prefix"], two["deployments"]) == ("two", "/two", {})
    assert any("proxy_location" in n for n in parsed["notes"])


def test_controller_options_tracing_and_the_external_scaler_flag_are_read():
    parsed = _parse("controller_options: {runtime_env: {env_vars: {K: v}}}\n"
                    "tracing_config: {enabled: false, sampling_ratio: 0.5}\n"
                    "applications: [{import_path: m:a, external_scaler_enabled: true, "
                    "deployments: [{name: D, num_replicas: 2}]}]\n")
    assert parsed["controller_options"] == {"runtime_env": {"env_vars": {"K": "v"}}}
    assert parsed["applications"][0]["external_scaler_enabled"] is True
    assert _parse(GOOD)["applications"][0]["external_scaler_enabled"] is False


def test_the_single_application_form():
    parsed = _parse("import_path: cfg_mod:app\nroute_prefix: /x\nport: 0\n")
    assert parsed["http_options"] == {"port": 0}
    assert [(a["name"], a["route_prefix"]) for a in parsed["applications"]] == \
        [("default", "/x")]


@pytest.mark.parametrize("text,names", [
    ("applicationz: []", "'applicationz'"),
    ("http_options: {prot: 8000}", "http_options: unknown key 'prot'"),
    ("applications: [{import_path: m:a, rout_prefix: /}]", "applications[0]: unknown key "
                                                           "'rout_prefix'"),
    ("applications: [{import_path: m:a, deployments: [{name: D, num_replica: 2}]}]",
     "applications[0].deployments[0]: unknown key 'num_replica'"),
    ("applications: [{import_path: m:a, deployments: [{name: D, autoscaling_config: "
     "{max_replica: 2}}]}]", "applications[0].deployments[0].autoscaling_config: unknown "
                             "key 'max_replica'"),
    ("applications: [{import_path: m:a, deployments: [{num_replicas: 2}]}]", "needs a name"),
    ("applications: [{import_path: m:a, deployments: [{name: D, num_replicas: -1}]}]",
     "num_replicas"),
    ("applications: [{import_path: m:a, deployments: [{name: D, num_replicas: 2, "
     "autoscaling_config: {max_replicas: 3}}]}]", "autoscaling_config"),
    ("applications: [{import_path: m:a, runtime_env: {pip: [x]}}]",
     "applications[0].runtime_env: unknown key 'pip'"),
    ("applications: [{name: a}]", "import_path is required"),
    ("applications: [{import_path: m:a, route_prefix: x}]", "route_prefix"),
    ("applications: [{import_path: m:a}, {import_path: m:b, route_prefix: /b}]",
     "'default' is used twice"),
    ("applications: [{import_path: m:a}, {name: b, import_path: m:b}]", "'/' is used twice"),
    ("http_options: {port: http}", "http_options.port"),
    ("target_capacity: 50", "target_capacity"),
    ("[1, 2]", "expected a mapping"),
    ("controller_options: {runtime_env: {pip: [x]}}",
     "controller_options: ControllerOptions.runtime_env only supports ['env_vars']"),
    ("controller_options: {runtime_env: {env_vars: {A: 1}}}",
     "controller_options: env_vars['A'] must be str"),
    ("controller_options: {runtim_env: {}}", "controller_options: unknown key 'runtim_env'"),
    ("tracing_config: {enabled: true}", "tracing_config: ray_lite.serve exports no traces"),
    ("tracing_config: {sampling_ratio: 2}", "sampling_ratio must be between 0.0 and 1.0"),
    ("applications: [{import_path: m:a, external_scaler_enabled: true, deployments: "
     "[{name: D, num_replicas: auto}, {name: E, num_replicas: 2}]}]",
     'external_scaler_enabled is set to True, but the following deployment(s) have '
     'autoscaling configured: "D"'),
    ("applications: [{import_path: m:a, external_scaler_enabled: 1}]",
     "external_scaler_enabled: expected true or false"),
])
def test_bad_files_are_refused_naming_the_key(text, names):
    with pytest.raises(ConfigError) as err:
        _parse(text)
    assert names in str(err.value)


def test_load_reads_yaml_and_refuses_what_is_not(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text(GOOD)
    assert [a["name"] for a in config.load(str(good))["applications"]] == ["one", "two"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("applications: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        config.load(str(bad))
    with pytest.raises(ConfigError, match="cannot read"):
        config.load(str(tmp_path / "missing.yaml"))


def test_build_overrides_the_deployments_options(cfg_dir):
    one, two = _parse(GOOD)["applications"]
    app = config.build_app(one, str(cfg_dir))
    outer = app.deployment
    assert outer.name == "Outer" and app._args[1] == "hello"
    assert outer.full_config()["autoscaling_config"]["max_replicas"] == 6
    inner = app._args[0].deployment
    cfg = inner.full_config()
    assert (cfg["num_replicas"], cfg["user_config"], cfg["max_ongoing_requests"]) == \
        (3, {"k": 2}, 7)
    # the application's env_vars reach each deployment's replicas
    assert cfg["ray_actor_options"]["runtime_env"] == {"env_vars": {"A": "1"}}
    assert config.build_app(two, str(cfg_dir)).deployment.name == "Outer"


def test_a_file_num_replicas_replaces_the_codes_autoscaling(cfg_dir):
    app_cfg = _parse("applications: [{import_path: cfg_mod.app, deployments: "
                     "[{name: Outer, num_replicas: 2}]}]")["applications"][0]
    cfg = config.build_app(app_cfg, str(cfg_dir)).deployment.full_config()
    assert cfg["num_replicas"] == 2 and cfg["autoscaling_config"] is None


@pytest.mark.parametrize("path,names", [
    ("nowhere_mod:app", "cannot import 'nowhere_mod'"),
    ("cfg_mod:nothing", "has no attribute 'nothing'"),
    ("cfg_mod:not_an_app", "not an Application"),
    ("cfg_mod", "expected module:attribute"),
])
def test_a_bad_import_path_is_refused_naming_it(cfg_dir, path, names):
    app_cfg = _parse(f"applications: [{{import_path: '{path}'}}]")["applications"][0]
    with pytest.raises(ConfigError) as err:
        config.build_app(app_cfg, str(cfg_dir))
    assert path in str(err.value) and names in str(err.value)


def test_overriding_a_deployment_the_app_lacks_is_refused(cfg_dir):
    app_cfg = _parse("applications: [{import_path: cfg_mod.app, deployments: "
                     "[{name: Missing, num_replicas: 2}]}]")["applications"][0]
    with pytest.raises(ConfigError, match="no deployment named 'Missing'"):
        config.build_app(app_cfg, str(cfg_dir))


# ------------------------------------------- applied again: in place or rolled
LIVE_MODULE = textwrap.dedent("""
    import os
    from ray_lite import serve

    @serve.deployment
    class Live:
        def __init__(self):
            self.cfg = None

        def reconfigure(self, cfg):
            self.cfg = cfg

        def __call__(self):
            return (WORD, os.getpid(), repr(self.cfg))

    WORD = "first"
    app = Live.bind()
""")


def _live_file(n, user_config, **options):
    return config.parse({"applications": [{
        "name": "live", "route_prefix": None, "import_path": "live_mod:app",
        "deployments": [{"name": "Live", "num_replicas": n, "user_config": user_config,
                         **options}]}]})


def _answers(n=12):
    from ray_lite import serve
    h = serve.get_app_handle("live")
    return {tuple(h.remote().result(timeout_s=60)) for _ in range(n)}


def test_a_file_that_changes_only_options_updates_in_place(serve_runtime, tmp_path,
                                                           monkeypatch):
    # Ray's lightweight update: same import path, args and code -> not
    # imported again, replicas kept, user_config to their reconfigure,
    # num_replicas scaled; edited code -> imported anew, replicas rolled.
    from ray_lite import serve
    serve.start(http_options={"port": 0, "proxies": 1})
    (tmp_path / "live_mod.py").write_text(LIVE_MODULE)
    config.apply(_live_file(1, {"v": 1}), str(tmp_path))
    (first,) = _answers(1)
    assert first[0] == "first" and first[2] == repr({"v": 1})

    imports = []
    real = config.import_attr
    monkeypatch.setattr(config, "import_attr",
                        lambda *a, **k: imports.append(a) or real(*a, **k))
    calls = []
    monkeypatch.setattr(config, "application_of", lambda *a: calls.append(a))   # never called
    config.apply(_live_file(2, {"v": 2}, max_queued_requests=50,
                            graceful_shutdown_timeout_s=3, health_check_period_s=5),
                 str(tmp_path))
    assert imports == [] and calls == []
    got = _answers()
    assert {pid for _, pid, _ in got} >= {first[1]}            # the first replica kept
    assert len({pid for _, pid, _ in got}) == 2                # and one more
    assert {(w, c) for w, _, c in got} == {("first", repr({"v": 2}))}
    monkeypatch.undo()

    # The code edited (a different length: not the same file to the bytecode cache).
    (tmp_path / "live_mod.py").write_text(LIVE_MODULE.replace('"first"', '"second!"'))
    config.apply(_live_file(2, {"v": 2}), str(tmp_path))
    got = _answers()
    assert {w for w, _, _ in got} == {"second!"}
    assert first[1] not in {pid for _, pid, _ in got}
    # An import path's change rolls them too (the same class by another name).
    (tmp_path / "live_alias.py").write_text("from live_mod import app\n")
    before = {pid for _, pid, _ in got}
    cfg = _live_file(2, {"v": 2})
    cfg["applications"][0]["import_path"] = "live_alias:app"
    config.apply(cfg, str(tmp_path))
    assert not before & {pid for _, pid, _ in _answers()}


BARRIER_MODULE = textwrap.dedent("""
    import asyncio, os
    from ray_lite import serve

    @serve.deployment
    class Barrier:
        # Each call waits (bounded) for a second one to run beside it: with
        # max_ongoing_requests=2 both meet; with 1 the second only starts
        # once the first gave up.
        def __init__(self):
            self.running = 0
            self.met = asyncio.Event()

        async def __call__(self):
            self.running += 1
            try:
                if self.running >= 2:
                    self.met.set()
                try:
                    await asyncio.wait_for(self.met.wait(), 3)
                    together = True
                except asyncio.TimeoutError:
                    together = False
                return (os.getpid(), together)
            finally:
                self.running -= 1
                if self.running == 0:
                    self.met = asyncio.Event()

    app = Barrier.bind()
""")


def _barrier_file(limit):
    return config.parse({"applications": [{
        "name": "barrier", "route_prefix": None, "import_path": "barrier_mod:app",
        "deployments": [{"name": "Barrier", "num_replicas": 1,
                         "max_ongoing_requests": limit}]}]})


def test_max_ongoing_requests_changes_in_place(serve_runtime, tmp_path):
    # A lightweight update in Ray: the replica stays, and its new limit holds
    # at once (the replica's own count, the handles' and proxies' routing).
    from ray_lite import serve
    serve.start(http_options={"port": 0, "proxies": 1})
    (tmp_path / "barrier_mod.py").write_text(BARRIER_MODULE)
    config.apply(_barrier_file(1), str(tmp_path))
    h = serve.get_app_handle("barrier")
    first = [h.remote() for _ in range(2)]
    one = [r.result(timeout_s=60) for r in first]
    assert [together for _, together in one] == [False, False]   # one at a time
    config.apply(_barrier_file(2), str(tmp_path))
    h = serve.get_app_handle("barrier")
    both = [r.result(timeout_s=60) for r in [h.remote() for _ in range(2)]]
    assert [together for _, together in both] == [True, True]
    assert {pid for pid, _ in both} == {pid for pid, _ in one}    # the same replica


def test_async_slots_resize_grows_and_shrinks_in_place():
    import asyncio

    from ray_lite._private.actors.aio import AsyncSlots

    async def main():
        slots = AsyncSlots(1)
        await slots.__aenter__()
        waiter = asyncio.ensure_future(slots.__aenter__())
        await asyncio.sleep(0)          # (one loop turn: the waiter queues)
        assert not waiter.done()
        slots.resize(2)                 # grown: the waiter takes the new slot
        await asyncio.wait_for(waiter, 5)
        slots.resize(1)                 # shrunk below the two taken
        assert slots.free == -1
        late = asyncio.ensure_future(slots.__aenter__())
        await asyncio.sleep(0)
        slots.release()                 # pays the shrink off: nobody gets it
        await asyncio.sleep(0)
        assert not late.done() and slots.free == 0
        slots.release()                 # under the new capacity: to the waiter
        await asyncio.wait_for(late, 5)
        slots.release()
        assert slots.free == 1 and slots.capacity == 1
    asyncio.run(main())


TYPED_BUILDER = textwrap.dedent("""
    from pydantic import BaseModel
    from ray_lite import serve

    class Args(BaseModel):
        message: str
        num_replicas: int = 1

    @serve.deployment
    class Echo:
        def __init__(self, message):
            self.message = message

    def build(args: Args):
        return Echo.options(num_replicas=args.num_replicas).bind(args.message)

    def build_two(args, more):
        return Echo.bind("x")
""")


def test_a_builder_gets_its_typed_arguments(tmp_path):
    # As Ray: a builder whose parameter is a pydantic model gets the
    # arguments validated into it ("2" -> 2); a builder takes one parameter.
    pytest.importorskip("pydantic")
    from ray_lite.serve.cli import load_target
    (tmp_path / "typed_builder_mod.py").write_text(TYPED_BUILDER)
    app = load_target("typed_builder_mod:build", {"message": "hi", "num_replicas": "2"},
                      app_dir=str(tmp_path))
    assert app.deployment.num_replicas == 2
    with pytest.raises(ValueError, match="message"):      # pydantic's ValidationError
        load_target("typed_builder_mod:build", {"num_replicas": "2"}, app_dir=str(tmp_path))
    with pytest.raises(TypeError, match="exactly one parameter"):
        load_target("typed_builder_mod:build_two", {}, app_dir=str(tmp_path))
