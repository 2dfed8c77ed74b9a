"""``ray_lite.util.joblib``: joblib's ``Parallel`` on ray_lite through the
``"ray"`` backend (skipped without the ``joblib`` extra)."""
import os
import sys

import pytest

import ray_lite

joblib = pytest.importorskip("joblib")

from ray_lite.util.joblib import register_ray  # noqa: E402


def _pid_and_square(x):
    return os.getpid(), x * x


def _fail_on(x, bad):
    if x == bad:
        raise ValueError(f"bad input {x}")
    return x


def test_parallel_runs_the_calls_in_ray_lite_workers(rt):
    register_ray()
    with joblib.parallel_backend("ray"):
        out = joblib.Parallel(n_jobs=2)(joblib.delayed(_pid_and_square)(i) for i in range(200))
    assert [sq for _, sq in out] == [i * i for i in range(200)]      # in order
    pids = {pid for pid, _ in out}
    assert os.getpid() not in pids and 1 <= len(pids) <= 2            # the pool's two workers


def test_n_jobs_minus_one_is_every_cpu_of_the_runtime(rt):
    register_ray()
    cpus = int(ray_lite.cluster_resources()["CPU"])
    with joblib.parallel_backend("ray"):
        assert joblib.effective_n_jobs(-1) == cpus
        assert joblib.effective_n_jobs(-2) == max(cpus - 1, 1)
        assert joblib.effective_n_jobs(3) == 3
        with pytest.raises(ValueError, match="n_jobs == 0"):
            joblib.effective_n_jobs(0)


def test_an_error_in_a_call_reaches_the_caller(rt):
    register_ray()
    with joblib.parallel_backend("ray"):
        with pytest.raises(ValueError, match="bad input 7"):
            joblib.Parallel(n_jobs=2)(joblib.delayed(_fail_on)(i, 7) for i in range(20))
        # The backend is usable again afterwards (joblib starts a new pool).
        assert joblib.Parallel(n_jobs=2)(joblib.delayed(abs)(-i) for i in range(5)) == \
            [0, 1, 2, 3, 4]


def test_the_backend_can_be_named_in_parallel_itself(rt):
    register_ray()
    out = joblib.Parallel(n_jobs=2, backend="ray")(joblib.delayed(len)("ab" * i) for i in range(6))
    assert out == [0, 2, 4, 6, 8, 10]


def test_without_joblib_register_ray_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "joblib.parallel", None)
    with pytest.raises(ImportError, match=r"pip install 'ray_lite\[joblib\]'"):
        register_ray()
