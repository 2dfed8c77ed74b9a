"""The driver's pool book (compiled twin ``_pool_book_c``, fallback
``_pool_book_py``): the per-task steps of the driver's common task.

``PLAIN_TYPES``
    The argument types that need no look before they travel: int, float,
    str, bytes, bool, None (exactly these types).
``plain_call(args, kwargs, arity)``
    True when a call is the driver's common task's: no keyword arguments,
    as many positional ones as ``arity`` (``(lo, hi, ...)`` or None) allows,
    each exactly an int, float, str, bytes, bool or None.
``PoolWorker(wid, pid)``
    A pool worker as the driver schedules onto it: ``id``, ``pid``,
    ``shipped`` (fn ids it loaded), ``task`` (the spec it runs or None),
    ``blocked`` (lends its CPU while blocked in get), ``calls``.
``PoolBook``
    Held by ``DriverNode`` (``driver.book``).  ``submit_plain(oid, fn_id, blob, args, kwargs,
    bp, retries, name, target)`` sends the task to an idle worker and books
    it there, or queues it; ``_task_finished(w, oid)`` makes ``w`` idle again
    at the result of ``oid``.  Both under the ``_sched`` lock, on the fields
    the book owns and the driver's parts read and write: ``idle``,
    ``queue``, ``nested_queue``, ``placed_queue``, ``res_waiters``, ``busy``,
    ``cpu_cap``; ``links``, ``pending``, ``inflight``, ``pool`` and
    ``forward`` are the node's tables, ``task_op`` and ``spec_type`` the
    protocol's TASK and TaskSpec.
    ``_on_pool_result(peer, msg)`` is the driver's handler of a RESULT: the
    common one (a value for a waiting ``entry_type`` entry of ``pending``,
    no nested task's result to ``forward``, a value of one of ``kept_types``) is
    set here, ``inflight`` updated and its worker in ``pool`` freed.
    What is not the common case goes to the callables the driver gives the
    book once, bound methods of its parts: ``enqueue``, ``unsent``,
    ``free_worker``, ``dispatch_queued`` (task dispatch), ``used_up``
    (max_calls), ``resources_freed`` (the resource ledger), ``on_result``
    (the driver's general RESULT handler).
"""
from ._pool_book_py import PLAIN_TYPES
from ._select import load_twin

_impl, COMPILED = load_twin("pool_book")

PoolWorker = _impl.PoolWorker
PoolBook = _impl.PoolBook
plain_call = _impl.plain_call

__all__ = ["COMPILED", "PLAIN_TYPES", "PoolBook", "PoolWorker", "plain_call"]
