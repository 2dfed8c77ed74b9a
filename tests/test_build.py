"""The package is built the way it should be."""
import importlib

import ray_lite._fast as fast
from ray_lite._fast import NO_EXTENSIONS

HOT_PATHS = ["broadcast", "codec", "ring", "stream_table"]


def test_compiled_twins_loaded_unless_disabled():
    # A wheel built with a compiler must run the compiled hot paths: a silent
    # fallback to Python would cost an order of magnitude unnoticed.
    if NO_EXTENSIONS:
        assert not fast.USING_EXTENSIONS
    else:
        assert fast.USING_EXTENSIONS, {
            name: importlib.import_module(f"ray_lite._fast.{name}").COMPILED for name in HOT_PATHS
        }


def test_twins_export_the_same_names():
    for name in HOT_PATHS:
        py = importlib.import_module(f"ray_lite._fast._{name}_py")
        public = {n for n in getattr(py, "__all__", []) }
        assert public, f"_{name}_py must declare __all__"
        if not NO_EXTENSIONS:
            c = importlib.import_module(f"ray_lite._fast._{name}_c")
            missing = {n for n in public if not hasattr(c, n)}
            assert not missing, f"_{name}_c lacks {sorted(missing)}"
