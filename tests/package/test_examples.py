"""The examples run (as users run them: a separate Python process)."""
import os
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_token_streaming_example():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    out = subprocess.run([sys.executable, str(EXAMPLES / "token_streaming.py"), "3", "50"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert "p2: 50 tokens, first 'p2-tok0', last 'p2-tok49'" in out.stdout
    assert "150 tokens in" in out.stdout


def test_serve_hello_example():
    import socket
    with socket.socket() as s:          # a free loopback port for the example
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    out = subprocess.run([sys.executable, str(EXAMPLES / "serve_hello.py"), str(port)],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    import json
    assert json.loads(out.stdout) == {"greeting": "hello ray_lite", "letters": list("ray_lite")}
