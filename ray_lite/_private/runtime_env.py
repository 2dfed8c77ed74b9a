"""``runtime_env`` on one machine: ``env_vars`` only.

The job's variables (``init(runtime_env=...)``) are set in every worker and
actor process when it starts; an actor's own are set in its process before
its constructor runs; a task's own are set around each run of the task in
the pool worker that runs it, and put back afterwards (pool workers are
shared by every task).  Every other key (``pip``, ``working_dir``,
``conda``, ...) installs or ships something, which a single-machine runtime
does not do: it is refused by name rather than ignored.
"""
import os

from ray_lite._lazy import lazy_module

from .shipping import ship, unship

inspect = lazy_module("inspect", globals())


def env_vars_of(runtime_env, where="runtime_env"):
    """The ``env_vars`` of ``runtime_env`` (a dict, or None); other keys refused."""
    if runtime_env is None:
        return None
    if not isinstance(runtime_env, dict):
        raise TypeError(f"{where} must be a dict, got {type(runtime_env).__name__}")
    other = sorted(k for k in runtime_env if k != "env_vars")
    if other:
        raise ValueError(f"ray_lite supports only 'env_vars' in {where}; it does not support "
                         f"{', '.join(map(repr, other))} (single machine runtime: nothing "
                         f"is installed or shipped)")
    env = runtime_env.get("env_vars")
    if env is None:
        return None
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                            for k, v in env.items()):
        raise TypeError(f"{where}['env_vars'] must be a dict of str to str, got {env!r}")
    return dict(env) or None


class _Environment:
    """Sets variables, and puts the previous values back on exit."""

    __slots__ = ("env", "saved")

    def __init__(self, env):
        self.env = env

    def __enter__(self):
        self.saved = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)

    def __exit__(self, *exc):
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
