"""``ActorPool``: spread calls over a fixed set of actors, one call per actor at a time."""
import collections

import ray_lite
from ray_lite._private.process import backend as _backend
from ray_lite.exceptions import ActorDiedError

__all__ = ["ActorPool"]

_TIMEOUT_MSG = "Timed out waiting for result"


def _key(future):
    # A call with num_returns > 1 gives a list of refs: keyed as a tuple.
    return tuple(future) if isinstance(future, list) else future


def _probe(future):
    # The refs of one call are filled together: the first tells for all.
    return future[0] if isinstance(future, list) else future


@_backend.ray_counterpart("ActorPool")
class ActorPool:
    """Runs ``fn(actor, value)`` calls on whichever actor of ``actors`` is idle.

    ``fn`` returns the ref of the call it made; the actor counts as busy until
    its result has been taken (``get_next``, ``get_next_unordered``, or by
    iterating ``map``/``map_unordered``).  Values submitted while every actor
    is busy wait in order for the next free one.

        pool = ActorPool([a1, a2])
        list(pool.map(lambda a, v: a.double.remote(v), [1, 2, 3]))   # [2, 4, 6]
    """

    def __init__(self, actors):
        self._idle_actors = list(actors)
        self._future_to_actor = {}        # key -> (submission index, actor)
        self._index_to_future = {}        # submission index -> future
        self._next_task_index = 0
        self._next_return_index = 0
        self._pending_submits = collections.deque()   # (fn, value) waiting for an actor
        self._completed = collections.deque()          # found ready by get_next_unordered

    # ------------------------------------------------------------ submitting
    def map(self, fn, values):
        """An iterator over ``fn(actor, v)``'s results, in the order of ``values``.

        Results still pending from earlier submissions are discarded first.
        """
        return self._run_all(fn, values, self.get_next)

    def map_unordered(self, fn, values):
        """Like ``map``, but each result comes as soon as it is ready."""
        return self._run_all(fn, values, self.get_next_unordered)

    def _run_all(self, fn, values, take):
        self._discard_pending(take)
        for v in values:
            self.submit(fn, v)

        def results():
            while self.has_next():
                yield take()
        return results()

    def _discard_pending(self, take):
        while self.has_next():
            try:
                take(timeout=0, ignore_if_timedout=True)
            except Exception:   # a discarded result's error (or timeout) is not the caller's
                pass

    def submit(self, fn, value):
        """Run ``fn(actor, value)`` on an idle actor now, or on the next one to free up."""
        if not self._idle_actors:
            self._pending_submits.append((fn, value))
            return
        actor = self._idle_actors.pop()
        future = fn(actor, value)
        index = self._next_task_index
        self._future_to_actor[_key(future)] = (index, actor)
        self._index_to_future[index] = future
        self._next_task_index = index + 1

    # ------------------------------------------------------------- results
    def has_next(self):
        """Whether a submitted call's result has not been returned yet."""
        return bool(self._future_to_actor)

    def get_next(self, timeout=None, ignore_if_timedout=False):
        """The next result in submission order, waiting up to ``timeout`` s.

        Raises ``TimeoutError`` when it is not ready in time; with
        ``ignore_if_timedout=True`` that call is skipped as well (its actor
        returns to the pool).  ``StopIteration`` when nothing is pending.
        """
        if not self.has_next():
            raise StopIteration("No more results to get")
        index = self._next_return_index
        if index >= self._next_task_index or index not in self._index_to_future:
            raise ValueError("It is not allowed to call get_next() after get_next_unordered().")
        future = self._index_to_future[index]
        timed_out = False
        if timeout is not None:
            ready, _ = ray_lite.wait([_probe(future)], timeout=timeout)
            if not ready:
                if not ignore_if_timedout:
                    raise TimeoutError(_TIMEOUT_MSG)
                timed_out = True
        del self._index_to_future[index]
        self._next_return_index = index + 1
        _, actor = self._future_to_actor.pop(_key(future))
        if timed_out:
            self._return_actor(actor)
            raise TimeoutError(f"{_TIMEOUT_MSG}. The task {future} has been ignored.")
        return self._take_result(future, actor)

    def get_next_unordered(self, timeout=None, ignore_if_timedout=False):
        """Any pending result that is ready, waiting up to ``timeout`` s for one.

        After this, ``get_next`` refuses to run (the order is lost).
        """
        if not self.has_next():
            raise StopIteration("No more results to get")
        future = self._pop_completed()
        if future is None:
            self._collect_ready(timeout)
            future = self._pop_completed()
        timed_out = False
        if future is None:
            if not ignore_if_timedout:
                raise TimeoutError(_TIMEOUT_MSG)
            timed_out = True
            future = self._index_to_future[min(i for i, _ in self._future_to_actor.values())]
        index, actor = self._future_to_actor.pop(_key(future))
        del self._index_to_future[index]
        self._next_return_index = max(self._next_return_index, index + 1)
        if timed_out:
            self._return_actor(actor)
            raise TimeoutError(f"{_TIMEOUT_MSG}. The task {future} has been ignored.")
        return self._take_result(future, actor)

    def _pop_completed(self):
        completed = self._completed
        while completed:
            future = completed.popleft()
            if _key(future) in self._future_to_actor:
                return future
        return None

    def _collect_ready(self, timeout):
        # One blocking wait for the first ready call, then every other call
        # that is ready too (no waiting): the next calls need no wait at all.
        by_probe = {_probe(self._index_to_future[i]): self._index_to_future[i]
                    for i, _ in self._future_to_actor.values()}
        probes = list(by_probe)
        ready, rest = ray_lite.wait(probes, num_returns=1, timeout=timeout)
        if ready and rest:
            more, _ = ray_lite.wait(rest, num_returns=len(rest), timeout=0)
            ready += more
        self._completed.extend(by_probe[r] for r in ready)

    def _take_result(self, future, actor):
        alive = True
        try:
            return ray_lite.get(future)
        except ActorDiedError:
            alive = False
            raise
        finally:
            self._return_actor(actor, alive)

    def _return_actor(self, actor, alive=True):
        # A dead actor leaves the pool: submitting to it again could never finish.
        if alive:
            self._idle_actors.append(actor)
        if self._pending_submits and self._idle_actors:
            self.submit(*self._pending_submits.popleft())

    # ---------------------------------------------------------- membership
    def has_free(self):
        """Whether an actor is idle and no submitted value waits for one."""
        return bool(self._idle_actors) and not self._pending_submits

    def pop_idle(self):
        """Remove an idle actor from the pool and return it (``None`` if none is free)."""
        if self.has_free():
            return self._idle_actors.pop()
        return None

    def push(self, actor):
        """Add ``actor`` to the pool (it takes a waiting value at once, if any)."""
        busy = [a for _, a in self._future_to_actor.values()]
        if actor in self._idle_actors or actor in busy:
            raise ValueError("Actor already belongs to current ActorPool")
        self._return_actor(actor)
