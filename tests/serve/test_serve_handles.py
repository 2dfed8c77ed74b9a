"""Serve's programming model through handles: deployments, composition, streaming,
batching, reconfigure, status, delete, replica death and replacement."""
import asyncio
import os
import signal
import time

import pytest

import ray_lite as ray
from ray_lite import serve
from ray_lite.serve import DeploymentHandle, DeploymentResponse, DeploymentResponseGenerator

T = 60


@serve.deployment
class Adder:
    def __init__(self, inc):
        self.inc = inc

    def __call__(self, x):
        return x + self.inc

    async def add_async(self, x):
        await asyncio.sleep(0)
        return x + self.inc

    def pid(self):
        return os.getpid()

    def fail(self):
        raise ValueError("boom")

    def count(self, n):
        for i in range(n):
            yield i

    async def acount(self, n):
        for i in range(n):
            yield f"tok{i}"


@serve.deployment
class Chain:
    def __init__(self, first, second):
        assert isinstance(first, DeploymentHandle)
        self.first = first
        self.second = second

    async def __call__(self, x):
        # A response passed straight into another call.
        return await self.second.remote(self.first.remote(x))

    async def stream_through(self, n):
        out = []
        async for item in self.first.options(stream=True).acount.remote(n):
            out.append(item)
        return out


@serve.deployment
def double(x):
    return 2 * x


def test_class_deployment_calls_methods_and_sees_errors(serve_port):
    h = serve.run(Adder.bind(10), name="a", route_prefix=None)
    assert isinstance(h, DeploymentHandle)
    r = h.remote(1)
    assert isinstance(r, DeploymentResponse)
    assert r.result(timeout_s=30) == 11
    assert h.add_async.remote(5).result(timeout_s=30) == 15
    assert h.options(method_name="add_async").remote(7).result(timeout_s=30) == 17
    with pytest.raises(ValueError, match="boom"):
        h.fail.remote().result(timeout_s=30)


def test_function_deployment_and_options(serve_port):
    h = serve.run(double.options(name="dbl", num_replicas=2).bind(), name="f", route_prefix=None)
    assert [h.remote(i).result(timeout_s=30) for i in range(4)] == [0, 2, 4, 6]
    st = serve.status().applications["f"]
    assert st.status == "RUNNING"
    assert st.deployments["dbl"].replica_states == {"RUNNING": 2}


def test_handle_shutdown_as_ray_has_it(serve_port):
    # Ray's DeploymentHandle.shutdown() / shutdown_async(): the handle's
    # methods (not a call of a deployment method of that name).
    h = serve.run(Adder.bind(1), name="sd", route_prefix=None)
    assert h.remote(1).result(timeout_s=30) == 2
    assert h.shutdown() is None
    assert asyncio.run(asyncio.wait_for(h.shutdown_async(), 30)) is None
    other = serve.get_app_handle("sd")      # other handles are not affected
    assert other.remote(2).result(timeout_s=30) == 3


def test_replicas_spread_calls_and_are_not_charged_cpus(serve_port):
    # 6 replicas with num_cpus=1 each on an init(num_cpus=1) runtime.
    app = Adder.options(num_replicas=6, ray_actor_options={"num_cpus": 1}).bind(0)
    h = serve.run(app, name="many", route_prefix=None)
    pids = {h.pid.remote().result(timeout_s=30) for _ in range(60)}
    assert len(pids) >= 2
    assert serve.status().applications["many"].deployments["Adder"].replica_states == \
        {"RUNNING": 6}


def test_composition_and_response_passing(serve_port):
    app = Chain.bind(Adder.bind(1), Adder.options(name="Adder2").bind(100))
    h = serve.run(app, name="chain", route_prefix=None)
    assert h.remote(0).result(timeout_s=30) == 101
    assert h.stream_through.remote(3).result(timeout_s=30) == ["tok0", "tok1", "tok2"]
    # From the driver too: a response passed into another handle's call.
    a = serve.get_deployment_handle("Adder", "chain")
    b = serve.get_deployment_handle("Adder2", "chain")
    assert b.remote(a.remote(5)).result(timeout_s=30) == 106
    assert serve.get_app_handle("chain").remote(1).result(timeout_s=30) == 102


