"""Which engine runs the program: this runtime ("local") or Ray ("ray").

One rule, in the order vLLM's ``distributed_executor_backend`` and Modin's
engine switch use: what ``init()`` says wins (``backend=``, or an
``address=`` that names a Ray cluster), then ``RAY_LITE_BACKEND``, then the
local runtime.  The choice is made once per ``init`` and cleared by
``shutdown``; until then ``current()`` reports what ``init()`` would choose.

Hot paths test the module global ``RAY`` (a bool), one load and one branch.

A process that Ray started to run a task or an actor (a Ray worker) runs on
Ray from the moment it imports ray_lite: ``adopt_ray_worker`` below.

The Ray engine itself (``ray_lite._ray``, a layer above the core) registers
here when it is imported (``register_engine``; the package root imports it,
which does not import Ray).  The core's Ray branches reach it as ``ENGINE``
and never import it.
"""
import sys

from ray_lite import _config

__all__ = ["LOCAL", "RAY_NAME", "current", "choose", "activate", "deactivate",
           "require_ray", "RAY_INSTALL_HINT", "AlsoRay", "RAY_TWINS", "ENGINE",
           "register_engine"]

LOCAL = "local"
RAY_NAME = "ray"
RAY_INSTALL_HINT = "pip install 'ray_lite[ray]'"

# The engine in use since init() (None: not decided yet, i.e. not initialised).
_active = None
# True while the Ray backend is the active one; hot paths read only this.
RAY = False
# The Ray engine (the module ``ray_lite._ray``) once it has registered.
ENGINE = None


def register_engine(engine):
    """Called by ``ray_lite._ray`` when it is imported."""
    global ENGINE
    ENGINE = engine


def choose(backend=None, address=None):
    """The engine ``init(backend=..., address=...)`` asks for.

    ``address`` is Ray's: ``"auto"``, ``"host:6379"`` or ``"ray://host:10001"``
    mean a Ray cluster; ``None`` and ``"local"`` mean this machine.
    """
    if backend is not None:
        if backend not in (LOCAL, RAY_NAME):
            raise ValueError(f"backend must be 'local' or 'ray', got {backend!r}")
        if backend == LOCAL and address not in (None, "local"):
            raise ValueError(f"backend='local' runs on this machine: cannot connect to "
                             f"address={address!r}; use backend='ray' for a Ray cluster")
        return backend
    if address not in (None, "local"):
        return RAY_NAME
    return _config.BACKEND


def current():
    """The engine in use (``"local"`` or ``"ray"``); before ``init``, the one
    ``init()`` without arguments would choose."""
    return _active if _active is not None else _config.BACKEND


def activate(name):
    global _active, RAY
    _active = name
    RAY = name == RAY_NAME
    if RAY:
        AlsoRay.__instancecheck__ = _instancecheck
        AlsoRay.__subclasscheck__ = _subclasscheck


def deactivate():
    global _active, RAY
    _active = None
    RAY = False
    for check in ("__instancecheck__", "__subclasscheck__"):
        if check in AlsoRay.__dict__:
            delattr(AlsoRay, check)


def require_ray():
    """The ``ray`` module, or ImportError saying how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError(
            f"the Ray backend needs Ray, which is not installed: {RAY_INSTALL_HINT} "
            f"(or pip install ray)") from exc
    return ray


# ray_lite class -> Ray's class that stands for it while Ray is the backend
# (filled by ray_lite._ray when it starts).
RAY_TWINS = {}


class AlsoRay(type):
    """Metaclass of the classes whose objects Ray makes on the Ray backend
    (``ObjectRef``, ``ObjectRefGenerator``, ``ActorHandle``): while Ray is the
    backend, ``isinstance(x, ray_lite.ObjectRef)`` holds for Ray's
    ``ObjectRef`` (``RAY_TWINS``).  The checks are installed by ``activate``
    and removed by ``deactivate``, so that on the local backend ``isinstance``
    runs no Python code."""


def _instancecheck(cls, obj):
    return type.__instancecheck__(cls, obj) or isinstance(obj, RAY_TWINS.get(cls, ()))


def _subclasscheck(cls, sub):
    return type.__subclasscheck__(cls, sub) or issubclass(sub, RAY_TWINS.get(cls, ()))


def adopt_ray_worker():
    """In a process Ray started for a task or an actor, run on Ray: user code
    there calls ``ray_lite.get`` etc. on Ray's objects.  (Ray is imported
    already in such a process; in any other one, this costs a dict look-up.)"""
    ray = sys.modules.get("ray")
    if ray is None or _active is not None:
        return
    try:
        from ray._private import worker as ray_worker
        in_worker = ray_worker.global_worker.mode == ray_worker.WORKER_MODE
    except (ImportError, AttributeError):
        return
    if in_worker:
        ENGINE.adopt()


def ray_counterpart(name):
    """Class decorator: on the Ray backend, making an object of this class
    makes Ray's counterpart ``ENGINE.util.CLASSES[name]`` instead (a
    subclass of it is left alone: it builds on the public API, which
    dispatches)."""
    def decorate(local_cls):
        def __new__(cls, *args, **kwargs):
            if RAY and cls is local_cls:
                return ENGINE.util.CLASSES[name](*args, **kwargs)
            return object.__new__(cls)
        local_cls.__new__ = staticmethod(__new__)
        return local_cls
    return decorate
