"""Deployment-scoped actors (Ray Serve's ``deployment_actors``).

A deployment may declare actors that all its replicas share (a prefix tree
for cache-aware routing, a rate limiter, a model registry).  The controller
creates them before the deployment's first replica, each under a name fixed
by the application, the deployment, its code version and the actor's own
name (Ray's scheme), so that ``serve.get_deployment_actor(name)`` in a replica
is a ``get_actor`` by that name.  A new code version gets new actors while
the old version's replicas keep theirs; an in-place update (num_replicas,
user_config...) keeps them.  They end with their deployment (deleted,
replaced, or ``serve.shutdown``).

The controller checks each one with ``__ray_ready__`` every
``RAY_SERVE_DEPLOYMENT_ACTOR_HEALTH_CHECK_PERIOD_S`` (10 s) and recreates it
after it died or failed ``..._UNHEALTHY_THRESHOLD`` (3) checks in a row,
each bounded by ``..._TIMEOUT_S`` (30 s): Ray's variables and defaults.  A
handle taken before a recreation points at the dead actor (its calls raise
``RayActorError``): ask ``get_deployment_actor`` again, as in Ray.
"""
import asyncio
import dataclasses
import os
import sys
import uuid

from . import _core, context
from ._defaults import env_number

PREFIX = "SERVE_DEPLOYMENT_ACTOR::"
# Set in a deployment actor's process (Ray's names): get_deployment_actor_context.
ENV_APP = "RAY_SERVE_INTERNAL_DEPLOYMENT_APP_NAME"
ENV_DEPLOYMENT = "RAY_SERVE_INTERNAL_DEPLOYMENT_NAME"
ENV_ACTOR = "RAY_SERVE_INTERNAL_DEPLOYMENT_ACTOR_NAME"
ENV_CODE_VERSION = "RAY_SERVE_INTERNAL_DEPLOYMENT_CODE_VERSION"
_RESERVED_ENV = (ENV_APP, ENV_DEPLOYMENT, ENV_ACTOR, ENV_CODE_VERSION)
# Options the controller sets itself: Ray drops the first two, and its own
# keywords would clash with the last three.
_DROPPED_OPTIONS = ("name", "max_restarts")
_REFUSED_OPTIONS = ("namespace", "lifetime", "get_if_exists")


def health_check_period_s():
    return env_number("RAY_SERVE_DEPLOYMENT_ACTOR_HEALTH_CHECK_PERIOD_S", 10.0, float)


def health_check_timeout_s():
    return env_number("RAY_SERVE_DEPLOYMENT_ACTOR_HEALTH_CHECK_TIMEOUT_S", 30.0, float)


def unhealthy_threshold():
    return env_number("RAY_SERVE_DEPLOYMENT_ACTOR_HEALTH_CHECK_UNHEALTHY_THRESHOLD", 3, int)


class DeploymentActorConfig:
    """One deployment-scoped actor: its ``name`` within the deployment, its
    ``actor_class`` (a ``@ray_lite.remote`` class, or an import path
    ``"module:Class"`` of one), the constructor's ``init_args`` and
    ``init_kwargs``, and ``actor_options`` (``num_cpus``, ``runtime_env``...:
    the deployment's ``runtime_env`` is inherited, its ``env_vars`` merged).
    Ray Serve's fields; checked when made."""

    def __init__(self, *, name, actor_class, init_args=(), init_kwargs=None,
                 actor_options=None):
        if not isinstance(name, str) or not name:
            raise ValueError(f"DeploymentActorConfig: name must be a non-empty string, "
                             f"got {name!r}")
        self.name = name
        self.actor_class = actor_class
        self._resolved = _actor_class(actor_class, name)
        if not isinstance(init_args, (list, tuple)):
            raise TypeError(f"DeploymentActorConfig {name!r}: init_args must be a tuple or "
                            f"list, got {type(init_args).__name__}")
        self.init_args = tuple(init_args)
        if init_kwargs is not None and not isinstance(init_kwargs, dict):
            raise TypeError(f"DeploymentActorConfig {name!r}: init_kwargs must be a dict, "
                            f"got {type(init_kwargs).__name__}")
        self.init_kwargs = dict(init_kwargs or {})
        if actor_options is not None and not isinstance(actor_options, dict):
            raise TypeError(f"DeploymentActorConfig {name!r}: actor_options must be a dict, "
                            f"got {type(actor_options).__name__}")
        self.actor_options = dict(actor_options or {})
        clash = sorted(k for k in self.actor_options if k in _REFUSED_OPTIONS)
        if clash:
            raise ValueError(f"DeploymentActorConfig {name!r}: actor_options may not set "
                             f"{', '.join(clash)} (Serve names and owns the actor)")
        env_vars = (self.actor_options.get("runtime_env") or {}).get("env_vars") or {}
        _check_env_vars(env_vars)

    def get_actor_class(self):
        """The actor class (imported, when given as a path)."""
        return self._resolved

    def _key(self):
        return (self.name, self.actor_class, self.init_args, self.init_kwargs,
                self.actor_options)

    def __eq__(self, other):
        return isinstance(other, DeploymentActorConfig) and self._key() == other._key()

    __hash__ = None

    def __repr__(self):
        return f"DeploymentActorConfig(name={self.name!r}, actor_class={self.actor_class!r})"


