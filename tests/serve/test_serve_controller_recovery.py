"""Serve outlives its controller (issue 48): HTTP and handles keep answering
while the controller is down; the runtime restarts it and it recovers the
applications, replicas and proxies from its checkpoint without restarting
any; status, run and delete work again.  Also: the warning about a replica
whose constructor does not return."""
import os
import signal
import threading
import time

import pytest

import ray_lite
from ray_lite import serve
from ray_lite.serve import _core, context
from ray_lite.util.state import list_actors

from serve_helpers import http, process_gone, wait_until


@serve.deployment(num_replicas=2)
class Pid:
    def __call__(self, request=None):
        return str(os.getpid())


def _controller_pid():
    """The controller's process, as the runtime's state API lists it."""
    (actor,) = list_actors(filters=[("name", "=", context.CONTROLLER_NAME),
                                    ("state", "=", "ALIVE")])
    return actor["pid"]


def _process_ids():
    return _core.get(context.get_controller().process_ids.remote(), timeout=30)


class _Load(threading.Thread):
    """Calls ``call()`` in a loop until stopped (each call is bounded by its
    own timeout); counts the answers and keeps the failures.  No bound on
    the number of calls: at tens of microseconds a call, even 100,000 of
    them end within seconds, before a restarted controller may be back."""

    def __init__(self, call):
        super().__init__(daemon=True)
        self.call = call
        self.ok, self.failures = 0, []
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            try:
                self.call()
                self.ok += 1
            except Exception as exc:   # noqa: BLE001 - recorded, asserted empty
                self.failures.append(repr(exc))

    def finish(self):
        self.stop.set()
        self.join(60)
        assert not self.is_alive()


def _kill_controller_under(load):
    """SIGKILL the controller while ``load`` runs; wait (bounded) until a new
    controller runs Serve again.  Returns (old pid, new pid)."""
    before = load.ok
    wait_until(lambda: load.ok >= before + 20, "answers before the kill")
    old = _controller_pid()
    os.kill(old, signal.SIGKILL)
    wait_until(lambda: process_gone(old), "the controller's end")
    at_kill = load.ok
    # The load goes on while the controller is down and restarts.
    wait_until(lambda: load.ok >= at_kill + 20, "answers after the kill")

    def recovered():
        try:
            return _controller_pid() != old and \
                serve.status().applications["a"].status == "RUNNING"
        except Exception:   # noqa: BLE001 - not restarted yet
            return False
    wait_until(recovered, "the restarted controller's RUNNING status", timeout=60)
    new = _controller_pid()
    after = load.ok
    wait_until(lambda: load.ok >= after + 20, "answers after the recovery")
    return old, new


def test_http_keeps_answering_while_the_controller_restarts(serve_port):
    serve.run(Pid.bind(), name="a", route_prefix="/a")
    before = _process_ids()
    assert len(before["replicas"]["a/Pid"]) == 2

    def get():
        status, _, body = http(serve_port, "GET", "/a", timeout=30)
        assert status == 200, (status, body)
        assert int(body) in before["replicas"]["a/Pid"]

    load = _Load(get)
    load.start()
    try:
        old, new = _kill_controller_under(load)
    finally:
        load.finish()
    assert load.failures == []
    assert new != old
    after = _process_ids()
    # The same replicas and proxies: recovered, not restarted.
    assert sorted(after["replicas"]["a/Pid"]) == sorted(before["replicas"]["a/Pid"])
    assert after["proxies"] == before["proxies"]
    assert after["controller"] == new
    st = serve.status()
    assert st.applications["a"].deployments["Pid"].replica_states == {"RUNNING": 2}
    # The restarted controller deploys and serves a new application.
    serve.run(Pid.options(num_replicas=1).bind(), name="b", route_prefix="/b")
    status, _, body = http(serve_port, "GET", "/b")
    assert status == 200 and int(body) not in before["replicas"]["a/Pid"]
    serve.delete("b")
    assert set(serve.status().applications) == {"a"}


