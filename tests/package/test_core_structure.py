"""The core's structure: its import graph, its module sizes, its shared helpers."""
import ast
import os
import pathlib
import re
import subprocess
import sys

import pytest

import ray_lite
from ray_lite._fast import ring

PKG = pathlib.Path(ray_lite.__file__).parent
PRIVATE = PKG / "_private"
# The checkout's manual (the tests may run against an installed ray_lite).
ARCHITECTURE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


def _architecture_page():
    if not ARCHITECTURE.is_file():
        pytest.skip("no docs/architecture.md beside the tests (installed-only run)")
    return ARCHITECTURE.read_text()


def _private_modules():
    """``package.module`` of every module under ``_private``."""
    return sorted(f"{p.parent.name}.{p.stem}" for p in PRIVATE.glob("*/*.py")
                  if p.stem != "__init__")


def test_private_is_a_few_packages_each_saying_what_it_owns():
    packages = sorted(p.parent.name for p in PRIVATE.glob("*/__init__.py"))
    assert [p.name for p in PRIVATE.glob("*.py")] == ["__init__.py"]
    assert 5 <= len(packages) <= 10
    for name in packages:
        doc = ast.get_docstring(ast.parse((PRIVATE / name / "__init__.py").read_text()))
        assert doc and "May import" in doc, name


def test_each_private_module_imports_first_in_a_fresh_interpreter():
    # Whatever module comes first, its imports must resolve (a cycle at
    # module level fails with a partially initialised module).
    code = ("import importlib, sys\n"
            "for m in sys.argv[1:]:\n"
            "    for k in [k for k in sys.modules if k.startswith('ray_lite')]:\n"
            "        del sys.modules[k]\n"
            "    importlib.import_module('ray_lite._private.' + m)\n")
    subprocess.run([sys.executable, "-c", code, *_private_modules()], check=True, timeout=120)


@pytest.mark.parametrize("folder", ["_private", "executor"])
def test_no_module_is_over_700_lines(folder):
    over = {str(p): n for p in (PKG / folder).rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 700}
    assert not over


# ------------------------------------------- messages and where they are handled

# Every message tag (one character, ``protocol.py``), by its name there.
def _message_tags():
    from ray_lite._private.links import protocol as P
    return {name: value for name, value in vars(P).items()
            if name.isupper() and isinstance(value, str) and len(value) == 1}


def test_every_message_has_a_row_in_the_architecture_page():
    page = _architecture_page()
    tags = _message_tags()
    assert {"TASK", "METHOD", "RESULT", "ITEM", "END", "REQUEST"} <= set(tags)
    assert [name for name in tags if f"| `{name}` |" not in page] == []


def test_the_driver_handles_the_messages_its_peers_send_it(rt):
    if rt is None:
        pytest.skip("the local backend's driver")
    from ray_lite._private.links import protocol as P
    handled = set(rt.handlers)
    # What workers and actors send to their owner or to the driver.
    for tag in (P.RESULT, P.ITEM, P.END, P.ACK, P.FETCH, P.FETCHED, P.RELEASE, P.REQUEST,
                P.REPLY, P.ATTACH, P.RESTARTED):
        assert tag in handled, tag
    # What only a worker or an actor receives.
    assert not handled & {P.TASK, P.METHOD, P.CANCEL, P.EXIT}
    # The parts the driver holds, each with its own state.
    assert rt.service.node is rt
    for part in ("placement", "actor_restarts", "owners", "retries", "max_calls"):
        assert getattr(rt, part).driver is rt, part


def test_the_node_holds_its_parts_and_each_handles_its_messages(rt):
    if rt is None:
        pytest.skip("the local backend's driver")
    from ray_lite._private.links import protocol as P
    from ray_lite._private.links.drive import DrivingMixin
    from ray_lite._private.node.node import Node
    assert Node.__bases__ == (DrivingMixin,)
    for part in ("service", "objects", "streams", "bridges"):
        assert getattr(rt, part).node is rt, part
    # Each part's messages go straight to its own methods ...
    for tag, part in ((P.FETCH, rt.objects), (P.FETCHED, rt.objects),
                      (P.RELEASE, rt.objects)):
        assert rt.handlers[tag].__self__ is part, tag
    # ... but a stream's, which the driver may forward to a nested task's owner first.
    for tag in (P.ITEM, P.END, P.ACK):
        assert rt.handlers[tag].__self__ is rt, tag
    # The names the compiled task runner reads on the node are the parts' own.
    assert rt._bridges is rt.bridges.by_loop
    assert rt._send_releases == rt.objects.send_releases


def test_the_handlers_the_architecture_page_names_exist():
    from ray_lite._fast.pool_book import PoolBook
    from ray_lite._fast.task_runner import TaskRunner
    from ray_lite._private.node.driver import DriverNode
    from ray_lite._private.node.node import Node
    from ray_lite._private.actors.async_actor import AsyncActor
    from ray_lite._private.actors.held_calls import HeldCalls
    from ray_lite._private.node.worker import WorkerNode
    from ray_lite._private.node.worker_streams import Generators
    from ray_lite._private.objects.ownership import Objects
    from ray_lite._private.objects.streams import Streams
    classes = {c.__name__: c for c in (Node, DriverNode, WorkerNode, Objects, Streams,
                                       PoolBook, TaskRunner, AsyncActor, Generators,
                                       HeldCalls)}
    page = _architecture_page()
    rows = [line for line in page.splitlines()
            if line.startswith("| `") and line.split("|")[1].strip().strip("`").isupper()]
    named = [name for row in rows for name in re.findall(r"`(\w+)\.(\w+)`", row)]
    assert ("Streams", "on_item") in named and ("Objects", "on_fetch") in named
    for cls, attr in named:
        if cls in classes:
            assert hasattr(classes[cls], attr), f"{cls}.{attr}"


def _worker_structure():
    """What the worker this runs in holds (run inside an actor's method)."""
    from ray_lite._fast.task_runner import TaskRunner
    from ray_lite._private.links import protocol as P
    from ray_lite._private.node.node import Node
    from ray_lite._private.process import state
    node = state.node
    on_method = node.handlers[P.METHOD]
    return {"bases": type(node).__bases__ == (TaskRunner, Node),
            "parts": [p for p in ("held_calls", "generators", "async_actor")
                      if getattr(node, p).node is not node],
            "ack": node.handlers[P.ACK].__self__ is node.generators,
            "held": node._held is node.held_calls.by_peer,
            "method": f"{type(on_method.__self__).__name__}.{on_method.__name__}"}


@ray_lite.remote
class _SyncLooks:
    def look(self):
        return _worker_structure()


@ray_lite.remote(max_concurrency=4)
class _ThreadedLooks:
    def look(self):
        return _worker_structure()


@ray_lite.remote
class _AsyncLooks:
    async def look(self):
        return _worker_structure()


def test_a_worker_holds_its_parts_and_each_handles_its_messages(rt):
    if rt is None:
        pytest.skip("the local backend's workers")
    expected = {"bases": True, "parts": [], "ack": True, "held": True}
    for cls, method in ((_SyncLooks, "WorkerNode._on_method"),
                        (_ThreadedLooks, "WorkerNode._on_method_threaded"),
                        (_AsyncLooks, "AsyncActor.on_method")):
        assert ray_lite.get(cls.remote().look.remote(), timeout=60) == \
            dict(expected, method=method)


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
