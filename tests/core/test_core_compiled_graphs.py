"""Ray's Compiled Graphs (``experimental_compile``) on one machine: results
read once, Ray's checks at compile time, the in-flight limit, errors that
leave the graph usable, asyncio, teardown.  Expected values measured on
Ray 2.60 (each graph on its own actors: on Ray an actor serves one
compiled graph at a time)."""
import asyncio
import copy
import pickle

import pytest

import ray_lite as ray
from ray_lite.dag import InputNode, MultiOutputNode
from ray_lite.dag.compiled_dag_node import CompiledDAGRef
from ray_lite.exceptions import (RayCgraphCapacityExceeded, RayChannelError,
                                 RayChannelTimeoutError, RayTaskError)

T = 30


@ray.remote
class Stage:
    def __init__(self):
        self.calls = 0

    def echo(self, x):
        self.calls += 1
        return x

    def add(self, x, y):
        return x + y

    def check(self, x):
        if x == "bad":
            raise ValueError("bad input")
        return x

    def wait_for(self, queue):
        return queue.get(timeout=T)

    def num_calls(self):
        return self.calls


@pytest.fixture
def graph(rt):
    """Compiles graphs, and tears each down after the test."""
    made = []

    def compile_(dag, **options):
        made.append(dag.experimental_compile(**options))
        return made[-1]
    yield compile_
    for c in made:
        c.teardown()


def test_a_chain_runs_per_execute_and_each_result_is_read_once(graph):
    a, b = Stage.remote(), Stage.remote()
    with InputNode() as inp:
        dag = b.echo.bind(a.echo.bind(inp))
    compiled = graph(dag)
    ref = compiled.execute(5)
    assert isinstance(ref, CompiledDAGRef)
    assert ray.get(ref, timeout=T) == 5 and compiled.execute(6).get(timeout=T) == 6
    with pytest.raises(ValueError, match="can only be called once"):
        ray.get(ref, timeout=T)
    for how, words in ((copy.copy, "copied"), (copy.deepcopy, "deep copied"),
                       (pickle.dumps, "pickled")):
        with pytest.raises(ValueError, match=f"cannot be {words}"):
            how(compiled.execute(1))
    assert ray.get(b.num_calls.remote(), timeout=T) == 5
    with pytest.raises(TypeError, match="CompiledDAGRef"):
        ray.wait([compiled.execute(1)])


def test_multiple_outputs_and_indexed_inputs(graph):
    a, b = Stage.remote(), Stage.remote()
    with InputNode() as inp:
        dag = MultiOutputNode([a.echo.bind(inp[0]), b.add.bind(inp[0], inp[1])])
    compiled = graph(dag)
    refs = compiled.execute(2, 3)
    assert isinstance(refs, list) and ray.get(refs, timeout=T) == [2, 5]
    with pytest.raises(ValueError, match="must be called with 2 positional args, got 1"):
        compiled.execute(1)
    with InputNode() as inp:
        by_name = Stage.remote().add.bind(inp.x, inp.y)
    named = graph(by_name)
    assert ray.get(named.execute(x=1, y=2), timeout=T) == 3
    with pytest.raises(ValueError, match="kwarg `y`"):
        named.execute(x=1)
    with pytest.raises(ValueError, match="not both"):
        ray.get([named.execute(x=1, y=1), a.echo.remote(1)], timeout=T)


def test_an_error_is_raised_by_its_get_and_the_graph_goes_on(graph):
    with InputNode() as inp:
        dag = Stage.remote().check.bind(inp)
    compiled = graph(dag)
    with pytest.raises(ValueError, match="bad input") as info:
        ray.get(compiled.execute("bad"), timeout=T)
    assert isinstance(info.value, RayTaskError)
    assert ray.get(compiled.execute("ok"), timeout=T) == "ok"


