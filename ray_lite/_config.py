"""Every ``RAY_LITE_*`` environment variable ray_lite reads, read here once.

No other module of the runtime reads ``os.environ`` for a ``RAY_LITE_*``
setting (the benchmark runner and the command line aside): they import the
value from here.  (Ray's own variables that ray_lite honours, such as
``RAY_SERVE_*`` and ``RAY_CGRAPH_*``, are read where they are used, as Ray
reads them.)  Each variable is validated when ray_lite is imported, and a bad value
raises ``ValueError`` naming the variable and what it accepts, instead of
surfacing later as an odd failure deep inside a worker.

The manual's configuration page (``docs/configuration.md``) is generated from
``VARIABLES`` when the manual is built, so the two cannot drift apart.

Processes that ray_lite starts inherit the environment, so they see the same
values as their parent.
"""
import os
import re

__all__ = [
    "VARIABLES", "ConfigVar",
    "NO_EXTENSIONS", "SHM_PREFIX",
    "SERVE_PROXY_SPIN_S", "SERVE_REPLICA_SPIN_S", "SERVE_REPLICA_NICE", "BACKEND",
    "SERVE_PACK_BELOW_S", "SERVE_PROXY_HOLD_WAKES", "SERVE_SYNC_OFF_LOOP_S",
    "SERVE_MEMDEBUG",
]


class ConfigVar:
    """One environment variable: its name, default, meaning and parser."""

    __slots__ = ("name", "default", "accepts", "meaning", "parse")

    def __init__(self, name, default, accepts, meaning, parse):
        self.name = name
        self.default = default
        self.accepts = accepts
        self.meaning = meaning
        self.parse = parse

    def read(self, environ=None):
        environ = os.environ if environ is None else environ
        raw = environ.get(self.name)
        if raw is None or raw.strip() == "":
            raw = self.default
        try:
            return self.parse(raw.strip())
        except (TypeError, ValueError):
            raise ValueError(
                f"environment variable {self.name}={raw!r} is invalid: "
                f"it accepts {self.accepts}") from None


def _flag(raw):
    if raw in ("0", "false", "False", "no", ""):
        return False
    if raw in ("1", "true", "True", "yes"):
        return True
    raise ValueError(raw)


def _micros_to_s(raw):
    value = float(raw)
    if not value >= 0 or value > 1e6:       # also refuses NaN
        raise ValueError(raw)
    return value * 1e-6


def _nice(raw):
    value = int(raw)
    if not 0 <= value <= 19:
        raise ValueError(raw)
    return value


def _backend(raw):
    if raw not in ("local", "ray"):
        raise ValueError(raw)
    return raw


def _directory_or_off(raw):
    if raw and not os.path.isabs(raw):
        raise ValueError(raw)
    return raw or None


_PREFIX_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def _prefix(raw):
    if not _PREFIX_RE.match(raw):
        raise ValueError(raw)
    return raw


VARIABLES = (
    ConfigVar("RAY_LITE_BACKEND", "local", "local or ray",
              "the engine a program runs on when init() does not choose: "
              "'local' (this runtime) or 'ray' (Ray, from the 'ray' extra)", _backend),
    ConfigVar("RAY_LITE_NO_EXTENSIONS", "0", "0 or 1",
              "1: use the pure-Python twins of the hot paths (at build time: "
              "build none of the compiled ones)", _flag),
    ConfigVar("RAY_LITE_SHM_PREFIX", "rl_",
              "1 to 64 letters, digits, '_', '.', '-'",
              "prefix of every shared-memory segment ray_lite creates in /dev/shm",
              _prefix),
    ConfigVar("RAY_LITE_SERVE_PROXY_SPIN_US", "400",
              "microseconds from 0 to 1000000",
              "how long an HTTP proxy with one request in flight spins for the "
              "replica's answer before it sleeps (0: never spins)", _micros_to_s),
    ConfigVar("RAY_LITE_SERVE_REPLICA_SPIN_US", "1000",
              "microseconds from 0 to 1000000",
              "how long a replica whose requests come in quick succession spins "
              "for the next one after answering (0: never spins)", _micros_to_s),
    ConfigVar("RAY_LITE_SERVE_PACK_BELOW_US", "200",
              "microseconds from 0 to 1000000",
              "an HTTP proxy packs a route's requests onto its first replicas that are "
              "under max_ongoing_requests while the route's replicas answer in less "
              "than this on average (0: never packs; requests are spread)", _micros_to_s),
    ConfigVar("RAY_LITE_SERVE_SYNC_OFF_LOOP_US", "2000",
              "microseconds from 0 to 1000000",
              "a Serve replica runs a synchronous handler (HTTP or handle call) that took "
              "this long or longer on a thread of its own from then on, so that its "
              "event loop keeps serving meanwhile (0: every synchronous handler)",
              _micros_to_s),
    ConfigVar("RAY_LITE_SERVE_PROXY_HOLD_WAKES", "1", "0 or 1",
              "1: an HTTP proxy wakes each replica it sent requests to once after "
              "each turn of its event loop, not at each request (0: at each)", _flag),
    ConfigVar("RAY_LITE_SERVE_REPLICA_NICE", "0", "an integer from 0 to 19",
              "the nice value Serve replicas lower their CPU priority by once "
              "started (0: not at all)", _nice),
    ConfigVar("RAY_LITE_SERVE_MEMDEBUG", "", "an absolute directory path, or empty",
              "a debugging aid: each Serve proxy writes the allocation sites that grew "
              "and its object counts to this directory on SIGUSR2 (empty: off)",
              _directory_or_off),
    ConfigVar("RAY_LITE_TIMELINE", "0", "0 or 1",
              "1: workers and actors note each task and call they run for "
              "ray_lite.timeline() and the dashboard (0: nothing is recorded)", _flag),
)

_BY_NAME = {v.name: v for v in VARIABLES}


def read(name, environ=None):
    """The parsed value of variable ``name`` in ``environ`` (default: os.environ)."""
    return _BY_NAME[name].read(environ)


BACKEND = read("RAY_LITE_BACKEND")
NO_EXTENSIONS = read("RAY_LITE_NO_EXTENSIONS")
SHM_PREFIX = read("RAY_LITE_SHM_PREFIX")
SERVE_PROXY_SPIN_S = read("RAY_LITE_SERVE_PROXY_SPIN_US")
SERVE_REPLICA_SPIN_S = read("RAY_LITE_SERVE_REPLICA_SPIN_US")
SERVE_REPLICA_NICE = read("RAY_LITE_SERVE_REPLICA_NICE")
SERVE_PACK_BELOW_S = read("RAY_LITE_SERVE_PACK_BELOW_US")
SERVE_PROXY_HOLD_WAKES = read("RAY_LITE_SERVE_PROXY_HOLD_WAKES")
SERVE_SYNC_OFF_LOOP_S = read("RAY_LITE_SERVE_SYNC_OFF_LOOP_US")
SERVE_MEMDEBUG = read("RAY_LITE_SERVE_MEMDEBUG")


def markdown_table():
    """The manual's table of variables, made from ``VARIABLES``."""
    rows = ["| variable | default | accepts | what it does |", "|---|---|---|---|"]
    for v in VARIABLES:
        rows.append(f"| `{v.name}` | `{v.default}` | {v.accepts} | {v.meaning} |")
    return "\n".join(rows)
