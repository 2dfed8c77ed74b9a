"""A job's ``worker_process_setup_hook`` given by module path
(tests/core/test_core_job_config.py): workers import it from the driver's sys.path."""
import os


def mark_process():
    os.environ["RL_HOOK_RAN"] = "module"


def fail():
    raise RuntimeError("the setup hook failed on purpose")
