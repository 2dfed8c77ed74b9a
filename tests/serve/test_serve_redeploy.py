"""``serve.run`` of an application that runs already, as Ray Serve does it:
a deployment redeployed without a code version (every ``serve.run``) gets
new replicas even when nothing changed; the old ones serve until the new
ones are ready, then stop (their multiplexed models unloaded, their
``__del__`` run) before ``serve.run`` returns.  A versioned redeploy (a
config file's unchanged code) keeps its replicas."""
import os
import threading

from ray_lite import serve
from ray_lite.serve import _core, context

from serve_helpers import http, process_gone, wait_until


def _replica_pids(app, dep):
    ids = _core.get(context.get_controller().process_ids.remote(), timeout=30)
    return sorted(ids["replicas"].get(f"{app}/{dep}", []))


class _Model:
    def __init__(self, model_id, path):
        self.model_id, self.path = model_id, path

    def __del__(self):
        with open(self.path, "a") as f:
            f.write(f"{self.model_id} {os.getpid()}\n")


@serve.deployment(num_replicas=1)
class Models:
    def __init__(self, path):
        self.path = path

    @serve.multiplexed(max_num_models_per_replica=4)
    async def get_model(self, model_id: str):
        return _Model(model_id, self.path)

    async def infer(self):
        model = await self.get_model(serve.get_multiplexed_model_id())
        return model.model_id, os.getpid()


def test_running_the_same_app_again_replaces_its_replicas_and_unloads_their_models(
        serve_runtime, tmp_path):
    unloaded = tmp_path / "unloaded"
    handle = serve.run(Models.bind(str(unloaded)), name="models", route_prefix=None)
    pids = set()
    for m in ("a", "b"):
        model, pid = handle.options(multiplexed_model_id=m).infer.remote().result(
            timeout_s=30)
        assert model == m
        pids.add(pid)
    (old,) = pids
    assert not unloaded.exists()

    handle = serve.run(Models.bind(str(unloaded)), name="models", route_prefix=None)
    # The old replica has stopped by now, and its models went with it.
    assert sorted(unloaded.read_text().split("\n")[:-1]) == [f"a {old}", f"b {old}"]
    wait_until(lambda: process_gone(old), "the old replica's end")
    (new,) = _replica_pids("models", "Models")
    assert new != old
    assert handle.options(multiplexed_model_id="a").infer.remote().result(
        timeout_s=30) == ("a", new)
    assert serve.status().applications["models"].status == "RUNNING"


@serve.deployment(num_replicas=2)
class Pid:
    def __call__(self, request=None):
        return str(os.getpid())


def test_http_answers_throughout_a_redeploy(serve_port):
    serve.run(Pid.bind(), name="p", route_prefix="/p")
    before = _replica_pids("p", "Pid")
    statuses = []
    stop = threading.Event()

    def load():
        for _ in range(100_000):
            if stop.is_set():
                return
            statuses.append(http(serve_port, "GET", "/p", timeout=30)[0])
    t = threading.Thread(target=load, daemon=True)
    t.start()
    try:
        serve.run(Pid.bind(), name="p", route_prefix="/p")
    finally:
        stop.set()
        t.join(60)
    assert not t.is_alive()
    assert statuses and set(statuses) == {200}
    after = _replica_pids("p", "Pid")
    assert len(after) == 2 and not set(after) & set(before)
    wait_until(lambda: all(process_gone(pid) for pid in before), "the old replicas' end")


def test_a_redeploy_of_the_same_code_version_keeps_the_replicas(serve_runtime):
    # A config file applied again with unchanged code carries its code
    # version (config.apply): Ray's lightweight update, the replicas stay.
    serve.run(Pid.bind(), name="v", route_prefix=None, _code_version="v1")
    before = _replica_pids("v", "Pid")
    serve.run(Pid.bind(), name="v", route_prefix=None, _code_version="v1")
    assert _replica_pids("v", "Pid") == before
    serve.run(Pid.bind(), name="v", route_prefix=None, _code_version="v2")
    assert not set(_replica_pids("v", "Pid")) & set(before)
