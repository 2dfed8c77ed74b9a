"""Every message the runtime's processes exchange over their links, named once.

A message is a tuple whose first element, its *tag*, says what it is (one
character: the tag travels with every message).  Each handler table maps a
tag to the method that handles it (``Node.handlers``).

  tag        from -> to                  fields after the tag
  TASK       driver -> pool worker       oid, fn_id, blob|None, args, kwargs, nret, stream, bp, name
  METHOD     caller -> actor             oid, method, args, kwargs, nret, stream, bp
  RESULT     executor -> owner           oid, ok, payload (a task or call finished)
  ITEM       producer -> owner           sid, index, ok, payload (a stream item)
  END        producer -> owner           sid, count (a stream ended)
  ACK        owner -> producer           sid, consumed (stream back-pressure)
  CANCEL     owner -> executor           oid, force
  FETCH      borrower -> owner           oid; answered by FETCHED (oid, ok, payload)
  RELEASE    borrower -> owner           [(oid, numerator, denominator)] ref weights given
                                         back, [(oid, num, den, holder, kind)] a
                                         borrower's HolderWeight; relayed by the driver
                                         as (batch, owner) when the borrower has no link
                                         to the owner; the driver then tells the owner
                                         when that borrower died: [(HOLDER_DIED, peer)]
  REQUEST    worker -> driver            req_id, op, args; answered by REPLY
                                         (req_id, ok, payload) unless req_id is 0
  ATTACH     driver -> worker            peer, pid, names (a link a peer created)
  EXIT       driver -> worker            (nothing)
  RESTARTED  driver -> every process     actor_id, pid|None (an actor was restarted
                                         under a new pid, or is dead for good)
  TIMELINE   driver -> worker            ask; answered by REQUEST OP_TIMELINE (no reply)

The builders below are for the paths where a call's cost does not matter;
the hot paths (a task, a method call, a result, a stream item) write the
tuple in place, with the tag constant, to spare a call per message.
"""

TASK = "T"
METHOD = "M"
# Methods every actor answers besides its class's (``method_lookup.method_table``).
BUILTIN_METHODS = ("__ray_terminate__", "__ray_ready__")
RESULT = "R"
ITEM = "I"
END = "E"
ACK = "K"
CANCEL = "X"
CANCEL_CALLS_OF = "Y"   # the driver to an actor: cancel the calls of a force-cancelled task's worker
CANCEL_OWNED = "W"      # the driver to a call's owner: cancel it (a process that borrowed its ref asks)
FETCH = "F"
FETCHED = "O"
RELEASE = "D"
HOLDER_DIED = "holder died"     # an item of a RELEASE batch (see above)
REQUEST = "Q"
REPLY = "P"
ATTACH = "A"
EXIT = "Z"
RESTARTED = "S"
TIMELINE = "L"     # the driver asks a worker for its timeline records (node/timeline.py)
START = "G"         # the driver to an actor created while its resources were taken: go

# What a process waits for from a peer (``Node.inflight``: peer -> {oid: kind}),
# which says which error the wait gets when that peer dies.
ACTOR_CALL = "actor"        # a call of an actor method
FETCH_OBJECT = "fetch"      # an object fetched from its owner
FETCH_FROM_ACTOR = "fetch-actor"
STREAM = "stream"           # the items of a stream
# The kind of a peer that runs pool tasks (others are actors).
POOL_WORKER = "worker"

# Requests a worker makes to the driver (``request(op, *args)``).
OP_SUBMIT = "submit"
OP_BLOCKED = "blocked"
OP_CONNECT = "connect"
OP_PID_OF = "pid_of"
OP_CREATE_ACTOR = "create_actor"
OP_CREATE_ACTORS = "create_actors"
OP_GET_ACTOR = "get_actor"
OP_KILL = "kill"
OP_CANCEL = "cancel"
OP_SUBMIT_PLACED = "submit_placed"    # a task with a Demand or a retry policy
OP_ACTOR_PID = "actor_pid"            # the current pid of a (restartable) actor
OP_PG_CREATE = "pg_create"
OP_PG_REMOVE = "pg_remove"
OP_PG_GET = "pg_get"
OP_PG_TABLE = "pg_table"
OP_RESOURCES = "resources"            # (total, available)
OP_INTROSPECT = "introspect"        # what, *args: the runtime's state (introspect.py)
OP_ACTOR_EXITING = "actor_exiting"  # an actor called exit_actor()
OP_TIMELINE = "timeline"            # ask, pid, kind, prefix, records (node/timeline.py)
OP_OUT_OF_SCOPE = "out_of_scope"    # an actor's last handle is gone (actor_handle._ActorLease)

# A stream's end "with no more items" for a consumer that dropped it.
UNLIMITED_ACK = 1 << 62


def result_msg(oid, ok, payload):
    return (RESULT, oid, ok, payload)


