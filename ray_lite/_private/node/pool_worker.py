"""Ray's ``max_calls`` (a pool worker itself is ``_fast/pool_book.PoolWorker``).

A function declared with ``@remote(max_calls=N)`` runs at most N times in
one worker process: after the Nth, that worker exits and a fresh one takes
its place when a task needs it.  Programs use it to get back what a library
never gives back (a leak, a framework's device context): it goes with the
process.  As in Ray, the count is per worker and per function, and the
limit is the function's (``.options(max_calls=...)`` is refused).
"""
from ..links import protocol as P
from .node import Node


class MaxCalls:
    """A part of ``DriverNode`` (``driver.max_calls``; called under its
    ``_sched`` lock): the pool workers retired after their ``max_calls``."""

    def __init__(self, driver):
        self.driver = driver
        self.retired = set()    # pool workers exiting after their max_calls

    def used_up(self, w, spec):
        """Count the run of ``spec``'s function on ``w``; True if it was its
        last there.  Then ``w`` leaves the pool and is told to exit: its
        result came before (on the same link), so nothing is lost."""
        calls = w.calls
        if calls is None:
            calls = w.calls = {}
        n = calls[spec.fn_id] = calls.get(spec.fn_id, 0) + 1
        if n < spec.max_calls:
            return False
        driver = self.driver
        del driver.pool[w.id]
        self.retired.add(w.id)
        driver.send(w.id, P.exit_msg())   # (False if it died already: seen as its death)
        return True

    def retired_died(self, peer):
        """A worker that exited after its max_calls: no task of ours ran there."""
        self.retired.discard(peer)
        Node._on_peer_died(self.driver, peer)
        self.driver.owners.end_owned(peer)
