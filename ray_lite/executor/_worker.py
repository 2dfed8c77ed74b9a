"""The worker process of a :class:`~ray_lite.executor.MultiprocExecutor`.

Started by the driver as ``python -c <bootstrap>`` (not ``multiprocessing``:
its spawn and forkserver methods leave a resource-tracker or server process
behind, and fork copies the driver's threads and state).  The bootstrap
(``ray_lite._private.process.boot``) loads the driver's own ray_lite, puts the
driver's ``sys.path`` in place and calls :func:`main` with a pipe that
carries the start-up blob (cloudpickle).

Protocol (messages are codec values):
  driver -> workers, on the broadcast MessageQueue:
      (CALL, call_id, method, args, kwargs, unique_reply_rank)
      (SHUTDOWN,)
  worker -> driver, on its own reply ShmRing:
      (READY, pid)                         once, after the worker object is built
      (START_FAILED, exc, traceback_text)  instead, if building it failed
      (call_id, OK, value)                 value is None on ranks other than
                                           unique_reply_rank when one is given
      (call_id, ERROR, (exc, traceback_text))
"""
import os
import signal
import sys
import traceback

from ray_lite._private.process.errors import sendable_error
from ray_lite._private.process.procutil import die_with_parent

CALL = 0
SHUTDOWN = 1
READY = -1
START_FAILED = -2
OK = 0
ERROR = 1


def _portable_error(exc):
    """``exc`` if it can travel to the driver, else a RuntimeError with its text."""
    return sendable_error(exc, _described)


def _described(exc):
    return RuntimeError(f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}")


def main(blob_fd):
    # Ctrl-C in a terminal goes to the whole process group; the driver
    # handles it (and shuts us down), the workers must not die half-way.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with os.fdopen(blob_fd, "rb") as f:
        blob = f.read()
    import cloudpickle
    boot = cloudpickle.loads(blob)
    driver_pid = boot["driver_pid"]
    if boot["die_with_parent"]:
        die_with_parent(driver_pid)
    elif os.getppid() != driver_pid:
        os._exit(1)
    if boot.get("cwd"):
        try:
            os.chdir(boot["cwd"])
        except OSError:
            pass

    from ray_lite._fast.broadcast import MessageQueue
    from ray_lite._fast.errors import ChannelClosedError, PeerDiedError
    from ray_lite._fast.ring import ShmRing

    rank = boot["rank"]
    ring = ShmRing.attach(boot["ring_name"], side="producer")
    try:
        mq = MessageQueue.attach(boot["mq_handle"], rank)
    except BaseException as exc:
        ring.put((START_FAILED, _portable_error(exc), traceback.format_exc()))
        ring.close()
        return 1
    try:
        worker = cloudpickle.loads(boot["worker_cls"])(
            rank=rank, world_size=boot["world_size"], **boot["worker_kwargs"])
    except BaseException as exc:
        ring.put((START_FAILED, _portable_error(exc), traceback.format_exc()))
        mq.close()
        ring.close()
        return 1
    del boot, blob
    ring.put((READY, os.getpid()))
    try:
        _serve(worker, rank, mq, ring)
    except (ChannelClosedError, PeerDiedError):
        pass  # the driver closed the queue or died: nothing left to do
    finally:
        mq.close()
        ring.close()
    return 0


def _serve(worker, rank, mq, ring):
    dequeue = mq.dequeue
    put = ring.put
    bound = {}  # method name -> bound method: getattr once per name
    while True:
        msg = dequeue()
        if msg[0] != CALL:
            if msg[0] == SHUTDOWN:
                return
            continue
        _, call_id, method, args, kwargs, reply_rank = msg
        try:
            if method.__class__ is str:
                fn = bound.get(method)
                if fn is None:
                    fn = bound[method] = getattr(worker, method)
                value = fn(*args, **kwargs) if kwargs else fn(*args)
            else:
                value = method(worker, *args, **kwargs) if kwargs else method(worker, *args)
        except Exception as exc:
            put((call_id, ERROR, (_portable_error(exc), traceback.format_exc())))
            continue
        if reply_rank is not None and reply_rank != rank:
            value = None
        try:
            put((call_id, OK, value))
        except Exception as exc:  # a result nothing can serialise
            put((call_id, ERROR, (_portable_error(exc), traceback.format_exc())))


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
