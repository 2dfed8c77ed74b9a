"""Spill files: where objects go when the shared-memory store is full.

Each runtime spills into its own directory, named like its segments so that
the next start's clean-up finds a killed driver's leftovers, under one
folder per user in the temporary directory.  Both are made private to this
user (the temporary directory is everybody's), and the clean-up walks only a
folder that passes that check.
"""
import os

from ray_lite._fast import shm
from ray_lite._lazy import lazy_module

# Only spilling and its clean-up need them.
shutil = lazy_module("shutil", globals())
tempfile = lazy_module("tempfile", globals())

_spill_root = None


def spill_root():
    """The folder of every runtime's spill directory (found once: tempfile looks
    at the environment and tries writing in each candidate).  Workers take
    the driver's (``use_spill_root``): found in a worker, after the job's
    env_vars were set, a ``TMPDIR`` among them would put its spills where
    the driver's clean-up does not look."""
    global _spill_root
    if _spill_root is None:
        _spill_root = os.path.join(_temp_dir(), f"ray_lite_spill-{os.geteuid()}")
    return _spill_root


def _temp_dir():
    # tempfile.gettempdir()'s answer where it is plain (no TMPDIR, TEMP or
    # TMP, and /tmp is a directory this user may write in) without importing
    # tempfile, which with shutil, random, bz2 and lzma costs init() ~3 ms.
    if not any(os.environ.get(k) for k in ("TMPDIR", "TEMP", "TMP")) and \
            os.path.isdir("/tmp") and os.access("/tmp", os.W_OK | os.X_OK):
        return "/tmp"
    return tempfile.gettempdir()


def use_spill_root(root):
    """Spill under ``root`` (a worker: the driver's ``spill_root()``)."""
    global _spill_root
    _spill_root = root


def spill_dir(node):
    """Where the runtime of ``node`` spills (named like its segments: its clean-up finds it)."""
    return os.path.join(spill_root(), node.shm_prefix)


def make_spill_dir(node):
    """``spill_dir(node)``, made private to this user (its folder too: both
    are in the temporary directory, which every user may write to)."""
    shm.private_dir(spill_root())
    return shm.private_dir(spill_dir(node))


def remove_spill_dir(node):
    """The runtime's shutdown: its spilled objects go."""
    shutil.rmtree(spill_dir(node), ignore_errors=True)


def cleanup_stale_spill_dirs():
    """Remove the spill directories of runtimes whose driver is dead (a killed driver's leftovers)."""
    root = spill_root()
    try:
        shm.check_private(root, True)   # another user's (or a symlink): not ours to clean
        entries = os.listdir(root)
    except OSError:
        return
    for entry in entries:
        pid = shm.creator_pid(entry)
        if pid is not None and not shm.pid_alive(pid):
            shutil.rmtree(os.path.join(root, entry), ignore_errors=True)
