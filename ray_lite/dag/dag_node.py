"""The nodes of a DAG: what ``.bind`` makes and ``execute`` runs (see the package)."""


# ``compiled_dag_node.build_compiled_dag``, set by the package (``__init__``):
# the compiled graph is built from these nodes, and imports them.
build_compiled_dag = None


class DAGNode:
    """A node of the graph: a call with its arguments, not made yet."""

    def __init__(self, args, kwargs, options=None):
        self._bound_args = tuple(args)
        self._bound_kwargs = dict(kwargs)
        self._bound_options = dict(options or {})

    def get_args(self):
        return self._bound_args

    def get_kwargs(self):
        return self._bound_kwargs

    def get_options(self):
        return self._bound_options

    def execute(self, *args, **kwargs):
        """Run the graph below this node with ``args``/``kwargs`` as the
        ``InputNode``'s value: an ``ObjectRef`` for a function or method
        node, an actor handle for a class node."""
        return self._resolve({}, DAGInputData(args, kwargs))

    def experimental_compile(self, **options):
        """Ray's Compiled Graph of this graph (see ``compiled_dag_node``)."""
        return build_compiled_dag(self, **options)

    def _resolve(self, done, inp):
        key = id(self)
        if key not in done:
            done[key] = self._execute_impl(done, inp)
        return done[key]

    def _resolved_arguments(self, done, inp):
        return (_resolved(list(self._bound_args), done, inp),
                _resolved(self._bound_kwargs, done, inp))

    def _execute_impl(self, done, inp):
        raise NotImplementedError

    def __reduce__(self):
        raise TypeError(f"a {type(self).__name__} cannot be passed to a task or actor: "
                        f"execute() the graph, and pass what it returns")


def _resolved(value, done, inp):
    if isinstance(value, DAGNode):
        return value._resolve(done, inp)
    t = type(value)
    if t is list or t is tuple:
        out = [_resolved(v, done, inp) for v in value]
        return out if t is list else tuple(out)
    if t is dict:
        return {k: _resolved(v, done, inp) for k, v in value.items()}
    return value


class _RemoteNode(DAGNode):
    """A node whose call is ``.remote`` on what was bound (with its options)."""

    def __init__(self, remote_object, args, kwargs, options=None):
        DAGNode.__init__(self, args, kwargs, options)
        self._body = remote_object

    def _execute_impl(self, done, inp):
        args, kwargs = self._resolved_arguments(done, inp)
        target = self._body.options(**self._bound_options) if self._bound_options else self._body
        return target.remote(*args, **kwargs)

    def __repr__(self):
        return f"{type(self).__name__}({getattr(self._body, '__name__', self._body)!r})"


class FunctionNode(_RemoteNode):
    """``f.bind(...)``: a task when executed."""


class ClassNode(_RemoteNode):
    """``C.bind(...)``: an actor when executed (once per ``execute``);
    ``node.method.bind(...)`` makes a call of it."""

    def __init__(self, remote_object, args, kwargs, options=None):
        _RemoteNode.__init__(self, remote_object, args, kwargs, options)
        self._last_call = None      # the last method node bound on it (see ClassMethodNode)

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return _MethodBinder(self, name, {})


class _MethodBinder:
    """``class_node.method``: what ``.bind`` (and ``.options``) are called on."""

    def __init__(self, parent, name, options):
        self._parent = parent
        self._name = name
        self._options = options

    def options(self, **options):
        return _MethodBinder(self._parent, self._name, {**self._options, **options})

    def bind(self, *args, **kwargs):
        node = ClassMethodNode(self._parent, self._name, args, kwargs, self._options)
        if isinstance(self._parent, ClassNode):
            node._previous, self._parent._last_call = self._parent._last_call, node
        return node


class ClassMethodNode(DAGNode):
    """``class_node.method.bind(...)`` or ``handle.method.bind(...)``: an
    actor call when executed.  As in Ray, the calls bound on one class node
    form a chain: executing one first executes those bound on it before (a
    graph's side effects, ``a.inc.bind(2)`` bound and not used, happen)."""

    def __init__(self, parent, method_name, args, kwargs, options=None):
        DAGNode.__init__(self, args, kwargs, options)
        self._parent = parent       # a ClassNode, or a live actor's handle
        self._method_name = method_name
        self._previous = None       # the call bound on the same class node before it

    def _execute_impl(self, done, inp):
        parent = self._parent
        handle = parent._resolve(done, inp) if isinstance(parent, DAGNode) else parent
        if self._previous is not None:
            self._previous._resolve(done, inp)      # sent first: the actor runs it first
        args, kwargs = self._resolved_arguments(done, inp)
        method = getattr(handle, self._method_name)
        if self._bound_options:
            method = method.options(**self._bound_options)
        return method.remote(*args, **kwargs)

    def __repr__(self):
        return f"ClassMethodNode({self._method_name!r})"


class DAGInputData:
    """What an ``execute`` was given, as ``InputNode`` holds it."""

    __slots__ = ("args", "kwargs")

    def __init__(self, args, kwargs):
        self.args = tuple(args)
        self.kwargs = dict(kwargs)


class InputNode(DAGNode):
    """The graph's input: ``with InputNode() as inp: dag = f.bind(inp)``.

    Executed with one argument, ``inp`` is that value (``inp[0]``,
    ``inp["key"]`` and ``inp.attr`` index it); with several, or keywords,
    ``inp[i]`` is the i-th positional argument and ``inp.key`` or
    ``inp["key"]`` a keyword argument, as in Ray.
    """

    def __init__(self, *args, **kwargs):
        DAGNode.__init__(self, (), {})

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def _execute_impl(self, done, inp):
        if len(inp.args) == 1 and not inp.kwargs:
            return inp.args[0]
        return inp

    def __getitem__(self, key):
        return InputAttributeNode(self, key, "__getitem__")

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return InputAttributeNode(self, name, "__getattr__")

    def __repr__(self):
        return "InputNode()"


class InputAttributeNode(DAGNode):
    """``inp[key]`` or ``inp.name``: a part of the graph's input."""

    def __init__(self, input_node, key, accessor):
        DAGNode.__init__(self, (), {})
        self._input = input_node
        self._key = key
        self._accessor = accessor

    def _execute_impl(self, done, inp):
        value = self._input._resolve(done, inp)
        key = self._key
        if type(value) is DAGInputData:
            if type(key) is int:
                if key >= len(value.args):
                    raise IndexError(f"execute() was given {len(value.args)} positional "
                                     f"argument(s): the graph's input has no [{key}]")
                return value.args[key]
            if key not in value.kwargs:
                raise KeyError(f"execute() was given no keyword argument {key!r}, which the "
                               f"graph's input node is asked for")
            return value.kwargs[key]
        if self._accessor == "__getattr__":
            return getattr(value, key)
        return value[key]

    def __repr__(self):
        return f"InputAttributeNode({self._key!r})"


class MultiOutputNode(DAGNode):
    """Several nodes as one graph's output: ``execute`` returns their results, a list."""

    def __init__(self, args, other_args_to_resolve=None):
        DAGNode.__init__(self, list(args), {})

    def _execute_impl(self, done, inp):
        return [_resolved(n, done, inp) for n in self._bound_args]

    def __repr__(self):
        return f"MultiOutputNode({len(self._bound_args)})"
