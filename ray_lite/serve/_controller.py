"""The Serve controller: an async actor that owns applications, replicas and proxies.

It creates replicas (actors of ``ServeReplica``), keeps ``num_replicas`` of
each deployment alive (one ``wait_forever`` call per replica fails at once
when the replica's process dies; ``check_health`` runs every
``health_check_period_s``), and publishes every change by bumping a version
that handles and proxies long-poll (``listen_*``).  A change is only
reported done to ``serve.run``/``delete`` once every proxy has applied it, so
that HTTP sees a new route as soon as ``serve.run`` returns.

Nothing on a request's path needs the controller: proxies and handles route
with the replica sets they last heard of.  The controller is a restartable
actor; each change is checkpointed (``_controller_checkpoint``), and a
restarted controller recovers the applications, replicas and proxies from
the checkpoint without restarting any (``_restore``, ``_resume``).

Replicas of a deployment are created together (one request to the driver,
which forks them from the zygote in one go) and each is published as soon
as it is ready: with dozens of replicas the first answers while the last
still starts.
"""
import asyncio
import itertools
import os
import random
import sys

from ray_lite.exceptions import RayActorError

from . import _controller_checkpoint, _core, _defaults, gang
from ._controller_scaling import Autoscaling, from_zero as _from_zero, \
    kept_target as _kept_target
from ._controller_scaling import error_text as _error_text, quiet as _quiet
from ._deployment_actors import DeploymentActors, new_code_version
from ._defaults import LISTEN_TIMEOUT_S
from ._listen import check_free

# With direct ingress, the proxies stop accepting while this many replicas
# listen (see ServeController._proxies_accept).
PROXIES_ASIDE_LISTENERS = 2


class _Dep:
    def __init__(self, app, name, spec):
        self.app = app
        self.name = name
        self.spec = spec                    # cls_blob, args, kwargs, config
        self.config = spec["config"]
        self.replicas = {}                  # replica id -> ActorHandle (RUNNING)
        self.pids = {}                      # replica id -> its process id
        self.starting = 0
        self.starting_handles = {}          # replica id -> handle: not ready yet
        self.start_times = {}               # replica id -> when it was created (loop time)
        self.slow_warner = None             # the task warning of slow constructors
        self.stopping = set()
        self.draining = {}                  # replica id -> handle: ending its requests
        self.target = gang.whole(self, self.config["num_replicas"])  # autoscaling moves it
        self.gang_of = {}                   # replica id -> its gang's ids (gang.py)
        self.ranks = {}                     # replica id -> its rank (starting or in service)
        self.listening = set()              # replica ids taking HTTP themselves (direct ingress)
        self.autoscaler = None              # the task sampling its load, when it autoscales
        self.waiting = {}                   # caller key -> requests it holds (see _demand)
        self.status = "UPDATING"
        self.message = ""
        self.tasks = set()
        self.code_version = new_code_version()  # names its deployment actors
        self.actors = {}                    # deployment actor name -> ActorHandle
        self.actor_configs = {}             # name -> DeploymentActorConfig
        # While a redeploy brings this one up: the deployment it replaces,
        # which serves until this one has a replica (see ``_serving``).
        self.predecessor = None


class _App:
    def __init__(self, name, route_prefix, ingress):
        self.name = name
        self.route_prefix = route_prefix
        self.ingress = ingress
        self.deps = {}
        self.status = "DEPLOYING"
        self.message = ""
        self.recovered = None   # while a restarted controller completes it: a future


