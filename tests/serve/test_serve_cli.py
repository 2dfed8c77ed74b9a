"""``ray-lite serve run`` in both forms (module:app and module:builder), shut down by
SIGTERM, SIGHUP and Ctrl-C (SIGINT, even when inherited ignored), a second Ctrl-C
while it drains, and a port that is taken or already in service."""
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from serve_helpers import http

APP = textwrap.dedent("""
    import asyncio

    from starlette.requests import Request
    from ray_lite import serve

    @serve.deployment(num_replicas=2, ray_actor_options={"num_cpus": 0})
    class TestDeployment:
        def __init__(self, word="hi"):
            self.word = word

        async def __call__(self, request: Request):
            if "sleep" in request.query_params:
                print("cli-app: sleeping", flush=True)
                await asyncio.sleep(float(request.query_params["sleep"]))
            return self.word

    app = TestDeployment.bind()

    def model(args):
        return TestDeployment.bind(args.get("word", "hi"))

    @serve.deployment(graceful_shutdown_timeout_s=1, ray_actor_options={"num_cpus": 0})
    def busy(request):
        import time
        end = time.monotonic() + 2
        while time.monotonic() < end:     # CPU-bound: its replica's loop is stuck
            pass
        return "done"

    busy_app = busy.bind()

    @serve.deployment(ray_actor_options={"num_cpus": 0})
    class Hangs:
        def __init__(self):
            import threading
            threading.Event().wait()        # a constructor that never returns

    hangs_app = Hangs.bind()

    @serve.deployment(ray_actor_options={"num_cpus": 0})
    def controller_pid(request):
        from ray_lite.util.state import list_actors
        (a,) = list_actors(filters=[("name", "=", "SERVE_CONTROLLER"), ("state", "=", "ALIVE")])
        return str(a["pid"])

    pid_app = controller_pid.bind()
""")


def _start(tmp_path, *args, port=0, ignore_sigint=False, command="run"):
    (tmp_path / "cli_app_mod.py").write_text(APP)
    cmd = [sys.executable, "-c", "import sys; from ray_lite.scripts import main; sys.exit(main())",
           "serve", command, *args, "--app-dir", str(tmp_path), "--port", str(port), "--proxies", "1",
           "--num-cpus", "1"]
    env = _child_env()
    # ignore_sigint: as a shell script's background job starts it.
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            cwd=str(tmp_path), env=env,
                            preexec_fn=_ignore_sigint if ignore_sigint else None)


def _child_env():
    """The environment of a child that imports the ray_lite this test imported
    (installed or a checkout)."""
    import ray_lite
    root = os.path.dirname(os.path.dirname(os.path.abspath(ray_lite.__file__)))
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))


def _ignore_sigint():
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _wait_line(proc, pattern, timeout=60):
    """The match of ``pattern`` in the first line of ``proc``'s output that has
    it, and the output until then; the test fails if none comes in ``timeout``."""
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    out = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not sel.select(max(0.0, deadline - time.monotonic())):
            break
        line = proc.stdout.readline()
        if not line:
            break
        out += line
        m = re.search(pattern, line)
        if m:
            return m, out
    proc.kill()
    proc.wait(10)
    pytest.fail(f"the CLI never printed {pattern!r}; output:\n{out.decode(errors='replace')}")


def _wait_port(proc, timeout=60):
    m, out = _wait_line(proc, rb"running at http://127\.0\.0\.1:(\d+)", timeout)
    return int(m.group(1)), out


