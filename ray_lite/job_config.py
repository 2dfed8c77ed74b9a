"""Ray's ``ray.job_config``: ``JobConfig``, what ``init(job_config=...)`` takes
(defined with the job's other settings in ``_private/job/job_config.py``)."""
from ray_lite._private.job.job_config import JobConfig

__all__ = ["JobConfig"]
