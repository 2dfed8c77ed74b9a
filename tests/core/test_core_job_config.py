"""The job's configuration, as in Ray: ``ray_lite.runtime_env`` (``RuntimeEnv``,
``RuntimeEnvConfig``), ``ray_lite.job_config.JobConfig`` and
``ray_lite.LoggingConfig`` given to ``init``, and the job's
``worker_process_setup_hook``."""
import json
import logging
import os

import pytest

import ray_lite as ray
from ray_lite.exceptions import ActorDiedError, RuntimeEnvSetupError
from ray_lite.job_config import JobConfig
from ray_lite.runtime_env import RuntimeEnv, RuntimeEnvConfig

pytestmark = pytest.mark.local_only
T = 30


@ray.remote
def read_env(*names):
    return [os.environ.get(n) for n in names]


@ray.remote
class EnvReader:
    def read(self, *names):
        return [os.environ.get(n) for n in names]


def set_hook_variable():
    os.environ["RL_HOOK_RAN"] = "function"


# ------------------------------------------------------------ RuntimeEnv
def test_runtime_env_is_a_checked_dict():
    env = RuntimeEnv(env_vars={"A": "1"}, config={"setup_timeout_seconds": 5, "other": 1})
    assert isinstance(env, dict) and env["env_vars"] == {"A": "1"}
    assert env.env_vars() == {"A": "1"}
    # config became a RuntimeEnvConfig with Ray's defaults; unknown keys dropped.
    assert env["config"] == {"setup_timeout_seconds": 5, "eager_install": True, "log_files": []}
    assert RuntimeEnv.deserialize(env.serialize()) == env
    assert RuntimeEnv(pip=["x"]).has_pip() and not env.has_working_dir()
    with pytest.raises(TypeError, match=r"env_vars'\] must be of type Dict\[str, str\]"):
        RuntimeEnv(env_vars={"A": 1})
    with pytest.raises(ValueError, match="cannot be specified at the same time"):
        RuntimeEnv(pip=["a"], conda="env")
    with pytest.raises(TypeError, match="worker_process_setup_hook must be a function"):
        RuntimeEnv(worker_process_setup_hook=3)
    with pytest.raises(ValueError, match="greater than zero or equals to -1"):
        RuntimeEnvConfig(setup_timeout_seconds=0)
    with pytest.raises(TypeError, match="eager_install must be a boolean"):
        RuntimeEnvConfig(eager_install="yes")
    with pytest.raises(TypeError, match="Each item in log_files must be a string"):
        RuntimeEnvConfig(log_files=[1])


def test_a_runtime_env_object_works_where_a_dict_does(rt):
    opts = RuntimeEnv(env_vars={"RL_RE": "task"}, config=RuntimeEnvConfig(eager_install=False))
    assert ray.get(read_env.options(runtime_env=opts).remote("RL_RE"), timeout=T) == ["task"]
    a = EnvReader.options(runtime_env=RuntimeEnv(env_vars={"RL_RE": "actor"})).remote()
    assert ray.get(a.read.remote("RL_RE"), timeout=T) == ["actor"]
    with pytest.raises(ValueError, match="'pip'"):
        read_env.options(runtime_env=RuntimeEnv(pip=["requests"]))
    with pytest.raises(ValueError, match="only supported in the job's runtime_env"):
        read_env.options(runtime_env=RuntimeEnv(worker_process_setup_hook=set_hook_variable))


@ray.remote
def env_string():
    return json.loads(ray.get_runtime_context().get_runtime_env_string())


@ray.remote
class EnvString:
    def get(self):
        return ray.get_runtime_context().runtime_env


def test_the_runtime_env_string_is_the_one_the_code_runs_with():
    ray.init(num_cpus=1, runtime_env={"env_vars": {"JOB": "1"},
                                      "worker_process_setup_hook": "setup_hook_target.mark_process"})
    try:
        job = {"env_vars": {"JOB": "1"},
               "worker_process_setup_hook": "setup_hook_target.mark_process"}
        assert json.loads(ray.get_runtime_context().get_runtime_env_string()) == job
        assert ray.get(env_string.remote(), timeout=T) == job
        own = env_string.options(runtime_env={"env_vars": {"TASK": "2"}})
        assert ray.get(own.remote(), timeout=T)["env_vars"] == {"JOB": "1", "TASK": "2"}
        assert ray.get(env_string.remote(), timeout=T) == job     # put back after it
        a = EnvString.options(runtime_env={"env_vars": {"JOB": "actor"}}).remote()
        env = ray.get(a.get.remote(), timeout=T)
        assert isinstance(env, RuntimeEnv) and env.env_vars() == {"JOB": "actor"}
    finally:
        ray.shutdown()


