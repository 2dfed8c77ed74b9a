"""Process helpers shared by the tests."""
import os
import select


def wait_dead(pid, timeout):
    """True once ``pid`` has exited (at once if it is gone), False after ``timeout`` s."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)
