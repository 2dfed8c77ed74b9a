"""ray_lite._config: every RAY_LITE_* variable is read once and validated."""
import os
import pathlib
import subprocess
import sys

import pytest

from ray_lite import _config


@pytest.mark.parametrize("name,raw,expected", [
    ("RAY_LITE_NO_EXTENSIONS", "1", True),
    ("RAY_LITE_NO_EXTENSIONS", "", False),
    ("RAY_LITE_SERVE_PROXY_SPIN_US", "0", 0.0),
    ("RAY_LITE_SERVE_REPLICA_SPIN_US", "250", 250e-6),
    ("RAY_LITE_SERVE_REPLICA_NICE", "19", 19),
    ("RAY_LITE_SHM_PREFIX", "rl_x_", "rl_x_"),
])
def test_valid_values_parse(name, raw, expected):
    assert _config.read(name, {name: raw}) == pytest.approx(expected)


def test_unset_variables_take_their_defaults():
    for var in _config.VARIABLES:
        assert _config.read(var.name, {}) == var.parse(var.default)


@pytest.mark.parametrize("name,raw", [
    ("RAY_LITE_NO_EXTENSIONS", "maybe"),
    ("RAY_LITE_SERVE_PROXY_SPIN_US", "-1"),
    ("RAY_LITE_SERVE_REPLICA_SPIN_US", "nan"),
    ("RAY_LITE_SERVE_REPLICA_NICE", "20"),
    ("RAY_LITE_SERVE_REPLICA_NICE", "ten"),
    ("RAY_LITE_SHM_PREFIX", "../etc/"),
    ("RAY_LITE_SERVE_MEMDEBUG", "relative/dir"),
    ("RAY_LITE_BACKEND", "dask"),
])
def test_bad_values_name_the_variable_and_what_it_accepts(name, raw):
    with pytest.raises(ValueError) as info:
        _config.read(name, {name: raw})
    assert name in str(info.value)
    assert "accepts" in str(info.value)


def test_a_bad_value_fails_the_import_naming_the_variable():
    env = dict(os.environ, RAY_LITE_SERVE_REPLICA_NICE="high")
    proc = subprocess.run([sys.executable, "-c", "import ray_lite"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "RAY_LITE_SERVE_REPLICA_NICE='high'" in proc.stderr


def test_no_other_runtime_module_reads_the_environment_for_settings():
    import ray_lite
    root = pathlib.Path(ray_lite.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root).as_posix()
        if rel == "_config.py" or rel.startswith("bench/") or rel == "scripts.py":
            continue
        text = path.read_text()
        if "os.environ.get(\"RAY_LITE" in text or "os.environ[\"RAY_LITE" in text:
            offenders.append(rel)
    assert offenders == []


def test_markdown_table_lists_every_variable():
    table = _config.markdown_table()
    for var in _config.VARIABLES:
        assert f"`{var.name}`" in table
