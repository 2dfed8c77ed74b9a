"""Ray's Compiled Graphs (``dag.experimental_compile()``) on one machine.

A graph of actor method calls on live actors, with one ``InputNode``, is
checked once when compiled, as Ray checks it; then each ``execute(...)``
sends its calls (in order, per actor, as Ray's compiled graphs run them)
and returns a ``CompiledDAGRef`` (a list of them for a ``MultiOutputNode``)
that ``ray.get`` or ``ref.get()`` reads once.  Ray moves the values over
shared-memory channels that it sets up when compiling; ray_lite's actor calls
already travel over shared-memory rings, so an execution is those calls.

As in Ray: at most ``_max_inflight_executions`` executions may wait to be
read (``RAY_CGRAPH_max_inflight_executions``, default 10) before ``execute``
raises ``RayCgraphCapacityExceeded``; a ref dropped unread frees its place;
``get`` that times out raises ``RayChannelTimeoutError`` (without a timeout,
after ``DAGContext.get_timeout``: ``RAY_CGRAPH_get_timeout``, 10 s); an execution whose
method raised raises that error from ``get`` and the graph stays usable;
``teardown()`` ends it (``kill_actors=True`` also kills its actors).
``enable_asyncio=True`` takes ``await compiled.execute_async(...)``, whose
futures are awaited once.  GPU transports (``with_tensor_transport``) have no
meaning here.
"""
from ray_lite.exceptions import (GetTimeoutError, RayCgraphCapacityExceeded, RayChannelError,
                                 RayChannelTimeoutError)
from ray_lite._private.api import plugins as _plugins

from .context import DAGContext
from .dag_node import (ClassMethodNode, DAGNode, FunctionNode, InputAttributeNode, InputNode,
                       MultiOutputNode)

__all__ = ["CompiledDAG", "CompiledDAGRef", "CompiledDAGFuture", "build_compiled_dag"]

_COMPILE_OPTIONS = {"enable_asyncio", "_submit_timeout", "_buffer_size_bytes",
                    "_max_inflight_executions", "_overlap_gpu_communication",
                    "_default_communicator"}


def _children(node):
    """The nodes ``node`` takes as arguments (at any depth of lists, tuples, dicts)."""
    found = []

    def walk(value):
        if isinstance(value, DAGNode):
            found.append(value)
        elif type(value) in (list, tuple):
            for v in value:
                walk(v)
        elif type(value) is dict:
            for v in value.values():
                walk(v)

    walk(list(node._bound_args))
    walk(node._bound_kwargs)
    if isinstance(node, InputAttributeNode):
        found.append(node._input)
    return found


def _check_graph(root):
    """Ray's checks at compile time; (positional inputs, keyword inputs, actors)."""
    nodes, stack, seen = [], [root], set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        nodes.append(node)
        stack.extend(_children(node))
    inputs = [n for n in nodes if type(n) is InputNode]
    if not inputs:
        raise ValueError(f"No InputNode found in the DAG: when traversing upwards, no "
                         f"upstream node was found for {root}.")
    if len(inputs) > 1:
        raise NotImplementedError("Compiled DAGs currently require exactly one InputNode")
    actors = []
    for node in nodes:
        if isinstance(node, FunctionNode):
            raise NotImplementedError("Compiled DAGs currently only support actor method nodes")
        if isinstance(node, ClassMethodNode):
            if isinstance(node._parent, DAGNode):
                raise ValueError("Compiled DAGs can only bind methods to an actor that is "
                                 "already created with Actor.remote()")
            if any(isinstance(v, DAGNode) for v in node._bound_kwargs.values()):
                raise ValueError("Compiled DAG currently does not support binding to other DAG "
                                 "nodes as kwargs")
            if not _children(node):
                raise ValueError(f"Compiled DAGs require each task to take a "
                                 f"ray.dag.InputNode or at least one other DAGNode as an "
                                 f"input. Invalid task node:\n{node}")
            if node._parent not in actors:
                actors.append(node._parent)
        elif not isinstance(node, (InputNode, InputAttributeNode, MultiOutputNode)):
            raise ValueError(f"Found unsupported node of type {type(node)}")
    parts = [n for n in nodes if isinstance(n, InputAttributeNode)]
    direct = any(inputs[0] in _children(n) for n in nodes if n is not inputs[0]
                 and not isinstance(n, InputAttributeNode)) or root is inputs[0]
    if direct and parts:
        raise ValueError("All tasks must either use InputNode() directly, or they must index "
                         "to specific args or kwargs.")
    if direct:
        return 1, (), actors
    positional = [p._key for p in parts if type(p._key) is int]
    keywords = sorted({p._key for p in parts if type(p._key) is str})
    return (max(positional) + 1 if positional else 0), keywords, actors


