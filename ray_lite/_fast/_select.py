"""Picks the compiled or the pure-Python twin of a hot-path module."""
import importlib

from .._config import NO_EXTENSIONS


def load_twin(name):
    """Return ``(module, compiled)`` for ``ray_lite._fast._<name>_c`` or its
    ``_<name>_py`` fallback.

    A compiled twin that fails to import for a reason other than being absent
    is an error worth seeing, so only ``ModuleNotFoundError`` for that very
    module falls back silently.
    """
    if not NO_EXTENSIONS:
        c_name = f"ray_lite._fast._{name}_c"
        try:
            return importlib.import_module(c_name), True
        except ModuleNotFoundError as exc:
            if exc.name != c_name:
                raise
    return importlib.import_module(f"ray_lite._fast._{name}_py"), False
