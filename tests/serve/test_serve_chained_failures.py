"""A ``DeploymentResponse`` passed to another deployment's call whose
upstream replica died: the caller gets a ``RayServeException`` naming both
deployments (the actor's death as its cause), as in Ray, not the
downstream replica's ``RayTaskError(ActorDiedError)``; the downstream
replica stays in service."""
import os

import pytest

from ray_lite import serve
from ray_lite.exceptions import ActorDiedError, RayTaskError
from ray_lite.serve.exceptions import RayServeException


@serve.deployment
class Upstream:
    def __call__(self, how):
        if how == "die":
            os._exit(1)
        return "up"

    def stream(self, how):
        if how == "die":
            os._exit(1)
        yield "up"


@serve.deployment
class Downstream:
    def __call__(self, value):
        return "down:" + value

    def parts(self, value):
        yield "down:" + value

    def pid(self):
        return os.getpid()


def _check(exc):
    assert isinstance(exc, RayServeException)
    assert not isinstance(exc, RayTaskError)
    text = str(exc)
    assert "'Downstream'" in text and "'Upstream'" in text, text
    assert "'down-app'" in text and "'up-app'" in text, text
    assert isinstance(exc.__cause__, ActorDiedError)


def test_result_names_both_deployments(serve_runtime):
    up = serve.run(Upstream.bind(), name="up-app", route_prefix=None)
    down = serve.run(Downstream.bind(), name="down-app", route_prefix=None)
    assert down.remote(up.remote("ok")).result(timeout_s=60) == "down:up"
    pid = down.pid.remote().result(timeout_s=60)
    with pytest.raises(RayServeException) as info:
        down.remote(up.remote("die")).result(timeout_s=60)
    _check(info.value)
    # A keyword argument too.
    with pytest.raises(RayServeException) as info:
        down.remote(value=up.remote("die")).result(timeout_s=60)
    _check(info.value)
    # The downstream replica was not the one that died: it serves on.
    assert down.pid.remote().result(timeout_s=60) == pid
    assert down.remote(up.remote("ok")).result(timeout_s=60) == "down:up"


def test_await_and_streams_name_both_deployments(serve_runtime):
    import asyncio
    up = serve.run(Upstream.bind(), name="up-app", route_prefix=None)
    down = serve.run(Downstream.bind(), name="down-app", route_prefix=None)

    async def awaited():
        with pytest.raises(RayServeException) as info:
            await down.remote(up.remote("die"))
        return info.value
    _check(asyncio.run(awaited()))

    with pytest.raises(RayServeException) as info:
        list(down.options(stream=True).parts.remote(up.remote("die")))
    _check(info.value)


def test_a_plain_failure_upstream_is_left_as_it_is(serve_runtime):
    # Only a death is Serve's to report: an upstream's own exception reaches
    # the caller as the user's error, as before.
    @serve.deployment
    class Raising:
        def __call__(self):
            raise ValueError("bad input")

    up = serve.run(Raising.bind(), name="up-app", route_prefix=None)
    down = serve.run(Downstream.bind(), name="down-app", route_prefix=None)
    with pytest.raises(ValueError, match="bad input") as info:
        down.remote(up.remote()).result(timeout_s=60)
    assert not isinstance(info.value, RayServeException)