def test_handles_keep_answering_while_the_controller_restarts(serve_runtime):
    handle = serve.run(Pid.bind(), name="a", route_prefix=None)
    replicas = _process_ids()["replicas"]["a/Pid"]
    fresh = serve.get_app_handle("a")       # not called before the kill

    def call():
        assert int(handle.remote().result(timeout_s=30)) in replicas

    load = _Load(call)
    load.start()
    try:
        _kill_controller_under(load)
        # A handle that learns its replicas after the restart.
        assert int(fresh.remote().result(timeout_s=30)) in replicas
    finally:
        load.finish()
    assert load.failures == []
    assert sorted(_process_ids()["replicas"]["a/Pid"]) == sorted(replicas)


def test_a_replica_that_dies_while_the_controller_is_down_is_replaced(serve_runtime):
    handle = serve.run(Pid.bind(), name="a", route_prefix=None)
    replicas = _process_ids()["replicas"]["a/Pid"]
    ctl_pid = _controller_pid()
    os.kill(ctl_pid, signal.SIGKILL)
    os.kill(replicas[0], signal.SIGKILL)
    wait_until(lambda: process_gone(ctl_pid) and process_gone(replicas[0]), "both ends")

    def replaced():
        try:
            now = _process_ids()["replicas"]["a/Pid"]
        except Exception:   # noqa: BLE001 - not restarted yet
            return False
        return len(now) == 2 and replicas[0] not in now
    wait_until(replaced, "a replacement replica", timeout=60)
    now = _process_ids()["replicas"]["a/Pid"]
    assert replicas[1] in now
    answers = {int(handle.remote().result(timeout_s=30)) for _ in range(40)}
    assert answers <= set(now) and replicas[0] not in answers
    assert serve.status().applications["a"].status == "RUNNING"


@serve.deployment(num_replicas=1, health_check_period_s=0.1, health_check_timeout_s=5)
class Checked:
    def __init__(self, flag):
        self.flag = flag

    def check_health(self):
        if os.path.exists(self.flag):
            raise RuntimeError("unhealthy")

    def __call__(self, request=None):
        return str(os.getpid())


def test_health_checks_resume_after_the_restart(serve_runtime, tmp_path):
    flag = str(tmp_path / "unhealthy")
    handle = serve.run(Checked.bind(flag), name="a", route_prefix=None)
    (first,) = _process_ids()["replicas"]["a/Checked"]
    old = _controller_pid()
    os.kill(old, signal.SIGKILL)
    wait_until(lambda: process_gone(old), "the controller's end")
    assert serve.status().applications["a"].status == "RUNNING"     # (restarted)
    assert _process_ids()["replicas"]["a/Checked"] == [first]
    open(flag, "w").close()       # its checks fail from now on: it is replaced

    def replaced():
        now = _process_ids()["replicas"]["a/Checked"]
        return bool(now) and now != [first]
    wait_until(lambda: process_gone(first), "the unhealthy replica's end")
    os.unlink(flag)
    wait_until(replaced, "its replacement")
    assert int(handle.remote().result(timeout_s=30)) != first


def test_the_checkpoint_store_restarts_and_gets_the_state_again(serve_runtime):
    from ray_lite.serve._controller_checkpoint import STORE_NAME
    handle = serve.run(Pid.bind(), name="a", route_prefix=None)
    replicas = sorted(_process_ids()["replicas"]["a/Pid"])
    (store,) = list_actors(filters=[("name", "=", STORE_NAME), ("state", "=", "ALIVE")])
    os.kill(store["pid"], signal.SIGKILL)

    def store_refilled():
        found = list_actors(filters=[("name", "=", STORE_NAME), ("state", "=", "ALIVE")])
        if not found or found[0]["pid"] == store["pid"]:
            return False
        from ray_lite.serve._controller_checkpoint import find_store
        try:
            return _core.get(find_store().load.remote(), timeout=10) is not None
        except Exception:   # noqa: BLE001 - restarting
            return False
    wait_until(store_refilled, "the restarted store's state")
    old = _controller_pid()
    os.kill(old, signal.SIGKILL)
    wait_until(lambda: process_gone(old), "the controller's end")
    assert serve.status().applications["a"].status == "RUNNING"
    assert sorted(_process_ids()["replicas"]["a/Pid"]) == replicas
    assert int(handle.remote().result(timeout_s=30)) in replicas


