"""``ray.dag.input_node``'s names (Ray code imports them from here)."""
from . import DAGInputData, InputAttributeNode, InputNode

__all__ = ["DAGInputData", "InputAttributeNode", "InputNode"]
