"""get_runtime_context(), resources, nodes() and get_gpu_ids(), as in Ray."""
import asyncio
import os
import re
import time

import pytest

import ray_lite as ray

T = 60
HEX = re.compile(r"^[0-9a-f]+$")


def _context():
    ctx = ray.get_runtime_context()
    return {"job": ctx.get_job_id(), "node": ctx.get_node_id(), "task": ctx.get_task_id(),
            "actor": ctx.get_actor_id(), "name": ctx.get_actor_name(),
            "namespace": ctx.namespace, "worker": ctx.get_worker_id()}


@ray.remote
def task_context():
    out = _context()
    out["assigned"] = ray.get_runtime_context().get_assigned_resources()
    out["task_name"] = ray.get_runtime_context().get_task_name()
    # Ray's deprecated get(): id objects, not hex.
    as_dict = ray.get_runtime_context().get()
    out["dict"] = {k: v if k == "namespace" else (type(v).__name__, v.hex())
                   for k, v in as_dict.items()}
    return out


@ray.remote
class SyncActor:
    def context(self):
        ctx = ray.get_runtime_context()
        out = _context()
        out["assigned"] = ctx.get_assigned_resources()
        out["reconstructed"] = ctx.was_current_actor_reconstructed
        out["me"] = ctx.current_actor
        out["task_name"] = ctx.get_task_name()
        return out

    def ping(self):
        return "pong"


@ray.remote
class AsyncActor:
    async def context(self):
        await asyncio.sleep(0)      # the id is still this call's after a switch
        out = _context()
        ctx = ray.get_runtime_context()
        out["assigned"] = ctx.get_assigned_resources()
        out["me"] = ctx.current_actor
        return out

    async def ping(self):
        return "pong"

    async def nested(self):
        outer = ray.get_runtime_context().get_task_id()
        inner = await self._id()            # awaited: still this call
        return outer, inner

    async def _id(self):
        await asyncio.sleep(0)
        return ray.get_runtime_context().get_task_id()


def test_driver_context(rt):
    ctx = ray.get_runtime_context()
    assert ctx.get_job_id() == "01000000"
    assert HEX.match(ctx.get_node_id()) and len(ctx.get_node_id()) == 56
    assert ctx.get_task_id() is None and ctx.get_actor_id() is None
    assert ctx.get_actor_name() is None
    assert len(ctx.namespace) == 36     # an anonymous namespace (a UUID), as in Ray
    with pytest.raises(RuntimeError, match="only available in an actor"):
        ctx.current_actor
    with pytest.raises(AssertionError):
        ctx.get_assigned_resources()
    assert ctx.get()["job_id"].hex() == "01000000"
    assert sorted(ctx.get()) == ["job_id", "namespace", "node_id"]


def test_task_context(rt):
    driver = _context()
    a, b = ray.get([task_context.remote(), task_context.remote()], timeout=T)
    for c in (a, b):
        assert c["job"] == driver["job"] and c["node"] == driver["node"]
        assert c["namespace"] == driver["namespace"]
        assert HEX.match(c["task"]) and len(c["task"]) == 48
        assert c["actor"] is None and c["name"] is None
        assert c["assigned"] == {"CPU": 1.0}
        assert c["task_name"] == "task_context"
        assert c["dict"] == {"job_id": ("JobID", c["job"]), "node_id": ("NodeID", c["node"]),
                             "task_id": ("TaskID", c["task"]), "namespace": c["namespace"]}
    assert a["task"] != b["task"]
    named = ray.get(task_context.options(name="my_task").remote(), timeout=T)
    assert named["task_name"] == "my_task"


