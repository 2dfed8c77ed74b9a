"""Starting a local Ray for the tests marked ``ray``."""
import sys

import pytest


def start_local_ray(init, attempts=2):
    """Call ``init()`` (which starts a local Ray); on a loaded machine Ray's
    own start-up wait can run out, so a failed start is cleaned up and
    tried once more."""
    ray = pytest.importorskip("ray")
    for attempt in range(attempts):
        try:
            return init()
        except Exception:   # noqa: BLE001 - Ray's start-up error, whatever its type
            ray.shutdown()
            if attempt == attempts - 1:
                raise


def ship_by_value(module_name, picklers):
    """Test modules are not importable in Ray's workers: their classes travel
    by value.  Returns the function that undoes it."""
    module = sys.modules[module_name]
    for pickler in picklers:
        pickler.register_pickle_by_value(module)

    def undo():
        for pickler in picklers:
            try:
                pickler.unregister_pickle_by_value(module)
            except ValueError:
                pass    # unregistered already (Ray's DeploymentActorConfig does it)
    return undo
