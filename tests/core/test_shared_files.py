"""What ray_lite makes in a shared place (the temporary directory, /dev/shm) is
private to its user: made exclusively, 0700 / 0600, and one that is there
already and is not this user's private directory or file is refused."""
import os
import stat
import types

import pytest

from ray_lite._fast import shm
from ray_lite._private.objects import object_store, spill as spill_files
from ray_lite.serve import _control, _metrics


def _mode(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_private_dir_is_made_0700_and_taken_again_when_it_is_ours(tmp_path):
    path = str(tmp_path / "d")
    assert shm.private_dir(path) == path
    assert _mode(path) == 0o700
    assert shm.private_dir(path) == path


def test_a_world_writable_dir_planted_at_the_path_is_refused(tmp_path):
    path = tmp_path / "d"
    path.mkdir()
    path.chmod(0o777)
    with pytest.raises(shm.SharedPathError, match=r"d has mode 0o777.*remove it"):
        shm.private_dir(str(path))


def test_a_symlink_planted_at_the_path_is_refused_not_followed(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    link = tmp_path / "d"
    link.symlink_to(target)
    with pytest.raises(shm.SharedPathError, match="symbolic link"):
        shm.private_dir(str(link))


def test_a_dir_of_another_user_is_refused(tmp_path):
    path = str(tmp_path / "d")
    shm.private_dir(path)
    with pytest.raises(shm.SharedPathError, match=f"belongs to uid {os.geteuid()}"):
        shm.private_dir(path, uid=os.geteuid() + 1)


def test_a_private_file_is_created_0600_and_never_through_what_is_there(tmp_path):
    path = str(tmp_path / "f")
    os.close(shm.create_private_file(path))
    assert _mode(path) == 0o600
    with pytest.raises(shm.SharedPathError, match="exists already"):
        shm.create_private_file(path)
    target = tmp_path / "target"
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(shm.SharedPathError):
        shm.create_private_file(str(link))
    assert not target.exists()


def _fake_node():
    return types.SimpleNamespace(shm_prefix=f"{shm.DEFAULT_PREFIX}{os.getpid()}_sf{os.urandom(4).hex()}_",
                                 zygote=None)


def test_the_store_capacity_file_is_0600_and_a_planted_symlink_is_refused(tmp_path):
    node = _fake_node()
    path = shm.segment_path(node.shm_prefix + "store_capacity")
    try:
        object_store.configure(node, 1 << 20)
        assert _mode(path) == 0o600
        object_store.configure(node, 2 << 20)      # the runtime's own: replaced
        node.store_capacity = None
        assert object_store.capacity_of(node) == 2 << 20
        os.unlink(path)
        target = tmp_path / "target"
        os.symlink(target, path)
        with pytest.raises(shm.SharedPathError, match="symbolic link"):
            object_store.configure(node, 1 << 20)
        assert not target.exists()
    finally:
        if os.path.lexists(path):
            os.unlink(path)


def test_the_spill_directory_is_private_and_a_planted_one_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(spill_files, "_spill_root", str(tmp_path / "spill"))
    node = _fake_node()
    spill = spill_files.make_spill_dir(node)
    assert _mode(str(tmp_path / "spill")) == 0o700 and _mode(spill) == 0o700
    os.rmdir(spill)
    os.mkdir(spill)
    os.chmod(spill, 0o777)
    with pytest.raises(shm.SharedPathError, match=spill):
        spill_files.make_spill_dir(node)


def test_the_serve_metrics_directory_planted_0777_is_refused(monkeypatch):
    node = _fake_node()
    monkeypatch.setattr(_metrics.metrics_files.state, "node", node)
    path = _metrics.metrics_dir()
    try:
        _metrics.prepare({"metrics_export_port": 0})
        assert _mode(path) == 0o700
        os.rmdir(path)
        os.mkdir(path)
        os.chmod(path, 0o777)
        with pytest.raises(shm.SharedPathError, match=path):
            _metrics.prepare({"metrics_export_port": 0})
    finally:
        if os.path.isdir(path):
            os.rmdir(path)


def test_the_control_socket_directory_planted_0777_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    planted = tmp_path / "ray_lite"
    planted.mkdir()
    planted.chmod(0o777)
    with pytest.raises(_control.ControlError, match="0o777"):
        _control.runtime_dir()


def test_stale_spill_clean_up_does_not_follow_a_planted_root(tmp_path, monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    victim = elsewhere / f"{shm.DEFAULT_PREFIX}999999999_"    # named like a dead driver's
    victim.mkdir(parents=True)
    (tmp_path / "spill").symlink_to(elsewhere)
    monkeypatch.setattr(spill_files, "_spill_root", str(tmp_path / "spill"))
    monkeypatch.setattr(shm, "pid_alive", lambda pid: False)
    spill_files.cleanup_stale_spill_dirs()
    assert victim.is_dir()
