"""``inspect_serializability``: find what stops an object from being pickled.

ray_lite ships functions, classes and arguments with cloudpickle, so the
question asked is "does cloudpickle take it?"; when it does not, the object's
parts (a function's globals and closure, another object's members) are
tried in turn, down to ``depth`` levels, to name the part that fails.
"""
import inspect
import sys

import cloudpickle

from ray_lite import _ray
from ray_lite._private.process import backend as _backend

__all__ = ["inspect_serializability", "FailureTuple"]


class FailureTuple:
    """One object that could not be serialized.

    ``obj`` the object, ``name`` the variable (or member) it was found under,
    ``path`` the names from the inspected object down to it, ``parent`` the
    object that refers to it.
    """

    __slots__ = ("obj", "name", "path", "parent")

    def __init__(self, obj, path, parent):
        self.obj = obj
        self.path = tuple(path)
        self.name = self.path[-1] if self.path else None
        self.parent = parent

    def __repr__(self):
        path = " -> ".join("unknown" if p is None else str(p) for p in self.path)
        return (f"FailTuple({self.name if self.name is not None else 'unknown'} "
                f"[path={path}, obj={self.obj!r}, parent={self.parent!r}])")


class _Report:
    """Indented lines to ``print_file`` (stdout when None, as ``print`` does)."""

    def __init__(self, print_file):
        self.file = print_file
        self.level = 0

    def line(self, text):
        print("    " * self.level + text, file=self.file if self.file is not None
              else sys.stdout)


def _pickle_error(obj):
    from ray_lite._private.objects.refs import not_lending
    try:
        with not_lending():     # a probe: the refs inside are not passed on
            cloudpickle.dumps(obj)
        return None
    except Exception as exc:   # any failure of the pickler is an answer here
        return exc


def _parts(obj):
    """(name, part) pairs of ``obj`` worth trying when ``obj`` fails to pickle."""
    if inspect.isfunction(obj):
        try:
            scope = inspect.getclosurevars(obj)
        except (TypeError, ValueError):
            return []
        return list(scope.globals.items()) + list(scope.nonlocals.items())
    try:
        members = inspect.getmembers(obj)
    except Exception:   # a member whose getter raises: nothing more to look at
        return []
    functions = [(n, m) for n, m in members if inspect.isfunction(m)]
    others = [(n, m) for n, m in members
              if not (n.startswith("__") and n.endswith("__")) and not inspect.isbuiltin(m)
              and not inspect.isfunction(m)]
    return functions + others


def _inspect(obj, name, depth, parent, path, failures, report):
    """Whether ``obj`` pickles; adds what fails (the deepest part found) to ``failures``."""
    error = _pickle_error(obj)
    if error is None:
        return True
    report.line(f"!!! FAIL serialization: {error}")
    here = path + ((name,) if name is not None else ())
    if depth <= 0:
        failures.add(FailureTuple(obj, here, parent))
        return False
    found = False
    report.level += 1
    try:
        for part_name, part in _parts(obj):
            report.line(f"Serializing '{part_name}' {part!r}...")
            if not _inspect(part, part_name, depth - 1, obj, here, failures, report):
                found = True
                break   # the first culprit at each level, as Ray reports it
    finally:
        report.level -= 1
    if not found:
        report.line(f"WARNING: Did not find non-serializable object in {obj!r}. "
                    "This may be an oversight.")
        failures.add(FailureTuple(obj, here, parent))
    return False


def inspect_serializability(base_obj, name=None, depth=3, print_file=None):
    """``(serializable, failures)``: whether ``base_obj`` pickles, and if not
    the set of ``FailureTuple`` naming the parts that do not.

    The search goes ``depth`` levels into the object and prints what it
    tries to ``print_file`` (stdout by default).
    """
    if _backend.RAY:
        return _ray.util.UTIL["inspect_serializability"](base_obj, name=name, depth=depth,
                                                         print_file=print_file)
    report = _Report(print_file)
    title = f"Checking Serializability of {base_obj!r}"
    rule = "=" * min(len(title), 80)
    report.line(rule)
    report.line(title)
    report.line(rule)
    failures = set()
    ok = _inspect(base_obj, name, depth, None, (), failures, report)
    if not ok:
        report.line(rule)
        report.line("Variable: \n\n\t" + "\n\t".join(repr(f) for f in failures)
                    + "\n\nwas found to be non-serializable. There may be other "
                    "non-serializable variables that were not detected.")
        report.line("Consider removing these objects from the scope of the function or "
                    "class, or creating them inside it instead.")
        report.line(rule)
    return ok, failures
