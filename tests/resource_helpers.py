"""Remote functions and classes the resource and placement tests share."""
import os

import ray_lite as ray

T = 30           # bound of every wait that should succeed
NOT_YET = 0.3    # how long a task that must wait is seen still waiting


@ray.remote
def one():
    return 1


@ray.remote
class Holder:
    """An actor that holds what its options ask for while it lives."""

    def ping(self):
        return os.getpid()


def scheduled(resources):
    """A scheduler's resource dict without the machine's ``memory`` (which
    every runtime has, sized by the machine)."""
    return {k: v for k, v in resources.items() if k != "memory"}
