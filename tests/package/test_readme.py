"""The README's Serve quickstart works as the README tells it: the ``app.py``
block served by ``ray-lite serve run app:app``, asked with the ``curl`` line,
answers what the README shows, and the server stops on Ctrl-C.

(Every ``python`` block of the README also runs as a script in test_docs.py.)
"""
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def _quickstart():
    """(app.py source, curl URL, expected answer) from the README."""
    text = README.read_text()
    app = re.search(r"<!-- file: app\.py -->\n```python\n(.*?)```", text, re.S)
    curl = re.search(r"^\$ curl (.+)\n(.+)$", text, re.M)
    assert app and curl, "the README lost its Serve quickstart (app.py block and a curl line)"
    return app.group(1), shlex.split(curl.group(1))[0], curl.group(2)


@pytest.mark.skipif(not README.exists(), reason="no README.md beside the tests (installed-only run)")
def test_serve_quickstart_answers_as_the_readme_shows(tmp_path):
    pytest.importorskip("fastapi")
    source, url, expected = _quickstart()
    (tmp_path / "app.py").write_text(source)
    import ray_lite
    root = os.path.dirname(os.path.dirname(os.path.abspath(ray_lite.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    cmd = [sys.executable, "-c", "import sys; from ray_lite.scripts import main; sys.exit(main())",
           "serve", "run", "app:app", "--port", "0", "--proxies", "1"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    # Bounds the read of its output below: a CLI that hangs silently is killed.
    watchdog = threading.Timer(120, proc.kill)
    watchdog.start()
    try:
        out = ""
        for line in proc.stdout:             # ends when the CLI exits
            out += line
            m = re.search(r"running at http://127\.0\.0\.1:(\d+)/", line)
            if m:
                break
        else:
            pytest.fail(f"`ray-lite serve run` never said it was running:\n{out}")
        port = m.group(1)
        url = re.sub(r"127\.0\.0\.1:8000", f"127.0.0.1:{port}", url)
        with urllib.request.urlopen(url, timeout=30) as r:
            assert json.loads(r.read()) == json.loads(expected)
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out + rest
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
