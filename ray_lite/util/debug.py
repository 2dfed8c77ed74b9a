"""Ray's ``ray.util.debug`` logging helpers: ``log_once(key)`` is True the
first time a key is seen in this process (and again once a minute after
``enable_periodic_logging()``), never after ``disable_log_once_globally()``;
``reset_log_once(key=None)`` forgets one key or all."""
import threading
import time

__all__ = ["log_once", "disable_log_once_globally", "enable_periodic_logging",
           "reset_log_once"]

_PERIOD_S = 60.0
_lock = threading.Lock()
_seen = set()
_disabled = False
_periodic = False
_last_reset = time.monotonic()


def log_once(key):
    """True the first time ``key`` is seen (so a message is logged once)."""
    global _last_reset
    with _lock:
        if _disabled:
            return False
        if _periodic and time.monotonic() - _last_reset >= _PERIOD_S:
            _seen.clear()
            _last_reset = time.monotonic()
        if key in _seen:
            return False
        _seen.add(key)
        return True


def disable_log_once_globally():
    """From now on ``log_once`` is always False (for tests that assert on logs)."""
    global _disabled
    _disabled = True


def enable_periodic_logging():
    """From now on ``log_once`` forgets what it saw once a minute."""
    global _periodic
    _periodic = True


def reset_log_once(key=None):
    """Forget ``key`` (every key if None)."""
    with _lock:
        if key is None:
            _seen.clear()
        else:
            _seen.discard(key)
