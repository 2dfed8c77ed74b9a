"""Where the libraries above the public API plug into the core.

The core never imports ``ray_lite.dag`` (a layer above it): the DAG package
registers what the core needs of it when it is imported (``register_dag``).
A program may call ``f.bind(...)`` before it imports ``ray_lite.dag``, as a
Ray program calls it after ``import ray`` alone: ``dag()`` then imports the
package by the name below, the one place in the core that names it.
"""
import importlib

DAG_MODULE = "ray_lite.dag"

# The DAG package, once imported (its FunctionNode, ClassNode, ClassMethodNode).
_dag = None
# The types ``get`` reads as a Compiled Graph's results (none until
# ``ray_lite.dag`` is imported: no such result can exist before).
COMPILED_REFS = ()


def register_dag(module):
    """Called by ``ray_lite.dag`` when it is imported."""
    global _dag
    _dag = module


def register_compiled_ref(cls):
    """Called by ``ray_lite.dag.compiled_dag_node`` when it is imported."""
    global COMPILED_REFS
    COMPILED_REFS += (cls,)


def dag():
    """The DAG package (imported on first use)."""
    if _dag is None:
        importlib.import_module(DAG_MODULE)
    return _dag
