"""Cancelling a pool task the driver scheduled (``ray_lite.cancel``; the
driver's ``OP_CANCEL`` request): a queued task never runs; a running one gets a
``KeyboardInterrupt`` (its message and a signal) and its caller gets
``TaskCancelledError`` at once; with ``force=True`` its worker is killed and
the caller gets the error when that death is seen.

``recursive`` (Ray's default): the pool tasks a running task submitted, and
theirs, are cancelled the same way, so what they hold is free again.  The
driver learns them as they are submitted (``ChildTasks``); calls a task made
to actors are cancelled by the worker that made them (it knows them;
they went straight to the actors) or, when ``force`` killed it, by each
actor at the driver's word."""
import itertools
import os
import signal

from ray_lite.exceptions import TaskCancelledError

from ..links import protocol as P
from ..process.errors import running_task_cancelled
from ..process.procutil import CANCEL_SIGNAL


class _Children:
    __slots__ = ("parent", "oids", "limit")

    def __init__(self, parent, oid):
        self.parent = parent        # oid of the task the worker runs
        self.oids = [oid]           # the tasks it submitted (some may be done)
        self.limit = _PRUNE_AT


_PRUNE_AT = 64


class ChildTasks:
    """The pool tasks that each pool worker's running task submitted.

    One entry per worker, replaced when a later task of that worker submits;
    the oids of children that ended are dropped once the list doubles, so a
    long task submitting many costs O(1) per child."""

    __slots__ = ("by_worker",)

    def __init__(self):
        self.by_worker = {}     # pool worker id -> _Children

    def note(self, w, oid, live):
        """Worker ``w``'s running task submitted task ``oid``; ``live(oid)``:
        whether a child has not ended yet."""
        parent = w.task
        if parent is None:
            return
        entry = self.by_worker.get(w.id)
        if entry is None or entry.parent != parent.oid:
            self.by_worker[w.id] = _Children(parent.oid, oid)
            return
        oids = entry.oids
        oids.append(oid)
        if len(oids) >= entry.limit:
            oids[:] = [o for o in oids if live(o)]
            entry.limit = max(_PRUNE_AT, 2 * len(oids))

    def take(self, wid, parent):
        """The children of task ``parent`` running on worker ``wid`` (forgotten)."""
        entry = self.by_worker.get(wid)
        if entry is None or entry.parent != parent:
            return ()
        del self.by_worker[wid]
        return entry.oids

    def forget(self, wid):
        self.by_worker.pop(wid, None)


def cancel_task(driver, oid, force, recursive=True):
    """Cancel a pool task ``driver`` scheduled, and with ``recursive`` the
    tasks it submitted; True if it was found.  (It owns no state: the queues
    are the pool book's, the children and the tasks waiting for their
    arguments the task dispatch's, ``driver.dispatch``.)"""
    with driver._sched:
        found = _cancel_one(driver, oid, force, recursive)
        if found is None or found is True:
            return found is not None
        todo = list(found)
        while todo:
            more = _cancel_one(driver, todo.pop(), force, True)
            if more not in (None, True):
                todo.extend(more)
        return True


def _cancel_one(driver, oid, force, recursive):
    """None: not found; True: cancelled; or the children of the running task
    cancelled (with ``recursive``), to be cancelled in turn."""
    book, dispatch = driver.book, driver.dispatch
    for spec in itertools.chain(book.nested_queue, book.queue, book.placed_queue):
        if spec.oid == oid:
            spec.cancelled = True
            dispatch.fail_task(spec, TaskCancelledError())
            return True
    spec = dispatch.waiting_deps.pop(oid, None)
    if spec is None:
        spec = driver.retries.take_delayed(oid)     # failed, to be run again
    if spec is not None:
        spec.cancelled = True
        dispatch.fail_task(spec, TaskCancelledError())
        return True
    for w in driver.pool.values():
        if w.task is not None and w.task.oid == oid:
            w.task.cancelled = True
            children = dispatch.child_tasks
            children = children.take(w.id, oid) if recursive and children is not None else ()
            if force:
                try:
                    os.kill(w.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                if recursive:       # its calls to actors: without force, as in Ray
                    for aid in list(driver.actors):
                        driver.send(aid, P.cancel_calls_of_msg(w.id))
            else:
                # The message says which task; the signal interrupts
                # it (a KeyboardInterrupt in the task, as in Ray) if
                # it is still that one when the worker looks.
                driver.send(w.id, P.cancel_msg(oid, False, recursive))
                try:
                    os.kill(w.pid, CANCEL_SIGNAL)
                except ProcessLookupError:
                    pass
                dispatch.fail_task(w.task, running_task_cancelled(w.task.name, oid, w.pid))
            return children or True
    return None