def test_streaming_sync_and_async_iteration(serve_port):
    h = serve.run(Adder.bind(0), name="s", route_prefix=None)
    gen = h.options(stream=True).count.remote(5)
    assert isinstance(gen, DeploymentResponseGenerator)
    assert list(gen) == [0, 1, 2, 3, 4]
    assert not gen.cancelled()
    gen.cancel()                                 # ended already: nothing to stop
    assert gen.cancelled()

    async def consume():
        return [x async for x in h.options(stream=True).acount.remote(3)]
    assert asyncio.run(consume()) == ["tok0", "tok1", "tok2"]


def test_await_response_in_driver_loop(serve_port):
    h = serve.run(Adder.bind(2), name="aw", route_prefix=None)

    async def main():
        return await asyncio.gather(*[h.remote(i) for i in range(5)])
    assert asyncio.run(main()) == [2, 3, 4, 5, 6]


def test_sync_waits_inside_an_event_loop_are_refused_as_in_ray(serve_port):
    # Waiting there would stall the loop that may have to run what it waits for.
    from ray_lite.serve.exceptions import RayServeException
    h = serve.run(Adder.bind(2), name="loopy", route_prefix=None)

    async def main():
        response = h.remote(1)
        with pytest.raises(RuntimeError, match="Use `await response` instead"):
            response.result()
        assert response.result(_skip_asyncio_check=True, timeout_s=30) == 3
        with pytest.raises(RuntimeError, match="Sync methods"):
            response._to_object_ref_sync()
        assert await response._to_object_ref() is response._to_object_ref_sync(
            _allow_running_in_asyncio_loop=True)
        gen = h.options(stream=True).count.remote(2)
        with pytest.raises(RuntimeError, match="async for"):
            next(gen)
        refs = await gen._to_object_ref_gen()
        assert refs is gen._to_object_ref_gen_sync(_allow_running_in_asyncio_loop=True)
        assert [await r for r in refs] == [0, 1]
        # Only a top-level response is resolved; a nested one is refused, as Ray's.
        with pytest.raises(RayServeException, match="top level arguments"):
            h.remote([h.remote(0)])
        return await h.remote(h.remote(0))   # (that one is)
    assert asyncio.run(main()) == 4


@serve.deployment(max_ongoing_requests=20)
class Batched:
    def __init__(self):
        self.sizes = []

    @serve.batch(max_batch_size=4, batch_wait_timeout_s=0.2)
    async def handle(self, xs):
        self.sizes.append(len(xs))
        return [x * 10 for x in xs]

    async def __call__(self, x):
        return await self.handle(x)

    def batch_sizes(self):
        return self.sizes


def test_batching_groups_concurrent_calls(serve_port):
    h = serve.run(Batched.bind(), name="b", route_prefix=None)
    rs = [h.remote(i) for i in range(8)]
    assert [r.result(timeout_s=30) for r in rs] == [i * 10 for i in range(8)]
    sizes = h.batch_sizes.remote().result(timeout_s=30)
    assert sum(sizes) == 8 and max(sizes) > 1 and max(sizes) <= 4


@serve.deployment(user_config={"v": 1})
class Configured:
    def __init__(self):
        self.v = None

    def reconfigure(self, cfg):
        if cfg["v"] == "bad":
            raise ValueError("cannot take this config")
        self.v = cfg["v"]

    def __call__(self):
        return self.v


def test_reconfigure_on_start_and_on_update(serve_port):
    h = serve.run(Configured.bind(), name="c", route_prefix=None)
    assert h.remote().result(timeout_s=30) == 1
    pid_before = serve.status().applications["c"].deployments["Configured"].replica_states
    h = serve.run(Configured.options(user_config={"v": 2}).bind(), name="c", route_prefix=None)
    assert h.remote().result(timeout_s=30) == 2
    assert pid_before == {"RUNNING": 1}


@serve.deployment(num_replicas=2)
class RankAware:
    """Ray calls a ``reconfigure`` that takes ``rank`` at start, user_config or not."""

    def __init__(self):
        self.seen = []

    def reconfigure(self, user_config, rank):
        self.seen.append((user_config, rank.rank, rank.node_rank, rank.local_rank))

    def __call__(self):
        return os.getpid(), self.seen


