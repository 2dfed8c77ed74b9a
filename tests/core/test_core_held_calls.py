"""Calls that reach an actor while its constructor runs, with a ref argument
not ready yet: each kind of actor (sync, threaded, threaded with concurrency
groups, async) runs them once the constructor has ended and the argument is
ready, whichever of the two comes first.  An async actor's plain ``def``
method called meanwhile is still known as one afterwards."""
import pytest

import ray_lite
from ray_lite.util.queue import Queue

T = 60


@ray_lite.remote
def _gated(q):
    return q.get(timeout=T)


@ray_lite.remote
def _call_from_another_caller(actor):
    # A caller of its own: a sync actor holds a caller's later calls behind
    # its call that waits for an argument.
    return ray_lite.get(actor.built.remote(), timeout=T)


class _BuiltSlowly:
    def __init__(self, started, refs):
        # Reads the links while it waits for the driver's object: a call sent
        # meanwhile arrives during the constructor.
        started.put(True)
        self.value = ray_lite.get(refs[0], timeout=T)

    def built(self):
        return self.value

    def echo(self, x):
        return (self.value, x)


_Sync = ray_lite.remote(_BuiltSlowly)
_Threaded = ray_lite.remote(max_concurrency=4)(_BuiltSlowly)
_Grouped = ray_lite.remote(max_concurrency=2, concurrency_groups={"io": 2})(_BuiltSlowly)


@ray_lite.remote
class _Async(_BuiltSlowly):
    async def ready(self):
        return True

    def sync_methods(self):
        from ray_lite._private.process import state
        return dict(state.node.async_actor.sync_methods)


_KINDS = {"sync": _Sync, "threaded": _Threaded, "groups": _Grouped, "async": _Async}


def _start_while_building(cls):
    """An actor whose constructor waits for ``gate``, and a call sent to it
    meanwhile whose argument waits for ``arg_gate``."""
    started, gate, arg_gate = Queue(), Queue(), Queue()
    actor = cls.remote(started, [_gated.remote(gate)])
    assert started.get(timeout=T)
    arg = _gated.remote(arg_gate)
    call = actor.echo.remote(arg)       # arrives while the constructor waits
    return actor, call, arg, gate, arg_gate


@pytest.mark.parametrize("kind", sorted(_KINDS))
def test_a_call_whose_argument_is_ready_after_the_constructor_runs(rt, kind):
    actor, call, arg, gate, arg_gate = _start_while_building(_KINDS[kind])
    gate.put("built")
    # Another caller's call answered: the actor serves calls now.
    assert ray_lite.get(_call_from_another_caller.remote(actor), timeout=T) == "built"
    arg_gate.put("arg")
    assert ray_lite.get(call, timeout=T) == ("built", "arg")


@pytest.mark.parametrize("kind", sorted(_KINDS))
def test_a_call_whose_argument_is_ready_before_the_constructor_ends(rt, kind):
    actor, call, arg, gate, arg_gate = _start_while_building(_KINDS[kind])
    arg_gate.put("arg")
    assert ray_lite.get(arg, timeout=T) == "arg"
    # The argument's value reaches the actor before the constructor's (both
    # come from the driver, on one ring, in this order).
    gate.put("built")
    assert ray_lite.get(call, timeout=T) == ("built", "arg")
    assert ray_lite.get(_call_from_another_caller.remote(actor), timeout=T) == "built"


def test_an_async_actors_plain_method_called_during_its_constructor_stays_known_as_plain(rt):
    if rt is None:
        pytest.skip("the local backend's workers")
    started, gate = Queue(), Queue()
    actor = _Async.remote(started, [_gated.remote(gate)])
    assert started.get(timeout=T)
    during = actor.built.remote()       # arrives while the constructor waits
    gate.put("built")
    assert ray_lite.get(during, timeout=T) == "built"
    assert ray_lite.get(actor.built.remote(), timeout=T) == "built"
    assert ray_lite.get(actor.sync_methods.remote(), timeout=T)["built"] is True