def test_sync_actor_context(rt):
    driver = _context()
    a = SyncActor.options(name="ctx-actor").remote()
    first, second = ray.get([a.context.remote(), a.context.remote()], timeout=T)
    assert first["node"] == driver["node"] and first["job"] == driver["job"]
    assert HEX.match(first["actor"]) and len(first["actor"]) == 32
    assert first["actor"] == second["actor"]
    assert first["task"] != second["task"] and len(first["task"]) == 48
    assert first["name"] == "ctx-actor"
    assert first["assigned"] == {}          # an actor holds no CPU by default, as in Ray
    assert first["reconstructed"] is False
    assert first["task_name"] == "SyncActor.context"
    assert ray.get(first["me"].ping.remote(), timeout=T) == "pong"
    assert first["me"] == a
    unnamed = ray.get(SyncActor.remote().context.remote(), timeout=T)
    assert unnamed["name"] == "" and unnamed["actor"] != first["actor"]


def test_threaded_actor_context(rt):
    a = SyncActor.options(max_concurrency=4).remote()
    results = ray.get([a.context.remote() for _ in range(8)], timeout=T)
    assert len({r["task"] for r in results}) == 8
    assert len({r["actor"] for r in results}) == 1
    assert all(r["assigned"] == {} and r["me"] == a for r in results)


def test_async_actor_context(rt):
    a = AsyncActor.remote()
    results = ray.get([a.context.remote() for _ in range(6)], timeout=T)
    assert len({r["task"] for r in results}) == 6
    assert all(r["task"] is not None for r in results)
    assert len({r["actor"] for r in results}) == 1 and results[0]["name"] == ""
    assert results[0]["assigned"] == {}
    assert ray.get(results[0]["me"].ping.remote(), timeout=T) == "pong"
    outer, inner = ray.get(a.nested.remote(), timeout=T)
    assert outer == inner and outer is not None


def test_resources_and_nodes():
    ray.init(num_cpus=3)
    try:
        total = ray.cluster_resources()
        assert total["CPU"] == 3.0
        assert total["memory"] > 0 and total["object_store_memory"] > 0
        assert total["node:127.0.0.1"] == 1.0 and total["node:__internal_head__"] == 1.0
        assert "GPU" not in total
        assert ray.available_resources() == total

        @ray.remote
        def inside():
            return ray.available_resources()["CPU"], ray.cluster_resources()["CPU"]
        # The task itself holds one of the three CPUs while it asks.
        assert ray.get(inside.remote(), timeout=T) == (2.0, 3.0)
        (node,) = ray.nodes()
        assert node["Alive"] is True and node["alive"] is True
        assert node["NodeID"] == ray.get_runtime_context().get_node_id()
        assert node["NodeManagerAddress"] == "127.0.0.1"
        assert node["Resources"]["CPU"] == 3.0
        for key in ("NodeManagerHostname", "NodeManagerPort", "ObjectManagerPort",
                    "NodeName", "Labels", "DeathReason", "DeathReasonMessage"):
            assert key in node
        assert ray.get_gpu_ids() == []
    finally:
        ray.shutdown()


def test_without_a_runtime():
    assert not ray.is_initialized()
    for query in (ray.cluster_resources, ray.available_resources, ray.nodes, ray.get_gpu_ids):
        with pytest.raises(ray.exceptions.RaySystemError, match="not been started"):
            query()
    assert not ray.is_initialized()         # none of these started it
    ctx = ray.get_runtime_context()         # this one does, as Ray's
    try:
        assert ray.is_initialized()
        assert ctx.get_job_id() == "01000000"
        assert ray.get_runtime_context() is ctx
    finally:
        ray.shutdown()
    with pytest.raises(AssertionError, match="not been initialized"):
        ctx.get_job_id()                    # the same object, once it stopped


@ray.remote
def function_name():
    return ray.get_runtime_context().get_task_function_name()


@ray.remote
class NamesItsCalls:
    def __init__(self):
        self.at_init = ray.get_runtime_context().get_task_function_name()

    def names(self):
        return self.at_init, ray.get_runtime_context().get_task_function_name()

    async def async_name(self):
        return ray.get_runtime_context().get_task_function_name()