def test_a_reconfigure_taking_rank_gets_it(serve_port):
    h = serve.run(RankAware.bind(), name="ranks", route_prefix=None)
    seen = {}
    for _ in range(100):
        pid, calls = h.remote().result(timeout_s=30)
        seen[pid] = calls
        if len(seen) == 2:
            break
    assert sorted(seen.values()) == [[(None, 0, 0, 0)], [(None, 1, 0, 1)]]
    h = serve.run(RankAware.options(user_config={"v": 1}).bind(), name="ranks",
                  route_prefix=None)
    pid, calls = h.remote().result(timeout_s=30)
    assert calls[-1][0] == {"v": 1} and calls[-1][1] in (0, 1)


@serve.deployment(num_replicas=2, health_check_period_s=0.2, health_check_timeout_s=5)
class Mortal:
    def pid(self):
        return os.getpid()

    def rank(self):
        ctx = serve.get_replica_context()
        return os.getpid(), ctx.rank.rank, ctx.world_size


def _ranks(h):
    """Each replica's (rank, world size) by pid, from calls through ``h``
    until two replicas answered (bounded): after a replacement the handle
    learns of the new replica a moment after the controller lists it, and
    until then only the survivor answers."""
    by_pid = {}
    deadline = time.monotonic() + 30
    while len(by_pid) < 2 and time.monotonic() < deadline:
        pid, rank, world = h.rank.remote().result(timeout_s=30)
        by_pid[pid] = (rank, world)
    return by_pid


def test_an_update_whose_reconfigure_raises_fails_the_app(serve_port):
    # As Ray: serve.run raises RuntimeError, the app is DEPLOY_FAILED and its
    # deployment serves no more (not silently the old config).
    from ray_lite.serve.exceptions import DeploymentUnavailableError
    h = serve.run(Configured.bind(), name="c2", route_prefix=None)
    assert h.remote().result(timeout_s=30) == 1
    with pytest.raises(RuntimeError, match="cannot take this config"):
        serve.run(Configured.options(user_config={"v": "bad"}).bind(), name="c2",
                  route_prefix=None)
    assert serve.status().applications["c2"].status == "DEPLOY_FAILED"
    with pytest.raises(DeploymentUnavailableError):
        serve.get_app_handle("c2").remote().result(timeout_s=30)


def test_dead_replica_is_replaced(serve_port):
    h = serve.run(Mortal.bind(), name="m", route_prefix=None)
    pids = set()
    for _ in range(40):
        pids.add(h.pid.remote().result(timeout_s=30))
        if len(pids) == 2:
            break
    assert len(pids) == 2
    before = _ranks(h)
    assert sorted(before.values()) == [(0, 2), (1, 2)]      # Ray's ranks
    victim = sorted(pids)[0]
    os.kill(victim, signal.SIGKILL)
    ctl = serve.context.get_controller()
    seen = set()
    # Bounded: the replacement shows up within the listen-based refresh.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        handles = ray.get(ctl.replica_handles.remote("m", "Mortal"), timeout=30)
        if len(handles) == 2:
            try:
                seen = {ray.get(x.ready.remote(), timeout=30) for x in handles}
            except ray.exceptions.RayActorError:
                continue    # the controller has not noticed the death yet
            if victim not in seen:
                break
        ray.get(ctl.status.remote(), timeout=30)
    assert len(seen) == 2 and victim not in seen
    for _ in range(10):
        assert h.pid.remote().result(timeout_s=30) != victim
    after = _ranks(h)       # the replacement took the rank of the replica it replaced
    assert sorted(after.values()) == [(0, 2), (1, 2)] and victim not in after
    survivor = (pids - {victim}).pop()
    assert after[survivor] == before[survivor]


@serve.deployment(health_check_period_s=0.1, health_check_timeout_s=5)
class Unhealthy:
    def __init__(self):
        self.calls = 0

    def check_health(self):
        self.calls += 1
        if self.calls > 2:
            raise RuntimeError("unhealthy")

    def pid(self):
        return os.getpid()