def _exit_of(proc, why, timeout=60):
    """``(return code, output)`` of ``proc`` once it exits; the test fails
    (``why`` says what it was waiting for) if it does not within ``timeout``."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate(timeout=10)
        pytest.fail(f"the CLI did not exit {why}")
    return proc.returncode, out


def _reap(proc):
    """Kill ``proc`` if a failed test left it running."""
    if proc.poll() is None:
        proc.kill()
        proc.communicate(timeout=10)


def _stop(proc, sig):
    proc.send_signal(sig)
    return _exit_of(proc, "after a signal")


@pytest.mark.parametrize("target,args,expected,sig,ignore_sigint", [
    ("cli_app_mod:app", [], b"hi", signal.SIGTERM, False),
    ("cli_app_mod:model", ["word=hello"], b"hello", signal.SIGINT, False),
    # Started by a script in the background (SIGINT ignored): stops all the same.
    ("cli_app_mod:app", [], b"hi", signal.SIGINT, True),
    ("cli_app_mod:app", [], b"hi", signal.SIGHUP, True),
])
def test_cli_serves_until_signalled(tmp_path, target, args, expected, sig, ignore_sigint):
    proc = _start(tmp_path, target, *args, ignore_sigint=ignore_sigint)
    try:
        port, _ = _wait_port(proc)
        assert http(port, "GET", "/")[2] == expected
    finally:
        code, out = _stop(proc, sig)
    assert code == 0, out.decode(errors="replace")
    assert b"shut down" in out


def test_cli_reports_a_bad_target(tmp_path):
    proc = _start(tmp_path, "cli_app_mod:nothing_here")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1 and b"cannot load" in out


def test_cli_route_prefix(tmp_path):
    proc = _start(tmp_path, "cli_app_mod:app", "--route-prefix", "/api")
    try:
        port, _ = _wait_port(proc)
        assert http(port, "GET", "/api")[2] == b"hi"
        assert http(port, "GET", "/")[0] == 404
    finally:
        code, out = _stop(proc, signal.SIGTERM)
    assert code == 0, out.decode(errors="replace")


def test_cli_port_in_use_fails_and_cleans_up(tmp_path):
    busy = socket.socket()
    try:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = _start(tmp_path, "cli_app_mod:app", port=port)
        code, out = _exit_of(proc, "when its port was taken", timeout=120)
    finally:
        busy.close()
    assert code != 0
    # One line naming the address; no proxy started (and died) trying.
    assert b"RayServeException: HTTP cannot listen on 127.0.0.1:%d: Address already in use" % port \
        in out, out.decode(errors="replace")
    assert b"ProxyActor" not in out and b"Traceback" not in out, out.decode(errors="replace")
    assert b"shut down" in out


def test_a_second_serve_run_on_a_port_in_service_fails(tmp_path):
    first = _start(tmp_path, "cli_app_mod:app")
    try:
        port, _ = _wait_port(first)
        second = _start(tmp_path, "cli_app_mod:model", "word=other", port=port)
        code, out = _exit_of(second, "when its port was in service", timeout=120)
        assert code != 0
        assert b"Address already in use" in out, out.decode(errors="replace")
        # The first keeps the port to itself.
        assert all(http(port, "GET", "/")[2] == b"hi" for _ in range(10))
    finally:
        code, out = _stop(first, signal.SIGTERM)
    assert code == 0, out.decode(errors="replace")


def test_a_second_ctrl_c_while_draining_stops_at_once_without_a_traceback(tmp_path):
    proc = _start(tmp_path, "cli_app_mod:app")
    try:
        port, _ = _wait_port(proc)
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(b"GET /?sleep=600 HTTP/1.1\r\nHost: x\r\n\r\n")
            _wait_line(proc, rb"cli-app: sleeping")
            proc.send_signal(signal.SIGINT)      # drains: waits for the request
            _wait_line(proc, rb"shutting down")
            # The second Ctrl-C while the client is still connected: closing
            # the connection first would end the request and with it the
            # drain, and the server could be gone before the signal came.
            code, out = _stop(proc, signal.SIGINT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    assert code == 0, out.decode(errors="replace")
    assert b"Traceback" not in out, out.decode(errors="replace")
    assert b"stopping without draining" in out and b"shut down" in out


def test_sigterm_under_load_stops_within_the_graceful_timeout(tmp_path):
    proc = _start(tmp_path, "cli_app_mod:busy_app")
    stop = threading.Event()
    answered = threading.Semaphore(0)

    def client(port):
        while not stop.is_set():
            try:
                http(port, "GET", "/", timeout=60)
            except OSError:
                return          # the server went away
            answered.release()
    threads = []
    try:
        port, _ = _wait_port(proc)
        threads = [threading.Thread(target=client, args=(port,), daemon=True) for _ in range(8)]
        for t in threads:
            t.start()
        assert answered.acquire(timeout=60)     # under load: requests run and wait
        proc.send_signal(signal.SIGTERM)
        # graceful_shutdown_timeout_s=1: the requests still queued then are
        # dropped, and the processes killed, well within this bound.
        code, out = _exit_of(proc, "within the graceful shutdown timeout", timeout=1 + 14)
    finally:
        stop.set()
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
        for t in threads:
            t.join(60)
    assert code == 0, out.decode(errors="replace")
    assert b"shut down" in out


# ------------------------------------------------ config files and the control socket
CONFIG = textwrap.dedent("""
    proxy_location: EveryNode
    http_options: {host: 127.0.0.1, port: 0}
    applications:
      - name: first
        route_prefix: /first
        import_path: cli_app_mod:model
        args: {word: from-config}
        deployments:
          - name: TestDeployment
            num_replicas: 1