class CompiledDAG:
    """What ``experimental_compile`` returns (Ray's ``CompiledDAG``)."""

    def __init__(self, root, enable_asyncio=False, max_inflight_executions=None):
        self._root = root
        self._enable_asyncio = enable_asyncio
        self._max_inflight = max_inflight_executions or \
            DAGContext.get_current().max_inflight_executions
        self._num_args, self._kwargs, self._actors = _check_graph(root)
        self._returns_list = isinstance(root, MultiOutputNode)
        self._submitted = 0             # executions made (their index is 1 + those before)
        self._finished = 0              # executions up to this one are read or dropped
        self._dropped = set()           # executions dropped unread after _finished
        self.is_teardown = False

    def get_id(self):
        return f"{id(self):x}"

    def _check_inputs(self, args, kwargs):
        if len(args) != self._num_args:
            raise ValueError(f"dag.execute() or dag.execute_async() must be called with "
                             f"{self._num_args} positional args, got {len(args)}")
        for name in self._kwargs:
            if name not in kwargs:
                raise ValueError(f"dag.execute() or dag.execute_async() must be called with "
                                 f"kwarg `{name}`")

    def _submit(self, args, kwargs):
        if self.is_teardown:
            raise RayChannelError("the compiled graph was torn down (teardown())")
        self._check_inputs(args, kwargs)
        inflight = self._submitted - self._finished
        if inflight >= self._max_inflight:
            raise RayCgraphCapacityExceeded(
                f"The compiled graph can't have more than {self._max_inflight} in-flight "
                f"executions, and you currently have {inflight} in-flight executions. Retrieve "
                f"an output using ray.get before submitting more requests or increase "
                f"`_max_inflight_executions`. "
                f"`dag.experimental_compile(_max_inflight_executions=...)`")
        out = self._root.execute(*args, **kwargs)
        self._submitted += 1
        return self._submitted, out

    def execute(self, *args, **kwargs):
        """Run the graph once: a ``CompiledDAGRef`` (a list for a MultiOutputNode)."""
        if self._enable_asyncio:
            raise ValueError("Use execute_async if enable_asyncio=True")
        index, out = self._submit(args, kwargs)
        if self._returns_list:
            return [CompiledDAGRef(self, index, ref, i) for i, ref in enumerate(out)]
        return CompiledDAGRef(self, index, out)

    async def execute_async(self, *args, **kwargs):
        """``execute`` of a graph compiled with ``enable_asyncio=True``: futures."""
        if not self._enable_asyncio:
            raise ValueError("Use execute if enable_asyncio=False")
        index, out = self._submit(args, kwargs)
        if self._returns_list:
            return [CompiledDAGFuture(self, index, ref, i) for i, ref in enumerate(out)]
        return CompiledDAGFuture(self, index, out)

    def _read(self, index):
        """Execution ``index`` was read: it and those before it are done."""
        self._finished = max(self._finished, index)
        self._advance()

    def _drop(self, index):
        """Execution ``index`` will never be read (its ref went unread)."""
        if index > self._finished:
            self._dropped.add(index)
            self._advance()

    def _advance(self):
        while self._finished + 1 in self._dropped:
            self._finished += 1
            self._dropped.discard(self._finished)
        self._dropped = {i for i in self._dropped if i > self._finished}

    def teardown(self, kill_actors=False):
        """End the graph; with ``kill_actors`` its actors too."""
        if self.is_teardown:
            return
        self.is_teardown = True
        if kill_actors:
            from ray_lite._private.api.core import kill
            for actor in self._actors:
                kill(actor)

    def __repr__(self):
        return f"CompiledDAG({self.get_id()})"


class _CompiledResult:
    """What a ``CompiledDAGRef`` and a ``CompiledDAGFuture`` share: read once,
    never copied, pickled or passed on (as in Ray)."""

    _what = "CompiledDAGRef"

    def __init__(self, dag, index, ref, channel=None):
        self._dag = dag
        self._execution_index = index
        self._channel_index = channel
        self._ref = ref
        self._read = False

    def _taken(self):
        if self._read:
            raise ValueError(self._read_twice)
        self._read = True
        self._dag._read(self._execution_index)

    def __copy__(self):
        raise ValueError(f"{self._what} cannot be copied.")

    def __deepcopy__(self, memo):
        raise ValueError(f"{self._what} cannot be deep copied.")

    def __reduce__(self):
        raise ValueError(f"{self._what} cannot be pickled.")

    def __del__(self):
        dag = getattr(self, "_dag", None)
        if dag is not None and not self._read and not dag.is_teardown:
            dag._drop(self._execution_index)

    def __str__(self):
        return (f"{self._what}({self._dag.get_id()}, execution_index="
                f"{self._execution_index}, channel_index={self._channel_index})")

    __repr__ = __str__


class CompiledDAGRef(_CompiledResult):
    """The result of one ``execute``: ``ray.get(ref)`` or ``ref.get()``, once."""

    _read_twice = ("ray.get() can only be called once on a CompiledDAGRef, and it was "
                   "already called.")

    def get(self, timeout=None):
        """The execution's result; ``timeout`` None is ``DAGContext``'s
        ``get_timeout`` (10 s), as in Ray."""
        from ray_lite._private.api.core import get
        self._taken()
        if timeout is None:
            timeout = DAGContext.get_current().get_timeout
        try:
            return get(self._ref, timeout=timeout)
        except GetTimeoutError as exc:
            raise RayChannelTimeoutError(
                f"the compiled graph's execution {self._execution_index} gave no result in "
                f"{timeout} s") from exc


class CompiledDAGFuture(_CompiledResult):
    """The result of one ``execute_async``: awaited once."""

    _what = "CompiledDAGFuture"
    _read_twice = "CompiledDAGFuture can only be awaited upon once."

    def __await__(self):
        self._taken()
        return self._ref.__await__()


def build_compiled_dag(root, **options):
    """``root.experimental_compile(**options)``: Ray's options, checked."""
    unknown = sorted(set(options) - _COMPILE_OPTIONS)
    if unknown:
        raise TypeError(f"experimental_compile() got unexpected keyword arguments: "
                        f"{', '.join(unknown)}")
    size = options.get("_buffer_size_bytes")
    if size is not None and (not isinstance(size, int) or size <= 0):
        raise ValueError(f"`buffer_size_bytes` must be a positive integer, found {size}")
    return CompiledDAG(root, enable_asyncio=bool(options.get("enable_asyncio")),
                       max_inflight_executions=options.get("_max_inflight_executions"))


# ``ray_lite.get`` reads a CompiledDAGRef through this hook (the core does not
# import this layer).
_plugins.register_compiled_ref(CompiledDAGRef)
