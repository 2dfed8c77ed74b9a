# cython: language_level=3
# Layout of the driver's pool book (semantics: _pool_book_py.py, the
# executable specification).  Typed fields, so that the two per-task steps
# of the driver's common task (book it on an idle worker and send it; free
# the worker at its result) read and write the scheduler's state at C level
# (B11).  The driver holds the book (``driver.book``).
cimport cython


@cython.final
cdef class PoolWorker:
    cdef public object id
    cdef public object pid
    cdef public set shipped          # fn ids this worker has loaded
    cdef public object task          # the TaskSpec it runs, or None
    cdef public bint blocked         # lends its CPU while blocked in get
    cdef public object calls         # fn id -> tasks run, of functions with max_calls


cdef class PoolBook:
    # Set by the driver; its parts read and write them (the book owns them).
    cdef public object _sched        # the scheduler's RLock
    cdef public list idle            # idle PoolWorkers
    cdef public object queue         # deque of the driver's own queued TaskSpecs
    cdef public object nested_queue  # deque of workers' queued TaskSpecs
    cdef public list placed_queue    # tasks with a Demand waiting for resources
    cdef public list res_waiters     # callables retried when resources are freed
    cdef public object busy          # CPUs taken by running tasks (int, or float
    cdef public object cpu_cap       # once a fractional demand ran): Python numbers
    cdef public dict links           # peer id -> Link
    cdef public object task_op       # protocol.TASK
    cdef public type spec_type       # protocol.TaskSpec
    # A result's (_on_pool_result): the node's tables, and the types it tells
    cdef public dict pending         # oid -> _Entry or [entries]
    cdef public dict inflight        # peer -> {oid: kind}
    cdef public dict pool            # worker id -> PoolWorker
    cdef public dict forward         # oid -> owner of a nested task (results passed on)
    cdef public type entry_type      # refs._Entry
    cdef public frozenset kept_types # values a result keeps as they are (immutable ones)
    # What is not the common case: bound methods of the driver's parts, set
    # once (a typed field read per call, no look-up through the driver's MRO).
    cdef public object enqueue          # dispatch.enqueue(spec)
    cdef public object unsent           # dispatch.unsent(spec, w, exc)
    cdef public object free_worker      # dispatch.free_worker(w, spec)
    cdef public object dispatch_queued  # dispatch.dispatch_queued()
    cdef public object used_up          # max_calls.used_up(w, spec)
    cdef public object resources_freed  # resources.freed()
    cdef public object on_result        # the driver's general RESULT handler
