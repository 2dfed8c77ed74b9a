"""Ray's ``ray.job_config.JobConfig``: what ``init(job_config=...)`` takes.

On one machine its fields mean: ``runtime_env`` the job's runtime_env (as
``init(runtime_env=...)``, which wins when both are given, as in Ray),
``ray_namespace`` the job's namespace (``init(namespace=...)`` wins),
``metadata`` an opaque dict reported by ``util.state.list_jobs``, and
``py_logging_config`` a ``LoggingConfig`` for every process of the job.
``default_actor_lifetime="detached"`` is refused by ``init`` as a
``lifetime="detached"`` actor is; Java's ``jvm_options`` and
``code_search_path`` are refused when not empty.
"""
from .logging_config import LoggingConfig

__all__ = ["JobConfig"]

_LIFETIMES = ("detached", "non_detached")


class JobConfig:
    def __init__(self, jvm_options=None, code_search_path=None, runtime_env=None,
                 _client_job=False, metadata=None, ray_namespace=None,
                 default_actor_lifetime="non_detached",
                 _disable_job_level_lineage_reconstruction=False, _py_driver_sys_path=None):
        self.jvm_options = jvm_options or []
        code_search_path = code_search_path or []
        if not isinstance(code_search_path, (list, tuple)):
            # Ray's check and words.
            raise TypeError(f"The type of code search path is incorrect: "
                            f"{type(code_search_path)}")
        self.code_search_path = code_search_path
        self._client_job = _client_job
        self.metadata = metadata or {}
        self.ray_namespace = ray_namespace
        self.set_runtime_env(runtime_env)
        self.set_default_actor_lifetime(default_actor_lifetime)
        self._disable_job_level_lineage_reconstruction = _disable_job_level_lineage_reconstruction
        self._py_driver_sys_path = _py_driver_sys_path or []
        self.py_logging_config = None

    def set_metadata(self, key, value):
        self.metadata[key] = value

    def set_runtime_env(self, runtime_env, validate=False):
        self.runtime_env = runtime_env if runtime_env is not None else {}
        if validate:
            from .runtime_env_spec import RuntimeEnv
            if not isinstance(self.runtime_env, RuntimeEnv):
                self.runtime_env = RuntimeEnv(**self.runtime_env)

    def set_py_logging_config(self, logging_config=None):
        self.py_logging_config = logging_config

    def ensure_logging_config(self, logging_config=None):
        """Set ``logging_config`` (a dict or a ``LoggingConfig``) unless one is set."""
        if logging_config is None or self.py_logging_config is not None:
            return
        if isinstance(logging_config, dict):
            logging_config = LoggingConfig.from_dict(logging_config)
        elif not isinstance(logging_config, LoggingConfig):
            raise TypeError(f"logging_config must be a dict or LoggingConfig, got "
                            f"{type(logging_config)}")
        self.set_py_logging_config(logging_config)

    def set_ray_namespace(self, ray_namespace):
        self.ray_namespace = ray_namespace

    def set_default_actor_lifetime(self, default_actor_lifetime):
        if default_actor_lifetime not in _LIFETIMES:
            raise ValueError("Default actor lifetime must be one of `detached`, `non_detached`")
        self.default_actor_lifetime = default_actor_lifetime

    @classmethod
    def from_json(cls, job_config_json):
        return cls(jvm_options=job_config_json.get("jvm_options"),
                   code_search_path=job_config_json.get("code_search_path"),
                   runtime_env=job_config_json.get("runtime_env"),
                   metadata=job_config_json.get("metadata"),
                   ray_namespace=job_config_json.get("ray_namespace"),
                   default_actor_lifetime=job_config_json.get("default_actor_lifetime",
                                                              "non_detached"))

    def __repr__(self):
        return (f"JobConfig(runtime_env={self.runtime_env!r}, metadata={self.metadata!r}, "
                f"ray_namespace={self.ray_namespace!r}, "
                f"default_actor_lifetime={self.default_actor_lifetime!r})")

    def _to_ray(self):
        """The same job config for Ray (the Ray backend)."""
        import ray.job_config
        out = ray.job_config.JobConfig(
            jvm_options=self.jvm_options or None, code_search_path=self.code_search_path or None,
            runtime_env=dict(self.runtime_env) or None, metadata=dict(self.metadata),
            ray_namespace=self.ray_namespace, default_actor_lifetime=self.default_actor_lifetime)
        if self.py_logging_config is not None:
            out.set_py_logging_config(self.py_logging_config._to_ray())
        return out