class ServeController(Autoscaling, DeploymentActors):
    def __init__(self, http_options):
        from . import context
        self._self_handle = _core.get_actor(context.CONTROLLER_NAME,
                                            namespace=context.SERVE_NAMESPACE)
        context.set_controller(self._self_handle)
        self.http_options = dict(http_options or {})
        self.apps = {}
        self.version = 0
        self.waiters = []
        self.proxies = []                   # ActorHandles, by index
        self.proxy_pids = []                # their process ids
        self.proxy_watchers = set()         # tasks: one per proxy (and the store's)
        self.proxy_versions = {}            # proxy index -> version applied
        self.proxy_waiters = []
        self._proxies_aside = False         # the proxies told to stop accepting (direct ingress)
        self.http_port = None
        self.next_id = 1                    # of the next replica (``name#id``)
        self.shutting_down = False
        self._replica_cls = None
        self._proxies_started = None        # the task starting them (its result: the port)
        self._store = _controller_checkpoint.find_store()
        self._save_scheduled = False        # a checkpoint is due at the end of this turn
        self._specs_changed = {}            # app name -> its specs, not yet saved
        self._specs_dropped = set()         # apps deleted since the last save
        if self._store is not None:
            self._recover()
            self._watch_store(self._store)

    def _recover(self):
        """Take over from the controller that died, if one did (its checkpoint).
        Never raises: a constructor that failed would be restarted at once,
        again and again."""
        try:
            saved = _core.get(self._store.load.remote(), timeout=_STORE_LOAD_TIMEOUT_S)
            if saved is not None:
                self._restore(*saved)
            else:
                # A first start; or a restart of one that died before its first
                # save, whose replicas (if any) nobody would route to.
                self._kill_untracked()
        except Exception as exc:   # noqa: BLE001 - Serve starts empty, saying so
            import traceback
            print(f"Serve: the controller could not recover its state ({exc!r}); the "
                  f"applications that ran are not managed any more:\n"
                  f"{traceback.format_exc()}", file=sys.stderr, flush=True)
            self.apps, self.proxies, self.proxy_pids = {}, [], []

    # ------------------------------------------------------------ versions
    def _bump(self):
        self.version += 1
        self._save()
        waiters, self.waiters = self.waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def _changed(self, known, timeout):
        if self.version != known:
            return
        fut = asyncio.get_running_loop().create_future()
        self.waiters.append(fut)
        try:
            await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            pass

    def _dep(self, app_name, dep_name):
        app = self.apps.get(app_name)
        return app.deps.get(dep_name) if app is not None else None

    def _dep_snapshot(self, app_name, dep_name):
        dep = self._dep(app_name, dep_name)
        if dep is None:
            return (self.version, False, [], {})
        cfg = dep.config
        auto = cfg.get("autoscaling_config")
        return (self.version, True, list(_serving(dep).values()),
                {"max_ongoing_requests": cfg["max_ongoing_requests"],
                 "max_queued_requests": cfg["max_queued_requests"],
                 "autoscaling": bool(auto), "from_zero": _from_zero(auto)})

    async def listen_deployment(self, app_name, dep_name, known_version):
        await self._changed(known_version, LISTEN_TIMEOUT_S)
        return self._dep_snapshot(app_name, dep_name)

    async def wait_replicas(self, app_name, dep_name, known_version,
                            timeout_s=_defaults.WAIT_REPLICAS_TIMEOUT_S, held=False, dead=()):
        """A snapshot with at least one replica (or the deployment gone), or after
        timeout.  A deployment scaled to zero starts one; a caller that can
        hold its call (``held``) gets the snapshot at once, without a replica.
        ``dead``: the actor IDs of replicas the caller knows died, which do
        not count (this controller may not have heard of their death yet)."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        dead = frozenset(dead)
        dep = self._dep(app_name, dep_name)
        if dep is not None and not _serving(dep):
            self._cold_start(dep)
        while True:
            snap = self._dep_snapshot(app_name, dep_name)
            dep = self._dep(app_name, dep_name)
            # A deployment whose deploy failed starts none: the caller is
            # told at once (DeploymentUnavailableError), as in Ray.
            failed = dep is not None and dep.status == "DEPLOY_FAILED" and not dep.starting
            live = [h for h in snap[2] if _core.actor_id(h) not in dead] if dead else snap[2]
            if live or not snap[1] or loop.time() >= end or failed or \
                    (held and snap[3]["from_zero"]):
                if not snap[1]:
                    from .exceptions import RayServeException
                    raise RayServeException(f"Deployment {dep_name!r} of application "
                                            f"{app_name!r} does not exist")
                return snap
            await self._changed(self.version, end - loop.time())

    def _routes(self):
        routes = {}
        for app in self.apps.values():
            if app.route_prefix is None or app.status == "DELETING":
                continue
            dep = app.deps.get(app.ingress)
            replicas = _serving(dep) if dep is not None else None
            if dep is None or (app.status == "DEPLOYING" and not replicas):
                # Replicas join as they become ready: the route appears with
                # the ingress's first one (until then: 404, not 503).
                continue
            cfg = dep.config
            auto = cfg.get("autoscaling_config")
            # Each proxy gets the whole max_queued_requests and enforces it on
            # its own queue: Ray Serve's limit is per caller (each proxy or
            # DeploymentHandle), not one shared count.
            routes[app.route_prefix] = (app.name, app.ingress, list(replicas.values()),
                                        cfg["max_ongoing_requests"], cfg["max_queued_requests"],
                                        cfg.get("multiplexed", False), bool(auto),
                                        _from_zero(auto), cfg.get("backpressure_config"))
        return routes

    async def listen_routes(self, proxy_index, known_version):
        """``(version, routes, accept)`` once the version differs from
        ``known_version`` (or after a while): what a proxy, or a replica's
        listener, routes by; ``accept``: whether a proxy takes new
        connections (``_proxies_accept``)."""
        if known_version >= 0:
            self.proxy_versions[proxy_index] = max(self.proxy_versions.get(proxy_index, -1),
                                                   known_version)
            self._wake_proxy_waiters()
            self._proxies_accept()      # (a listener's first call may change it)
        await self._changed(known_version, LISTEN_TIMEOUT_S)
        accept = self._proxies_accept()     # (before the version: a change bumps it)
        return (self.version, self._routes(), accept)

    def _proxies_accept(self):
        """Whether the proxies take new connections.  With direct ingress
        they step aside while at least two replicas listen (``_listeners``):
        a connection a proxy takes pays a hop the replicas' own do not, and
        with every listener on the port the kernel gave the proxy its share
        of them.  Two, so that one listener dying leaves another taking
        connections while the proxies come back (a planned stop waits for
        them: ``_stop_replicas``, ``_drain_one``).  A change bumps the
        version, which the proxies apply before they say so."""
        aside = bool(self.http_options.get("direct_ingress")) and \
            self._listeners() >= PROXIES_ASIDE_LISTENERS
        if aside != self._proxies_aside:
            self._proxies_aside = aside
            self._bump()
        return not aside

    def _listeners(self):
        """How many replicas listen now: in service, chosen to listen, and
        routing (their listener's route loop has run, which it starts after
        its server)."""
        n = 0
        for app in self.apps.values():
            if app.status == "DELETING":
                continue
            for dep in app.deps.values():
                for rid in dep.listening:
                    if rid in dep.replicas and f"direct:{rid}" in self.proxy_versions:
                        n += 1
        return n

    def _caught_up_keys(self):
        """Whose routes a change waits for: every proxy, and with direct
        ingress every live replica that listens (``direct:<replica id>``)."""
        keys = list(range(len(self.proxies)))
        direct = [k for k in self.proxy_versions if type(k) is str]
        if direct:
            live = {f"direct:{rid}" for app in self.apps.values()
                    for dep in app.deps.values() for rid in dep.replicas}
            for k in direct:
                if k in live:
                    keys.append(k)
                elif not any(k == f"direct:{rid}" for app in self.apps.values()
                             for dep in app.deps.values() for rid in dep.starting_handles):
                    del self.proxy_versions[k]      # (a replica gone)
        return keys

    def _wake_proxy_waiters(self):
        waiters, self.proxy_waiters = self.proxy_waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def _proxies_caught_up(self, timeout=_defaults.PROXIES_CAUGHT_UP_TIMEOUT_S):
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        target = self.version
        while any(self.proxy_versions.get(i, -1) < target for i in self._caught_up_keys()):
            if loop.time() >= end:
                print(f"Serve: proxies did not apply version {target} in {timeout} s "
                      f"(they are at {self.proxy_versions})", file=sys.stderr, flush=True)
                return False
            fut = loop.create_future()
            self.proxy_waiters.append(fut)
            try:
                await asyncio.wait_for(fut, end - loop.time())
            except asyncio.TimeoutError:
                return False
        return True

    # -------------------------------------------------------------- proxies
    async def start_proxies(self, http_options):
        if self._proxies_started is None:
            self._proxies_started = asyncio.ensure_future(self._start_proxies(http_options))
        try:
            return await asyncio.shield(self._proxies_started)
        except BaseException:
            if self._proxies_started.done():
                self._proxies_started = None    # failed: a later call tries again
            raise

    async def _start_proxies(self, http_options):
        from ._proxy import ProxyActor
        opts = dict(self.http_options)
        opts.update(http_options or {})
        from ._direct import direct_ingress_on
        # The mode as decided here, whatever a proxy's or replica's
        # environment says.  Direct ingress: the ingress replicas listen
        # too; one proxy answers while none does (see _direct).
        opts["direct_ingress"] = direct = direct_ingress_on(opts)
        self.http_options = opts
        n = int(opts.get("proxies") or opts.get("num_proxies") or 0) or (
            1 if direct else _default_proxies())
        asked = opts.get("port", _defaults.HTTP_PORT)
        if asked:
            # A port another program holds fails here, with its address (the
            # first proxy checks again: it may be taken meanwhile).
            check_free(opts.get("host", _defaults.HTTP_HOST), asked)
        actor_cls = _proxy_class(ProxyActor)
        # The first proxy binds the port (it picks one if asked for port 0);
        # the others then share it and start together.
        first = actor_cls.remote(self._self_handle, 0, dict(opts, port=asked))
        started = [first]
        try:
            port = await first.start.remote()
            started += [actor_cls.remote(self._self_handle, i, dict(opts, port=port))
                        for i in range(1, n)]
            await asyncio.gather(*[h.start.remote() for h in started[1:]])
        except BaseException:
            for h in started:
                self._kill(h)
            raise
        self.proxies = started
        self.proxy_pids = list(await asyncio.gather(*[h.pid.remote() for h in started]))
        self.http_port = port
        self._save()
        for i, h in enumerate(started):
            self._watch_proxy(i, h)
        await self._proxies_caught_up()
        return port

    def _watch_proxy(self, index, h):
        t = asyncio.ensure_future(self._replace_proxy_when_dead(index, h))
        self.proxy_watchers.add(t)
        t.add_done_callback(self.proxy_watchers.discard)

    async def _replace_proxy_when_dead(self, index, h):
        try:
            await h.wait_forever.remote()
        except asyncio.CancelledError:
            raise
        except BaseException:   # noqa: BLE001 - it died (the core saw its process end)
            pass
        from ._proxy import ProxyActor
        delay = 0.1
        # (When the runtime stops, the driver tells every process to exit at
        # once: this controller may see its proxies go before it goes.)
        while not self.shutting_down and not _core.runtime_stopping() and \
                index < len(self.proxies) and self.proxies[index] is h:
            print(f"Serve: HTTP proxy {index} died; starting a replacement on port "
                  f"{self.http_port}", file=sys.stderr, flush=True)
            new = _proxy_class(ProxyActor).remote(
                self._self_handle, index,
                dict(self.http_options, port=self.http_port, replacing=True))
            try:
                await new.start.remote()
                pid = await new.pid.remote()
            except Exception as exc:   # noqa: BLE001 - the port was taken meanwhile, say
                print(f"Serve: the replacement of HTTP proxy {index} failed: {exc!r}",
                      file=sys.stderr, flush=True)
                self._kill(new)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            if self.shutting_down or self.proxies[index] is not h:
                self._kill(new)
                return
            self.proxies[index] = new
            self.proxy_pids[index] = pid
            self._watch_proxy(index, new)
            self._save()
            return

    async def http_address(self):
        return (self.http_options.get("host", _defaults.HTTP_HOST), self.http_port)

    async def direct_ingress(self, app_name, dep_name, rid):
        """The HTTP options (with the port) ingress replica ``rid`` of
        ``app_name`` listens with in direct-ingress mode; None when it does
        not listen: not the ingress, not direct ingress, or as many of its
        deployment's replicas listen as ``direct_ingress_listeners`` says
        (the others stand by: ``_top_up_listeners``)."""
        app = self.apps.get(app_name)
        if app is None or app.ingress != dep_name or app.route_prefix is None or \
                self._proxies_started is None:
            return None
        port = await asyncio.shield(self._proxies_started)
        dep = app.deps.get(dep_name)
        if dep is None or not self._direct_ingress_of(dep):
            return None
        if rid not in dep.ranks or len(dep.listening) >= self._listener_cap():
            return None
        dep.listening.add(rid)
        self._save()
        return dict(self.http_options, port=port)

    def _direct_ingress_of(self, dep):
        """Whether ``dep`` takes HTTP itself: direct ingress is on and it is
        the ingress deployment, in service, of an application with a route."""
        from ._direct import direct_ingress_on
        app = self.apps.get(dep.app)
        return (not self.shutting_down and app is not None and app.deps.get(dep.name) is dep
                and app.ingress == dep.name and app.route_prefix is not None
                and self._proxies_started is not None
                and direct_ingress_on(self.http_options))

    def _listener_cap(self):
        """How many replicas of an ingress deployment listen at most: the
        HTTP option ``direct_ingress_listeners``, by default the cores.  More
        listeners than cores only spread the connections thinner: each is
        woken for fewer requests, and every wake-up costs."""
        n = self.http_options.get("direct_ingress_listeners")
        return int(n) if n else _cores()

    def _top_up_listeners(self, dep):
        """After a listener left (it died, stopped or was drained): the
        replicas in service with the lowest ranks that stand by start
        listening, up to ``_listener_cap``."""
        if not self._direct_ingress_of(dep) or not self._proxies_started.done():
            return
        dep.listening &= set(dep.ranks)         # (a rank: starting or in service)
        room = self._listener_cap() - len(dep.listening)
        if room <= 0:
            return
        standby = sorted((dep.ranks.get(rid, 1 << 30), rid) for rid in dep.replicas
                         if rid not in dep.listening and rid not in dep.stopping)
        for _, rid in standby[:room]:
            dep.listening.add(rid)
            self._task(dep, self._start_listening(dep, rid, dep.replicas[rid]))
        self._save()

    async def _start_listening(self, dep, rid, h):
        try:
            port = await asyncio.shield(self._proxies_started)
            if await h.listen_direct.remote(dict(self.http_options, port=port)):
                return
        except Exception as exc:   # noqa: BLE001 - it died (its watcher replaces it), or could not bind
            print(f"Serve: replica {rid} of {dep.app}/{dep.name} could not start listening: "
                  f"{_error_text(exc)}", file=sys.stderr, flush=True)
        dep.listening.discard(rid)

    # ------------------------------------------------------------- replicas
    def _replica_class(self):
        if self._replica_cls is None:
            from ._replica import ServeReplica
            self._replica_cls = _core.remote(ServeReplica)
        return self._replica_cls

    async def _bring_up(self, dep, n):
        """Start ``n`` replicas of ``dep``; the errors of those that failed.

        All are created with one request to the driver; each joins the
        deployment, and is published to handles and proxies, as soon as it is
        ready, so that the first ones serve while the others still start."""
        spec = dep.spec
        cls = self._replica_class()
        rao = dep.config.get("ray_actor_options") or {}
        # env_vars (the app's and its own), and where the replicas may run:
        # a label_selector that matches no node is refused here.
        opts = {k: rao[k] for k in ("runtime_env", "label_selector", "fallback_strategy")
                if rao.get(k)}
        try:
            # Detached: not ended with this process (a restarted controller
            # takes them over), only when killed or when the runtime ends.
            cls = cls.options(lifetime="detached", **opts)
        except ValueError as exc:
            return [_OptionsRefused(str(exc))] * n
        n = gang.whole(dep, n)
        first, self.next_id = self.next_id, self.next_id + n
        rids = [f"{dep.name}#{i}" for i in range(first, first + n)]
        gang_contexts, gangs = gang.form(dep, rids)
        # Ray's ranks: the smallest ones no live replica holds (a replacement
        # takes its predecessor's), out of a world the size of the target.
        taken = set(dep.ranks.values())
        free = (r for r in itertools.count() if r not in taken)
        for rid in rids:
            dep.ranks[rid] = next(free)
        world = max(dep.target, len(dep.ranks))
        errors = []
        dep.starting += n
        try:
            handles = _core.create_actors(cls, [
                ((self._self_handle, dep.app, dep.name, rid, spec["cls_blob"], spec["args"],
                  spec["kwargs"], dict(dep.config, code_version=dep.code_version,
                                       gang_context=gang_contexts.get(rid)),
                  dep.ranks[rid], world), {}) for rid in rids])
            made = dict(zip(rids, handles))

            async def ready(rid, h):
                try:
                    return await h.ready.remote()
                except Exception as exc:   # noqa: BLE001 - its constructor failed, or it died
                    errors.append(exc)
                finally:
                    dep.starting_handles.pop(rid, None)
                    dep.start_times.pop(rid, None)

            async def join(members):
                """Members (a gang, else one replica) join together or not at all."""
                now = asyncio.get_running_loop().time()
                for rid in members:
                    if isinstance(made[rid], Exception):
                        errors.append(made[rid])
                    else:
                        dep.starting_handles[rid] = made[rid]
                        dep.start_times[rid] = now
                if dep.slow_warner is None and dep.start_times:
                    dep.slow_warner = self._task(dep, self._warn_slow_startups(dep))
                # (Saved so that a restarted controller stops them: they
                # would serve nobody.)
                self._save()
                pids = await asyncio.gather(*[ready(rid, made[rid]) for rid in members
                                              if not isinstance(made[rid], Exception)])
                live = self.apps.get(dep.app) is not None and \
                    self.apps[dep.app].deps.get(dep.name) is dep
                if len(pids) < len(members) or None in pids or not live:
                    for rid in members:
                        dep.ranks.pop(rid, None)
                        dep.listening.discard(rid)
                        if not isinstance(made[rid], Exception):
                            self._kill(made[rid])
                    return
                for rid, pid in zip(members, pids):
                    dep.replicas[rid] = made[rid]
                    dep.pids[rid] = pid
                    if gang_contexts:
                        dep.gang_of[rid] = members
                    self._watch(dep, rid, made[rid])
                self._bump()
            await asyncio.gather(*[join(m) for m in (gangs or [[rid] for rid in rids])])
        finally:
            dep.starting -= n
        return errors

    async def _start_retrying(self, dep, n):
        """Start ``n`` replicas of ``dep``, starting again those that fail, as
        Ray does: its failures to start (constructor or first health check)
        are counted across its replicas, and once they reach
        ``_failed_to_start_threshold`` while none of its replicas has
        started, it gives up.  Once one has started, the others are started
        again until they start.  Returns None, or what ended it: a
        ``_StartFailed`` (or the options' refusal)."""
        threshold = _failed_to_start_threshold(dep)
        failures = 0
        delay = 0.1
        started = bool(dep.replicas)
        while True:
            errors = await self._bring_up(dep, n)
            started = started or bool(dep.replicas)
            if not errors:
                return None
            app = self.apps.get(dep.app)
            if self.shutting_down or app is None or app.deps.get(dep.name) is not dep or \
                    any(isinstance(e, _OptionsRefused) for e in errors):
                return errors[0]
            failures += len(errors)
            text = _error_text(errors[-1])
            if not started and failures >= threshold:
                return _StartFailed(failures, text)
            more = "" if started else f" {threshold - failures} more time(s)"
            dep.message = (f"A replica failed to start with exception. Retrying{more}. "
                           f"Error:\n{text}")
            print(f"Serve: {dep.app}/{dep.name}: {dep.message}", file=sys.stderr, flush=True)
            self._bump()
            n = dep.target - len(dep.replicas) - dep.starting
            if n <= 0:
                return None
            if started:
                # (It may never start: no hurry, it is served meanwhile.)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    @staticmethod
    def _task(dep, coro):
        """Run ``coro`` for ``dep`` (cancelled when the deployment stops)."""
        t = asyncio.ensure_future(coro)
        dep.tasks.add(t)
        t.add_done_callback(dep.tasks.discard)
        return t

    def _watch(self, dep, rid, h):
        self._task(dep, self._watch_replica(dep, rid, h))
        period = dep.config.get("health_check_period_s") or 0
        if period > 0:
            self._task(dep, self._health_loop(dep, rid, h, period))

    async def _watch_replica(self, dep, rid, h):
        try:
            await h.wait_forever.remote()
        except asyncio.CancelledError:
            raise
        except BaseException:
            pass
        await self._replace(dep, rid, h, "died")

    async def _health_loop(self, dep, rid, h, period):
        """Check the replica every ``health_check_period_s`` (jittered, as
        Ray does, so that the checks of many replicas do not come together),
        each check bounded by ``health_check_timeout_s``; after
        ``REPLICA_HEALTH_CHECK_UNHEALTHY_THRESHOLD`` failures in a row it is
        stopped and replaced (``_replace``).  Its death is the watcher's."""
        failures = 0
        while dep.replicas.get(rid) is h:
            await asyncio.sleep(period * random.uniform(0.9, 1.1))
            if dep.replicas.get(rid) is not h:
                return
            # Read each time: a config file may change them in place.
            period = dep.config.get("health_check_period_s") or period
            timeout = dep.config.get("health_check_timeout_s") or \
                _defaults.HEALTH_CHECK_TIMEOUT_S
            try:
                await asyncio.wait_for(h.check_health.remote(), timeout)
                failures = 0
                continue
            except asyncio.CancelledError:
                raise
            except RayActorError:
                return   # the watcher replaces it
            except asyncio.TimeoutError:
                why = f"did not answer its health check within {timeout:g} s"
            except BaseException as exc:   # noqa: BLE001 - the user's check raised
                why = f"failed its health check ({_check_error(exc)})"
            failures += 1
            if failures < REPLICA_HEALTH_CHECK_UNHEALTHY_THRESHOLD:
                print(f"Serve: replica {rid} of {dep.app}/{dep.name} {why}, {failures} "
                      f"time(s) in a row", file=sys.stderr, flush=True)
                continue
            await self._replace(dep, rid, h, f"{why}, {failures} times in a row", stop=True)
            return

    async def _replace(self, dep, rid, h, why, stop=False):
        """Take replica ``rid`` out of service and start its replacement: it
        died, or (``stop``) it failed its health checks and stops as a
        replica taken out of service does (its requests in flight get
        ``graceful_shutdown_timeout_s``, its ``__del__`` runs), as in Ray.
        Until the deployment has all its replicas again, it and its
        application say UNHEALTHY, naming the replica and why."""
        dep.pids.pop(rid, None)
        dep.ranks.pop(rid, None)
        dep.listening.discard(rid)
        if dep.replicas.pop(rid, None) is None or rid in dep.stopping:
            return
        for mate in gang.mates(dep, rid):       # RESTART_GANG: its gang goes with it
            mh = dep.replicas.pop(mate, None)
            if mh is not None:
                dep.pids.pop(mate, None)
                dep.ranks.pop(mate, None)
                dep.listening.discard(mate)
                dep.stopping.add(mate)
                self._kill(mh)
        if stop:
            dep.stopping.add(rid)
            dep.draining[rid] = h
            asyncio.ensure_future(self._drain_one(dep, rid, h))
        self._top_up_listeners(dep)
        app = self.apps.get(dep.app)
        if self.shutting_down or app is None or app.deps.get(dep.name) is not dep:
            self._bump()
            return
        reason = f"replica {rid} {why}"
        print(f"Serve: {dep.app}/{dep.name}: {reason}; starting a replacement",
              file=sys.stderr, flush=True)
        self._set_unhealthy(app, dep, f"{reason}; a replacement is starting")
        self._bump()
        delay = 0.1
        while not self.shutting_down and app.deps.get(dep.name) is dep and \
                self.apps.get(dep.app) is app:
            missing = dep.target - len(dep.replicas) - dep.starting
            if missing <= 0:
                break
            errors = await self._bring_up(dep, missing)
            if not errors:
                break
            self._set_unhealthy(app, dep, f"{reason}; its replacement failed to start: "
                                          f"{_check_error(errors[0])}")
            self._bump()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
        if app.deps.get(dep.name) is dep and self.apps.get(dep.app) is app:
            self._healthy_again(app, dep)
        self._bump()

    @staticmethod
    def _set_unhealthy(app, dep, message):
        dep.status, dep.message = "UNHEALTHY", message
        _app_health(app)

    @staticmethod
    def _healthy_again(app, dep):
        """UNHEALTHY until it runs all its replicas again, as in Ray."""
        if dep.status == "UNHEALTHY" and len(dep.replicas) >= dep.target:
            dep.status, dep.message = "HEALTHY", ""
            _app_health(app)

    def _kill(self, h):
        try:
            _core.kill(h)
        except Exception:   # noqa: BLE001 - already gone
            pass

    async def _stop_replicas(self, dep):
        if dep.listening and not self.shutting_down:
            # Its listeners stop below: the proxies first take connections
            # again, if these were what let them step aside.
            dep.listening.clear()
            self._bump()
            await self._proxies_caught_up()
        dep.status = "DELETING" if dep.status != "DELETING" else dep.status
        items = list(dep.replicas.items()) + list(dep.draining.items())
        dep.stopping.update(rid for rid, _ in items)
        dep.replicas.clear()
        dep.pids.clear()
        for t in list(dep.tasks):
            t.cancel()
        # Those still in their constructor (an ``async def __init__`` that
        # may never end) serve no request: they end now; their bring-up
        # sees them die.
        for h in list(dep.starting_handles.values()):
            self._kill(h)
        dep.starting_handles.clear()
        timeout = dep.config.get("graceful_shutdown_timeout_s") or 0

        async def stop(h):
            if timeout > 0:
                try:
                    await asyncio.wait_for(h.drain.remote(timeout), timeout + 1.0)
                except BaseException:   # noqa: BLE001 - dead or slow: kill it anyway
                    pass
            self._kill(h)
        await asyncio.gather(*[stop(h) for _, h in items])
        self._stop_deployment_actors(dep)       # after the replicas that use them

    # ----------------------------------------------------------------- apps
    async def deploy_app(self, name, route_prefix, ingress, specs):
        """Deploy (or update) application ``name``; returns once it is RUNNING."""
        if self.shutting_down:
            raise RuntimeError("Serve is shutting down")
        recovering = self.apps[name].recovered if name in self.apps else None
        if recovering is not None:
            # A restarted controller completes it (serve.run asks again after
            # the controller died mid-deploy): this deploy starts from there.
            await asyncio.shield(recovering)
        for other in self.apps.values():
            if other.name != name and route_prefix is not None and \
                    other.route_prefix == route_prefix:
                from .exceptions import RayServeException     # Ray's type for it
                raise RayServeException(
                    f"Prefix {route_prefix} is being used by application \"{other.name}\". "
                    f"Failed to deploy application \"{name}\".")
        old = self.apps.get(name)
        app = _App(name, route_prefix, ingress)
        reuse = {}
        failed = {}         # deployment -> its first error
        if old is not None:
            for dname, spec in specs.items():
                od = old.deps.get(dname)
                if od is not None and _same_code(od.spec, spec):
                    reuse[dname] = od
        for dname, spec in specs.items():
            if dname in reuse:
                dep = reuse[dname]
                dep.spec = spec
                new_cfg = spec["config"]
                if new_cfg.get("user_config") != dep.config.get("user_config"):
                    try:
                        await asyncio.gather(*[h.reconfigure.remote(new_cfg.get("user_config"))
                                               for h in dep.replicas.values()])
                    except Exception as exc:   # noqa: BLE001 - its reconfigure raised
                        failed[dep] = exc      # the update failed, as in Ray (below)
                limit = new_cfg["max_ongoing_requests"]
                if limit != dep.config["max_ongoing_requests"]:
                    # Replicas enforce it; proxies and handles learn it
                    # from the routes and snapshots of the new version.
                    await asyncio.gather(*[h.set_max_ongoing_requests.remote(limit)
                                           for h in dep.replicas.values()])
                dep.target = gang.whole(dep, _kept_target(dep, new_cfg))
                dep.config = new_cfg
                app.deps[dname] = dep
            else:
                app.deps[dname] = _Dep(name, dname, spec)
        self.apps[name] = app
        self._specs_changed[name] = {d.name: d.spec for d in app.deps.values()}
        self._specs_dropped.discard(name)
        if old is not None:
            for dname, od in old.deps.items():
                nd = app.deps.get(dname)
                if nd is not None and nd is not od and od.replicas:
                    # Replaced: the old replicas serve until the new ones
                    # can, then stop (before this returns, as in Ray).
                    nd.predecessor = od
                elif nd is not od:
                    asyncio.ensure_future(self._stop_replicas(od))
        new = [d for d in app.deps.values() if d.name not in reuse]
        for dep, err in zip(new, await asyncio.gather(*[self._start_deployment_actors(d)
                                                         for d in new])):
            if err is not None:
                failed[dep] = err     # (its replicas would not find them)
        bring_ups, brought = [], []
        for dep in app.deps.values():
            have = len(dep.replicas) + dep.starting
            if dep in failed:
                continue
            if have < dep.target:
                bring_ups.append(self._start_retrying(dep, dep.target - have))
                brought.append(dep)
            elif len(dep.replicas) > dep.target:
                self._drain_some(dep, len(dep.replicas) - dep.target)
        for dep, err in zip(brought, await asyncio.gather(*bring_ups)):
            if err is not None:
                failed[dep] = err
        replaced = [d.predecessor for d in app.deps.values() if d.predecessor is not None]
        for dep in app.deps.values():
            dep.predecessor = None
        if not failed:
            for dep in app.deps.values():
                dep.status = "HEALTHY"
                dep.message = ""
        if failed:
            msg = _error_text(next(iter(failed.values())))
            app.status = "DEPLOY_FAILED"
            app.message = msg
            await asyncio.gather(*[self._stop_replicas(od) for od in replaced])
            for dep in app.deps.values():
                await self._stop_replicas(dep)
                # As Ray: the deployment that failed says why; the others
                # of the app are stopped with it.
                err = failed.get(dep)
                dep.status = "DEPLOY_FAILED" if err is not None else "UNHEALTHY"
                dep.message = _error_text(err) if err is not None else ""
            self._bump()
            raise RuntimeError(f"Deploying application {name!r} failed:\n{msg}")
        app.status = "RUNNING"
        for dep in app.deps.values():
            if dep.config.get("autoscaling_config") and dep.autoscaler is None:
                dep.autoscaler = self._task(dep, self._autoscale(dep))
        self._bump()
        await self._proxies_caught_up()
        # The replaced replicas stop once no proxy routes to them; their
        # requests in flight get graceful_shutdown_timeout_s.
        await asyncio.gather(*[self._stop_replicas(od) for od in replaced])
        return True

    async def delete_apps(self, names):
        apps = [self.apps[n] for n in names if n in self.apps]
        for app in apps:
            app.status = "DELETING"
        self._bump()
        await self._proxies_caught_up()
        await asyncio.gather(*[self._stop_replicas(d) for app in apps for d in app.deps.values()])
        for app in apps:
            if self.apps.get(app.name) is app:
                del self.apps[app.name]
                self._specs_changed.pop(app.name, None)
                self._specs_dropped.add(app.name)
        self._bump()
        await self._proxies_caught_up()

    async def shutdown(self):
        """Stop everything within the longest ``graceful_shutdown_timeout_s``
        (and a second): the proxies take no new connections, requests in
        flight may end meanwhile, then replicas and proxies are killed."""
        self.shutting_down = True
        for t in list(self.proxy_watchers):
            t.cancel()
        apps = list(self.apps.values())
        for app in apps:
            app.status = "DELETING"
        self._bump()        # the proxies stop routing to them
        deps = [d for app in apps for d in app.deps.values()]
        timeout = max([d.config.get("graceful_shutdown_timeout_s") or 0 for d in deps],
                      default=0)
        proxies, self.proxies, self.proxy_pids = self.proxies, [], []
        self._proxies_started = None
        await asyncio.gather(*[_quiet(asyncio.wait_for(p.stop.remote(timeout), timeout + 1.0))
                               for p in proxies],
                             *[self._stop_replicas(d) for d in deps])
        for p in proxies:
            self._kill(p)
        for app in apps:
            if self.apps.get(app.name) is app:
                del self.apps[app.name]
        self._bump()
        return True

    # ----------------------------------------------- checkpoint and recovery
    def _save(self, everything=False):
        """Send the state a restarted controller recovers from to the store
        (see ``_controller_checkpoint``); called on every change.  The specs
        go with it when they changed (``everything``: all of them).

        The changes of a burst (48 replicas coming up) go in one message at
        the end of the loop's turn: a message per change pickled every
        replica's handle each time: ``serve run`` of 48 replicas took 0.63 s
        against 0.52 s with one message a turn (2-core Xeon VM, 2026-12-05,
        ``ray-lite bench serve --only B10 --quick``).  What a controller
        killed in between had not saved, the next one finds and redoes
        (``_kill_untracked``, ``_complete``)."""
        if self._store is None:
            return
        if everything:
            self._specs_changed = {app.name: {d.name: d.spec for d in app.deps.values()}
                                   for app in self.apps.values()}
        if self._save_scheduled:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._send_checkpoint()
            return
        self._save_scheduled = True
        loop.call_soon(self._send_checkpoint)

    def _send_checkpoint(self):
        self._save_scheduled = False
        specs, self._specs_changed = self._specs_changed, {}
        dropped, self._specs_dropped = self._specs_dropped, set()
        try:
            self._store.save.remote(self._checkpoint(), specs, dropped)
        except Exception as exc:   # noqa: BLE001 - the store is gone: Serve runs on
            if not self.shutting_down and not _core.runtime_stopping():
                print(f"Serve: the controller could not checkpoint its state ({exc!r}); "
                      f"it will not recover this change if it dies", file=sys.stderr,
                      flush=True)

    def _watch_store(self, store):
        """The store is restartable too: when its process dies, a new one starts
        empty and gets the whole state again."""
        async def watch():
            while not self.shutting_down:
                try:
                    await store.wait_forever.remote()
                except asyncio.CancelledError:
                    raise
                except BaseException:   # noqa: BLE001 - it died
                    pass
                if self.shutting_down or _core.runtime_stopping():
                    return
                # (Sent to its new incarnation once the runtime has started it.)
                delay = 0.05
                while not self.shutting_down:
                    try:
                        await store.load.remote()
                        break
                    except Exception:   # noqa: BLE001 - not restarted yet
                        await asyncio.sleep(delay)
                        delay = min(delay * 2, 1.0)
                self._save(everything=True)
        t = asyncio.ensure_future(watch())
        self.proxy_watchers.add(t)
        t.add_done_callback(self.proxy_watchers.discard)

    def _checkpoint(self):
        apps = {}
        for app in self.apps.values():
            deps = {}
            for d in app.deps.values():
                deps[d.name] = {
                    "config": d.config, "replicas": dict(d.replicas), "pids": dict(d.pids),
                    "orphans": list(d.starting_handles.values()) + list(d.draining.values()),
                    "target": d.target, "gang_of": dict(d.gang_of), "ranks": dict(d.ranks),
                    "listening": sorted(d.listening),
                    "status": d.status, "message": d.message,
                    "code_version": d.code_version, "actors": dict(d.actors)}
            apps[app.name] = {"route_prefix": app.route_prefix, "ingress": app.ingress,
                              "status": app.status, "message": app.message, "deps": deps}
        return {"version": self.version, "next_id": self.next_id,
                "http_options": self.http_options, "http_port": self.http_port,
                "proxies": list(self.proxies), "proxy_pids": list(self.proxy_pids),
                "apps": apps}

    def _restore(self, state, specs):
        """Take over what the controller that died ran (its last checkpoint);
        ``_resume`` then watches it again."""
        import cloudpickle
        # Above every version a proxy or handle may have seen: each one's next
        # long poll then answers at once, with the recovered state (a router
        # ignores a version below the one it has).
        self.version = state["version"] + _VERSION_MARGIN
        self.next_id = state["next_id"]
        self.http_options = state["http_options"]
        self.http_port = state["http_port"]
        self.proxies = list(state["proxies"])
        self.proxy_pids = list(state["proxy_pids"])
        orphans = []
        for name, a in state["apps"].items():
            app = _App(name, a["route_prefix"], a["ingress"])
            app.status, app.message = a["status"], a["message"]
            app_specs = specs.get(name) or {}
            for dname, d in a["deps"].items():
                spec = app_specs.get(dname)
                if spec is None:        # (saved with its app's deploy: not expected)
                    orphans += list(d["replicas"].values()) + d["orphans"]
                    continue
                dep = _Dep(name, dname, spec)
                dep.config = d["config"]
                dep.replicas, dep.pids = d["replicas"], d["pids"]
                dep.target, dep.gang_of = d["target"], d["gang_of"]
                dep.ranks = {rid: r for rid, r in d["ranks"].items() if rid in dep.replicas}
                dep.listening = {rid for rid in d.get("listening", ()) if rid in dep.replicas}
                # Their listeners route by what they applied from the dead
                # controller: a change waits for them too (``_caught_up_keys``)
                # before their next long poll says what they have.
                for rid in dep.listening:
                    self.proxy_versions[f"direct:{rid}"] = -1
                dep.status, dep.message = d["status"], d["message"]
                dep.code_version, dep.actors = d["code_version"], d["actors"]
                if dep.actors:
                    dep.actor_configs = {c.name: c for c in
                                         cloudpickle.loads(spec["actors_blob"])}
                orphans += d["orphans"]
                app.deps[dname] = dep
            self.apps[name] = app
        self._resume(orphans)

    def _resume(self, orphans):
        """After ``_restore``: watch the proxies, replicas and deployment
        actors again (those that died meanwhile are replaced at once), resume
        autoscaling, and finish what the dead controller was doing."""
        n = sum(len(d.replicas) for app in self.apps.values() for d in app.deps.values())
        print(f"Serve: the controller restarted; it recovered {len(self.apps)} "
              f"application(s), {n} replica(s) and {len(self.proxies)} proxies",
              file=sys.stderr, flush=True)
        # Replicas still in their constructor, or being drained, when it died:
        # nothing would ever route to them.
        for h in orphans:
            self._kill(h)
        self._kill_untracked()
        if self.proxies:
            done = asyncio.get_running_loop().create_future()
            done.set_result(self.http_port)
            self._proxies_started = done
            for i, h in enumerate(self.proxies):
                self._watch_proxy(i, h)
        for app in list(self.apps.values()):
            for dep in app.deps.values():
                for rid, h in dep.replicas.items():
                    self._watch(dep, rid, h)
                for name in dep.actors:
                    self._task(dep, self._watch_deployment_actor(dep, name))
                if app.status in ("RUNNING", "UNHEALTHY") and \
                        dep.config.get("autoscaling_config"):
                    dep.autoscaler = self._task(dep, self._autoscale(dep))
            if app.status == "DELETING":
                asyncio.ensure_future(self.delete_apps([app.name]))
            elif app.status in ("RUNNING", "DEPLOYING", "UNHEALTHY"):
                app.recovered = asyncio.get_running_loop().create_future()
                asyncio.ensure_future(self._complete(app))
        self._bump()

    def _kill_untracked(self):
        """Kill the replicas and proxies the checkpoint does not name: those
        the dead controller had created but not yet saved (it died between
        their creation and its next save).  Before this controller creates
        any."""
        known = set(self.proxy_pids)
        for app in self.apps.values():
            for dep in app.deps.values():
                known.update(dep.pids.values())
        try:
            _core.kill_serve_processes(keep=known)
        except Exception as exc:   # noqa: BLE001 - a recovery without this check
            print(f"Serve: could not list the actors ({exc!r})", file=sys.stderr, flush=True)

    async def _complete(self, app):
        """Start the replicas ``app`` lacks (those that were starting when the
        controller died); an app that was deploying then runs.  A deploy of
        the same app waits for this (``app.recovered``)."""
        try:
            await self._complete_app(app)
        finally:
            app.recovered.set_result(None)
            app.recovered = None

    async def _complete_app(self, app):
        deps = [d for d in app.deps.values()
                if d.target - len(d.replicas) - d.starting > 0]
        errors = await asyncio.gather(*[
            self._start_retrying(d, d.target - len(d.replicas) - d.starting) for d in deps])
        if self.apps.get(app.name) is not app or self.shutting_down:
            return
        failed = [(d, e) for d, e in zip(deps, errors) if e is not None]
        for d, err in failed:
            d.message = _error_text(err)
        if app.status == "UNHEALTHY":
            for d in app.deps.values():
                self._healthy_again(app, d)
        if app.status == "DEPLOYING":
            if failed:
                app.status, app.message = "DEPLOY_FAILED", _error_text(failed[0][1])
            else:
                app.status = "RUNNING"
                for dep in app.deps.values():
                    dep.status, dep.message = "HEALTHY", ""
                    if dep.config.get("autoscaling_config") and dep.autoscaler is None:
                        dep.autoscaler = self._task(dep, self._autoscale(dep))
        self._bump()

    # ---------------------------------------------------- slow constructors
    async def _warn_slow_startups(self, dep):
        """Warn, as Ray Serve does, of the replicas of ``dep`` whose constructor
        has not returned after ``slow_startup_warning_s()``, naming each and
        how long it has taken; again every ``slow_startup_warning_period_s()``
        while one has not."""
        loop = asyncio.get_running_loop()
        try:
            while dep.start_times:
                threshold = _defaults.slow_startup_warning_s()
                now = loop.time()
                slow = {rid: now - t for rid, t in dep.start_times.items()
                        if now - t >= threshold}
                if not slow:
                    await asyncio.sleep(min(dep.start_times.values()) + threshold - now)
                    continue
                which = ", ".join(f"{rid} ({s:.0f} s)" for rid, s in sorted(slow.items()))
                print(f"Serve: deployment {dep.name!r} of application {dep.app!r} has "
                      f"{len(slow)} replica(s) that have taken more than {threshold:g} s "
                      f"to initialize: {which}. Its constructor (__init__) may be slow "
                      f"or stuck.", file=sys.stderr, flush=True)
                await asyncio.sleep(_defaults.slow_startup_warning_period_s())
        finally:
            dep.slow_warner = None

    async def process_ids(self):
        """The process ids of Serve: ``{"controller": pid, "proxies": [pid, ...],
        "replicas": {"app/deployment": [pid, ...]}}``."""
        import os
        return {"controller": os.getpid(), "proxies": list(self.proxy_pids),
                "replicas": {f"{app.name}/{d.name}": list(d.pids.values())
                             for app in self.apps.values() for d in app.deps.values()}}

    async def status(self):
        out = {}
        for app in self.apps.values():
            deps = {}
            for d in app.deps.values():
                states = {}
                if d.replicas:
                    states["RUNNING"] = len(d.replicas)
                if d.starting:
                    states["STARTING"] = d.starting
                if d.draining:
                    states["STOPPING"] = len(d.draining)
                status = d.status
                if status == "HEALTHY" and len(d.replicas) != d.target:
                    scaled = d.config.get("autoscaling_config") and app.status == "RUNNING"
                    status = ("UPDATING" if not scaled else
                              "UPSCALING" if len(d.replicas) < d.target else "DOWNSCALING")
                deps[d.name] = {"status": status, "message": d.message,
                                "replica_states": states}
            out[app.name] = {"status": app.status, "message": app.message,
                             "route_prefix": app.route_prefix, "ingress": app.ingress,
                             "deployments": deps}
        # Ray's shape: node id -> the node's proxy status (one node here,
        # however many proxy processes share its port).
        proxies = {_core.get_runtime_context().get_node_id(): "HEALTHY"} if self.proxies else {}
        return {"applications": out, "http_port": self.http_port, "proxies": proxies}

    async def num_apps(self):
        return len(self.apps)

    async def ingress_of(self, app_name):
        app = self.apps.get(app_name)
        if app is None:
            return None
        return app.ingress

    async def replica_handles(self, app_name, dep_name):
        return self._dep_snapshot(app_name, dep_name)[2]


# Options a running replica does not depend on (the controller, proxies and
# handles apply them; user_config goes to the replicas' reconfigure,
# max_ongoing_requests to their set_max_ongoing_requests): changing them (a
# config file's num_replicas, say) updates the deployment in place, as Ray's
# lightweight updates do.
_IN_PLACE = ("user_config", "num_replicas", "autoscaling_config", "max_queued_requests",
             "backpressure_config", "max_constructor_retry_count",
             "max_ongoing_requests", "graceful_shutdown_timeout_s",
             "graceful_shutdown_wait_loop_s", "health_check_period_s",
             "health_check_timeout_s")


# Ray's: a replica is unhealthy once this many health checks in a row failed
# (its death counts at once).
REPLICA_HEALTH_CHECK_UNHEALTHY_THRESHOLD = 3


# Ray's: each replica of a deployment may fail to start this many times
# (its default max_constructor_retry_count bounds the total).
MAX_PER_REPLICA_RETRY_COUNT = 3


def _failed_to_start_threshold(dep):
    """The failures to start after which a deploy fails, as in Ray."""
    return min(dep.config.get("max_constructor_retry_count") or
               _defaults.MAX_CONSTRUCTOR_RETRY_COUNT,
               max(dep.target, 1) * MAX_PER_REPLICA_RETRY_COUNT)


class _StartFailed(Exception):
    """A deployment's replicas failed to start as often as it allows."""

    def __init__(self, failures, error):
        super().__init__(
            f"The deployment failed to start {failures} times in a row. This may be due "
            f"to a problem with its constructor or initial health check failing. See "
            f"controller logs for details. Error:\n{error}")


class _OptionsRefused(ValueError):
    """The replicas' actor options were refused: no retry can help."""


def _serving(dep):
    """The replicas that serve ``dep``: its own, or while a redeploy has
    none of them ready yet, those of the deployment it replaces."""
    if dep.replicas or dep.predecessor is None:
        return dep.replicas
    return dep.predecessor.replicas


def _app_health(app):
    """A running application is UNHEALTHY while one of its deployments is
    (its message names them), RUNNING again once none is, as in Ray."""
    if app.status not in ("RUNNING", "UNHEALTHY"):
        return
    sick = [d for d in app.deps.values() if d.status == "UNHEALTHY"]
    if sick:
        app.status = "UNHEALTHY"
        app.message = "; ".join(f"The deployment {d.name!r} is UNHEALTHY: {d.message}"
                                for d in sick)
    else:
        app.status, app.message = "RUNNING", ""


def _check_error(exc):
    """A failed call's error in one line: the user's exception, not the
    remote traceback."""
    cause = getattr(exc, "cause", None) or exc
    return f"{type(cause).__name__}: {cause}"


# Added to the saved version by a restarted controller (``_restore``).
_VERSION_MARGIN = 1000
# A restarted controller's wait for its checkpoint.
_STORE_LOAD_TIMEOUT_S = 30.0


def _proxy_class(proxy_cls):
    # Detached, as the replicas are (see ``_replica_class``).
    return _core.remote(proxy_cls).options(lifetime="detached")


def _same_code(a, b):
    """Whether a redeploy keeps the running replicas (updating them in
    place).  As in Ray, only a versioned deployment can: a config file's
    carries its code version; ``serve.run``'s has none, so each run of it
    brings new replicas, even of unchanged code."""
    if a.get("code_version") is None or b.get("code_version") is None:
        return False
    return a["cls_blob"] == b["cls_blob"] and a["args_blob"] == b["args_blob"] and \
        a.get("code_version") == b.get("code_version") and \
        a.get("actors_blob") == b.get("actors_blob") and \
        {k: v for k, v in a["config"].items() if k not in _IN_PLACE} == \
        {k: v for k, v in b["config"].items() if k not in _IN_PLACE}


# Proxies beyond one per core: a proxy is often asleep while work is on its
# way (a replica's answer, a client's next request), and a core whose only
# runnable work waits for a wake-up stays idle meanwhile; a spare proxy takes
# it.  With one per core, `ab -c100` (a connection per request) left 11-13 %
# of this 2-core VM idle; with two spare, 3 % (docs/performance.md, "Spare proxies").  Two,
# not one more per core: the more proxies, the rarer it is that all of them
# sleep at once, and each costs its memory (7 MB PSS) while it idles.
SPARE_PROXIES = 2


def _cores():
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _default_proxies():
    return _cores() + SPARE_PROXIES
