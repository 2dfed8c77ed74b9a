"""Tasks run again when they fail with an exception their ``retry_exceptions``
lists, or when their worker dies: ``TaskRetries``, a part of the driver's
node (``driver.retries``).

A task is run again ``RETRY_DELAY_S`` after its failure, as in Ray, whose
owner resubmits a failed task at its next internal heartbeat (every
``core_worker_internal_heartbeat_ms``, 1000 ms; ``task_retry_delay_ms`` is 0
by default): ten retries take about ten seconds, time for what made the task
fail to go away.  The resubmission is a timer of the driver's service thread
(``ServiceThread.call_later``); the worker and what the task held serve
other tasks meanwhile.

A streaming generator is run again from its start, as in Ray: the items its
earlier run reported are not reported twice (the owner already has them), so
whoever iterates it sees each index once, then what the new run yields past
them.  Streams with back-pressure are not run again on an exception (the new
run would wait for acknowledgements of items the consumer took from the
earlier one).
"""
from .scheduler import matches_retry

# Seconds from a task's failure to its resubmission (Ray's heartbeat period).
RETRY_DELAY_S = 1.0


class TaskRetries:
    """The pool tasks run again, and the streams whose earlier run's items are skipped."""

    def __init__(self, driver):
        self.driver = driver
        self.stream_replayed = {}    # sid -> items an earlier run reported (skipped now)
        self.stale_stream_ends = set()     # (sid, peer): the END of a run that failed
        self.delayed = {}            # oid -> TaskSpec waiting for its resubmission
        self.delay_s = RETRY_DELAY_S
        # later(delay, fn): runs fn once, delay seconds from now, on a thread
        # that is not the caller's (the service thread's timers).
        self.later = driver.service.call_later

    def retry_on_error(self, peer, msg):
        """A task failed with an exception its retry_exceptions lists: run it again."""
        w = self.driver.pool.get(peer)
        spec = None if w is None else w.task
        if spec is None or spec.oid != msg[1] or not self._may_retry(spec, msg[3]):
            return False
        return self._run_again(w, spec)

    def retry_stream_on_error(self, peer, msg):
        """A streaming task's generator raised at item ``msg[2]`` with an
        exception its retry_exceptions lists: run it again (see above)."""
        w = self.driver.pool.get(peer)
        spec = None if w is None else w.task
        if spec is None or spec.oid != msg[1] or not spec.stream or spec.bp > 0 or \
                not self._may_retry(spec, msg[4]):
            return False
        sid, reported = msg[1], msg[2]
        if not self._run_again(w, spec):
            return False
        self.stream_replayed[sid] = max(reported, self.stream_replayed.get(sid, 0))
        # The failed run's END follows on the same link (before anything of a
        # new run there, even one on the same worker): dropped.
        self.stale_stream_ends.add((sid, peer))
        return True

    def skip_replayed_item(self, msg):
        """True for an item of a stream run again whose earlier run reported it."""
        done = self.stream_replayed.get(msg[1])
        return done is not None and msg[2] < done

    def drop_stale_end(self, peer, msg):
        """True for the END of a stream's run that failed and was run again;
        an END of the last run forgets the stream's replay."""
        key = (msg[1], peer)
        if key in self.stale_stream_ends:
            self.stale_stream_ends.discard(key)
            return True
        self.stream_replayed.pop(msg[1], None)
        return False

    def resubmit_later(self, spec, first=False):
        """Queue ``spec`` again once the retry delay has passed (under
        ``_sched``; its retry already counted).  ``first``: at the head of
        its queue (a task whose worker died)."""
        self.delayed[spec.oid] = spec
        self.later(self.delay_s, lambda: self._resubmit(spec, first))

    def take_delayed(self, oid):
        """The task ``oid`` waiting for its resubmission, forgotten (cancel); or None."""
        return self.delayed.pop(oid, None) if self.delayed else None

    def _resubmit(self, spec, first):
        driver = self.driver
        with driver._sched:
            if self.delayed.pop(spec.oid, None) is None or driver.closed:
                return          # cancelled meanwhile, or the runtime shut down
            driver.dispatch.enqueue(spec, first)

    def _may_retry(self, spec, error):
        return (spec.retry_on is not None and spec.retries != 0 and not spec.cancelled
                and matches_retry(spec.retry_on, error))

    def _run_again(self, w, spec):
        driver = self.driver
        with driver._sched:
            if w.task is not spec:
                return False
            spec.retries -= 1
            driver.dispatch.free_worker(w, spec)
            w.task = None
            if not spec.max_calls or not driver.max_calls.used_up(w, spec):
                driver.book.idle.append(w)
            self.resubmit_later(spec)
            driver.resources.freed()
        return True
