"""Cancelling a pool task the driver scheduled (``ray_lite.cancel``), part of
``DriverNode``: a queued task never runs; a running one gets a
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


class TaskCancelMixin:
    def cancel_task(self, oid, force):
        """Cancel a pool task this driver scheduled; True if it was found."""
        with self._sched:
            for spec in itertools.chain(self.nested_queue, self.queue, self.placed_queue):
                if spec.oid == oid:
                    spec.cancelled = True
                    self._fail_task(spec, TaskCancelledError())
                    return True
            spec = self.waiting_deps.pop(oid, None)
            if spec is not None:
                spec.cancelled = True
                self._fail_task(spec, TaskCancelledError())
                return True
            for w in self.pool.values():
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
                        self.send(w.id, P.cancel_msg(oid, False))
                        try:
                            os.kill(w.pid, CANCEL_SIGNAL)
                        except ProcessLookupError:
                            pass
                        self._fail_task(w.task, running_task_cancelled(w.task.name, oid, w.pid))
                    return True
        return False
