"""Named shared-memory segments (``ray_lite._fast.shm``): the stale-segment clean-up."""
import os
import subprocess
import sys

import pytest

from ray_lite._fast import shm

OTHER_UID = 65534  # "nobody"
PREFIX = "rl_cleanup_test_"


def _dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)
    return proc.pid


@pytest.fixture
def shm_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(shm, "SHM_DIR", str(tmp_path))
    return tmp_path


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another uid needs root")
def test_cleanup_removes_only_our_own_segments_of_a_dead_creator(shm_dir):
    dead = _dead_pid()
    ours = f"{PREFIX}{dead}_ours"
    theirs = f"{PREFIX}{dead}_theirs"
    their_link = f"{PREFIX}{dead}_their_link"  # another user's symlink to a file of ours
    alive = f"{PREFIX}{os.getpid()}_alive"
    for name in (ours, theirs, alive):
        (shm_dir / name).write_bytes(b"x")
    os.chown(shm_dir / theirs, OTHER_UID, OTHER_UID)
    os.symlink(shm_dir / alive, shm_dir / their_link)
    os.lchown(shm_dir / their_link, OTHER_UID, OTHER_UID)

    removed = shm.cleanup_stale_segments(PREFIX)

    assert removed == [ours]
    assert sorted(os.listdir(shm_dir)) == sorted([theirs, their_link, alive])
    assert (shm_dir / alive).read_bytes() == b"x"


def test_cleanup_removes_our_segments_of_a_dead_creator_and_keeps_the_live_ones(shm_dir):
    dead = _dead_pid()
    stale = [f"{PREFIX}{dead}_seg", f"{PREFIX}{dead}_seg.fifo"]
    live = f"{PREFIX}{os.getpid()}_seg"
    for name in stale + [live]:
        (shm_dir / name).write_bytes(b"")
    assert sorted(shm.cleanup_stale_segments(PREFIX)) == sorted(stale)
    assert os.listdir(shm_dir) == [live]