def test_failed_health_check_replaces_replica(serve_port):
    h = serve.run(Unhealthy.bind(), name="u", route_prefix=None)
    first = h.pid.remote().result(timeout_s=30)
    ctl = serve.context.get_controller()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        handles = ray.get(ctl.replica_handles.remote("u", "Unhealthy"), timeout=30)
        try:
            if handles and ray.get(handles[0].ready.remote(), timeout=30) != first:
                break
        except ray.exceptions.RayActorError:
            continue
    else:
        pytest.fail("the unhealthy replica was not replaced")


@serve.deployment
class BadInit:
    def __init__(self):
        raise RuntimeError("constructor failed")


def test_constructor_failure_fails_run(serve_port):
    with pytest.raises(RuntimeError, match="constructor failed"):
        serve.run(BadInit.bind(), name="bad", route_prefix=None)
    # As Ray: the deployment is DEPLOY_FAILED and its message says why.
    app = serve.status().applications["bad"]
    dep = app.deployments["BadInit"]
    assert (app.status, dep.status) == ("DEPLOY_FAILED", "DEPLOY_FAILED")
    assert "constructor failed" in dep.message and "constructor failed" in app.message


@serve.deployment(graceful_shutdown_timeout_s=30)
class Slow:
    async def __call__(self, gate):
        await asyncio.sleep(gate)
        return "finished"


def test_delete_drains_in_flight_requests(serve_port):
    h = serve.run(Slow.bind(), name="slow", route_prefix=None)
    r = h.remote(0.5)
    serve.delete("slow")
    assert r.result(timeout_s=30) == "finished"
    assert "slow" not in serve.status().applications
    with pytest.raises(Exception):
        serve.get_app_handle("slow")


@ray.remote
class _Notes:
    def __init__(self):
        self.notes = []
        self.changed = asyncio.Event()

    async def add(self, note):
        self.notes.append(note)
        self.changed.set()

    async def first(self):
        """The first note, once there is one (the caller's get bounds the wait)."""
        while not self.notes:
            self.changed.clear()
            await self.changed.wait()
        return self.notes[0]

    async def read(self):
        return self.notes


@serve.deployment
class WithDestructor:
    def __init__(self, notes, kind):
        self.notes = notes
        self.kind = kind

    def __call__(self):
        return "up"

    def __del__(self):
        ray.get(self.notes.add.remote(f"{self.kind} __del__"))


@serve.deployment
class WithAsyncDestructor(WithDestructor.func_or_class):
    async def __del__(self):
        await self.notes.add.remote(f"{self.kind} async __del__")


@pytest.mark.parametrize("cls", [WithDestructor, WithAsyncDestructor], ids=["sync", "async"])
def test_a_replica_runs_its_destructor_when_it_stops(serve_port, cls):
    # As Ray: __del__ (sync or async) runs once when the replica stops.
    notes = _Notes.remote()
    assert serve.run(cls.bind(notes, "del"), name="d", route_prefix=None).remote().result(
        timeout_s=T) == "up"
    serve.delete("d")
    expect = "del async __del__" if cls is WithAsyncDestructor else "del __del__"
    assert ray.get(notes.read.remote(), timeout=T) == [expect]


@serve.deployment
class NeverReady:
    async def __init__(self, notes):
        await notes.add.remote(os.getpid())
        await asyncio.Event().wait()         # its constructor never ends


def test_delete_stops_a_replica_still_in_its_constructor(serve_port):
    import threading
    from procs import wait_dead
    notes = _Notes.remote()
    outcome = []

    def run():
        try:
            serve.run(NeverReady.bind(notes), name="never", route_prefix=None)
            outcome.append("ran")
        except Exception as exc:   # noqa: BLE001 - what the test looks at
            outcome.append(exc)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    pid = ray.get(notes.first.remote(), timeout=T)     # the constructor has begun
    serve.delete("never")
    assert wait_dead(pid, T), "the replica outlived its deployment"
    t.join(T)
    assert not t.is_alive() and isinstance(outcome[0], Exception)


class _Wrapper:
    def __init__(self, inner):
        self.inner = inner


@serve.deployment
class Unwraps:
    def __init__(self, wrapped):
        self.wrapped = wrapped

    async def __call__(self, x):
        return await self.wrapped.inner.remote(x)