def test_a_controller_that_lost_its_checkpoint_too_ends_what_it_cannot_manage(serve_port):
    # The store and the controller killed together: the new controller
    # starts empty and ends the replicas and the proxy it finds (the docs'
    # "When the controller dies"); Serve is usable again.
    from ray_lite.serve._controller_checkpoint import STORE_NAME
    serve.run(Pid.bind(), name="a", route_prefix="/a")
    before = _process_ids()
    (store,) = list_actors(filters=[("name", "=", STORE_NAME), ("state", "=", "ALIVE")])
    os.kill(store["pid"], signal.SIGKILL)
    os.kill(before["controller"], signal.SIGKILL)
    for pid in before["replicas"]["a/Pid"] + before["proxies"]:
        wait_until(lambda: process_gone(pid), f"process {pid}'s end")
    assert serve.status().applications == {}
    handle = serve.run(Pid.bind(), name="a", route_prefix="/a")
    after = _process_ids()
    assert int(handle.remote().result(timeout_s=30)) in after["replicas"]["a/Pid"]
    # New proxies (the port was 0, "any free one": they have another).
    assert after["proxies"] and not set(after["proxies"]) & set(before["proxies"])


def test_a_proxy_that_dies_while_the_controller_is_down_is_replaced(serve_port):
    serve.run(Pid.bind(), name="a", route_prefix="/a")
    before = _process_ids()
    (proxy,) = before["proxies"]
    os.kill(before["controller"], signal.SIGKILL)
    os.kill(proxy, signal.SIGKILL)
    wait_until(lambda: process_gone(before["controller"]) and process_gone(proxy),
               "both ends")

    def replaced():
        try:
            now = _process_ids()["proxies"]
        except Exception:   # noqa: BLE001 - not restarted yet
            return False
        return len(now) == 1 and now != [proxy]
    wait_until(replaced, "a replacement proxy")
    # On the same port, with the recovered routes.
    status, _, body = http(serve_port, "GET", "/a")
    assert status == 200 and int(body) in before["replicas"]["a/Pid"]


def test_shutdown_after_a_restart_leaves_nothing(serve_runtime):
    serve.run(Pid.bind(), name="a", route_prefix=None)
    pids = _process_ids()
    os.kill(pids["controller"], signal.SIGKILL)
    wait_until(lambda: process_gone(pids["controller"]), "the controller's end")
    serve.shutdown()
    for pid in pids["replicas"]["a/Pid"]:
        wait_until(lambda: process_gone(pid), f"replica {pid}'s end")
    assert serve.status().applications == {}
    # Killed by shutdown, it is not restarted (nor its checkpoint store).
    assert [a for a in list_actors() if a.get("ray_namespace") == context.SERVE_NAMESPACE
            and a["state"] == "ALIVE"] == []


def test_shutdown_without_a_controller_still_ends_serves_processes(serve_runtime):
    # The controller killed for good (as if its restart had failed): nothing
    # can ask it which processes are Serve's, and shutdown finds them itself.
    serve.run(Pid.bind(), name="a", route_prefix=None)
    pids = _process_ids()
    ray_lite.kill(context.get_controller(), no_restart=True)
    wait_until(lambda: process_gone(pids["controller"]), "the controller's end")
    serve.shutdown()
    for pid in pids["replicas"]["a/Pid"] + pids["proxies"]:
        wait_until(lambda: process_gone(pid), f"process {pid}'s end")
    # (A process gone is dead to the runtime once it has read the death.)
    wait_until(lambda: [a for a in list_actors() if a["state"] == "ALIVE"] == [],
               "the runtime to see every actor dead")