# ------------------------------------------------------------- JobConfig
def test_job_config_gives_the_job_its_runtime_env_namespace_and_metadata():
    jc = JobConfig(runtime_env=RuntimeEnv(env_vars={"RL_JOB": "jc"}), ray_namespace="jc-ns",
                   metadata={"owner": "tests"})
    jc.set_metadata("run", "1")
    ray.init(num_cpus=1, job_config=jc)
    try:
        assert ray.get(read_env.remote("RL_JOB"), timeout=T) == ["jc"]
        assert ray.get_runtime_context().namespace == "jc-ns"
        from ray_lite.util.state import list_jobs
        [job] = list_jobs()
        assert job["metadata"] == {"owner": "tests", "run": "1"}
        assert job["status"] == "RUNNING" and job["type"] == "DRIVER"
        assert job["job_id"] == ray.get_runtime_context().get_job_id()
    finally:
        ray.shutdown()


def test_init_arguments_win_over_the_job_config():
    jc = JobConfig(runtime_env={"env_vars": {"RL_JOB": "jc"}}, ray_namespace="jc-ns")
    ray.init(num_cpus=1, job_config=jc, namespace="mine",
             runtime_env={"env_vars": {"RL_JOB": "init"}})
    try:
        assert ray.get(read_env.remote("RL_JOB"), timeout=T) == ["init"]
        assert ray.get_runtime_context().namespace == "mine"
    finally:
        ray.shutdown()


def test_job_configs_one_machine_cannot_honour_are_refused():
    with pytest.raises(ValueError, match="Default actor lifetime must be one of"):
        JobConfig(default_actor_lifetime="forever")
    with pytest.raises(TypeError, match="code search path"):
        JobConfig(code_search_path="/x")
    with pytest.raises(ValueError, match="default_actor_lifetime='detached'"):
        ray.init(num_cpus=1, job_config=JobConfig(default_actor_lifetime="detached"))
    with pytest.raises(ValueError, match="jvm_options or code_search_path"):
        ray.init(num_cpus=1, job_config=JobConfig(code_search_path=["/x.jar"]))
    with pytest.raises(TypeError, match="must be a ray_lite.job_config.JobConfig"):
        ray.init(num_cpus=1, job_config={"runtime_env": {}})
    with pytest.raises(ValueError, match="'working_dir'"):
        ray.init(num_cpus=1, job_config=JobConfig(runtime_env={"working_dir": "."}))
    assert not ray.is_initialized()


# --------------------------------------------- worker_process_setup_hook
@pytest.mark.parametrize("hook", [set_hook_variable, "setup_hook_target.mark_process"],
                         ids=["function", "module path"])
def test_the_setup_hook_runs_in_every_worker_before_its_work(hook):
    ray.init(num_cpus=1, runtime_env={"worker_process_setup_hook": hook,
                                      "env_vars": {"RL_JOB": "1"}})
    try:
        expect = "function" if callable(hook) else "module"
        assert ray.get(read_env.remote("RL_HOOK_RAN", "RL_JOB"), timeout=T) == [expect, "1"]
        a = EnvReader.remote()
        assert ray.get(a.read.remote("RL_HOOK_RAN"), timeout=T) == [expect]
        # Not in the driver: the hook is the workers', as in Ray.
        assert "RL_HOOK_RAN" not in os.environ
    finally:
        ray.shutdown()


@ray.remote
def spill_root():
    from ray_lite._private.objects import spill
    return spill.spill_root()


def test_workers_spill_where_the_driver_cleans_up_whatever_their_tmpdir(tmp_path):
    from ray_lite._private.objects import spill
    ray.init(num_cpus=1, runtime_env={"env_vars": {"TMPDIR": str(tmp_path)}})
    try:
        own = spill_root.options(runtime_env={"env_vars": {"TMPDIR": str(tmp_path)}})
        assert ray.get([spill_root.remote(), own.remote()], timeout=T) == \
            [spill.spill_root()] * 2
    finally:
        ray.shutdown()


def _write_cwd_marker():
    open("hook_ran_here", "w").close()


def test_the_setup_hook_runs_in_the_drivers_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ray.init(num_cpus=1, runtime_env={"worker_process_setup_hook": _write_cwd_marker})
    try:
        assert ray.get(read_env.remote("X"), timeout=T) == [None]
        assert (tmp_path / "hook_ran_here").exists()
    finally:
        ray.shutdown()


