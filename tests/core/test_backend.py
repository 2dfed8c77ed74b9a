"""The engine switch: init()'s arguments, then RAY_LITE_BACKEND, then local."""
import pytest

import ray_lite
from ray_lite import _config
from ray_lite._private.process import backend


@pytest.mark.parametrize("kwargs,env,expected", [
    ({}, "local", "local"),
    ({}, "ray", "ray"),
    ({"backend": "local"}, "ray", "local"),
    ({"backend": "ray"}, "local", "ray"),
    ({"address": "auto"}, "local", "ray"),
    ({"address": "ray://127.0.0.1:10001"}, "local", "ray"),
    ({"address": "127.0.0.1:6379"}, "local", "ray"),
    ({"address": "local"}, "ray", "ray"),
    ({"address": "local"}, "local", "local"),
])
def test_choose_follows_init_then_environment(monkeypatch, kwargs, env, expected):
    monkeypatch.setattr(_config, "BACKEND", env)
    assert backend.choose(**kwargs) == expected


def test_choose_refuses_unknown_backend_and_local_with_cluster_address():
    with pytest.raises(ValueError, match="backend must be"):
        backend.choose(backend="dask")
    with pytest.raises(ValueError, match="address="):
        backend.choose(backend="local", address="auto")


def test_backend_reports_local_by_default(monkeypatch):
    monkeypatch.setattr(_config, "BACKEND", "local")
    assert ray_lite.backend() == "local"
