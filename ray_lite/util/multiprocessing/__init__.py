"""``multiprocessing.Pool``'s API on ray_lite actors (Ray's ``ray.util.multiprocessing``)."""
from multiprocessing import JoinableQueue, TimeoutError   # (Ray's module has both)

from ray_lite.util.multiprocessing.pool import AsyncResult, IMapIterator, Pool

__all__ = ["Pool", "TimeoutError", "JoinableQueue", "AsyncResult", "IMapIterator"]