def _actor_class(actor_class, name):
    from ray_lite.actor import ActorClass
    target = actor_class
    if isinstance(actor_class, str):
        from ._options import import_attr
        target = import_attr(actor_class, None, f"DeploymentActorConfig {name!r}: actor_class")
    if not isinstance(target, ActorClass):
        raise TypeError(f"DeploymentActorConfig {name!r}: actor_class must be a "
                        f"@ray.remote actor class or an import path of one, got {target!r}")
    return target


def _check_env_vars(env_vars):
    taken = sorted(k for k in env_vars if k in _RESERVED_ENV)
    if taken:
        raise ValueError("Users may not set reserved Ray Serve deployment actor context "
                         "env vars: " + ", ".join(taken))     # Ray's words


def check(value):
    """``deployment_actors`` as given (a list of configs or of dicts with their
    fields) -> a list of ``DeploymentActorConfig``; errors name the problem."""
    if value is None:
        return None
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"deployment_actors must be a list of DeploymentActorConfig, "
                        f"got {type(value).__name__}")
    configs = []
    for item in value:
        if isinstance(item, dict):
            item = DeploymentActorConfig(**item)
        elif not isinstance(item, DeploymentActorConfig):
            raise TypeError(f"deployment_actors: each item must be a DeploymentActorConfig "
                            f"or a dict of its fields, got {type(item).__name__}")
        configs.append(item)
    names = [c.name for c in configs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"deployment_actors: names must be unique within the deployment; "
                         f"repeated: {', '.join(twice)}")
    return configs


def pickled(configs):
    """``configs`` pickled for the controller, each actor class's module by
    value (as Ray does): neither the controller nor the actor's process need
    import it (a config file's application folder is only on this process's
    ``sys.path``; an actor class's methods would otherwise go by reference,
    through the class's read-through attributes)."""
    return dumps_by_value(configs, [c.get_actor_class() for c in configs])


def dumps_by_value(obj, owners):
    """``obj`` pickled with the modules that define ``owners`` by value (those
    registered so already, by the program, stay registered)."""
    import cloudpickle
    registered = getattr(cloudpickle.cloudpickle, "_PICKLE_BY_VALUE_MODULES", set())
    added = []
    for owner in owners:
        module = sys.modules.get(getattr(owner, "__module__", None) or "")
        if module is not None and module.__name__ != "__main__" and \
                module.__name__ not in registered and module not in added:
            cloudpickle.register_pickle_by_value(module)
            added.append(module)
    try:
        return cloudpickle.dumps(obj)
    finally:
        for module in added:
            cloudpickle.unregister_pickle_by_value(module)


def actor_name(app_name, deployment_name, code_version, name):
    """The name the controller gives the actor (Ray's scheme)."""
    return f"{PREFIX}{app_name}::{deployment_name}::{code_version}::{name}"


def new_code_version():
    """The id of a new version of a deployment (each gets its own actors)."""
    return uuid.uuid4().hex[:12]


# ------------------------------------------------------------ in the processes
@dataclasses.dataclass
class DeploymentActorContext:
    """What ``serve.get_deployment_actor_context()`` returns in a deployment actor."""
    deployment_id: context.DeploymentID
    actor_name: str
    code_version: str = None

    @property
    def app_name(self):
        return self.deployment_id.app_name

    @property
    def deployment(self):
        return self.deployment_id.name


def get_deployment_actor(actor_name_):
    """A handle to the running replica's deployment-scoped actor ``actor_name_``
    (RayServeException outside a replica; ValueError when no such actor runs)."""
    from .exceptions import RayServeException
    ctx = context._replica_context
    if ctx is None:
        raise RayServeException("`serve.get_deployment_actor()` may only be called from "
                                "within a Ray Serve deployment replica.")
    dep = ctx.replica_id.deployment_id
    return _core.get_actor(actor_name(dep.app_name, dep.name, ctx.code_version, actor_name_),
                           namespace=context.SERVE_NAMESPACE)


