"""What ``@ray.remote`` refuses, and the source lines of a remote traceback
through helpers defined in ``__main__``."""
import subprocess
import sys

import pytest

import ray_lite as ray


def test_remote_refuses_an_async_function():
    async def f():
        return 1
    with pytest.raises(ValueError, match="'async def' should not be used for remote tasks"):
        ray.remote(f)
    with pytest.raises(ValueError, match="async def"):
        ray.remote(num_cpus=1)(f)


HELPER_FROM_MAIN = """
import ray_lite as ray

def helper(x):
    return 1 / x

@ray.remote
def divide(x):
    return helper(x)

ray.init(num_cpus=1)
try:
    ray.get(divide.remote(0), timeout=60)
except ZeroDivisionError as exc:
    print(exc.traceback_str)
ray.shutdown()
"""


def test_a_helper_from_main_keeps_its_file_name_in_a_remote_traceback(tmp_path):
    """cloudpickle ships the helpers a task in ``__main__`` calls by value, and
    names their code ``<dynamic-code>``: the traceback lost their source."""
    script = tmp_path / "helper_from_main.py"
    script.write_text(HELPER_FROM_MAIN)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f'File "{script}", line 9, in divide' in proc.stdout, proc.stdout
    assert f'File "{script}", line 5, in helper' in proc.stdout, proc.stdout
    assert "return 1 / x" in proc.stdout and "<dynamic-code>" not in proc.stdout
