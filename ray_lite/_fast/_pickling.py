"""The pickle inside the codec's ``EXT_PICKLE``: the standard pickler where it
is exact, cloudpickle where a reader needs a class or function by value.

The standard pickler (C code) saves a class or a function as a reference,
its module and name, which a reader imports.  That reference is all a
reader needs when the module is an importable one; cloudpickle makes the
same choice there, at about three times the cost (its hooks run in Python
for every object).  The reference breaks, or cannot even be written, for
what cloudpickle sends by value: anything defined in ``__main__`` (a
reader's ``__main__`` is another script), lambdas, closures and local
classes, classes and functions whose module is not in ``sys.modules``, and
the modules registered with ``cloudpickle.register_pickle_by_value``.

So ``dumps`` pickles with a standard pickler whose ``reducer_override``
looks at each class and function on the way and gives up on the first one
that must travel by value (or when the pickle names ``__main__`` at all);
it then pickles the whole object again with cloudpickle.  An object the
standard pickler cannot pickle at all is tried with cloudpickle too, whose
error is the one reported.  An exact numpy array of plain data (the
commonest pickled value) needs no look: numpy's own reduction names only
numpy's functions, so it goes straight to ``pickle.dumps``.  A reader gets
the same object as from cloudpickle alone; only the bytes differ.

Shared by both codec twins: the picklers are Python and C code either way.
"""
import copyreg
import io
import pickle
import sys
from types import FunctionType

from ._arrays import dumps_readonly_arrays as _cloudpickle_readonly_arrays
from ._arrays import readonly_array

__all__ = ["dumps"]

_std_dumps = pickle.dumps
_cloudpickle_dumps = None


def _cloudpickle():
    # Imported on first use: cloudpickle costs start-up time and memory that a
    # process exchanging only plain values and arrays never needs.
    global _cloudpickle_dumps
    if _cloudpickle_dumps is None:
        import cloudpickle
        _cloudpickle_dumps = cloudpickle.dumps
    return _cloudpickle_dumps


def _by_value_registered():
    # Nothing can be registered before cloudpickle is imported.
    cloudpickle = sys.modules.get("cloudpickle")
    return cloudpickle is not None and bool(cloudpickle.list_registry_pickle_by_value())


class _NeedsCloudpickle(Exception):
    """A class or function the standard pickler would save as a reference a reader cannot follow."""


def _by_reference_is_safe(obj):
    """Whether a reader can import ``obj`` (a class or a Python function) by its names."""
    module_name = getattr(obj, "__module__", None)
    if module_name is None or module_name == "__main__":
        return False
    if "<" in getattr(obj, "__qualname__", "<"):   # <lambda>, <locals>
        return False
    # As cloudpickle assumes: a module in sys.modules can be imported by a reader.
    return module_name in sys.modules


class _ReferencePickler(pickle.Pickler):
    """The standard pickler, refusing classes and functions that must travel by value."""

    readonly_arrays = False

    def reducer_override(self, obj):
        if type(obj) is FunctionType or isinstance(obj, type):
            if not _by_reference_is_safe(obj):
                raise _NeedsCloudpickle
        elif self.readonly_arrays:
            reduced = _readonly_reduction(obj)
            if reduced is not None:
                return reduced
        return NotImplemented


class _ReadonlyReferencePickler(_ReferencePickler):
    readonly_arrays = True


def _plain_array(obj):
    """Whether ``obj`` is an exact numpy array of plain data pickled by numpy's own reduction."""
    numpy = sys.modules.get("numpy")
    return numpy is not None and type(obj) is numpy.ndarray and not obj.dtype.hasobject \
        and obj.dtype.metadata is None and numpy.ndarray not in copyreg.dispatch_table


def _readonly_reduction(obj):
    # The same reduction as _arrays' cloudpickle pickler: numpy's own, rebuilt
    # read-only by readonly_array.
    if not _plain_array(obj):
        return None
    reduced = obj.__reduce_ex__(5)
    return readonly_array, (reduced[0], reduced[1], reduced[2] if len(reduced) > 2 else None)


def dumps(obj, readonly_arrays, buffer_callback, buffers):
    """A protocol-5 pickle of ``obj`` (see the module).

    ``buffers`` is the list ``buffer_callback`` appends to (or None): an
    attempt given up leaves no buffer of its own in it.
    """
    if not _by_value_registered():
        first = 0 if buffers is None else len(buffers)
        if not readonly_arrays and _plain_array(obj):
            return _std_dumps(obj, protocol=5, buffer_callback=buffer_callback)
        try:
            with io.BytesIO() as file:
                pickler_class = _ReadonlyReferencePickler if readonly_arrays else _ReferencePickler
                pickler_class(file, protocol=5, buffer_callback=buffer_callback).dump(obj)
                payload = file.getvalue()
            # An object whose reduction is a plain name (a singleton) is
            # saved by reference without passing reducer_override: the
            # name of __main__ in the pickle gives it away.
            if b"__main__" not in payload:
                return payload
        except Exception:
            pass
        if buffers is not None:
            del buffers[first:]
    if readonly_arrays:
        return _cloudpickle_readonly_arrays(obj, protocol=5, buffer_callback=buffer_callback)
    return _cloudpickle()(obj, protocol=5, buffer_callback=buffer_callback)
