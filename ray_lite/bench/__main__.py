"""``python -m ray_lite.bench ...`` is ``ray-lite bench ...``."""
import sys

from . import main

if __name__ == "__main__":   # not when a spawned child re-imports the main module
    sys.exit(main())
