"""``ray.dag.input_node``'s names (Ray code imports them from here)."""
from .dag_node import DAGInputData, InputAttributeNode, InputNode

__all__ = ["DAGInputData", "InputAttributeNode", "InputNode"]
