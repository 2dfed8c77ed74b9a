"""The core's structure: its import graph, its module sizes, its shared helpers."""
import ast
import os
import pathlib
import subprocess
import sys

import pytest

import ray_lite
from ray_lite._fast import ring

PKG = pathlib.Path(ray_lite.__file__).parent
PRIVATE = PKG / "_private"
# The zygote imports the worker before it forks, on purpose: each worker then
# starts with it loaded (see zygote.py).  Nothing imports the zygote but the driver.
ALLOWED_BACK_EDGES = {("zygote", "worker")}


def _private_imports(path):
    """The ``_private`` modules ``path`` imports, at module level or in a function."""
    names = {p.stem for p in PRIVATE.glob("*.py")} - {"__init__"}
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:
                mod = node.module
            elif node.module and node.module.startswith("ray_lite._private"):
                mod = node.module[len("ray_lite._private"):].lstrip(".") or None
            else:
                continue
            if mod is None:         # from . import a, b
                found.update(a.name for a in node.names)
            else:
                found.add(mod.split(".")[0])
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("ray_lite._private."):
                    found.add(a.name.split(".")[2])
    return found & names


def _import_graph():
    return {p.stem: _private_imports(p) for p in PRIVATE.glob("*.py") if p.stem != "__init__"}


def _find_cycle(graph):
    state = {}
    stack = []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in sorted(graph[m]):
            if (m, n) in ALLOWED_BACK_EDGES:
                continue
            if state.get(n) == "open":
                return stack[stack.index(n):] + [n]
            if n not in state:
                cycle = visit(n)
                if cycle:
                    return cycle
        stack.pop()
        state[m] = "done"
        return None

    for m in sorted(graph):
        if m not in state:
            cycle = visit(m)
            if cycle:
                return cycle
    return None


def test_the_private_modules_import_each_other_without_a_cycle():
    graph = _import_graph()
    assert "node" in graph and "protocol" in graph and graph["state"] == set()
    assert _find_cycle(graph) is None, " -> ".join(_find_cycle(graph))


def test_the_cycle_check_finds_a_cycle():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"zygote": {"worker"}, "worker": {"zygote"}}) is None


def test_remote_and_protocol_do_not_need_the_driver():
    graph = _import_graph()
    assert "driver" not in graph["remote"]
    assert graph["protocol"] == set()


def test_each_private_module_imports_first_in_a_fresh_interpreter():
    # Whatever module comes first, its imports must resolve (a cycle at
    # module level fails with a partially initialised module).
    mods = sorted(_import_graph())
    code = ("import importlib, sys\n"
            "for m in sys.argv[1:]:\n"
            "    for k in [k for k in sys.modules if k.startswith('ray_lite')]:\n"
            "        del sys.modules[k]\n"
            "    importlib.import_module('ray_lite._private.' + m)\n")
    subprocess.run([sys.executable, "-c", code, *mods], check=True, timeout=120)


@pytest.mark.parametrize("folder", ["_private", "executor"])
def test_no_module_is_over_700_lines(folder):
    over = {p.name: n for p in (PKG / folder).glob("*.py")
            if (n := len(p.read_text().splitlines())) > 700}
    assert not over


# ---------------------------------------------- the shared multi-ring wait

def _pair(ring_impl):
    consumer = ring_impl.ShmRing.create(1 << 12, side="consumer")
    producer = ring_impl.ShmRing.attach(consumer.name, side="producer")
    return consumer, producer


def test_wait_rings_or_fds_reports_a_descriptor_that_fired(ring_impl):
    consumer, producer = _pair(ring_impl)
    r, w = os.pipe()
    try:
        os.write(w, b"x")
        assert ring.wait_rings_or_fds([consumer], [r], timeout=10) == [r]
        assert consumer.arm_fd()        # the wait disarmed the ring on its way out
        consumer.clear_fd()
    finally:
        os.close(r)
        os.close(w)
        producer.close()
        consumer.close()


def test_wait_rings_or_fds_ends_on_a_message_and_on_time(ring_impl):
    consumer, producer = _pair(ring_impl)
    r, w = os.pipe()
    try:
        assert ring.wait_rings_or_fds([consumer], [r], timeout=0.01) == []
        producer.put("hello")
        assert ring.wait_rings_or_fds([consumer], [r], timeout=10, spin_s=0.0) == []
        assert consumer.get_nowait() == "hello"
    finally:
        os.close(r)
        os.close(w)
        producer.close()
        consumer.close()


def test_wait_any_still_returns_the_ready_rings(ring_impl):
    a, pa = _pair(ring_impl)
    b, pb = _pair(ring_impl)
    try:
        assert ring.wait_any([a, b], timeout=0.01) == []
        pb.put(1)
        assert ring.wait_any([a, b], timeout=10) == [b]
    finally:
        for x in (pa, pb, a, b):
            x.close()