class FailedReturn:
    """In a RESULT's list of ``num_returns=N`` values: one that failed while
    the others are values (a generator that raised, or stopped, before its
    N-th yield), as in Ray.  The owner gives its ref the error."""

    __slots__ = ("error",)

    def __init__(self, error):
        self.error = error

    def __reduce__(self):
        return (FailedReturn, (self.error,))


def stream_failed_msgs(sid, index, error):
    """The pair that ends stream ``sid`` with ``error`` as its item ``index``."""
    return (ITEM, sid, index, False, error), (END, sid, index + 1)


def end_msg(sid, count):
    return (END, sid, count)


def failure_msgs(oid, stream, error):
    """What tells the owner that call ``oid`` failed with ``error`` before it ran."""
    if stream:
        return stream_failed_msgs(oid, 0, error)
    return (result_msg(oid, False, error),)


def ack_msg(sid, consumed):
    return (ACK, sid, consumed)


def cancel_msg(oid, force, recursive=False):
    """``recursive`` (the driver to the worker running task ``oid``): the
    calls that task made to actors are cancelled too."""
    return (CANCEL, oid, force, recursive)


def cancel_calls_of_msg(node_id):
    return (CANCEL_CALLS_OF, node_id)


def cancel_owned_msg(oid):
    return (CANCEL_OWNED, oid)


def fetch_msg(oid):
    return (FETCH, oid)


def fetched_msg(oid, ok, payload):
    return (FETCHED, oid, ok, payload)


def release_msg(batch, owner=None):
    return (RELEASE, batch) if owner is None else (RELEASE, batch, owner)


def request_msg(req_id, op, args):
    return (REQUEST, req_id, op, args)


def reply_msg(req_id, ok, payload):
    return (REPLY, req_id, ok, payload)


def attach_msg(peer, pid, names):
    return (ATTACH, peer, pid, names)


def exit_msg():
    return (EXIT,)


def restarted_msg(actor_id, pid):
    return (RESTARTED, actor_id, pid)


def method_msg(oid, method, args, kwargs, nret, stream, bp):
    return (METHOD, oid, method, args, kwargs, nret, stream, bp)


class TaskSpec:
    """A task the driver schedules onto the pool (its own or a worker's nested one)."""

    __slots__ = ("oid", "fn_id", "blob", "args", "kwargs", "nret", "stream", "bp",
                 "retries", "name", "owner", "deps_left", "cancelled", "has_refs")

    def __init__(self, oid, fn_id, blob, args, kwargs, nret, stream, bp, retries, name, owner,
                 has_refs=True):
        self.oid = oid
        self.fn_id = fn_id
        self.blob = blob
        self.args = args
        self.kwargs = kwargs
        self.nret = nret
        self.stream = stream
        self.bp = bp
        self.retries = retries
        self.name = name
        self.owner = owner
        self.deps_left = 0
        self.cancelled = False
        # Whether an argument may be an ObjectRef (submit looks, and notes
        # what it found); False from a caller that saw only plain values.
        self.has_refs = has_refs

    def wire_fields(self):
        """The fields a worker sends the driver for its nested task (``OP_SUBMIT``)."""
        return (self.oid, self.fn_id, self.blob, self.args, self.kwargs, self.nret,
                self.stream, self.bp, self.retries, self.name)

    # A plain task has none of these (class attributes: nothing to set per
    # task); a ``PlacedTaskSpec`` has its own.
    demand = None       # scheduler.Demand: resources beyond 1 CPU, a placement group
    retry_on = None     # retry_exceptions: True or a tuple of exception classes
    max_calls = 0       # the function's max_calls (0: no limit)
    held = None


class PlacedTaskSpec(TaskSpec):
    """A task with a ``Demand``, a retry policy or ``max_calls`` (``OP_SUBMIT_PLACED``)."""

    __slots__ = ("demand", "retry_on", "max_calls", "held")

    def __init__(self, demand, retry_on, max_calls, *fields, owner):
        TaskSpec.__init__(self, *fields, owner)
        self.demand = demand
        self.retry_on = retry_on
        self.max_calls = max_calls
        self.held = None


class ActorInfo:
    """What a handle needs to reach an actor (picklable: handles travel)."""

    __slots__ = ("actor_id", "pid", "class_name", "methods", "is_async", "name", "namespace",
                 "max_task_retries", "groups", "restartable")

    def __init__(self, actor_id, pid, class_name, methods, is_async, name, namespace,
                 max_task_retries=0, groups=None, restartable=False):
        self.actor_id = actor_id
        self.pid = pid
        self.class_name = class_name
        self.methods = methods
        self.is_async = is_async
        self.name = name
        self.namespace = namespace
        # How often a call is retried: after a restart (``restartable``: it
        # has max_restarts) and, for a method with retry_exceptions, after
        # an exception of its own.
        self.max_task_retries = max_task_retries
        self.groups = groups                       # concurrency group names, or None
        self.restartable = restartable

    def __reduce__(self):
        return (ActorInfo, (self.actor_id, self.pid, self.class_name, self.methods,
                            self.is_async, self.name, self.namespace, self.max_task_retries,
                            self.groups, self.restartable))
