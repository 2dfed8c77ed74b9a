"""Ray's DAG API: ``.bind`` builds a graph of calls, ``execute`` runs it as
tasks and actor calls, in dependency order, each node once per execute."""
import pytest

import ray_lite as ray
from ray_lite.dag import InputNode, MultiOutputNode
from ray_lite.dag.input_node import InputNode as InputNodeByRaysPath

# Public API only: these run on Ray too (--backend=ray; see conftest.py).
pytestmark = pytest.mark.both_backends

T = 60


@ray.remote
def add(a, b):
    return a + b


@ray.remote
def double(x):
    return 2 * x


@ray.remote
def total(values):
    return sum(ray.get(values))     # refs inside a list arrive as refs


@ray.remote
class Model:
    def __init__(self, weight):
        self.weight = weight
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.weight * x

    def count(self, *_after):
        return self.calls


def test_a_chain_of_functions_runs_when_executed(rt):
    dag = double.bind(add.bind(1, double.bind(3)))
    ref = dag.execute()
    assert isinstance(ref, ray.ObjectRef)
    assert ray.get(ref, timeout=T) == 14
    assert ray.get(dag.execute(), timeout=T) == 14      # again: a new run


def test_the_input_node_gives_each_execute_its_value(rt):
    assert InputNodeByRaysPath is InputNode
    with InputNode() as inp:
        dag = add.bind(double.bind(inp), 1)
    assert [ray.get(dag.execute(x), timeout=T) for x in (1, 5)] == [3, 11]


def test_input_parts_by_index_key_and_attribute(rt):
    class Data:
        m1, m2 = 3, 4

    with InputNode() as inp:
        positional = add.bind(inp[0], inp[1])
        keyword = add.bind(inp[0], inp.x)
        by_key = add.bind(inp["m1"], inp["m2"])
        by_attr = add.bind(inp.m1, inp.m2)
    assert ray.get(positional.execute(1, 2), timeout=T) == 3
    assert ray.get(keyword.execute(1, x=10), timeout=T) == 11
    assert ray.get(positional.execute([5, 6]), timeout=T) == 11   # one list: indexed
    assert ray.get(by_key.execute({"m1": 1, "m2": 2}), timeout=T) == 3
    assert ray.get(by_attr.execute(Data()), timeout=T) == 7


def test_actors_in_a_graph_are_made_once_per_execute(rt):
    with InputNode() as inp:
        m1 = Model.bind(1)
        m2 = Model.options(num_cpus=0).bind(2)
        out1 = m1.forward.bind(inp[0])
        out2 = m2.forward.bind(inp.x)
        dag = add.bind(out1, out2)
        # Calls on m1 reach the same actor, after those bound on m1 before
        # them (out1 too, as in Ray: measured there, 2).
        calls = m1.count.bind(m1.forward.bind(inp[0]))
    assert ray.get(dag.execute(1, x=2), timeout=T) == 5
    assert ray.get(calls.execute(1, x=2), timeout=T) == 2
    handle = m1.execute()
    assert ray.get(handle.forward.remote(7), timeout=T) == 7


def test_multiple_outputs_and_nodes_inside_lists(rt):
    with InputNode() as inp:
        a, b = double.bind(inp), add.bind(inp, 1)
        dag = MultiOutputNode([a, b, total.bind([a, b])])
    refs = dag.execute(4)
    assert isinstance(refs, list) and len(refs) == 3
    assert ray.get(refs, timeout=T) == [8, 5, 13]


def test_options_on_a_bound_function_and_method(rt):
    with InputNode() as inp:
        m = Model.bind(3)
        dag = add.options(num_cpus=0).bind(m.forward.options(num_returns=1).bind(inp), 1)
    assert ray.get(dag.execute(2), timeout=T) == 7


def test_a_missing_input_part_says_which(rt):
    with InputNode() as inp:
        dag = add.bind(inp[0], inp[1])
        keyword = add.bind(inp[0], inp.y)
    assert ray.get(dag.execute(1, 2), timeout=T) == 3
    with pytest.raises(IndexError, match="positional"):
        add.bind(inp[0], inp[5]).execute(1, 2)
    with pytest.raises(KeyError, match="'y'"):
        keyword.execute(1, x=2)


def test_calls_bound_on_one_class_node_run_before_later_ones(rt):
    # Ray's documented example: calls bound and not used still run, in order,
    # before a later call on the same class node (each execute, a new actor).
    a1, a2 = Model.bind(1), Model.bind(1)
    a1.forward.bind(2)
    a1.forward.bind(4)
    a2.forward.bind(6)
    dag = add.bind(a1.count.bind(), a2.count.bind())
    assert ray.get(dag.execute(), timeout=T) == 3      # 2 calls on a1, 1 on a2
    assert ray.get(dag.execute(), timeout=T) == 3      # fresh actors each time


@pytest.mark.local_only
def test_a_live_actors_method_binds_too(rt):
    a = Model.remote(10)
    with InputNode() as inp:
        dag = a.forward.bind(inp)
    assert [ray.get(dag.execute(x), timeout=T) for x in (1, 2)] == [10, 20]
    assert ray.get(a.count.remote(), timeout=T) == 2


@pytest.mark.local_only
def test_a_node_passed_to_a_task_is_refused_clearly(rt):
    node = double.bind(1)
    with pytest.raises(TypeError, match="execute"):
        ray.get(total.remote([node]), timeout=T)
    with pytest.raises(ValueError, match="No InputNode"):      # Ray's compile-time check
        node.experimental_compile()
