"""Named shared-memory segments: creation, attachment, naming and clean-up.

Not a hot path (segments are created once per channel), so there is one
implementation shared by both twins.

A segment is a file in ``/dev/shm`` (what ``shm_open`` does on Linux), named
``<prefix><creator pid>_<64 random bits>``: unguessable, mode 0600, and
recognisable so that :func:`cleanup_stale_segments` can remove the segments of
a creator that was killed before it could unlink them.  We do not use
``multiprocessing.shared_memory``: it starts a resource-tracker process and
unlinks segments behind our back at interpreter exit.
"""
import mmap
import os
import re
import stat

from .._config import SHM_PREFIX
from .errors import SharedPathError

SHM_DIR = "/dev/shm"

#: Prefix of every segment ray_lite creates unless told otherwise.  A runtime
#: can narrow it (``rl_<runtime id>_``) so its clean-up touches only its own.
DEFAULT_PREFIX = SHM_PREFIX

_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,200}$")
# The first number after the prefix is the owning process: the creator for
# new_name(), the driver for a runtime's narrower prefix.
_PID_RE = re.compile(r"(\d+)_")


def _check_name(name):
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(f"invalid shared-memory segment name: {name!r}")


def segment_path(name):
    _check_name(name)
    return os.path.join(SHM_DIR, name)


def new_name(prefix=None):
    """An unguessable segment name that records the creating process."""
    prefix = DEFAULT_PREFIX if prefix is None else prefix
    name = f"{prefix}{os.getpid()}_{os.urandom(8).hex()}"
    _check_name(name)
    return name


def create_segment(size, prefix=None, name=None):
    """Create a zero-filled segment of ``size`` bytes; return ``(name, mmap)``.

    The file descriptor is closed at once: the mapping keeps the memory.
    """
    if size <= 0:
        raise ValueError(f"segment size must be positive, got {size}")
    name = new_name(prefix) if name is None else name
    path = segment_path(name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, size)
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except BaseException:
        os.close(fd)
        _unlink_quietly(path)
        raise
    os.close(fd)
    return name, mm


def attach_segment(name, size=None):
    """Map an existing segment read-write; ``size`` defaults to the whole file.

    Raises ``FileNotFoundError`` naming the segment when it does not exist.
    """
    path = segment_path(name)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        raise FileNotFoundError(f"shared-memory segment {name!r} does not exist") from None
    try:
        actual = os.fstat(fd).st_size
        if size is None:
            size = actual
        elif size > actual:
            raise ValueError(
                f"shared-memory segment {name!r} has {actual} bytes, expected at least {size}")
        if size <= 0:
            raise ValueError(f"shared-memory segment {name!r} is empty")
        return mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)


def unlink_segment(name):
    """Remove a segment's name; mappings stay valid until they are dropped.

    Returns False when it was already gone.
    """
    return _unlink_quietly(segment_path(name))


def _unlink_quietly(path):
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False


def list_segments(prefix=None):
    """Names of the entries in /dev/shm that start with ``prefix``."""
    prefix = DEFAULT_PREFIX if prefix is None else prefix
    try:
        entries = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return []
    return sorted(e for e in entries if e.startswith(prefix))


def pid_alive(pid):
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def creator_pid(name, prefix=None):
    """The pid recorded in a segment name made by :func:`new_name`, or None."""
    prefix = DEFAULT_PREFIX if prefix is None else prefix
    if not name.startswith(prefix):
        return None
    m = _PID_RE.match(name[len(prefix):])
    return int(m.group(1)) if m else None


def cleanup_stale_segments(prefix=None):
    """Unlink segments (and their side files) whose creator is dead.

    A process killed with SIGKILL cannot unlink what it created; the next
    runtime start calls this.  Only files this user owns are touched: /dev/shm
    is shared by every user, and a pid in a name says nothing about whose
    it is (started as root, we could otherwise remove anybody's).  Returns
    the names removed.
    """
    prefix = DEFAULT_PREFIX if prefix is None else prefix
    removed = []
    for name in list_segments(prefix):
        pid = creator_pid(name, prefix)
        if pid is not None and not pid_alive(pid):
            path = os.path.join(SHM_DIR, name)
            if _owned_by_us(path) and _unlink_quietly(path):
                removed.append(name)
    return removed


def check_private(path, directory, uid=None):
    """Refuse ``path`` unless it is a ``directory`` (or a regular file) of
    ``uid`` (this process's effective uid) that nobody else may write to.

    A symlink is refused, never followed: in a shared place another user could
    point it anywhere.  ``uid`` is for tests run as root."""
    uid = os.geteuid() if uid is None else uid
    st = os.lstat(path)
    kind = "directory" if directory else "file"
    if stat.S_ISLNK(st.st_mode):
        problem = "is a symbolic link"
    elif directory and not stat.S_ISDIR(st.st_mode) or not directory and not stat.S_ISREG(st.st_mode):
        problem = f"is not a {kind}"
    elif st.st_uid != uid:
        problem = f"belongs to uid {st.st_uid}, not to this user (uid {uid})"
    elif st.st_mode & 0o077:
        problem = f"has mode {oct(st.st_mode & 0o777)}: other users may read or change it"
    else:
        return st
    raise SharedPathError(
        f"{path} {problem}; ray_lite makes it as a private {kind} of its user (mode "
        f"{'0700' if directory else '0600'}) and will not use one it did not make: "
        f"remove it, or point TMPDIR at a directory of your own")


def private_dir(path, uid=None):
    """Make the directory ``path`` (in a shared place) private to this user:
    created 0700, or taken when it exists already as this user's and private
    (``check_private``; ``SharedPathError`` otherwise).  Returns ``path``."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    check_private(path, True, uid)
    return path


def create_private_file(path, flags=os.O_WRONLY):
    """Create the file ``path`` (in a shared place) exclusively, 0600, never
    through a symlink; return its descriptor.  ``SharedPathError`` when
    something is there already (``FileExistsError`` is its cause)."""
    try:
        return os.open(path, flags | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError as exc:
        raise SharedPathError(
            f"{path} exists already and ray_lite did not make it; it creates this file "
            f"afresh (mode 0600): remove it") from exc


def _owned_by_us(path):
    """Whether ``path`` itself (a symlink is not followed) belongs to our effective uid."""
    try:
        return os.lstat(path).st_uid == os.geteuid()
    except FileNotFoundError:
        return False


def close_if_dropped(end):
    """``__del__`` of a pure-Python channel end: an end dropped without
    ``close()`` is closed, so that its peer wakes and its segments go.
    Never raises (the interpreter may be shutting down)."""
    try:
        if not getattr(end, "_released", True):
            end.close()
    except Exception:
        pass
