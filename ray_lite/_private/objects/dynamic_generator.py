"""``num_returns="dynamic"`` (Ray's older generator tasks, deprecated there in
favour of ``"streaming"`` and still supported): the call returns one ref,
ready when the generator has ended, whose value is a
``DynamicObjectRefGenerator`` of the refs of every item it yielded.

It runs as a stream without back-pressure; when the stream ends, the items
already reported are taken from its table into the generator.  As in Ray,
an error the generator raised is the last of those refs (the items before
it stay readable), while a failure of the call itself (its worker crashed,
its actor died, it was cancelled) is the error of the ref the call returned.
"""
from ray_lite._fast.stream_table import NOT_READY
from ray_lite.exceptions import RayActorError, RayTaskError, TaskCancelledError

from ..process.backend import AlsoRay
from .refs import ObjectRef, _Entry

# The ``nret`` of such a call (its messages carry it; a stream's is not read).
DYNAMIC = -1


class DynamicObjectRefGenerator(metaclass=AlsoRay):
    """The refs of a dynamic generator task's items, in order: iterating
    takes them (``len`` is how many are left), as Ray's does."""

    def __init__(self, refs):
        self._refs = list(refs)
        self._next = 0

    def __iter__(self):
        while self._next < len(self._refs):
            ref = self._refs[self._next]
            self._next += 1
            yield ref

    def __len__(self):
        return len(self._refs) - self._next

    def __reduce__(self):
        return DynamicObjectRefGenerator, (self._refs[self._next:],)

    def __repr__(self):
        return f"DynamicObjectRefGenerator({len(self)} refs)"


def _failed_call(err):
    """Whether ``err`` ended the call itself rather than came from its code."""
    return not isinstance(err, RayTaskError) or isinstance(err, (TaskCancelledError,
                                                                 RayActorError))


class DynamicEntry(_Entry):
    """The entry of the ref a dynamic call returns; ``items``, the call's
    stream generator until it ends, is what ``cancel`` of that ref cancels
    (and what keeps the items: dropping it would drop them)."""

    __slots__ = ("items",)

    def __init__(self, items):
        _Entry.__init__(self)
        self.items = items


def dynamic_result(node, s, items):
    """The ref a dynamic call returns, for its stream ``s`` (whose generator
    is ``items``)."""
    outer = DynamicEntry(items)

    def finish(completed):
        refs = []
        table = s.table
        while table is not None:
            try:
                ref = table.try_next()
            except StopIteration:
                break
            if ref is NOT_READY:
                break
            refs.append(ref)
        err = completed.error
        if err is not None and _failed_call(err):
            outer.set_error(err)
        else:
            outer.set_value(DynamicObjectRefGenerator(refs))
        outer.items = None

    s.completed.add_callback(finish)
    return ObjectRef(node.new_oid(), node.id, outer)
