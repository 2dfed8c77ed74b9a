"""Read-only numpy arrays for the core's messages, as Ray gives them.

Ray hands out every numpy array that crossed a process, or went through
``put``, as a read-only view of its object store copy: writing to what
``get`` returned, or to an array a task was passed, raises.  ray_lite keeps
small arrays in its frames instead, where pickle would rebuild them
writable, so a program that writes into one would run here and break on
Ray.  The core's encodings (``readonly_arrays=True``: the links between
processes, ``put``) therefore pickle exact ``numpy.ndarray``\\ s through
``readonly_array``, which rebuilds the array as numpy does and then makes it
read-only; the array's data still travels as a pickle-5 buffer (out of band
when large, so no copy is added).

Other users of the codec (the vLLM ``MessageQueue``, the executor's reply
ring) keep plain pickle semantics: their arrays stay writable, as with
vLLM's own queue.  Shared by both codec twins: the pickler is Python code
either way.
"""
import copyreg
import io
import sys

__all__ = ["dumps_readonly_arrays", "readonly_array"]


def readonly_array(rebuild, args, state):
    """The array numpy's own reduction ``(rebuild, args, state)`` makes, read-only."""
    array = rebuild(*args)
    if state is not None:
        array.__setstate__(state)
    array.flags.writeable = False
    return array


_pickler_class = None


def _make_pickler_class():
    import cloudpickle

    class ReadonlyArrayPickler(cloudpickle.Pickler):
        def reducer_override(self, obj):
            # Only numpy's own arrays of plain data: a subclass has its own
            # reduction, an object array holds Python objects (not a
            # buffer, and Ray gives those back writable), and a serializer
            # the user registered for ndarray (register_serializer) wins.
            numpy = sys.modules.get("numpy")
            if numpy is not None and type(obj) is numpy.ndarray and \
                    not obj.dtype.hasobject and numpy.ndarray not in copyreg.dispatch_table:
                reduced = obj.__reduce_ex__(5)
                return readonly_array, (reduced[0], reduced[1],
                                        reduced[2] if len(reduced) > 2 else None)
            return super().reducer_override(obj)

    return ReadonlyArrayPickler


def dumps_readonly_arrays(obj, protocol=None, buffer_callback=None):
    """``cloudpickle.dumps`` whose numpy arrays load read-only (see the module)."""
    global _pickler_class
    if _pickler_class is None:
        _pickler_class = _make_pickler_class()
    with io.BytesIO() as file:
        _pickler_class(file, protocol=protocol, buffer_callback=buffer_callback).dump(obj)
        return file.getvalue()
