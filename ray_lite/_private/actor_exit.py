"""An actor ending itself (``exit_actor()``), as in Ray.

The call that exits fails with ``ActorDiedError`` (Ray's text); calls still
queued, and any that arrive later, are refused with the same error; calls
already running (threaded and async actors) finish and deliver their
results; then the ``atexit`` handlers run and the process ends.  The driver
is told first, so that its calls to the dead actor say why it died.
"""
import asyncio
import atexit
import os
import sys
import threading

from ray_lite.exceptions import ActorDiedError

from . import protocol as P
from .errors import EXITED, actor_died_message
from .protocol import ActorInfo


def begin_exit(node):
    """The running call raised ``exit_actor()``'s exception: the error it fails with."""
    err = node.actor_init_error
    if isinstance(err, ActorDiedError) and getattr(err, "exiting", False):
        return err          # a second call exiting meanwhile
    me = ActorInfo(node.id, os.getpid(), type(node.actor).__name__, {}, node.loop is not None,
                   node.actor_name, node.namespace)
    err = ActorDiedError(actor_died_message(me, EXITED), actor_id=node.id)
    err.exiting = True
    # Every later call is refused where a failed constructor refuses them.
    node.actor_init_error = err
    node.notify(P.OP_ACTOR_EXITING)
    if node.loop is not None:
        # (From a concurrency group's thread too: see concurrency_groups.)
        node.loop.call_soon_threadsafe(node.loop.create_task, _exit_when_idle_async(node))
    elif node.executor is not None:
        threading.Thread(target=_exit_when_idle, args=(node,), name="ray_lite-exit",
                         daemon=True).start()
    else:
        # One thread: the calls queued behind this one fail now; the exit
        # itself propagates to worker_main (SystemExit), which ends the process.
        queued = list(node.tasks)
        node.tasks.clear()
        with node._held_lock:      # and those waiting for a ref argument
            for peer, held in node.held_calls.items():
                queued.extend((peer, msg) for msg in held)
            node.held_calls.clear()
        for peer, msg in queued:
            if msg[0] == P.METHOD:
                node.live.discard(msg[1])
                for m in P.failure_msgs(msg[1], msg[6], err):
                    node.send(peer, m)
        node.exiting = True
    return err


def _exit_when_idle(node):
    # A threaded actor: the calls running on other threads finish first.
    node.wait_until(lambda: not node.live)
    end_process()


async def _exit_when_idle_async(node):
    me = asyncio.current_task()
    while True:
        others = [t for t in node.running.values() if t is not me and not t.done()]
        if not others:
            break
        # (A concurrency group's call runs on its own loop: see concurrency_groups.)
        await asyncio.wait([t if isinstance(t, asyncio.Future) else t.main_loop_future()
                            for t in others])
    end_process()


def run_exit_handlers():
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass


def end_process():
    try:
        run_exit_handlers()
    finally:
        os._exit(0)
