"""Cancelling a pool task the driver scheduled (``ray_lite.cancel``; the
driver's ``OP_CANCEL`` request): a queued task never runs; a running one gets a
``KeyboardInterrupt`` (its message and a signal) and its caller gets
``TaskCancelledError`` at once; with ``force=True`` its worker is killed and
the caller gets the error when that death is seen."""
import itertools
import os
import signal

from ray_lite.exceptions import TaskCancelledError

from ..links import protocol as P
from ..process.errors import running_task_cancelled
from ..process.procutil import CANCEL_SIGNAL


def cancel_task(driver, oid, force):
    """Cancel a pool task ``driver`` scheduled; True if it was found.  (It
    owns no state: the queues and the pool are the driver's scheduler's.)"""
    with driver._sched:
        for spec in itertools.chain(driver.nested_queue, driver.queue, driver.placed_queue):
            if spec.oid == oid:
                spec.cancelled = True
                driver._fail_task(spec, TaskCancelledError())
                return True
        spec = driver.waiting_deps.pop(oid, None)
        if spec is not None:
            spec.cancelled = True
            driver._fail_task(spec, TaskCancelledError())
            return True
        for w in driver.pool.values():
            if w.task is not None and w.task.oid == oid:
                w.task.cancelled = True
                if force:
                    try:
                        os.kill(w.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                else:
                    # The message says which task; the signal interrupts
                    # it (a KeyboardInterrupt in the task, as in Ray) if
                    # it is still that one when the worker looks.
                    driver.send(w.id, P.cancel_msg(oid, False))
                    try:
                        os.kill(w.pid, CANCEL_SIGNAL)
                    except ProcessLookupError:
                        pass
                    driver._fail_task(w.task, running_task_cancelled(w.task.name, oid, w.pid))
                return True
    return False
