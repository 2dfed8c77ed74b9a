"""Actor handles and their methods: ``handle.method.remote(...)``."""
import weakref

from ray_lite.exceptions import ActorDiedError

from ..actors.lease import _ActorLease, actor_lease  # noqa: F401 (re-exported)
from ..actors.restarts import keep_for_exceptions, reach, retained_calls
from ..links import protocol as P
from ..links.protocol import ACTOR_CALL, BUILTIN_METHODS, METHOD   # per call: globals
from ..links.transport import LinkClosed
from ..objects.refs import ObjectRef, _Entry
from ..process import backend as _backend
from ..process import state
from ..scheduling.scheduler import check_retry_exceptions
from .call_options import (_SIMPLE_TYPES, _check_method_options, _make_call_result,
                           _prepare_args, _stream_opts, warn_dynamic)
from .signatures import check_call


# What ``handle.__ray_terminate__`` (Ray's graceful end, queued behind the
# calls sent before it) and ``handle.__ray_ready__`` are: methods without
# parameters (``protocol.BUILTIN_METHODS``).
_BUILTIN_ENTRY = (False, None, (0, 0, ()))


class ActorHandle(metaclass=_backend.AlsoRay):
    """A handle to an actor; picklable, so it can be passed to tasks and actors.

    As in Ray, the actor ends (gracefully: the calls sent before run first)
    when the handle its creator got and every copy of it are gone, in this
    process and in the others it was passed to (``_ActorLease``).  A
    handle got by name (``get_actor``, ``get_if_exists``) does not keep the
    actor alive: only the creator's handle and its copies do, as in Ray.
    """

    # The methods made so far live in the instance's __dict__: the next
    # ``handle.method`` is a plain attribute hit (``__getattr__`` runs once);
    # they hold the handle weakly, so that it goes when the user drops it.
    __slots__ = ("_info", "_lease", "__dict__", "__weakref__")

    def __init__(self, info, lease=None):
        self._info = info
        self._lease = lease     # an ObjectRef to the actor's _ActorLease, or None

    def __getattr__(self, name):
        if name.startswith("__") and name != "__call__" and name not in BUILTIN_METHODS:
            raise AttributeError(name)
        info = self._info
        entry = info.methods.get(name)
        if entry is None and name in BUILTIN_METHODS:
            entry = _BUILTIN_ENTRY
        if entry is None:
            raise AttributeError(f"'ActorHandle' object has no attribute '{name}' "
                                 f"(actor class {info.class_name} has no method {name!r})")
        is_gen, declared, arity = entry
        declared = declared or {}
        cls = _method_type(info, declared)
        self.__dict__[name] = cls(self, name, is_gen, declared, arity)
        # What this access returns holds the handle: ``A.remote().f.remote()``
        # must not lose the actor between ``.f`` and ``.remote()``.
        return cls(self, name, is_gen, declared, arity, hard=True)

    @property
    def _actor_id(self):
        """The actor's ``ActorID`` (Ray's private attribute, which libraries
        read: ``handle._actor_id.hex()`` is the runtime context's
        ``get_actor_id()`` inside the actor)."""
        from ..process.ids import ActorID, actor_id_hex
        return ActorID(bytes.fromhex(actor_id_hex(self._info.actor_id)))

    def __reduce__(self):
        # The lease travels as any ref: the receiver holds a share of it.
        return (ActorHandle, (self._info, self._lease))

    def __dir__(self):
        return sorted(set(object.__dir__(self)) | set(self._info.methods))

    def __repr__(self):
        return f"Actor({self._info.class_name}, {self._info.actor_id:08x})"

    def __hash__(self):
        return hash(self._info.actor_id)

    def __eq__(self, other):
        return isinstance(other, ActorHandle) and other._info.actor_id == self._info.actor_id


