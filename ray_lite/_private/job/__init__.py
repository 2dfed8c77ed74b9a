"""The job's settings, the same in every process of the job.

Owns: ``job_config`` (``JobConfig``), ``runtime_env`` (``RuntimeEnv`` and
what it sets up in each worker), ``logging_config`` (``LoggingConfig``),
``job_setup`` (what ``init`` makes of them), ``metrics_files``.

May import: ``objects``, ``links``, ``process``, ``ray_lite._fast``, the base
modules.  It reads the runtime context through ``process.state.runtime_context``,
which ``api`` sets.
"""
