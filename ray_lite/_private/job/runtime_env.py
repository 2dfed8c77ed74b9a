"""``runtime_env`` on one machine: ``env_vars``, ``config`` (checked; nothing
to set up) and the job's ``worker_process_setup_hook``.

The job's variables (``init(runtime_env=...)``) are set in every worker and
actor process when it starts; an actor's own are set in its process before
its constructor runs; a task's own are set around each run of the task in
the pool worker that runs it, and put back afterwards (pool workers are
shared by every task).  The job's setup hook (a function, or a module path
``"pkg.mod.fn"``) runs in every worker and actor process of the job before
it runs anything (``worker._set_up_for_the_job``).  Every other key (``pip``, ``working_dir``,
``conda``, ...) installs or ships something, which a single-machine runtime
does not do: it is refused by name rather than ignored.
"""
import contextvars
import os

from ray_lite._lazy import lazy_module

from ..objects.shipping import ship, unship

inspect = lazy_module("inspect", globals())


# Keys that ask for nothing to be installed or shipped.  ``config`` (setup
# timeout, eager install) is checked and has nothing to set up here.
_HONOURED = ("env_vars", "config")
SETUP_HOOK = "worker_process_setup_hook"


def env_vars_of(runtime_env, where="runtime_env", job=False):
    """The ``env_vars`` of ``runtime_env`` (a dict, a ``RuntimeEnv``, or
    None); keys that install or ship something refused by name.  ``job``:
    the job's (``init``), where ``worker_process_setup_hook`` is allowed too
    (``setup_hook_of`` reads it)."""
    if runtime_env is None:
        return None
    if not isinstance(runtime_env, dict):
        raise TypeError(f"{where} must be a dict, got {type(runtime_env).__name__}")
    honoured = _HONOURED + (SETUP_HOOK,) if job else _HONOURED
    other = sorted(k for k in runtime_env if k not in honoured)
    if SETUP_HOOK in other:
        # As in Ray: the hook is the job's, set up once per worker process.
        raise ValueError(f"{SETUP_HOOK} is only supported in the job's runtime_env "
                         f"(init(runtime_env=...)), not in {where}")
    if other:
        raise ValueError(f"ray_lite supports only 'env_vars', 'config' and (in init) "
                         f"'{SETUP_HOOK}' in {where}; it does not support "
                         f"{', '.join(map(repr, other))} (single machine runtime: nothing "
                         f"is installed or shipped)")
    if runtime_env.get("config") is not None:
        from .runtime_env_spec import RuntimeEnvConfig
        RuntimeEnvConfig.parse_and_validate_runtime_env_config(runtime_env["config"])
    env = runtime_env.get("env_vars")
    if env is None:
        return None
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                            for k, v in env.items()):
        raise TypeError(f"{where}['env_vars'] must be a dict of str to str, got {env!r}")
    return dict(env) or None


def setup_hook_of(runtime_env):
    """The job's ``worker_process_setup_hook`` as it travels to the workers:
    ``("module", "pkg.mod.fn")`` for a module path, ``("blob", bytes)`` for a
    function (cloudpickle, loaded in each worker); None without one."""
    hook = (runtime_env or {}).get(SETUP_HOOK)
    if hook is None:
        return None
    if isinstance(hook, str):
        if "." not in hook:
            raise ValueError(f"{SETUP_HOOK} {hook!r} is not a module path: give "
                             f"'package.module.function'")
        return ("module", hook)
    if not callable(hook):
        raise TypeError(f"{SETUP_HOOK} must be a function or a module path (str), got "
                        f"{type(hook)}.")
    try:
        return ("blob", ship(hook))
    except Exception as exc:    # noqa: BLE001 - cloudpickle's many errors
        raise TypeError(f"Cannot serialize the {SETUP_HOOK} {getattr(hook, '__name__', hook)!r}: "
                        f"{type(exc).__name__}: {exc}") from exc


def run_setup_hook(hook):
    """Run the job's setup hook in this worker process (before it runs any
    task or constructor); None, or the error text naming the hook."""
    import importlib
    import traceback
    kind, what = hook
    shown = what if kind == "module" else "function"
    try:
        if kind == "module":
            module, _, name = what.rpartition(".")
            fn = getattr(importlib.import_module(module), name)
        else:
            fn = unship(what)
            shown = getattr(fn, "__qualname__", shown)
        fn()
        return None
    except Exception:   # noqa: BLE001 - reported to every caller of this process
        return (f"Failed to execute the {SETUP_HOOK} {shown} from "
                f"init(runtime_env={{'{SETUP_HOOK}': ...}}):\n{traceback.format_exc()}")


# The env_vars of the task running now in a pool worker (its own runtime_env).
_task_env_vars = contextvars.ContextVar("ray_lite_task_env_vars", default=None)


def process_runtime_env(spec):
    """The runtime_env a worker process runs with (its spawn ``spec``: the
    job's env_vars, with an actor's own; the job's setup hook), as
    ``get_runtime_context().get_runtime_env_string()`` reports it."""
    env = {}
    if spec.get("env_vars"):
        env["env_vars"] = dict(spec["env_vars"])
    hook = spec.get("setup_hook")
    if hook is not None:
        env[SETUP_HOOK] = hook[1] if hook[0] == "module" else "<function>"
    return env


def runtime_env_string(base):
    """``base`` (the process's runtime_env) with the running task's own
    env_vars, as JSON (Ray's ``get_runtime_env_string``)."""
    import json
    task_env = _task_env_vars.get()
    if task_env:
        base = dict(base, env_vars={**(base.get("env_vars") or {}), **task_env})
    return json.dumps(base, sort_keys=True)


class _Environment:
    """Sets variables, and puts the previous values back on exit."""

    __slots__ = ("env", "saved", "token")

    def __init__(self, env):
        self.env = env

    def __enter__(self):
        self.saved = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)
        self.token = _task_env_vars.set(self.env)

    def __exit__(self, *exc):
        try:
            _task_env_vars.reset(self.token)
        except ValueError:      # a generator resumed in another context: left as is
            pass
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class EnvTask:
    """A task's function run with its ``env_vars`` set (what the worker loads)."""

    def __init__(self, function, env):
        self.function = function
        self.env = env

    def __call__(self, *args, **kwargs):
        fn, env = self.function, self.env
        if inspect.isgeneratorfunction(fn):
            return _gen_in_env(fn, env, args, kwargs)
        if inspect.isasyncgenfunction(fn):
            return _agen_in_env(fn, env, args, kwargs)
        if inspect.iscoroutinefunction(fn):
            return _coro_in_env(fn, env, args, kwargs)
        with _Environment(env):
            return fn(*args, **kwargs)

    def __reduce__(self):
        # The function inside goes as ``ship`` packs it (with its file name
        # for tracebacks).
        return (_rebuild_env_task, (ship(self.function), self.env))


def _rebuild_env_task(blob, env):
    return EnvTask(unship(blob), env)


def _gen_in_env(fn, env, args, kwargs):
    with _Environment(env):
        yield from fn(*args, **kwargs)


async def _agen_in_env(fn, env, args, kwargs):
    with _Environment(env):
        async for item in fn(*args, **kwargs):
            yield item


async def _coro_in_env(fn, env, args, kwargs):
    with _Environment(env):
        return await fn(*args, **kwargs)