@serve.deployment
class WaitsForFile:
    def __init__(self, path):
        deadline = time.monotonic() + 60
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.01)

    def __call__(self, request=None):
        return str(os.getpid())


def test_serve_run_completes_when_the_controller_dies_mid_deploy(serve_runtime, tmp_path):
    go = str(tmp_path / "go")
    done = {}

    def deploy():
        try:
            done["handle"] = serve.run(WaitsForFile.bind(go), name="a", route_prefix=None)
        except Exception as exc:   # noqa: BLE001 - asserted absent below
            done["error"] = exc
    t = threading.Thread(target=deploy, daemon=True)
    t.start()

    def starting():
        found = list_actors(filters=[("class_name", "=", "ServeReplica"),
                                     ("state", "=", "ALIVE")])
        return found[0]["pid"] if found else None
    wait_until(starting, "a replica in its constructor")
    orphan = starting()
    old = _controller_pid()
    os.kill(old, signal.SIGKILL)
    wait_until(lambda: process_gone(old) and process_gone(orphan),
               "the controller's end, and then the replica it was starting")
    open(go, "w").close()
    t.join(90)
    assert not t.is_alive()
    assert "error" not in done, done
    assert serve.status().applications["a"].status == "RUNNING"
    (pid,) = _process_ids()["replicas"]["a/WaitsForFile"]
    assert pid != orphan
    assert int(done["handle"].remote().result(timeout_s=30)) == pid


@serve.deployment
class Hangs:
    def __init__(self):
        threading.Event().wait()

    def __call__(self, request=None):
        return "never"


def test_a_constructor_that_does_not_return_is_warned_of_repeatedly(capfd):
    import ray_lite
    # (Ray's settings, given to the controller, which warns.)
    env = {"RAY_SERVE_SLOW_STARTUP_WARNING_S": "1",
           "RAY_SERVE_SLOW_STARTUP_WARNING_PERIOD_S": "1"}
    result = {}

    def deploy():
        try:
            # (One failure to start ends the deploy: the replica killed below
            # is not started again.)
            serve.run(Hangs.options(max_constructor_retry_count=1).bind(), name="stuck",
                      route_prefix=None,
                      controller_options={"runtime_env": {"env_vars": env}})
        except Exception as exc:   # noqa: BLE001 - the deploy fails (below)
            result["error"] = exc
    seen = []

    def two_warnings():
        out, err = capfd.readouterr()      # (the runtime relays workers' output)
        seen.append(out + err)
        return "".join(seen).count("to initialize") >= 2

    # Started here, within the capture: the runtime relays its workers'
    # output to the standard streams it had when it started.
    ray_lite.init(num_cpus=1)
    try:
        t = threading.Thread(target=deploy, daemon=True)
        t.start()
        try:
            wait_until(two_warnings, "two slow-startup warnings", timeout=60)
        finally:
            # serve.run holds Serve's lock until the deploy ends: the stuck
            # replica is killed, which fails the deploy.
            for a in list_actors(filters=[("class_name", "=", "ServeReplica"),
                                          ("state", "=", "ALIVE")]):
                os.kill(a["pid"], signal.SIGKILL)
            t.join(60)
        assert not t.is_alive()
    finally:
        serve.shutdown()
        ray_lite.shutdown()
    assert "Deploying application 'stuck' failed" in str(result["error"])
    text = "".join(seen)
    line = next(x for x in text.splitlines() if "to initialize" in x)
    assert "'Hangs'" in line and "'stuck'" in line
    assert "Hangs#" in line and "more than 1 s" in line
