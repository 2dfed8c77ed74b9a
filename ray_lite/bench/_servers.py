"""The servers the Serve benchmarks load (``serve``, ``serve_cpu``,
``soak``): an app served by ray_lite's CLI, Ray Serve, bare uvicorn (one
process, or one per core) or granian in a process tree of its own, started, waited for and ended by PID.

The suites import this module; it imports none of them.
"""
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request

from .._private.process.boot import python_argv
from ._procs import kill_survivors, tree_cpu_s, tree_snapshot

HERE = os.path.dirname(os.path.abspath(__file__))
# What a server prints (stdout) once every replica is ready.
READY_LINE = {"ray_lite": "ray-lite serve: application", "ray": "READY"}
#: The server kind of bare uvicorn with a worker process per core (B8's goal
#: is relative to it); "uvicorn" is one process.
UVICORN_WORKERS = "uvicorn-workers"
#: The server kind of granian (an HTTP server written in Rust) with one
#: worker: the mark past uvicorn's workers that Serve's HTTP rows report.
GRANIAN = "granian"
#: The servers that serve the app alone, without a runtime: the ceilings.
BARE_SERVERS = ("uvicorn", UVICORN_WORKERS, GRANIAN)
#: How ray_lite's Serve takes HTTP (``http_mode``): through its proxies, or
#: with the ingress replicas listening themselves (direct ingress).
HTTP_MODES = ("proxies", "direct")
#: The environment switch of direct ingress (Ray's name).
DIRECT_INGRESS_ENV = "RAY_SERVE_ENABLE_DIRECT_INGRESS"


def uvicorn_workers():
    """How many worker processes the ``UVICORN_WORKERS`` server runs: one per core."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def is_bare_server(raymod):
    """Whether ``raymod`` names a server without a runtime (no B10, no READY line)."""
    return raymod in BARE_SERVERS


class AppSpec:
    """An app a benchmark serves: ``ray_lite.bench.<module>:model`` on
    ray_lite and Ray Serve, ``<module>:<asgi>`` on bare uvicorn (None: the
    "hi" app of ``_hi_asgi``); ``path`` is what the load asks for and ``expect`` how
    its answer starts."""

    def __init__(self, module, asgi, path, expect):
        self.module, self.asgi, self.path, self.expect = module, asgi, path, expect


#: The 48-replica "hi" app of Ray's issue (``serve_hi_app.py``).
HI = AppSpec("serve_hi_app", None, "/", b"hi")


def free_port():
    """A TCP port free on 127.0.0.1 now."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def env_for(raymod, replicas):
    """The environment of a server (or workload) of ``raymod`` with ``replicas``."""
    return dict(os.environ, RAYMOD=raymod, REPLICAS=str(replicas), RAY_AUTH_MODE="disabled")


_RAY_SERVER = """
import sys, time, ray
from ray import serve
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
serve.start(http_options={"host": "127.0.0.1", "port": int(sys.argv[1])})
sys.path.insert(0, sys.argv[2])
import importlib, ray.cloudpickle as cloudpickle
app = importlib.import_module(sys.argv[3])
cloudpickle.register_pickle_by_value(app)   # Ray's workers cannot import it
serve.run(app.model({}), route_prefix="/")   # returns once every replica is up
print("READY", flush=True)
time.sleep(3600)
"""


_UVICORN_SERVER = """
import importlib, sys, uvicorn

port, app_dir, target = int(sys.argv[1]), sys.argv[2], sys.argv[3]
workers = int(sys.argv[4]) if len(sys.argv) > 4 else 1
sys.path.insert(0, app_dir)
if workers > 1:              # worker processes: the app by its import string
    app, extra = target, {"workers": workers, "app_dir": app_dir}
else:
    module, attr = target.split(":")
    app, extra = getattr(importlib.import_module(module), attr), {}
uvicorn.run(app, host="127.0.0.1", port=port, loop="uvloop", http="httptools",
            access_log=False, log_level="warning", **extra)
"""