def test_a_failing_setup_hook_fails_the_work_sent_there_naming_the_hook():
    ray.init(num_cpus=1,
             job_config=JobConfig(runtime_env={"worker_process_setup_hook":
                                               "setup_hook_target.fail"}))
    try:
        with pytest.raises(RuntimeEnvSetupError, match="setup_hook_target.fail") as info:
            ray.get(read_env.remote("X"), timeout=T)
        assert "the setup hook failed on purpose" in str(info.value)
        a = EnvReader.remote()
        with pytest.raises(ActorDiedError, match="worker_process_setup_hook failed"):
            ray.get(a.read.remote("X"), timeout=T)
    finally:
        ray.shutdown()


def test_bad_setup_hooks_are_refused_at_init():
    with pytest.raises(ValueError, match="not a module path"):
        ray.init(num_cpus=1, runtime_env={"worker_process_setup_hook": "nodots"})
    with pytest.raises(TypeError, match="must be a function or a module path"):
        ray.init(num_cpus=1, runtime_env={"worker_process_setup_hook": 5})
    assert not ray.is_initialized()


# ---------------------------------------------------------- LoggingConfig
@pytest.fixture
def restore_logging():
    root, ours = logging.getLogger(), logging.getLogger("ray_lite")
    saved = (root.level, list(root.handlers), ours.level, list(ours.handlers), ours.propagate)
    yield
    root.setLevel(saved[0])
    root.handlers[:] = saved[1]
    ours.setLevel(saved[2])
    ours.handlers[:] = saved[3]
    ours.propagate = saved[4]


def test_logging_config_checks():
    assert ray.LoggingConfig().to_dict() == {"encoding": "TEXT", "log_level": "INFO",
                                             "additional_log_standard_attrs": []}
    with pytest.raises(ValueError, match="Invalid encoding type: XML"):
        ray.LoggingConfig(encoding="XML")
    with pytest.raises(ValueError, match="Unknown python logging standard attribute: nope"):
        ray.LoggingConfig(additional_log_standard_attrs=["nope"])
    with pytest.raises(ValueError, match="Invalid log_level"):
        ray.LoggingConfig(log_level="LOUD")
    with pytest.raises(TypeError, match="must be a ray_lite.LoggingConfig"):
        ray.init(num_cpus=1, logging_config={"encoding": "JSON"})


@ray.remote
def log_in_task():
    logging.getLogger("user.task").info("from the task")
    logging.getLogger("user.task").debug("not shown at INFO")


@ray.remote
class Logs:
    def log(self):
        logging.getLogger("user.actor").warning("from the actor")


def test_json_logs_of_tasks_actors_and_the_driver_carry_their_context(capfd, restore_logging):
    ray.init(num_cpus=1, logging_config=ray.LoggingConfig(
        encoding="JSON", additional_log_standard_attrs=["name"]))
    try:
        ray.get(log_in_task.remote(), timeout=T)
        a = Logs.remote()
        ray.get(a.log.remote(), timeout=T)
        logging.getLogger("user.driver").info("from the driver")
        job = ray.get_runtime_context().get_job_id()
    finally:
        ray.shutdown()      # the zygote relays everything before it exits
    records = {}
    for line in capfd.readouterr().err.splitlines():
        start = line.find("{")
        if start >= 0 and '"message"' in line:
            rec = json.loads(line[start:])
            records[rec["message"]] = rec
    assert "not shown at INFO" not in records
    task = records["from the task"]
    assert (task["levelname"], task["name"], task["task_name"]) == ("INFO", "user.task",
                                                                    "log_in_task")
    assert task["job_id"] == job and task["task_func_name"].endswith("log_in_task")
    actor = records["from the actor"]
    assert actor["task_name"] == "Logs.log" and actor["actor_id"]
    driver = records["from the driver"]
    assert driver["job_id"] == job and "task_id" not in driver


def test_text_logs_from_a_job_config(capfd, restore_logging):
    jc = JobConfig()
    jc.set_py_logging_config(ray.LoggingConfig(log_level="DEBUG"))
    ray.init(num_cpus=1, job_config=jc)
    try:
        ray.get(log_in_task.remote(), timeout=T)
        # As in Ray, a JobConfig's logging config is the workers': the
        # driver's root logger is set up by init(logging_config=...) only.
        assert not [h for h in logging.getLogger().handlers
                    if h.get_name() == "ray_lite.logging_config"]
    finally:
        ray.shutdown()
    err = capfd.readouterr().err
    line = next(ln for ln in err.splitlines() if "from the task" in ln)
    assert "INFO" in line and "-- from the task" in line and "task_name=log_in_task" in line
    assert "not shown at INFO" in err       # DEBUG asked for
