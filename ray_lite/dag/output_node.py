"""``ray.dag.output_node``'s names (Ray code imports them from here)."""
from .dag_node import MultiOutputNode

__all__ = ["MultiOutputNode"]