def get_deployment_actor_context():
    """The deployment actor this code runs in (RayServeException elsewhere)."""
    from .exceptions import RayServeException
    env = os.environ
    if not all(k in env for k in (ENV_APP, ENV_DEPLOYMENT, ENV_ACTOR)):
        raise RayServeException("`serve.get_deployment_actor_context()` may only be called "
                                "from within a Ray Serve deployment actor.")
    return DeploymentActorContext(context.DeploymentID(env[ENV_DEPLOYMENT], env[ENV_APP]),
                                  env[ENV_ACTOR], env.get(ENV_CODE_VERSION))


# ---------------------------------------------------------- in the controller
class DeploymentActors:
    """The controller's part (a base of ``ServeController``, whose ``_task``
    and ``_kill`` these use): each deployment's ``actors`` (name -> handle),
    made from ``spec["actors_blob"]``."""

    async def _start_deployment_actors(self, dep):
        """Create ``dep``'s actors and wait until each is ready; None, or the
        first error (the deployment then fails, naming the actor)."""
        blob = dep.spec.get("actors_blob")
        if not blob:
            return None
        import cloudpickle
        try:
            dep.actor_configs = {c.name: c for c in cloudpickle.loads(blob)}
        except Exception as exc:   # noqa: BLE001 - its class does not import here
            return RuntimeError(f"the deployment actors could not be loaded: {exc!r}")
        cfg = None
        try:
            for cfg in dep.actor_configs.values():
                dep.actors[cfg.name] = self._create_deployment_actor(dep, cfg)
        except Exception as exc:   # noqa: BLE001 - bad options: the deploy fails with it
            return RuntimeError(f"deployment actor {cfg.name!r} could not be created: {exc}")
        names = list(dep.actors)
        results = await asyncio.gather(*[dep.actors[n].__ray_ready__.remote() for n in names],
                                       return_exceptions=True)
        for name, result in zip(names, results):
            if isinstance(result, BaseException):
                return RuntimeError(f"deployment actor {name!r} failed to start: {result}")
        for name in names:
            self._task(dep, self._watch_deployment_actor(dep, name))
        return None

    def _create_deployment_actor(self, dep, cfg):
        opts = {k: v for k, v in cfg.actor_options.items() if k not in _DROPPED_OPTIONS}
        inherited = (dep.config.get("ray_actor_options") or {}).get("runtime_env") or {}
        own = opts.pop("runtime_env", None) or {}
        env_vars = {**(inherited.get("env_vars") or {}), **(own.get("env_vars") or {}),
                    ENV_APP: dep.app, ENV_DEPLOYMENT: dep.name, ENV_ACTOR: cfg.name,
                    ENV_CODE_VERSION: dep.code_version}
        cls = cfg.get_actor_class().options(
            name=actor_name(dep.app, dep.name, dep.code_version, cfg.name),
            # Detached: a restarted controller takes them over (see _controller).
            namespace=context.SERVE_NAMESPACE, get_if_exists=True, max_restarts=0,
            lifetime="detached",
            runtime_env={**inherited, **own, "env_vars": env_vars}, **opts)
        return cls.remote(*cfg.init_args, **cfg.init_kwargs)

    async def _watch_deployment_actor(self, dep, name):
        """Check the actor every period; recreate it once it died or failed
        too many checks (cancelled with the deployment's other tasks)."""
        from ray_lite.exceptions import RayActorError
        failures = 0
        while True:
            await asyncio.sleep(health_check_period_s())
            h = dep.actors.get(name)
            if h is None:
                return
            try:
                await asyncio.wait_for(h.__ray_ready__.remote(), health_check_timeout_s())
                failures = 0
                continue
            except asyncio.CancelledError:
                raise
            except RayActorError as exc:
                failures, why = unhealthy_threshold(), f"died ({exc.__class__.__name__})"
            except BaseException as exc:   # noqa: BLE001 - slow, or its check failed
                failures += 1
                why = f"failed {failures} health checks in a row (last: {exc!r})"
            if failures < unhealthy_threshold():
                continue
            print(f"Serve: deployment actor {name!r} of {dep.app}/{dep.name} {why}; "
                  f"recreating it", file=sys.stderr, flush=True)
            self._kill(h)
            await self._recreate_deployment_actor(dep, name)
            failures = 0

    async def _recreate_deployment_actor(self, dep, name):
        delay = 0.1
        while dep.actors.get(name) is not None:
            try:
                # (get_if_exists gives the old actor until its process has
                # ended, a killed hung one taking a moment: its check then
                # fails and the loop tries again.)
                h = dep.actors[name] = self._create_deployment_actor(dep,
                                                                     dep.actor_configs[name])
                await h.__ray_ready__.remote()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:   # noqa: BLE001 - its constructor fails: try again later
                dep.message = f"deployment actor {name!r} failed to restart: {exc}"
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    def _stop_deployment_actors(self, dep):
        actors, dep.actors = dep.actors, {}
        for h in actors.values():
            self._kill(h)

