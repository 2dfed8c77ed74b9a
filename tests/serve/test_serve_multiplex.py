"""Model multiplexing: ``@serve.multiplexed``, ``serve.get_multiplexed_model_id()``,
routing by ``handle.options(multiplexed_model_id=)`` and by the
``serve_multiplexed_model_id`` header to the replica that holds the model,
LRU eviction per replica, and a model that fails to load."""
import json

import pytest

from serve_helpers import http

MODEL_HEADER = "serve_multiplexed_model_id"


def _multiplexed_deployment(num_replicas, max_models):
    from starlette.requests import Request

    from ray_lite import serve

    unloaded = []

    class Model:
        def __init__(self, model_id):
            self.model_id = model_id

        def __del__(self):
            unloaded.append(self.model_id)

    @serve.deployment(num_replicas=num_replicas)
    class Models:
        def __init__(self):
            self.loads = []

        @serve.multiplexed(max_num_models_per_replica=max_models)
        async def get_model(self, model_id: str):
            if model_id == "broken":
                raise RuntimeError("cannot load model 'broken'")
            self.loads.append(model_id)
            return Model(model_id)

        async def __call__(self, request: Request):
            return await self.infer()

        async def infer(self):
            model_id = serve.get_multiplexed_model_id()
            model = await self.get_model(model_id)
            return {"model": model.model_id, "replica": serve.get_replica_context().replica_tag}

        def history(self):
            return {"loads": list(self.loads), "unloaded": list(unloaded)}

        def current_model_id(self):
            return serve.get_multiplexed_model_id()
    return Models


def test_a_model_goes_to_the_replica_that_holds_it(serve_port):
    from ray_lite import serve

    handle = serve.run(_multiplexed_deployment(num_replicas=3, max_models=4).bind())
    by_handle = {}
    for model_id in ("m1", "m2", "m3", "m4", "m5", "m6"):
        h = handle.options(multiplexed_model_id=model_id)
        answers = [h.infer.remote().result(timeout_s=30) for _ in range(4)]
        assert {a["model"] for a in answers} == {model_id}
        replicas = {a["replica"] for a in answers}
        assert len(replicas) == 1          # every call on the replica that loaded it
        by_handle[model_id] = replicas.pop()
        # Over HTTP (another caller: the proxy) it goes to the same replica.
        for _ in range(3):
            status, _, body = http(serve_port, "GET", "/", headers={MODEL_HEADER: model_id})
            assert status == 200
            assert json.loads(body) == {"model": model_id, "replica": by_handle[model_id]}
    # Each model was loaded once, by its replica only.
    loads = []
    seen = set()
    for _ in range(60):
        seen.add(json.dumps(handle.history.remote().result(timeout_s=30)))
    for s in seen:
        loads += json.loads(s)["loads"]
    assert sorted(loads) == ["m1", "m2", "m3", "m4", "m5", "m6"]


def test_each_replica_evicts_its_least_recently_used_model(serve_runtime):
    from ray_lite import serve

    handle = serve.run(_multiplexed_deployment(num_replicas=1, max_models=2).bind(),
                       route_prefix=None)

    def use(model_id):
        return handle.options(multiplexed_model_id=model_id).infer.remote().result(
            timeout_s=30)["model"]

    assert [use(m) for m in ("a", "b", "a", "c", "a", "b")] == ["a", "b", "a", "c", "a", "b"]
    # c evicted b (least recently used, a having been used since); b back evicts c.
    assert handle.history.remote().result(timeout_s=30) == {
        "loads": ["a", "b", "c", "b"], "unloaded": ["b", "c"]}


def test_a_stopping_replica_unloads_its_models(serve_runtime, tmp_path):
    # As in Ray: when a replica stops, its models go (their __del__ runs).
    from ray_lite import serve

    class Model:
        def __init__(self, model_id, path):
            self.model_id, self.path = model_id, path

        def __del__(self):
            with open(self.path, "a") as f:
                f.write(self.model_id + "\n")

    @serve.deployment
    class Models:
        @serve.multiplexed(max_num_models_per_replica=3)
        async def get_model(self, model_id: str):
            return Model(model_id, str(tmp_path / "unloaded"))

        async def infer(self):
            return (await self.get_model(serve.get_multiplexed_model_id())).model_id

    handle = serve.run(Models.bind(), name="models", route_prefix=None)
    for m in ("a", "b"):
        assert handle.options(multiplexed_model_id=m).infer.remote().result(timeout_s=30) == m
    serve.delete("models")
    assert sorted((tmp_path / "unloaded").read_text().split()) == ["a", "b"]


def test_a_model_that_fails_to_load_fails_its_requests_only(serve_port):
    from ray_lite import serve

    handle = serve.run(_multiplexed_deployment(num_replicas=1, max_models=2).bind())
    assert http(serve_port, "GET", "/", headers={MODEL_HEADER: "broken"})[0] == 500
    status, _, body = http(serve_port, "GET", "/", headers={MODEL_HEADER: "fine"})
    assert status == 200 and json.loads(body)["model"] == "fine"
    with pytest.raises(Exception, match="cannot load model 'broken'"):
        handle.options(multiplexed_model_id="broken").infer.remote().result(timeout_s=30)
    assert handle.options(multiplexed_model_id="fine").infer.remote().result(
        timeout_s=30)["model"] == "fine"


def test_the_model_id_is_the_calls_own(serve_runtime):
    from ray_lite import serve

    handle = serve.run(_multiplexed_deployment(num_replicas=1, max_models=2).bind(),
                       route_prefix=None)
    assert handle.current_model_id.remote().result(timeout_s=30) == ""
    assert handle.options(multiplexed_model_id="x").current_model_id.remote().result(
        timeout_s=30) == "x"
    assert handle.current_model_id.remote().result(timeout_s=30) == ""
    gen = handle.options(multiplexed_model_id="y", stream=True).history.remote()
    with pytest.raises(Exception, match="did not return a generator|not a generator"):
        list(gen)


def test_multiplexed_refuses_what_ray_refuses():
    from ray_lite import serve

    def sync_loader(self, model_id):
        return model_id
    with pytest.raises(TypeError, match="async functions or methods"):
        serve.multiplexed(sync_loader)

    async def no_args():
        return None
    with pytest.raises(TypeError, match="model_id: str"):
        serve.multiplexed(no_args)
    with pytest.raises(TypeError, match="must be an integer"):
        serve.multiplexed(max_num_models_per_replica="3")
    with pytest.raises(ValueError, match="must be positive"):
        serve.multiplexed(max_num_models_per_replica=0)


def test_an_ingress_app_sees_the_requests_model_id(serve_port):
    from ray_lite import serve

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        model = await serve.get_replica_context().servable_object.get_model(
            serve.get_multiplexed_model_id())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": model.encode()})

    @serve.deployment
    @serve.ingress(app)
    class Models:
        @serve.multiplexed(max_num_models_per_replica=2)
        async def get_model(self, model_id):
            return f"model {model_id}"

    serve.run(Models.bind())
    assert http(serve_port, "GET", "/", headers={MODEL_HEADER: "m7"})[::2] == (200, b"model m7")