def test_task_function_name(rt):
    # Ray's "module.function" and "module.Class.method" (the options' name
    # does not change it); None in the driver.
    assert ray.get_runtime_context().get_task_function_name() is None
    mod = __name__
    assert ray.get(function_name.options(name="renamed").remote(), timeout=T) == \
        f"{mod}.function_name"
    a = NamesItsCalls.remote()
    assert ray.get(a.names.remote(), timeout=T) == (
        f"{mod}.NamesItsCalls.__init__", f"{mod}.NamesItsCalls.names")
    assert ray.get(a.async_name.remote(), timeout=T) == f"{mod}.NamesItsCalls.async_name"

    def nested():
        @ray.remote
        def inner():
            return ray.get_runtime_context().get_task_function_name()
        return inner
    # A nested function by its __name__, as on Ray (not "...nested.<locals>.inner").
    assert ray.get(nested().remote(), timeout=T) == f"{mod}.inner"


@ray.remote
def _id_objects():
    ctx = ray.get_runtime_context()
    return ctx.task_id, ctx.actor_id, ctx.node_id, ctx.get_task_id()


@ray.remote
class _IdActor:
    def ids(self):
        ctx = ray.get_runtime_context()
        return ctx.actor_id, ctx.get_actor_id(), ctx.task_id, ctx.get_task_id()


def test_id_objects(rt):
    # Ray's older properties give id objects; the get_*_id() methods hex.
    ctx = ray.get_runtime_context()
    assert ctx.node_id == ray.NodeID.from_hex(ctx.get_node_id())
    assert ctx.job_id == ray.JobID.from_int(1) and ctx.job_id.int() == 1
    assert repr(ctx.job_id) == "JobID(01000000)"
    with pytest.raises(AssertionError, match="only available when the process is a worker"):
        ctx.task_id         # noqa: B018 - the driver is no worker (Ray's assertion)
    ref = _id_objects.remote()
    task_id, actor_id, node_id, task_hex = ray.get(ref, timeout=T)
    assert type(task_id) is ray.TaskID and task_id.hex() == task_hex
    assert ref.task_id() == task_id and ref.job_id() == ctx.job_id
    assert task_id.job_id() == ctx.job_id
    assert actor_id is None and node_id == ctx.node_id
    actor = _IdActor.remote()
    actor_id, actor_hex, call_id, call_hex = ray.get(actor.ids.remote(), timeout=T)
    assert type(actor_id) is ray.ActorID and actor_id.hex() == actor_hex
    assert actor._actor_id == actor_id      # Ray's private attribute, which libraries read
    assert call_id.hex() == call_hex and not call_id.is_nil()


def test_id_types():
    sizes = {ray.JobID: 4, ray.ActorID: 16, ray.TaskID: 24, ray.PlacementGroupID: 18,
             ray.NodeID: 28, ray.WorkerID: 28, ray.UniqueID: 28}
    for cls, size in sizes.items():
        assert cls.size() == size and len(cls.from_random().binary()) == size
        assert cls.nil().is_nil() and not cls.from_random().is_nil()
        one = cls.from_random()
        assert cls.from_hex(one.hex()) == one and hash(cls.from_binary(one.binary())) == hash(one)
        assert one != one.hex()
    with pytest.raises(ValueError, match="length 28, got 2"):
        ray.NodeID(b"12")
    with pytest.raises(ValueError, match="not a hex string"):
        ray.NodeID.from_hex("zz")
    with pytest.raises(TypeError):
        ray.NodeID("not bytes")
    import pickle
    one = ray.TaskID.from_random()
    assert pickle.loads(pickle.dumps(one)) == one


@ray.remote
def node_facts():
    ctx = ray.get_runtime_context()
    return (ctx.get_session_name(), ctx.get_node_labels(), ctx.get_temp_dir(),
            ctx.get_resource_ids())


@ray.remote
class Facts:
    def get(self):
        return ray.get(node_facts.remote())[0], ray.get_runtime_context().get_session_name()


