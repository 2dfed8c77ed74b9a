"""What ``init`` makes of the job's ``job_config``, ``logging_config`` and
``runtime_env`` (Ray's precedence: an argument of ``init`` wins over the same
field of the ``JobConfig``), and their Ray twins for the Ray backend."""
from .runtime_env import env_vars_of, process_runtime_env, setup_hook_of


class JobSetup:
    """The job's settings on the local backend: ``namespace`` (None: a fresh
    one), ``env_vars``, ``logging_config``, ``metadata``, and ``for_workers``,
    what every worker process gets in its spawn spec."""

    def __init__(self, namespace=None, runtime_env=None, job_config=None, logging_config=None):
        metadata = {}
        self.workers_logging = None
        if job_config is not None:
            from .job_config import JobConfig
            if not isinstance(job_config, JobConfig):
                raise TypeError(f"init(job_config=...) must be a ray_lite.job_config.JobConfig, "
                                f"got {type(job_config).__name__}")
            if job_config.jvm_options or job_config.code_search_path:
                raise ValueError("ray_lite runs Python only: leave jvm_options or "
                                 "code_search_path out of the JobConfig")
            if job_config.default_actor_lifetime == "detached":
                raise ValueError("JobConfig(default_actor_lifetime='detached'): ray_lite "
                                 "does not make every actor detached; leave it out and give "
                                 "lifetime='detached' to the actors that should outlive "
                                 "their creator")
            if not runtime_env:
                runtime_env = job_config.runtime_env or None
            if namespace is None:
                namespace = job_config.ray_namespace
            if logging_config is None:
                # The workers' only: Ray sets up the driver's logging with
                # init(logging_config=...) alone.
                self.workers_logging = job_config.py_logging_config
            metadata = dict(job_config.metadata)
        for given in (logging_config, self.workers_logging):
            if given is not None and not _is_logging_config(given):
                raise TypeError(f"init(logging_config=...) must be a ray_lite.LoggingConfig, "
                                f"got {type(given).__name__}")
        self.namespace = namespace
        self.env_vars = env_vars_of(runtime_env, "init(runtime_env=...)", job=True)
        self.logging_config = logging_config
        self.metadata = metadata
        from ..objects import spill
        # Where the driver looks for spills: the workers spill there too.
        self.for_workers = {"spill_root": spill.spill_root()}
        hook = setup_hook_of(runtime_env)
        if hook is not None:
            self.for_workers["setup_hook"] = hook
        workers_logging = logging_config or self.workers_logging
        if workers_logging is not None:
            self.for_workers["logging_config"] = workers_logging.to_dict()

    def record(self):
        """What ``util.state.list_jobs`` reports of the job (the driver keeps it)."""
        import sys
        import time
        env = process_runtime_env({"env_vars": self.env_vars,
                                   "setup_hook": self.for_workers.get("setup_hook")})
        return {"metadata": self.metadata, "runtime_env": env,
                "start_time_ms": int(time.time() * 1000),
                "entrypoint": " ".join(sys.argv) if sys.argv and sys.argv[0] else ""}


def _is_logging_config(obj):
    from ray_lite._private.job.logging_config import LoggingConfig
    return isinstance(obj, LoggingConfig)


def ray_init_kwargs(runtime_env, kwargs):
    """``init``'s arguments for Ray: ray_lite's ``JobConfig``, ``LoggingConfig``
    and ``RuntimeEnv`` as Ray's own."""
    from .runtime_env_spec import RuntimeEnv
    out = dict(kwargs)
    job_config = out.get("job_config")
    if job_config is not None and hasattr(job_config, "_to_ray"):
        out["job_config"] = job_config._to_ray()
    logging_config = out.get("logging_config")
    if logging_config is not None and hasattr(logging_config, "_to_ray"):
        out["logging_config"] = logging_config._to_ray()
    if isinstance(runtime_env, RuntimeEnv):
        runtime_env = runtime_env.to_dict()
    return runtime_env, out