class Server:
    """An app (an :class:`AppSpec`; the hi app by default) served by
    ray_lite's CLI, Ray Serve or bare uvicorn, until stopped.  ``http_mode``
    (ray_lite only, one of :data:`HTTP_MODES`): how its Serve takes HTTP;
    None leaves the environment's choice."""

    def __init__(self, python, raymod, replicas, app=None, http_mode=None):
        self.port = free_port()
        self.raymod = raymod
        self.app = app = app or HI
        env = env_for(raymod, replicas)
        if raymod == "ray_lite" and http_mode is not None:
            if http_mode not in HTTP_MODES:
                raise ValueError(f"http_mode must be one of {HTTP_MODES}, got {http_mode!r}")
            env[DIRECT_INGRESS_ENV] = "1" if http_mode == "direct" else "0"
        if raymod == "ray_lite":
            # Pinned to this ray_lite, wherever the benchmark is started from.
            cmd = python_argv("from ray_lite.scripts import main; sys.exit(main())",
                              "benchmark's serve run", python=python)
            cmd += ["serve", "run", f"ray_lite.bench.{app.module}:model", "--port", str(self.port)]
        elif raymod == UVICORN_WORKERS:
            target = f"{app.module}:{app.asgi}" if app.asgi else "_hi_asgi:app"
            cmd = [python, "-c", _UVICORN_SERVER, str(self.port), HERE, target,
                   str(uvicorn_workers())]
        elif raymod == "uvicorn":
            target = f"{app.module}:{app.asgi}" if app.asgi else "_hi_asgi:app"
            cmd = [python, "-c", _UVICORN_SERVER, str(self.port), HERE, target]
        elif raymod == GRANIAN:
            target = f"{app.module}:{app.asgi}" if app.asgi else "_hi_asgi:app"
            cmd = [python, "-m", "granian", "--interface", "asgi", "--host", "127.0.0.1",
                   "--port", str(self.port), "--workers", "1", "--log-level", "warning",
                   "--no-access-log", "--working-dir", HERE, target]
        else:
            cmd = [python, "-c", _RAY_SERVER, str(self.port), HERE, app.module]
        self.out = tempfile.TemporaryFile()
        self.err = tempfile.TemporaryFile()
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.out, stderr=self.err,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        self.up_s = None
        self.stderr_lines = []

    def _check_alive(self):
        if self.proc.poll() is not None:
            raise RuntimeError(f"the {self.raymod} server exited ({self.proc.returncode}): "
                               f"{self.stderr_text()[-600:]}")

    def wait_up(self, timeout):
        """Seconds from the start to the first answer."""
        url = f"http://127.0.0.1:{self.port}{self.app.path}"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.read().startswith(self.app.expect):
                        self.up_s = time.monotonic() - self.t0
                        return self.up_s
            except OSError:
                time.sleep(0.01)
        raise RuntimeError(f"the {self.raymod} server did not answer within {timeout} s")

    def wait_ready(self, timeout):
        """Until the server says every replica is ready (bare uvicorn: it answers)."""
        marker = READY_LINE.get(self.raymod)
        if marker is None:
            return
        deadline = time.monotonic() + timeout
        while marker.encode() not in self._read(self.out):
            self._check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"the {self.raymod} server was not ready within {timeout} s")
            time.sleep(0.05)

    @staticmethod
    def _read(f):
        f.seek(0)
        return f.read()

    def stderr_text(self):
        return self._read(self.err).decode(errors="replace")

    def cpu_s(self):
        return tree_cpu_s(self.proc.pid)

    def stop(self):
        # Ray's GCS, raylet and workers are this server's descendants: end
        # them by PID if the server's own shutdown left any (never `ray stop`,
        # which ends every Ray on the machine, other users' too).
        tree = tree_snapshot(self.proc.pid)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT if self.raymod == "ray" else signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        kill_survivors(tree)
        self.stderr_lines = self.stderr_text().splitlines()
        self.out.close()
        self.err.close()
