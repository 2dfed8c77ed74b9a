"""When a Serve process's bounded spin is worth its CPU, learnt as it runs.

A proxy alone with one request in flight spins for the replica's answer; a
replica that just answered spins for the next request.  A spin that catches
what it waits for saves a sleep and a wake-up (a descriptor write by the
peer, a return from epoll here: tens of microseconds each on a VM); one that
does not burns its whole budget.  So a spin starts only while most of the
recent waits (``HIT_RATE``) were shorter than the budget, measured whether or
not it spun; and a spin cut short without its event (this CPU went to
another process, see ``ring.spin_any``) means the CPU is contended: spinning
stops until short waits have been seen again, so beside a CPU-bound program
the spins cost it (and us) nothing.
"""

# Share of recent waits a spin would have caught, at or above which it spins.
HIT_RATE = 0.75
# Weight of the latest wait in the moving share (about the last 8 count).
_WEIGHT = 0.125


class SpinPolicy:
    __slots__ = ("budget", "hits")

    def __init__(self, budget):
        self.budget = budget    # seconds; 0 turns spinning off
        self.hits = 0.0         # moving share of waits shorter than the budget

    def observe(self, waited):
        """A wait that ended after ``waited`` seconds (spun for or slept through)."""
        self.hits += ((waited < self.budget) - self.hits) * _WEIGHT

    def worth_it(self):
        return self.budget > 0 and self.hits >= HIT_RATE

    def spun(self, came, spent):
        """After a spin: a spin that gave up early, empty-handed, was preempted."""
        if not came and spent < self.budget * 0.5:
            self.hits = 0.0
