"""A deployment that cannot be serialised (its class captures a lock, or
its constructor's arguments hold one) is refused by ``serve.run`` with a
``TypeError`` naming the deployment and what could not be serialised, as
Ray Serve does; nothing of it is deployed."""
import threading

import pytest

from ray_lite import serve

_LOCK = threading.Lock()


def _closure_deployment():
    lock = threading.Lock()

    @serve.deployment
    class HoldsLock:
        def __call__(self, request=None):
            with lock:
                return "locked"
    return HoldsLock


@serve.deployment
class Takes:
    def __init__(self, arg=None, *, kwarg=None):
        self.arg, self.kwarg = arg, kwarg

    def __call__(self, request=None):
        return "ok"


def test_a_class_that_captures_a_lock_is_refused(serve_runtime):
    with pytest.raises(TypeError) as info:
        serve.run(_closure_deployment().bind(), name="lock", route_prefix=None)
    text = str(info.value)
    assert "deployment 'HoldsLock'" in text and "lock" in text
    assert "lock" not in serve.status().applications


@pytest.mark.parametrize("how", ["args", "kwargs"])
def test_constructor_arguments_holding_a_lock_are_refused(serve_runtime, how):
    app = Takes.bind(_LOCK) if how == "args" else Takes.bind(kwarg={"inner": [_LOCK]})
    with pytest.raises(TypeError) as info:
        serve.run(app, name="args", route_prefix=None)
    text = str(info.value)
    assert "deployment 'Takes'" in text and "init args" in text and "lock" in text
    if how == "kwargs":
        assert "kwarg" in text      # where it was found
    assert "args" not in serve.status().applications


def test_a_nested_deployment_is_named(serve_runtime):
    @serve.deployment
    class Outer:
        def __init__(self, inner):
            self.inner = inner

        async def __call__(self, request=None):
            return await self.inner.remote()

    with pytest.raises(TypeError, match="deployment 'Takes'"):
        serve.run(Outer.bind(Takes.bind(_LOCK)), name="nested", route_prefix=None)
    # And a deployment that serialises runs as before.
    handle = serve.run(Outer.bind(Takes.bind(1)), name="nested", route_prefix=None)
    assert handle.remote().result(timeout_s=30) == "ok"
