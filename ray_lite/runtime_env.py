"""Ray's ``ray.runtime_env``: ``RuntimeEnv`` and ``RuntimeEnvConfig`` (defined
with the job's other settings in ``_private/job/runtime_env_spec.py``)."""
from ray_lite._private.job.runtime_env_spec import RuntimeEnv, RuntimeEnvConfig

__all__ = ["RuntimeEnv", "RuntimeEnvConfig"]
