"""Ray's ``ray.runtime_env``: ``RuntimeEnv`` and ``RuntimeEnvConfig``.

Both are dicts, as in Ray, so everything that takes a ``runtime_env`` dict
takes them.  They hold every key Ray knows, with Ray's checks when made; what
ray_lite does with the keys is decided where a runtime_env is used
(``runtime_env.py`` beside this module): ``env_vars`` are set, ``config`` is checked
and has nothing to set up, ``worker_process_setup_hook`` (the job's, in
``init``) runs in every worker process, and a key that installs or ships
something (``pip``, ``working_dir``...) is refused by name.
"""
import json

__all__ = ["RuntimeEnv", "RuntimeEnvConfig"]

# Ray's default for how long a runtime_env may take to be set up.
_DEFAULT_SETUP_TIMEOUT_S = 600


class RuntimeEnvConfig(dict):
    """``runtime_env["config"]``: ``setup_timeout_seconds`` (> 0, or -1 for
    none), ``eager_install``, ``log_files``.  Nothing is installed on one
    machine, so nothing waits on them; they are checked as Ray checks them."""

    known_fields = {"setup_timeout_seconds", "eager_install", "log_files"}

    def __init__(self, setup_timeout_seconds=_DEFAULT_SETUP_TIMEOUT_S, eager_install=True,
                 log_files=None):
        super().__init__()
        # Ray's checks and words.
        if isinstance(setup_timeout_seconds, bool) or not isinstance(setup_timeout_seconds, int):
            raise TypeError(f"setup_timeout_seconds must be of type int, got: "
                            f"{type(setup_timeout_seconds)}")
        if setup_timeout_seconds <= 0 and setup_timeout_seconds != -1:
            raise ValueError(f"setup_timeout_seconds must be greater than zero or equals to "
                             f"-1, got: {setup_timeout_seconds}")
        if not isinstance(eager_install, bool):
            raise TypeError(f"eager_install must be a boolean. got {type(eager_install)}")
        if log_files is None:
            log_files = []
        elif not isinstance(log_files, list):
            raise TypeError(f"log_files must be a list of strings or None, got {log_files} "
                            f"with type {type(log_files)}.")
        elif not all(isinstance(f, str) for f in log_files):
            raise TypeError("Each item in log_files must be a string.")
        self["setup_timeout_seconds"] = setup_timeout_seconds
        self["eager_install"] = eager_install
        self["log_files"] = log_files

    @staticmethod
    def parse_and_validate_runtime_env_config(config):
        """``config`` (a dict or a ``RuntimeEnvConfig``) as a checked
        ``RuntimeEnvConfig``; unknown keys are dropped, as in Ray."""
        if isinstance(config, RuntimeEnvConfig):
            return config
        if isinstance(config, dict):
            return RuntimeEnvConfig(**{k: v for k, v in config.items()
                                       if k in RuntimeEnvConfig.known_fields})
        raise TypeError(f"runtime_env['config'] must be of type dict or RuntimeEnvConfig, "
                        f"got: {type(config)}")

    @classmethod
    def default_config(cls):
        return cls()

    def to_dict(self):
        return dict(self)


def _check_env_vars(value):
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                              for k, v in value.items()):
        raise TypeError(f"runtime_env['env_vars'] must be of type Dict[str, str], "
                        f"got {value!r}")
    return value


def _check_setup_hook(value):
    if not (callable(value) or isinstance(value, str)):
        raise TypeError(f"worker_process_setup_hook must be a function or a module path "
                        f"(str), got {type(value)}.")
    return value


# The keys whose values are checked (and normalised) when set, as in Ray.
_CHECKS = {"env_vars": _check_env_vars,
           "config": RuntimeEnvConfig.parse_and_validate_runtime_env_config,
           "worker_process_setup_hook": _check_setup_hook}


class RuntimeEnv(dict):
    """A runtime environment for a job (``init``), a task or an actor, usable
    wherever a ``runtime_env`` dict is.  Ray's fields; see the module's
    docstring for which ones ray_lite honours."""

    known_fields = {"py_modules", "py_executable", "java_jars", "working_dir", "conda", "pip",
                    "uv", "container", "excludes", "env_vars", "_ray_release", "_ray_commit",
                    "_inject_current_ray", "config", "worker_process_setup_hook", "_nsight",
                    "_rocprof_sys", "image_uri"}

    def __init__(self, *, py_modules=None, py_executable=None, working_dir=None, pip=None,
                 conda=None, container=None, env_vars=None, worker_process_setup_hook=None,
                 nsight=None, rocprof_sys=None, config=None, _validate=True, image_uri=None,
                 uv=None, **kwargs):
        super().__init__()
        given = dict(kwargs)
        for key, value in (("py_modules", py_modules), ("py_executable", py_executable),
                           ("working_dir", working_dir), ("pip", pip), ("uv", uv),
                           ("conda", conda), ("_nsight", nsight), ("_rocprof_sys", rocprof_sys),
                           ("container", container), ("env_vars", env_vars),
                           ("config", config),
                           ("worker_process_setup_hook", worker_process_setup_hook),
                           ("image_uri", image_uri)):
            if value is not None:
                given[key] = value
        if not _validate:
            dict.update(self, given)
            return
        if sum(given.get(k) is not None for k in ("conda", "pip", "uv")) > 1:
            raise ValueError("The 'pip' field, 'uv' field, and 'conda' field of runtime_env "
                             "cannot be specified at the same time.")
        for key, value in given.items():
            self[key] = value

    def __setitem__(self, key, value):
        check = _CHECKS.get(key)
        super().__setitem__(key, value if check is None else check(value))

    def set(self, name, value):
        self[name] = value

    def update(self, *args, **kwargs):
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    # ------------------------------------------------------------ accessors
    def env_vars(self):
        return dict(self.get("env_vars") or {})

    def working_dir(self):
        return self.get("working_dir", "")

    def has_working_dir(self):
        return bool(self.get("working_dir"))

    def py_modules(self):
        return list(self.get("py_modules") or [])

    def py_executable(self):
        return self.get("py_executable")

    def has_pip(self):
        return bool(self.get("pip"))

    def has_conda(self):
        return bool(self.get("conda"))

    def has_uv(self):
        return bool(self.get("uv"))

    def image_uri(self):
        return self.get("image_uri")

    def plugins(self):
        """The ``(key, value)`` pairs that are not Ray's own fields."""
        return [(k, v) for k, v in self.items() if k not in self.known_fields]

    def to_dict(self):
        return {k: (dict(v) if isinstance(v, RuntimeEnvConfig) else v) for k, v in self.items()}

    def serialize(self):
        """JSON text (``deserialize`` makes it a ``RuntimeEnv`` again); a
        setup hook given as a function cannot be written, as in Ray."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def deserialize(cls, serialized_runtime_env):
        return cls(_validate=False, **json.loads(serialized_runtime_env))
