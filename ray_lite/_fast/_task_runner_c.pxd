# cython: language_level=3
# Layout of a worker's task runner (semantics: _task_runner_py.py, the
# executable specification).  Typed fields, so that the steps a worker takes
# per task and per actor call read and write its state at C level instead of
# through attribute look-ups along WorkerNode's bases (B11).  WorkerNode is
# ``WorkerNode(TaskRunner, Node)`` and holds its parts (held_calls,
# generators, async_actor): the runner is its first base, so these
# descriptors come before any class attribute of the same name in Node.


cdef class TaskRunner:
    # The worker's own fields (the names the node and its parts read and write).
    cdef public dict functions       # fn id -> loaded function
    cdef public set cancelled        # live oids whose cancel arrived
    cdef public set live             # oids of calls received and not finished
    cdef public dict links           # peer id -> Link
    cdef public object current_oid   # the pool task running on the main thread,
    cdef public object current_fn    # its function (None until loaded)
    cdef public object current_name  # and its name (get_runtime_context reads them)
    cdef public object task_oids_from  # no oid this process made before the task is >= it
    cdef public bint current_thread_busy
    cdef public bint _interrupted
    cdef public bint _in_user_code
    cdef public object _interrupt    # the oid whose cancel interrupts, or None
    cdef public bint _cancel_signalled
    cdef public object blocked_depth  # gets nested inside the running task (int)
    cdef public dict _bridges        # event loop -> its bridge
    cdef public object kind          # "pool" or "actor"
    cdef public object tasks         # deque of (peer, msg) received, not run yet
    cdef public bint exiting
    cdef public list _releases       # (owner, oid, weight) to give back
    cdef public object _drive_lock   # held by the thread that drives the links
    cdef public long _sleepers       # threads asleep while another drives
    cdef public bint _bridge_waiting  # some loop bridge may be waiting
    # The runtime's names it needs, set by the worker (no import of _private).
    cdef public object ref_type      # ObjectRef (its metaclass is not exactly type)
    cdef public object result_op     # protocol.RESULT
    cdef public object never_stored  # result types never put in the store
    cdef public object store_result  # refs.stored_result

    cdef _invoke_c(self, peer, oid, fn, args, kwargs, nret, stream, bp, name)