def test_in_flight_executions_are_bounded_and_dropped_refs_free_their_place(graph):
    with InputNode() as inp:
        dag = Stage.remote().echo.bind(inp)
    compiled = graph(dag, _max_inflight_executions=3)
    refs = [compiled.execute(i) for i in range(3)]
    with pytest.raises(RayCgraphCapacityExceeded, match="more than 3 in-flight"):
        compiled.execute(3)
    assert ray.get(refs[1], timeout=T) == 1       # it and those before it are read
    more = [compiled.execute(i) for i in (4, 5)]
    assert ray.get(refs[2], timeout=T) == 2
    del refs
    assert ray.get(more, timeout=T) == [4, 5]
    unread = [compiled.execute(i) for i in range(3)]
    del unread                                   # dropped unread: room again
    assert ray.get(compiled.execute(9), timeout=T) == 9


def test_a_get_that_times_out_is_a_channel_timeout(graph):
    queue = ray.util.queue.Queue()
    with InputNode() as inp:
        dag = Stage.remote().wait_for.bind(inp)
    compiled = graph(dag)
    ref = compiled.execute(queue)
    with pytest.raises(RayChannelTimeoutError):
        ref.get(timeout=0.05)
    queue.put("done")           # (lets the call end before the actor goes)


def test_compile_time_checks_are_rays(rt):
    a = Stage.remote()

    @ray.remote
    def task(x):
        return x

    with pytest.raises(NotImplementedError, match="only support actor method nodes"):
        task.bind(InputNode()).experimental_compile()
    with pytest.raises(ValueError, match="No InputNode found"):
        a.echo.bind(1).experimental_compile()
    with InputNode() as inp:
        with pytest.raises(ValueError, match="as kwargs"):
            a.add.bind(inp, y=inp).experimental_compile()
        with pytest.raises(ValueError, match="already created with Actor.remote"):
            Stage.bind().echo.bind(inp).experimental_compile()
        with pytest.raises(ValueError, match="directly, or they must index"):
            MultiOutputNode([a.echo.bind(inp), a.echo.bind(inp[0])]).experimental_compile()
    with pytest.raises(TypeError, match="unexpected keyword"):
        a.echo.bind(InputNode()).experimental_compile(colour="red")


def test_asyncio_graphs_are_awaited_once(graph):
    with InputNode() as inp:
        dag = Stage.remote().echo.bind(inp)
    compiled = graph(dag, enable_asyncio=True)

    async def run():
        fut = await compiled.execute_async(11)
        first = await fut
        with pytest.raises(ValueError, match="awaited upon once"):
            await fut
        return first
    assert asyncio.run(asyncio.wait_for(run(), T)) == 11
    with pytest.raises(ValueError, match="Use execute_async"):
        compiled.execute(1)


def test_teardown_ends_the_graph_and_can_end_its_actors(rt):
    a = Stage.remote()
    with InputNode() as inp:
        compiled = a.echo.bind(inp).experimental_compile()
    compiled.teardown()
    with pytest.raises(RayChannelError, match="torn down"):
        compiled.execute(1)
    assert ray.get(a.echo.remote(9), timeout=T) == 9        # the actor goes on
    with InputNode() as inp:
        ended = a.echo.bind(inp).experimental_compile()
    ended.teardown(kill_actors=True)
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(a.echo.remote(1), timeout=T)


def test_dag_context_sets_the_defaults(graph, monkeypatch):
    from ray_lite.dag import DAGContext
    ctx = DAGContext.get_current()
    assert (ctx.max_inflight_executions, ctx.get_timeout) == (10, 10)      # Ray's
    monkeypatch.setattr(ctx, "max_inflight_executions", 1)
    monkeypatch.setattr(ctx, "get_timeout", 0.05)
    queue = ray.util.queue.Queue()
    with InputNode() as inp:
        compiled = graph(Stage.remote().wait_for.bind(inp))
    ref = compiled.execute(queue)
    with pytest.raises(RayCgraphCapacityExceeded):
        compiled.execute(queue)
    with pytest.raises(RayChannelTimeoutError):
        ray.get(ref)            # no timeout given: the context's get_timeout
    queue.put("done")
    with pytest.raises(ValueError, match="must be less than or equal"):
        DAGContext(read_iteration_timeout=20, get_timeout=10)


def test_a_bad_setting_in_the_environment_is_named(monkeypatch):
    from ray_lite.dag import context
    monkeypatch.setenv("RAY_CGRAPH_get_timeout", "soon")
    with pytest.raises(ValueError, match="RAY_CGRAPH_get_timeout='soon' is not a valid int"):
        context._env("get_timeout", 10)
