"""Ray's DAG API (``ray.dag``): build a graph of calls with ``.bind`` and run
it with ``execute``.

``f.bind(...)`` on a remote function, ``C.bind(...)`` on an actor class and
``node.method.bind(...)`` on what that returns (or ``handle.method.bind``
on a live actor's handle) call nothing: each returns a node holding its
arguments, which may be other nodes, and ``InputNode()``, the input that
every ``execute(...)`` gives.  ``node.execute(*args, **kwargs)`` runs the
graph below ``node`` as Ray does, in dependency order: a function node
becomes a task (its ``ObjectRef``), a class node an actor (its handle), a
method node an actor call; a node's result reaches the nodes that take it
as the ``ObjectRef`` it is (a task resolves a top-level ref argument before
it runs).  Within one ``execute`` each node runs once, however many nodes
take it: a class node shared by two method nodes is one actor.

Nodes are found in the arguments at the top level and inside lists,
tuples and dicts (Ray also looks inside other objects).
``experimental_compile()`` makes Ray's Compiled Graph of a graph of actor
calls (``compiled_dag_node``).
"""
import sys

from ray_lite._private.api import plugins as _plugins

from . import dag_node as _dag_node
from .compiled_dag_node import build_compiled_dag as _build_compiled_dag
from .context import DAGContext
from .dag_node import (ClassMethodNode, ClassNode, DAGInputData, DAGNode, FunctionNode,
                       InputAttributeNode, InputNode, MultiOutputNode)

__all__ = ["DAGNode", "FunctionNode", "ClassNode", "ClassMethodNode", "InputNode",
           "InputAttributeNode", "MultiOutputNode", "DAGInputData", "DAGContext"]

_dag_node.build_compiled_dag = _build_compiled_dag
# The core builds nodes for ``.bind`` through this hook, never by importing
# this package (a layer above the core).
_plugins.register_dag(sys.modules[__name__])