def test_a_bound_deployment_inside_an_object_becomes_a_handle(serve_port):
    # As Ray: at any depth of the arguments, in the user's own objects too.
    class LocalWrapper(_Wrapper):      # defined here: goes by value
        pass
    for wrapper in (_Wrapper, LocalWrapper):
        h = serve.run(Unwraps.bind(wrapper(double.bind())), name="wrapped", route_prefix=None)
        assert h.remote(21).result(timeout_s=T) == 42


def test_options_and_decorator_validation():
    with pytest.raises(ValueError):
        serve.deployment(num_replicas=-1)
    with pytest.raises(TypeError):
        serve.deployment(not_an_option=1)
    with pytest.raises(ValueError):
        Adder.options(max_ongoing_requests=0)
    with pytest.raises(RuntimeError):
        Adder(1)
    assert Adder.options(name="X").name == "X"
    assert Adder.options(num_replicas=3).num_replicas == 3
    # As Ray: a digit string is a number; these two options exclude each other;
    # an old-style positional name is ignored (the class's name stays).
    assert Adder.options(num_replicas="3").num_replicas == 3
    with pytest.raises(ValueError, match="max_replicas_per_node is not allowed when "
                                         "placement_group_bundles"):
        serve.deployment(max_replicas_per_node=1, placement_group_bundles=[{"CPU": 1}])

    @serve.deployment("old_style_name", num_replicas=2)
    class Named:
        pass
    assert (Named.name, Named.num_replicas) == ("Named", 2)


# -- the handle's own limits: max_ongoing_requests, max_queued_requests -----------

@ray.remote
class Gate:
    """Holds the calls of a deployment until opened; counts who entered."""

    def __init__(self):
        self.event = asyncio.Event()
        self.entered = []

    async def enter(self, x):
        self.entered.append(x)
        await self.event.wait()

    async def open(self):
        self.event.set()

    async def wait_entered(self, n):
        while len(self.entered) < n:      # the workload's own poll, bounded by the caller
            await asyncio.sleep(0.005)
        return list(self.entered)


@serve.deployment(max_ongoing_requests=2)
class Held:
    def __init__(self, gate):
        self.gate = gate

    async def __call__(self, x):
        await self.gate.enter.remote(x)
        return x


def test_handle_holds_calls_beyond_max_ongoing_requests(serve_port):
    gate = Gate.remote()
    h = serve.run(Held.bind(gate), name="held", route_prefix=None)
    responses = [h.remote(i) for i in range(5)]
    # Two reach the replica; the other three wait in the handle.
    assert ray.get(gate.wait_entered.remote(2), timeout=T) == [0, 1]
    assert len(h._router.queue) == 3
    ray.get(gate.open.remote(), timeout=T)
    assert [r.result(timeout_s=T) for r in responses] == [0, 1, 2, 3, 4]
    # The held calls went out first come, first served.
    assert ray.get(gate.wait_entered.remote(5), timeout=T) == [0, 1, 2, 3, 4]


def test_handle_raises_backpressure_beyond_max_queued_requests(serve_port):
    from ray_lite.serve.exceptions import BackPressureError, RequestCancelledError
    gate = Gate.remote()
    h = serve.run(Held.options(max_ongoing_requests=1, max_queued_requests=2).bind(gate),
                  name="bp", route_prefix=None)
    running = h.remote(0)
    assert ray.get(gate.wait_entered.remote(1), timeout=T) == [0]
    queued = [h.remote(1), h.remote(2)]
    refused = h.remote(3)
    with pytest.raises(BackPressureError) as info:
        refused.result(timeout_s=T)
    assert info.value.max_queued_requests == 2
    queued[0].cancel()                         # a held call is dropped at once
    with pytest.raises(RequestCancelledError):
        queued[0].result(timeout_s=T)
    ray.get(gate.open.remote(), timeout=T)
    assert running.result(timeout_s=T) == 0
    assert queued[1].result(timeout_s=T) == 2
    assert ray.get(gate.wait_entered.remote(2), timeout=T) == [0, 2]


