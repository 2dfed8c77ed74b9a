"""When a Serve process's bounded spin is worth its CPU, learnt as it runs.

A proxy alone with one request in flight spins for the replica's answer; a
replica that just answered spins for the next request.  A spin that catches
what it waits for saves a sleep and a wake-up (a descriptor write by the
peer, a return from epoll here: tens of microseconds each on a VM); one that
does not burns its whole budget.  So a spin starts only while most of the
recent waits (``HIT_RATE``) were shorter than the budget *and* their moving
average is too, measured whether or not it spun.  Both, because under heavy
load (48 replicas behind ``wrk -c100``) most of a replica's idle gaps are
short but a long tail of them is not: the share alone kept dozens of
replicas spinning at once on two cores, which took the CPU from the replicas
that had requests and raised the p99 latency tenfold (20 -> 200 ms).

A spin that came back empty-handed after being switched out (one of its
``sched_yield`` handed the CPU to another runnable thread: an involuntary
context switch of this thread) or cut short (its CPU went elsewhere, see
``ring.spin_any``) means the CPU is contended: spinning stops until short
waits have been seen again, so beside a CPU-bound program the spins cost it
(and us) nothing.  A spin that yielded to another thread and still caught
its event did what a spin should: it keeps going.
"""
import os
from resource import RUSAGE_THREAD, getrusage
from time import monotonic as _monotonic

# Share of recent waits a spin would have caught, at or above which it spins.
HIT_RATE = 0.75
# Weight of the latest wait in the moving share (about the last 8 count) ...
_WEIGHT = 0.125
# ... and in the moving average (about the last 4).
_MEAN_WEIGHT = 0.25


_CPUS = len(os.sched_getaffinity(0))
_loadavg_fd = -1


def cpu_free():
    """True when no more threads are running on the machine than it has
    CPUs, this one included (``/proc/loadavg``'s running count): a spin now
    takes a CPU that no other process is waiting for.  True where the count
    cannot be read."""
    global _loadavg_fd
    try:
        if _loadavg_fd < 0:
            _loadavg_fd = os.open("/proc/loadavg", os.O_RDONLY | os.O_CLOEXEC)
        running = int(os.pread(_loadavg_fd, 80, 0).split()[3].split(b"/")[0])
    except (OSError, ValueError, IndexError):
        return True
    return running <= _CPUS


def involuntary_switches():
    """This thread's involuntary context switches so far (a yield that let
    another thread run counts as one): read before and after a spin."""
    return getrusage(RUSAGE_THREAD).ru_nivcsw


class SpinPolicy:
    __slots__ = ("budget", "hits", "mean")

    def __init__(self, budget):
        self.budget = budget    # seconds; 0 turns spinning off
        self.hits = 0.0         # moving share of waits shorter than the budget
        self.mean = None        # moving average of the waits (None: none seen)

    def observe(self, waited):
        """A wait that ended after ``waited`` seconds (spun for or slept through)."""
        self.hits += ((waited < self.budget) - self.hits) * _WEIGHT
        mean = self.mean
        self.mean = waited if mean is None else mean + (waited - mean) * _MEAN_WEIGHT

    def worth_it(self):
        return self.budget > 0 and self.hits >= HIT_RATE and self.mean < self.budget

    def run(self, spin, *args):
        """``spin(*args)`` (true when it caught its event), timed and watched
        for context switches, and learnt from; its result."""
        start, switches = _monotonic(), involuntary_switches()
        came = spin(*args)
        self.spun(came, _monotonic() - start, involuntary_switches() != switches)
        return came

    def spun(self, came, spent, switched=False):
        """After a spin of ``spent`` seconds: ``came`` if it caught its event,
        ``switched`` if this thread was switched out meanwhile."""
        if not came and (switched or spent < self.budget * 0.5):
            self.hits = 0.0