class ActorMethod:
    __slots__ = ("_info", "_handle_ref", "_hard", "_name", "_is_gen", "_options", "_nret",
                 "_stream", "_bp", "_qualname", "_arity")

    def __init__(self, handle, name, is_gen, options, arity=None, hard=False):
        self._info = handle._info
        # Weak in the handle's own cache (see ActorHandle); strong in what
        # ``handle.f`` first returns and in ``.options(...)``'s result, which
        # may be all that keeps a handle made in the same expression alive.
        self._handle_ref = weakref.ref(handle)
        self._hard = handle if hard else None
        self._name = name
        self._is_gen = is_gen
        self._arity = arity
        self._options = options
        self._nret, self._stream, self._bp = _stream_opts(options, is_gen)
        self._qualname = f"{self._info.class_name}.{name}"

    def __call__(self, *args, **kwargs):
        raise TypeError(f"Actor methods cannot be called directly. Instead of running "
                        f"'object.{self._name}()', try 'object.{self._name}.remote()'.")

    def _handle(self):
        handle = self._handle_ref()
        if handle is None:
            raise RuntimeError("Lost reference to actor")     # Ray's words
        return handle

    def bind(self, *args, **kwargs):
        """A node of Ray's DAG API: this call when the graph is executed (``ray_lite.dag``)."""
        from .plugins import dag
        name = self._name if type(self._name) is str else self._name[0]
        return dag().ClassMethodNode(self._handle(), name, args, kwargs, self._options)

    def _remote(self, args=None, kwargs=None, **options):
        """Ray's older form: ``m._remote(args=[...], kwargs={...}, num_returns=...)``."""
        target = self.options(**options) if options else self
        return target.remote(*(args or ()), **(kwargs or {}))

    def __reduce__(self):
        # Passed to a task or actor as its handle and name, as Ray allows.
        name = self._name if type(self._name) is str else self._name[0]
        return (_rebuild_method, (self._handle(), name, self._options))

    def options(self, **opts):
        merged = {**self._options, **opts}
        info = self._info
        _check_method_options(merged, info)
        if opts.get("num_returns") == "dynamic":
            warn_dynamic()
        return _method_type(info, merged)(self._handle(), self._name, self._is_gen, merged,
                                          self._arity, hard=True)

    def remote(self, *args, **kwargs):
        node = state.node
        if node is None:
            node = state.get_node()
        info = self._info
        aid = info.actor_id
        nret, stream, bp = self._nret, self._stream, self._bp
        name = self._qualname
        method = self._name
        arity = self._arity     # checked as Ray does, at the call (two comparisons)
        if arity is not None and (kwargs or not arity[0] <= len(args) <= arity[1]):
            check_call(arity, args, kwargs)
        if kwargs:
            args, kwargs = _prepare_args(args, kwargs, name, node)
        elif args:
            for a in args:
                if type(a) not in _SIMPLE_TYPES:
                    args, kwargs = _prepare_args(args, kwargs, name, node)
                    break
            else:
                args = list(args)     # plain values only (the common case)
        if node.id != 0:
            node.known_pids.setdefault(aid, info.pid)
        if nret == 1 and not stream:
            oid = node._oid_base | next(node._seq)      # node.new_oid(), inline: per call
            target = _Entry(aid)
            result = None       # the ref is made after the send: the actor works meanwhile (B11)
        else:
            oid, target, result = _make_call_result(node, nret, stream, bp, name, aid)
        if not stream:
            node.pending[oid] = target
            fl = node.inflight.get(aid)
            if fl is None:
                fl = node.inflight[aid] = {}
            fl[oid] = ACTOR_CALL
        link = node.links.get(aid)
        if link is not None:
            try:
                link.send((METHOD, oid, method, args, kwargs, nret, stream, bp))
                return ObjectRef(oid, node.id, target) if nret == 1 and not stream else result
            except (LinkClosed, OSError):
                pass
            except BaseException:
                if not stream:
                    node.pending.pop(oid, None)
                    node.inflight.get(aid, {}).pop(oid, None)
                raise
        if aid in node.dead_peers or not node.connect(aid) or not node.send(
                aid, P.method_msg(oid, self._name, args, kwargs, nret, stream, bp)):
            err = ActorDiedError(node.death_causes.get(aid) or f"The actor {info.class_name} "
                                 f"is dead: {name} cannot run.", actor_id=aid)
            err.never_sent = True     # certain: the actor never saw this call (Serve retries it)
            if stream:
                node.streams.fail_stream(target, err)
            else:
                node.pending.pop(oid, None)
                node.inflight.get(aid, {}).pop(oid, None)
                for e in (target if type(target) is list else [target]):
                    e.set_error(err)
        return ObjectRef(oid, node.id, target) if nret == 1 and not stream else result



