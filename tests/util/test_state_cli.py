"""ray-lite status / list / summary: Ray's state CLI, reaching a running
program through its driver's per-user state socket."""
import json
import os
import socket
import stat
import subprocess
import sys

import pytest

import ray_lite
from ray_lite._private.node import state_socket
from ray_lite.util import state_cli


@ray_lite.remote
class Keeper:
    def ping(self):
        return "pong"


@pytest.fixture
def private_dir(tmp_path, monkeypatch):
    """This test's own runtime directory: only its program's socket is there."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    return tmp_path / "ray_lite"


@pytest.fixture
def program(private_dir):
    ray_lite.init(num_cpus=2)
    try:
        k = Keeper.options(name="keeper").remote()
        assert ray_lite.get(k.ping.remote()) == "pong"
        yield k
    finally:
        ray_lite.shutdown()


def _run(capsys, *argv):
    code = state_cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_socket_is_private_and_goes_with_shutdown(private_dir):
    ray_lite.init(num_cpus=1)
    try:
        path = state_socket.current().address
        assert os.path.dirname(path) == str(private_dir)
        assert os.path.basename(path) == f"state-{os.getpid()}.sock"
        assert stat.S_IMODE(os.stat(private_dir).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert state_socket.find_address() == path
    finally:
        ray_lite.shutdown()
    assert not os.path.exists(path)
    assert state_socket.current() is None


def test_list_actors_with_rays_columns_filters_and_formats(program, capsys):
    code, out, _ = _run(capsys, "list", "actors")
    assert code == 0
    header = next(line for line in out.splitlines() if "ACTOR_ID" in line).split()
    assert header == [c.upper() for c in state_cli.COLUMNS["actors"]]
    assert "keeper" in out and "Total: 1" in out
    code, out, _ = _run(capsys, "list", "actors", "--filter", "state=ALIVE", "--format", "json")
    rows = json.loads(out)
    assert [(r["name"], r["class_name"], r["state"]) for r in rows] == [("keeper", "Keeper",
                                                                         "ALIVE")]
    code, out, _ = _run(capsys, "list", "actors", "--filter", "state!=ALIVE", "--format", "json")
    assert json.loads(out) == []
    code, out, _ = _run(capsys, "list", "workers", "--limit", "1", "--format", "json")
    assert len(json.loads(out)) == 1
    code, out, _ = _run(capsys, "list", "actors", "--detail")
    assert "NUM_RESTARTS" in out


def test_a_bad_filter_is_refused(program, capsys):
    code, _, err = _run(capsys, "list", "actors", "--filter", "state")
    assert code == 2 and "KEY=VALUE" in err


def test_yaml_needs_pyyaml(program, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "yaml", None)
    with pytest.raises(SystemExit, match="PyYAML"):
        state_cli.main(["list", "actors", "--format", "yaml"])


def test_summary_and_status(program, capsys):
    code, out, _ = _run(capsys, "summary", "actors", "--format", "json")
    cluster = json.loads(out)["cluster"]
    assert cluster["total_actors"] == 1
    assert cluster["summary"]["Keeper"]["state_counts"] == {"ALIVE": 1}
    code, out, _ = _run(capsys, "summary", "tasks")
    assert code == 0 and "Tasks Summary" in out
    code, out, _ = _run(capsys, "status", "--format", "json")
    st = json.loads(out)
    assert st["driver_pid"] == os.getpid()
    assert st["resources"]["CPU"]["total"] == 2.0
    kinds = {p["pid"]: p["kind"] for p in st["processes"]}
    assert kinds[os.getpid()] == "driver"
    assert "actor Keeper" in kinds.values()
    assert all(p["rss_bytes"] > 0 for p in st["processes"])
    assert st["object_store"]["capacity_bytes"] > 0
    assert st["serve"] == {}
    code, out, _ = _run(capsys, "status")
    assert "Resources" in out and "Serve applications" in out and "actor Keeper" in out


def test_from_another_process(program):
    # As from another terminal: the command, its own process, finds the one program.
    out = subprocess.run([sys.executable, "-m", "ray_lite.scripts", "list", "actors",
                          "--format", "json"], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    assert [r["name"] for r in json.loads(out)] == ["keeper"]
    out = subprocess.run([sys.executable, "-m", "ray_lite.scripts", "list", "actors",
                          "--address", str(os.getpid()), "--format", "json"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert [r["name"] for r in json.loads(out)] == ["keeper"]


def test_no_program_running_says_so(private_dir, capsys):
    code, _, err = _run(capsys, "status")
    assert code == 1 and "no running ray_lite program" in err


def test_several_programs_ask_for_an_address(program, private_dir, capsys):
    other = state_socket.StateServer(str(private_dir / "state-1.sock"), lambda msg: "other")
    try:
        code, _, err = _run(capsys, "list", "actors")
        assert code == 1 and "--address" in err and str(os.getpid()) in err
        assert state_socket.request(state_socket.find_address("1"), {"op": "x"}) == "other"
    finally:
        other.close()


def test_a_dead_programs_socket_is_removed(private_dir):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=60)
    directory = state_socket.runtime_dir()
    stale = os.path.join(directory, f"state-{proc.pid}.sock")
    s = socket.socket(socket.AF_UNIX)
    s.bind(stale)
    s.close()
    assert state_socket.live_sockets() == []
    assert not os.path.exists(stale)


def test_another_users_connection_is_refused(program, monkeypatch):
    from ray_lite._private.links import local_socket
    monkeypatch.setattr(local_socket, "peer_uid", lambda conn: os.getuid() + 1)
    with pytest.raises(state_socket.StateSocketError, match="another user"):
        state_socket.request(state_socket.find_address(), {"op": "status"})