def test_held_response_passes_into_another_call(serve_port):
    gate = Gate.remote()
    held = serve.run(Held.options(max_ongoing_requests=1).bind(gate), name="held2",
                     route_prefix=None)
    add = serve.run(Adder.bind(100), name="adder", route_prefix=None)
    first = held.remote(1)
    assert ray.get(gate.wait_entered.remote(1), timeout=T) == [1]
    second = held.remote(2)                     # held by the handle
    total = add.remote(second)                  # its (unready) ref goes to another replica
    ray.get(gate.open.remote(), timeout=T)
    assert first.result(timeout_s=T) == 1
    assert total.result(timeout_s=T) == 102


def test_held_calls_fail_when_their_deployment_is_deleted(serve_port):
    from ray_lite.serve.exceptions import DeploymentUnavailableError
    gate = Gate.remote()                         # never opened
    h = serve.run(Held.options(max_ongoing_requests=1, graceful_shutdown_timeout_s=0.2)
                  .bind(gate), name="gone", route_prefix=None)
    running = h.remote(0)
    assert ray.get(gate.wait_entered.remote(1), timeout=T) == [0]
    held = h.remote(1)
    serve.delete("gone")                         # the running call is cut off
    with pytest.raises(Exception):
        running.result(timeout_s=T)
    with pytest.raises(DeploymentUnavailableError, match="deleted"):
        held.result(timeout_s=T)


def test_cancelled_response_raises_request_cancelled(serve_port):
    from ray_lite.exceptions import TaskCancelledError
    from ray_lite.serve.exceptions import RequestCancelledError
    gate = Gate.remote()                         # never opened: the call runs until cancelled
    h = serve.run(Held.bind(gate), name="cancel", route_prefix=None)
    r = h.remote(7)
    assert ray.get(gate.wait_entered.remote(1), timeout=T) == [7]
    assert not r.cancelled()
    r.cancel()
    assert r.cancelled()                         # Ray's: cancel() was called
    with pytest.raises(RequestCancelledError) as info:
        r.result(timeout_s=T)
    assert isinstance(info.value, TaskCancelledError)    # what Ray code may catch
    assert str(info.value) == "Request was cancelled."   # Ray Serve's words

    async def awaited():
        r2 = h.remote(8)
        assert await gate.wait_entered.remote(2) == [7, 8]
        r2.cancel()
        with pytest.raises(RequestCancelledError):
            await r2
    asyncio.run(asyncio.wait_for(awaited(), T))


def test_request_cancelled_error_says_which_request_and_pickles():
    import pickle
    from ray_lite.serve.exceptions import RequestCancelledError
    err = pickle.loads(pickle.dumps(RequestCancelledError("7f3a")))
    assert str(err) == "Request 7f3a was cancelled." and err._request_id == "7f3a"


@serve.deployment
class HeldCatchingCancel:
    def __init__(self, gate):
        self.gate = gate

    async def __call__(self, x):
        try:
            await self.gate.enter.remote(x)
        except asyncio.CancelledError:
            return "caught its cancellation"
        return x


def test_cancelled_response_raises_even_when_the_handler_caught_it(serve_port):
    # As Ray: cancel() then result() raises, whatever the handler returned.
    from ray_lite.serve.exceptions import RequestCancelledError
    gate = Gate.remote()                         # never opened
    h = serve.run(HeldCatchingCancel.bind(gate), name="catching", route_prefix=None)
    r = h.remote(7)
    assert ray.get(gate.wait_entered.remote(1), timeout=T) == [7]
    r.cancel()
    with pytest.raises(RequestCancelledError):
        r.result(timeout_s=T)


def test_a_requests_handle_calls_are_kept_only_while_they_run():
    # What a replica call keeps to cancel with it: a call that loops for
    # ever, calling another deployment, must not keep every response.
    from ray_lite.serve._request_calls import _Calls

    class Response:
        def __init__(self, done):
            self.done = done

        def _done(self):
            return self.done
    calls = _Calls()
    for _ in range(1000):
        calls.note(Response(True))
    assert len(calls) <= 64
    running = [Response(False) for _ in range(300)]
    for r in running:
        calls.note(r)
    assert all(any(c is r for c in calls) for r in running)     # none dropped
    assert len(calls) <= 64 + 300
