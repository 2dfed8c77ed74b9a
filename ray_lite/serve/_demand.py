"""The requests callers hold waiting for a replica, told to the controller.

As in Ray, a deployment's load is the requests running at its replicas plus
those its callers (HTTP proxies, ``DeploymentHandle``s) hold because every
replica is at ``max_ongoing_requests`` or none runs: the autoscaler counts
both, and a request waiting while a deployment runs no replica makes the
controller start one (scale from zero).

Each caller keeps a ``WaitingReport`` per autoscaling deployment and calls
``changed`` as its count moves.  One report is in flight at a time, and the
controller answers it only ``REPORT_SPACING_S`` after it came
(``ServeController.report_waiting``); the answer sends the latest count if
it moved meanwhile.  So a busy queue costs a few messages a second, its last
count always arrives, and no timer runs in the caller.  A report is keyed
by the caller's process id: the controller forgets the counts of processes
that died.  A report the controller's death lost is sent again once it is
back (``retell``: the caller's next answer from the restarted controller).
"""
import itertools
import os
import threading

from . import _core, context

REPORT_SPACING_S = 0.1

_serial = itertools.count(1)


class WaitingReport:
    """One caller's count of requests waiting for a replica of one deployment."""

    __slots__ = ("app", "deployment", "key", "count", "told", "in_flight", "lock")

    def __init__(self, app, deployment):
        self.app = app
        self.deployment = deployment
        self.key = (os.getpid(), next(_serial))
        self.count = 0          # what waits now
        self.told = 0           # what the controller was last told
        self.in_flight = False
        # A handle's count moves on the caller's thread and on the one that
        # runs reply callbacks; never held while sending.
        self.lock = threading.Lock()

    def changed(self, count):
        with self.lock:
            self.count = count
            if self.in_flight or count == self.told:
                return
            self.in_flight = True
        self._send()

    def _send(self):
        ctl = context._controller
        with self.lock:
            count = self.told = self.count
        ref = None
        if ctl is not None:
            try:
                ref = ctl.report_waiting.remote(self.app, self.deployment, self.key, count)
            except Exception:   # noqa: BLE001 - Serve is shutting down
                ref = None
        if ref is None:
            with self.lock:
                self.in_flight = False
            return
        _core.on_ready(ref, lambda _entry: self._answered(ref))

    def _answered(self, ref):
        r = _core.peek(ref)
        with self.lock:
            if r is not None and not r[0]:
                # Lost (the controller died): told again by retell.
                self.told = None
                self.in_flight = False
                return
            again = self.count != self.told
            self.in_flight = again
        if again:
            self._send()

    def retell(self):
        """Send the count again if the last report was lost (the caller heard
        from the controller since: it is back)."""
        with self.lock:
            if self.in_flight or self.told is not None:
                return
            self.in_flight = True
        self._send()


def prune_dead(waiting):
    """Drop from ``waiting`` ({(pid, n): count}) the counts of dead processes."""
    from ray_lite._fast.shm import pid_alive
    for key in [k for k in waiting if not pid_alive(k[0])]:
        del waiting[key]
