"""``as_completed`` and ``map_unordered``: results as they become ready."""
import ray_lite
from ray_lite import _ray
from ray_lite._private.process import backend as _backend

__all__ = ["as_completed", "map_unordered"]

DEFAULT_CHUNK_SIZE = 10
DEFAULT_BACKPRESSURE_SIZE = 100


def _check(chunk_size, wait_kwargs):
    if chunk_size < 1:
        raise ValueError("`chunk_size` must be >= 1")
    if "num_returns" in wait_kwargs:
        raise ValueError("Use the `chunk_size` argument instead of `num_returns`.")


def _next_batch(refs, chunk_size, yield_obj_refs, wait_kwargs):
    """The first ready refs (up to ``chunk_size``, as ``wait`` picks them), as
    values unless ``yield_obj_refs``; and the refs still pending."""
    ready, pending = ray_lite.wait(refs, num_returns=min(chunk_size, len(refs)), **wait_kwargs)
    return (ready if yield_obj_refs else ray_lite.get(ready)), pending


def as_completed(refs, *, chunk_size=DEFAULT_CHUNK_SIZE, yield_obj_refs=False, **kwargs):
    """Yield the results of ``refs`` as batches of ``chunk_size`` become ready.

    No order is promised (within a batch, submission order).  ``kwargs``
    go to ``wait`` (``timeout``, ``fetch_local``); ``yield_obj_refs=True``
    yields the refs instead of their values.
    """
    if _backend.RAY:
        return _ray.util.UTIL["as_completed"](refs, chunk_size=chunk_size,
                                              yield_obj_refs=yield_obj_refs, **kwargs)
    _check(chunk_size, kwargs)
    return _as_completed(list(refs), chunk_size, yield_obj_refs, kwargs)


def _as_completed(refs, chunk_size, yield_obj_refs, wait_kwargs):
    while refs:
        batch, refs = _next_batch(refs, chunk_size, yield_obj_refs, wait_kwargs)
        yield from batch


def map_unordered(fn, items, *, backpressure_size=DEFAULT_BACKPRESSURE_SIZE,
                  chunk_size=DEFAULT_CHUNK_SIZE, yield_obj_refs=False, **kwargs):
    """Yield ``fn.remote(item)``'s results for each of ``items``, as they complete.

    At most ``backpressure_size`` calls are in flight (``None``: no limit);
    past it, the iterator waits for ``chunk_size`` of them before submitting
    more.  ``kwargs`` go to ``wait``.
    """
    if _backend.RAY:
        return _ray.util.UTIL["map_unordered"](fn, items, backpressure_size=backpressure_size,
                                               chunk_size=chunk_size,
                                               yield_obj_refs=yield_obj_refs, **kwargs)
    if backpressure_size is None:
        backpressure_size = float("inf")
    elif backpressure_size <= 0:
        raise ValueError("backpressure_size must be positive.")
    _check(chunk_size, kwargs)
    return _map_unordered(fn, items, backpressure_size, chunk_size, yield_obj_refs, kwargs)


def _map_unordered(fn, items, backpressure_size, chunk_size, yield_obj_refs, wait_kwargs):
    refs = []
    for item in items:
        refs.append(fn.remote(item))
        if len(refs) >= backpressure_size:
            batch, refs = _next_batch(refs, chunk_size, yield_obj_refs, wait_kwargs)
            yield from batch
    yield from _as_completed(refs, chunk_size, yield_obj_refs, wait_kwargs)