""")

CONFIG_UPDATED = CONFIG.replace("num_replicas: 1", "num_replicas: 3") + (
    "  - name: second\n"
    "    route_prefix: /second\n"
    "    import_path: cli_app_mod.app\n")


def _cli(*args, timeout=120):
    """(exit code, output) of a one-shot ``ray-lite serve`` command."""
    cmd = [sys.executable, "-c", "import sys; from ray_lite.scripts import main; sys.exit(main())",
           "serve", *args]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=_child_env(),
                       timeout=timeout)
    return r.returncode, r.stdout.decode(errors="replace")


def _replicas(status_text, app):
    """{deployment: RUNNING count} of ``app`` in ``serve status`` output."""
    m = re.search(rf"^  {app}:\n((?:    .*\n)+)", status_text, re.M)
    assert m, status_text
    return {d: int(n) for d, n in re.findall(r"^      (\w+):\n(?:        .*\n)*?"
                                              r"          RUNNING: (\d+)", m.group(1), re.M)}


def _wait_status(sock, cond, what, timeout=60):
    deadline = time.monotonic() + timeout
    out = ""
    while time.monotonic() < deadline:
        code, out = _cli("status", "--address", sock)
        assert code == 0, out
        if cond(out):
            return out
        time.sleep(0.1)
    pytest.fail(f"serve status never showed {what}:\n{out}")


pytest.importorskip("yaml")


def test_config_run_status_deploy_and_shutdown(tmp_path):
    (tmp_path / "c1.yaml").write_text(CONFIG)
    (tmp_path / "c2.yaml").write_text(CONFIG_UPDATED)
    sock = str(tmp_path / "serve.sock")
    proc = _start(tmp_path, str(tmp_path / "c1.yaml"), "--address", sock)
    try:
        m, out = _wait_line(proc, rb"running at http://127\.0\.0\.1:(\d+)")
        assert b"proxy_location EveryNode is ignored" in out
        port = int(m.group(1))
        assert http(port, "GET", "/first")[2] == b"from-config"
        assert os.stat(sock).st_mode & 0o777 == 0o600
        code, status = _cli("status", "--address", sock)
        assert code == 0, status
        assert re.search(r"^applications:\n  first:\n    status: RUNNING\n", status, re.M)
        assert "    route_prefix: /first\n" in status
        assert "        status: HEALTHY\n" in status
        assert _replicas(status, "first") == {"TestDeployment": 1}

        # A bad file changes nothing and says what is wrong.
        (tmp_path / "bad_key.yaml").write_text(CONFIG.replace("num_replicas", "num_replica"))
        code, out = _cli("deploy", str(tmp_path / "bad_key.yaml"), "--address", sock)
        assert code != 0 and "unknown key 'num_replica'" in out, out
        (tmp_path / "bad_path.yaml").write_text(CONFIG_UPDATED.replace("cli_app_mod.app",
                                                                       "no_such_mod.app"))
        code, out = _cli("deploy", str(tmp_path / "bad_path.yaml"), "--address", sock,
                         "--app-dir", str(tmp_path))
        assert code != 0 and "no_such_mod.app" in out, out
        assert "second" not in _cli("status", "--address", sock)[1]

        # In place: more replicas of the first app, and a second app.
        code, out = _cli("deploy", str(tmp_path / "c2.yaml"), "--address", sock,
                         "--app-dir", str(tmp_path))
        assert code == 0, out
        status = _wait_status(sock, lambda s: _replicas(s, "first") == {"TestDeployment": 3},
                              "three replicas")
        assert _replicas(status, "second") == {"TestDeployment": 2}
        assert http(port, "GET", "/second")[2] == b"hi"
        assert http(port, "GET", "/first")[2] == b"from-config"
        # Back to the first file: the second app goes, the replicas drain to one.
        code, out = _cli("deploy", str(tmp_path / "c1.yaml"), "--address", sock,
                         "--app-dir", str(tmp_path))
        assert code == 0, out
        _wait_status(sock, lambda s: "second" not in s and
                     _replicas(s, "first") == {"TestDeployment": 1} and "STOPPING" not in s,
                     "one app with one replica")
        assert http(port, "GET", "/second")[0] == 404
        assert http(port, "GET", "/first")[2] == b"from-config"

        code, out = _cli("shutdown", "--address", sock)     # no -y, no terminal: refused
        assert code != 0 and "-y" in out
        code, out = _cli("shutdown", "-y", "--address", sock)
        assert code == 0, out
        code, out = _exit_of(proc, "after serve shutdown")
    finally:
        _reap(proc)
    assert code == 0, out.decode(errors="replace")
    assert b"shut down" in out
    assert not os.path.exists(sock)
    code, out = _cli("status", "--address", sock)
    assert code != 0 and "no running Serve instance" in out


def test_serve_start_then_deploy(tmp_path):
    (tmp_path / "c2.yaml").write_text(CONFIG_UPDATED)
    sock = str(tmp_path / "serve.sock")
    proc = _start(tmp_path, "--address", sock, command="start")
    try:
        m, _ = _wait_line(proc, rb"Serve running at http://127\.0\.0\.1:(\d+)")
        port = int(m.group(1))
        code, status = _cli("status", "--address", sock)
        assert code == 0 and "applications: {}" in status, status
        code, out = _cli("deploy", str(tmp_path / "c2.yaml"), "--address", sock,
                         "--app-dir", str(tmp_path))
        assert code == 0, out
        assert "http_options are set when Serve starts" in out
        assert http(port, "GET", "/first")[2] == b"from-config"
        assert http(port, "GET", "/second")[2] == b"hi"
        proc.send_signal(signal.SIGTERM)
        code, out = _exit_of(proc, "after SIGTERM")
    finally:
        _reap(proc)
    assert code == 0, out.decode(errors="replace")


def test_a_bad_config_file_fails_serve_run_naming_the_key(tmp_path):
    (tmp_path / "bad.yaml").write_text(CONFIG.replace("route_prefix", "route_prefx"))
    proc = _start(tmp_path, str(tmp_path / "bad.yaml"), "--address", str(tmp_path / "s.sock"))
    code, out = _exit_of(proc, "on a bad config file")
    assert code != 0 and b"unknown key 'route_prefx'" in out, out


def test_the_control_directory_must_be_private(tmp_path, monkeypatch):
    from ray_lite.serve import _control
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert _control.runtime_dir() == str(tmp_path / "ray_lite")
    assert os.stat(tmp_path / "ray_lite").st_mode & 0o777 == 0o700
    with pytest.raises(_control.ControlError, match="no running Serve instance"):
        _control.find_address()
    os.chmod(tmp_path / "ray_lite", 0o777)
    with pytest.raises(_control.ControlError, match="not a private directory"):
        _control.runtime_dir()


def test_sockets_of_killed_instances_are_removed(tmp_path, monkeypatch):
    import socket
    import subprocess
    import sys
    from ray_lite.serve import _control
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    folder = _control.runtime_dir()
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, timeout=60)
    dead_pid = int(ended.stdout)
    paths = {}
    for kind, pid in (("dead", dead_pid), ("mine", os.getpid())):
        paths[kind] = os.path.join(folder, f"serve-{pid}.sock")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.bind(paths[kind])       # bound, never listening: as a killed instance left it
    with pytest.raises(_control.ControlError, match="no running Serve instance"):
        _control.find_address()
    # The dead process's socket is gone; a live process's stays (not ours to judge).
    assert not os.path.exists(paths["dead"]) and os.path.exists(paths["mine"])


def test_the_next_start_removes_the_socket_of_a_killed_serve_run(tmp_path, monkeypatch):
    from ray_lite.serve import _control
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    first = _start(tmp_path, "cli_app_mod:app")
    try:
        _wait_port(first)
        left = os.path.join(_control.runtime_dir(), f"serve-{first.pid}.sock")
        assert os.path.exists(left)
        first.kill()                    # SIGKILL: it cannot remove its socket
        first.communicate(timeout=60)
    finally:
        _reap(first)
    assert os.path.exists(left)
    second = _start(tmp_path, "cli_app_mod:app")
    try:
        port, _ = _wait_port(second)
        # Gone at this start, before any client command looked.
        assert not os.path.exists(left)
        assert os.path.exists(os.path.join(_control.runtime_dir(),
                                           f"serve-{second.pid}.sock"))
        assert http(port, "GET", "/")[2] == b"hi"
        code, _ = _stop(second, signal.SIGTERM)
        assert code == 0
    finally:
        _reap(second)


def test_serve_run_shows_the_warning_about_a_constructor_that_does_not_return(
        tmp_path, monkeypatch):
    # Ray's settings, lowered from 30 s.
    monkeypatch.setenv("RAY_SERVE_SLOW_STARTUP_WARNING_S", "1")
    monkeypatch.setenv("RAY_SERVE_SLOW_STARTUP_WARNING_PERIOD_S", "1")
    proc = _start(tmp_path, "cli_app_mod:hangs_app")
    try:
        warning = rb"'Hangs' of application 'default' has 1 replica\(s\) that have taken " \
                  rb"more than 1 s to initialize: Hangs#\d+ \((\d+) s\)"
        first, _ = _wait_line(proc, warning)
        second, _ = _wait_line(proc, warning)      # repeated while it has not returned
        assert int(first.group(1)) >= 1 and int(second.group(1)) >= 1
        _stop(proc, signal.SIGTERM)
    finally:
        _reap(proc)


def test_status_deploy_and_shutdown_work_after_the_controller_is_killed(tmp_path):
    (tmp_path / "c2.yaml").write_text(CONFIG_UPDATED)
    sock = str(tmp_path / "serve.sock")
    proc = _start(tmp_path, "cli_app_mod:pid_app", "--address", sock)
    try:
        port, _ = _wait_port(proc)
        old = int(http(port, "GET", "/")[2])
        os.kill(old, signal.SIGKILL)
        # Asked at once: answered by the restarted controller.
        code, status = _cli("status", "--address", sock)
        assert code == 0, status
        assert re.search(r"^  default:\n    status: RUNNING\n", status, re.M), status
        assert int(http(port, "GET", "/")[2]) != old
        code, out = _cli("deploy", str(tmp_path / "c2.yaml"), "--address", sock,
                         "--app-dir", str(tmp_path))
        assert code == 0, out
        status = _wait_status(sock, lambda s: _replicas(s, "first") == {"TestDeployment": 3}
                              and "default" not in s, "the config's applications")
        assert _replicas(status, "second") == {"TestDeployment": 2}
        assert http(port, "GET", "/first")[2] == b"from-config"
        code, out = _cli("shutdown", "-y", "--address", sock)
        assert code == 0, out
        code, out = _exit_of(proc, "after serve shutdown")
    finally:
        _reap(proc)
    assert code == 0, out.decode(errors="replace")
    assert not os.path.exists(sock)