def test_session_name_node_labels_and_temp_dir(rt):
    ctx = ray.get_runtime_context()
    session = ctx.get_session_name()
    assert re.match(r"^session_\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d_\d{6}_%d$" % os.getpid(), session)
    labels = ctx.get_node_labels()
    assert labels == {"ray.io/node-id": ctx.get_node_id()}
    assert os.path.isdir(ctx.get_temp_dir())
    assert ctx.get_resource_ids() == ctx.get_accelerator_ids() == {"GPU": []}
    # One runtime, one session: the same in a task and in an actor's call.
    assert ray.get(node_facts.remote(), timeout=T) == (session, labels, ctx.get_temp_dir(),
                                                       {"GPU": []})
    assert ray.get(Facts.remote().get.remote(), timeout=T) == (session, session)


def test_session_name_needs_a_runtime():
    assert not ray.is_initialized()
    ctx = ray.get_runtime_context()     # (starts one, as Ray's)
    first = ctx.get_session_name()
    ray.shutdown()
    with pytest.raises(RuntimeError, match="not been initialized"):
        ctx.get_session_name()
    ray.init(num_cpus=1)
    try:
        assert ctx.get_session_name() == first      # same driver process: same start time
    finally:
        ray.shutdown()


def _wait_for_file(path):
    deadline = time.monotonic() + T
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


@ray.remote
class Cancellable:
    def __init__(self):
        self.saw = None

    def work_until_cancelled(self, started):
        open(started, "w").close()
        deadline = time.monotonic() + T
        while time.monotonic() < deadline:
            if ray.get_runtime_context().is_canceled():
                self.saw = "cancel"
                return "stopped"
            time.sleep(0.005)
        self.saw = "deadline"
        return "ran out"

    def saw_what(self):
        return self.saw, ray.get_runtime_context().is_canceled()


@ray.remote
class AsyncAsks:
    async def ask(self):
        try:
            ray.get_runtime_context().is_canceled()
        except RuntimeError as exc:
            return str(exc)


@ray.remote
def catches_its_cancel(started, out):
    try:
        # (Inside the try: the cancel, sent once the file appears, can
        # interrupt this process before the close returns.)
        open(started, "w").close()
        time.sleep(T)
        verdict = "not interrupted"
    except KeyboardInterrupt:
        verdict = f"interrupted, is_canceled={ray.get_runtime_context().is_canceled()}"
    with open(out + ".part", "w") as f:
        f.write(verdict)
    os.replace(out + ".part", out)      # whole when it appears
    return verdict


@ray.remote
def not_cancelled():
    return ray.get_runtime_context().is_canceled()


def test_is_canceled(rt, tmp_path):
    with pytest.raises(RuntimeError, match="only available when the process is a worker"):
        ray.get_runtime_context().is_canceled()
    assert ray.get(not_cancelled.remote(), timeout=T) is False
    # A sync actor's running call is not interrupted: it sees the cancel and
    # stops; its caller gets the cancellation.  A threaded actor's likewise.
    for i, a in enumerate((Cancellable.remote(), Cancellable.options(max_concurrency=2).remote())):
        started = str(tmp_path / f"started{i}")
        ref = a.work_until_cancelled.remote(started)
        _wait_for_file(started)
        ray.cancel(ref)
        with pytest.raises(ray.exceptions.TaskCancelledError):
            ray.get(ref, timeout=T)
        assert ray.get(a.saw_what.remote(), timeout=T) == ("cancel", False)   # the next is not
    # A task that catches the interrupt can ask why.
    started, out = str(tmp_path / "task_started"), str(tmp_path / "verdict")
    ref = catches_its_cancel.remote(started, out)
    _wait_for_file(started)
    ray.cancel(ref)
    with pytest.raises(ray.exceptions.TaskCancelledError):
        ray.get(ref, timeout=T)
    _wait_for_file(out)
    assert open(out).read() == "interrupted, is_canceled=True"
    assert "not supported in an async actor" in ray.get(AsyncAsks.remote().ask.remote(),
                                                         timeout=T)
