"""Starting a Python process that imports the same ray_lite as its parent.

``python -c CODE`` puts the current folder first on ``sys.path`` (``python
FILE`` the file's folder), so a child started from a checkout would import
the checkout's ``ray_lite/`` -- possibly uncompiled, i.e. the pure-Python
twins -- while its parent runs the installed wheel.  ``PYTHONSAFEPATH`` and
``-P`` would help, but only on Python 3.11+.  :func:`python_argv` instead
makes a child load the package ``ray_lite`` from the parent's own package
directory before anything else imports it; everything else (the user's
modules) still resolves through the ``sys.path`` given, as in the parent.

A child whose hot paths then run the pure-Python twins while the parent's
are compiled says so on standard error (:func:`check_twins`), so a slow
benchmark or server is not a mystery.
"""
import os
import sys


#: Folder of the parent's ``ray_lite`` package, which its children import.
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The child's first statements.  The package is loaded from a fixed location
# (spec_from_file_location) rather than by putting its parent folder first on
# sys.path, which would also change where every other module comes from.
_PRELUDE = """import sys
sys.path[:] = {path!r}
import importlib.util as _u
_s = _u.spec_from_file_location("ray_lite", {init!r}, submodule_search_locations=[{pkg!r}])
_m = sys.modules["ray_lite"] = _u.module_from_spec(_s)
_s.loader.exec_module(_m)
del _u, _s, _m
from ray_lite._private.process.boot import check_twins
check_twins({process!r}, {parent_compiled!r})
"""


def _parent_compiled():
    from ray_lite._fast import USING_EXTENSIONS
    return USING_EXTENSIONS


def python_code(entry, process, sys_path=None):
    """Source for ``python -c``: pin ray_lite, set ``sys.path`` (default: this
    process's), warn if the twins differ from ours, then run ``entry``."""
    path = list(sys.path if sys_path is None else sys_path)
    return _PRELUDE.format(path=path, init=os.path.join(PACKAGE_DIR, "__init__.py"),
                           pkg=PACKAGE_DIR, process=process,
                           parent_compiled=_parent_compiled()) + entry


def python_argv(entry, process, sys_path=None, python=None):
    """``[python, "-c", python_code(...)]`` (``python``: default this interpreter)."""
    return [python or sys.executable, "-c", python_code(entry, process, sys_path)]


def twins_reason():
    """Why this process runs pure-Python twins, or None when all are compiled."""
    from ray_lite import _fast
    if _fast.USING_EXTENSIONS:
        return None
    if _fast.NO_EXTENSIONS:
        return "RAY_LITE_NO_EXTENSIONS=1 in its environment"
    absent = [name for name in _fast.HOT_PATHS
              if not getattr(_fast, name).COMPILED]
    return (f"no compiled twin of {', '.join(absent)} in {os.path.join(PACKAGE_DIR, '_fast')} "
            f"for {sys.implementation.cache_tag}")


def check_twins(process, parent_compiled):
    """Say on stderr, in one line, that this child runs the pure-Python twins
    while its parent runs the compiled ones (and why)."""
    if not parent_compiled:
        return
    reason = twins_reason()
    if reason is not None:
        sys.stderr.write(f"ray_lite: the {process} (pid {os.getpid()}) runs the pure-Python "
                         f"hot paths while its parent's are compiled: {reason}\n")
        sys.stderr.flush()
