"""The waiting policy, in one place: how long a waiter spins, yields and sleeps.

Every wait in ray_lite happens on the thread that waits (no background thread
ever spins): a short bounded spin, then a few ``sched_yield``, then a sleep on
a futex or a descriptor in slices.  These are the numbers of that policy, for
the compiled and the pure-Python twins alike (each twin checks at import that
it runs with these values, as both check the segment layouts) and for the
runtime layers above them.

All durations are in nanoseconds (``_NS``); ``ns_to_s`` converts for code that
works in seconds.  Why each value: a round trip between two busy processes
takes about a microsecond, waking a sleeping process on a VM tens of
microseconds, and a process that spins for longer than a few tens of
microseconds steals the CPU its peer needs on a 2-core machine.
"""

# -- one ring (SPSC) ----------------------------------------------------------
#: The compiled twin spins this long holding the GIL before it releases it
#: (a reply within ~1 µs is caught without paying for the release).
RING_SPIN_GIL_NS = 3_000
#: Then spins this long (without the GIL, in C; the pure twin spins with it).
RING_SPIN_NS = 20_000
#: Then yields the CPU this many times before sleeping on the futex.
RING_YIELDS = 4
#: A sleep ends at least this often, to look for a dead peer and for Ctrl-C.
SLICE_NS = 100_000_000
#: ... and this often when an end cannot fence (a pure-Python end may lose a
#: wake-up: see ``_ring_py``, "Ordering").
SLICE_WEAK_NS = 2_000_000
#: The compiled twin's raw API returns "again" this often so that callers can
#: run signal handlers.
AGAIN_NS = 100_000_000

# -- spinning on purpose (spin_poll / spin_any) -------------------------------
#: A deliberate spin hands the CPU on this often (the peer may be runnable on
#: this CPU) ...
SPIN_POLL_YIELD_NS = 5_000
#: ... and gives up when one round took this long: its CPU went elsewhere.
SPIN_POLL_PREEMPTED_NS = 100_000

# -- many rings (wait_any, a node's drive loop, an executor's replies) -------
#: How long a waiter polls several rings before arming their descriptors.
MULTI_SPIN_NS = 20_000
#: ... and how long a node polls its links before it sleeps in ``poll(2)``
#: with them and its processes' sentinels (``_private/links/drive.py``).
LINK_SPIN_NS = 30_000

# -- the broadcast queue (one writer, N readers) ------------------------------
#: A reader spins this long (the compiled twin; the pure twin checks
#: ``BROADCAST_SPIN_CHECKS`` times) ...
BROADCAST_SPIN_NS = 5_000
BROADCAST_SPIN_CHECKS = 64
#: ... then yields for at most this long, so that an idle waiter costs at most
#: about this much CPU per idle period, then sleeps.
BROADCAST_YIELD_NS = 200_000


def ns_to_s(ns):
    """Nanoseconds as seconds (a float)."""
    return ns * 1e-9


def check_twin(name, values):
    """Raise ``ImportError`` when a twin was built with other numbers.

    ``values`` maps the names above to what the twin uses; a compiled module
    built from an older checkout then fails to import instead of waiting
    differently from its pure-Python twin.
    """
    here = globals()
    wrong = {k: v for k, v in values.items() if here.get(k) != v}
    if wrong:
        raise ImportError(
            f"{name} was built with another wait policy than ray_lite._fast.wait_policy: "
            + ", ".join(f"{k}={v!r} (expected {here.get(k)!r})" for k, v in sorted(wrong.items()))
            + "; rebuild ray_lite")
