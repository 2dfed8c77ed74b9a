"""``ray.dag.output_node``'s names (Ray code imports them from here)."""
from . import MultiOutputNode

__all__ = ["MultiOutputNode"]
