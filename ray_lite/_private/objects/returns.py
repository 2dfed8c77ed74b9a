"""A call's fixed ``num_returns=N``: its result split into the N values its refs get."""

from ray_lite._lazy import lazy_module

from ..links import protocol as P
from ..process.errors import make_task_error, sendable_error, unpicklable_task_error

inspect = lazy_module("inspect", globals())


def split_returns(result, nret, name):
    """The ``nret`` values of ``result`` (a sequence, or a generator: see below)."""
    if nret == 0:
        return []
    if inspect.isgenerator(result):
        return _split_generator(result, nret, name)
    try:
        values = list(result)
    except TypeError:       # one object that is not a sequence
        values = [result]
    if len(values) != nret:
        raise ValueError(f"Task returned {len(values)} objects, but num_returns={nret}.")
    return values


def _split_generator(gen, nret, name):
    """A generator's ``num_returns=N`` values, as in Ray: each value it yields
    fills the next ref; if it raises (or stops) before the N-th, the refs it
    did not fill get that error; yields past the N-th are not taken."""
    values = []
    try:
        for value in gen:
            values.append(value)
            if len(values) == nret:
                gen.close()
                return values
        raise ValueError(f"Task returned {len(values)} objects, but num_returns={nret}.")
    except Exception as exc:   # noqa: BLE001 - the user's error, for the refs not filled
        if not values:
            raise
        err = sendable_error(make_task_error(name, exc), unpicklable_task_error(name))
    return values + [P.FailedReturn(err)] * (nret - len(values))