class _GroupedActorMethod(ActorMethod):
    """A method called with ``.options(concurrency_group=...)``: its calls carry
    the group (``(method, group)`` in place of the method's name)."""

    __slots__ = ()

    def __init__(self, handle, name, is_gen, options, arity=None, hard=False):
        ActorMethod.__init__(self, handle, name, is_gen, options, arity, hard)
        self._name = (name, options["concurrency_group"])

    def options(self, **opts):
        return ActorMethod(self._handle(), self._name[0], self._is_gen, {}, self._arity).options(
            **{**self._options, **opts})


class _RetryingActorMethod(ActorMethod):
    """A method whose calls are retried (``max_task_retries``): on a restart
    of a restartable actor, and after an exception its ``retry_exceptions``
    lists; see restarts.py."""

    __slots__ = ("_retries", "_retry_on")

    def __init__(self, handle, name, is_gen, options, arity=None, hard=False):
        ActorMethod.__init__(self, handle, name, is_gen, options, arity, hard)
        r = options.get("max_task_retries")
        self._retries = self._info.max_task_retries if r is None else r
        self._retry_on = check_retry_exceptions(options.get("retry_exceptions"))

    def remote(self, *args, **kwargs):
        if self._stream:
            return ActorMethod.remote(self, *args, **kwargs)
        node = state.get_node()
        info = self._info
        aid = info.actor_id
        name = self._qualname
        if self._arity is not None:
            check_call(self._arity, args, kwargs)
        args, kwargs = _prepare_args(args, kwargs, name, node)
        oid, target, result = _make_call_result(node, self._nret, False, self._bp, name, aid)
        node.pending[oid] = target
        group = self._options.get("concurrency_group")
        msg = P.method_msg(oid, self._name if group is None else (self._name, group), args,
                           kwargs, self._nret, False, self._bp)
        kept = [msg, self._retries]
        if info.restartable:
            retained_calls(node, aid)[oid] = kept
        else:
            node.inflight.setdefault(aid, {})[oid] = ACTOR_CALL   # its death fails the call
        if self._retry_on is not None:
            keep_for_exceptions(node, aid, oid, kept, self._retry_on)
        if not (reach(node, aid, info.pid) and node.send(aid, msg)) and node.id == 0 \
                and aid not in node.actor_restarts:
            # Dead for good.  (Dying, it is resent by the restart: RESTARTED.)
            node.retry_calls.get(aid, {}).pop(oid, None)
            node.inflight.get(aid, {}).pop(oid, None)
            node.exc_retries.pop(oid, None)
            node.pending.pop(oid, None)
            err = ActorDiedError(f"The actor {info.class_name} is dead: {name} cannot run.",
                                 actor_id=aid)
            for e in (target if type(target) is list else [target]):
                e.set_error(err)
        return result


def _rebuild_method(handle, name, options):
    method = getattr(handle, name)
    return method.options(**options) if options else method


def _method_type(info, options):
    """The ActorMethod class for calls of ``info``'s actor with ``options``."""
    retries = options.get("max_task_retries", info.max_task_retries)
    if retries and (info.restartable or options.get("retry_exceptions")):
        return _RetryingActorMethod
    if options.get("concurrency_group") is not None:
        return _GroupedActorMethod
    return ActorMethod
