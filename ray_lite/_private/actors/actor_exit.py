"""An actor ending itself (``exit_actor()``), as in Ray.

The call that exits fails with ``ActorDiedError`` (Ray's text); calls still
queued, and any that arrive later, are refused with the same error; calls
already running (threaded and async actors) finish and deliver their
results; then the ``atexit`` handlers run and the process ends.  The driver
is told first, so that its calls to the dead actor say why it died.
"""
import atexit
import os
import sys
import threading

from ray_lite._lazy import lazy_module
from ray_lite.exceptions import ActorDiedError, AsyncioActorExit

from ..links import protocol as P
from ..links.protocol import ActorInfo
from ..process import backend as _backend, state
from ..process.errors import EXITED, ActorExit, actor_died_message

asyncio = lazy_module("asyncio", globals())


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
        queued.extend(node.held_calls.take_all())   # and those waiting for a ref argument
        for peer, msg in queued:
            if msg[0] == P.METHOD:
                node.live.discard(msg[1])
                for m in P.failure_msgs(msg[1], msg[6], err):
                    node.send(peer, m)
        node.exiting = True
    return err


OUT_OF_SCOPE = "__ray_lite_out_of_scope__"


def out_of_scope(actor):
    """The actor's last handle is gone, its creator's and every copy
    (``lease._ActorLease``): Ray's out-of-scope end.

    A copy held in another process sent its last calls before its share of
    the count went back to the creator, and so before the creator sent
    this: they are in this actor's rings, maybe not read yet, maybe read
    after this in one drain.  They run first; then the actor exits as by
    ``exit_actor()``."""
    node = state.node
    if node.loop is not None:
        # (Run at once, inside the drain that read it: the calls read after
        # it in that drain start as tasks before this one looks.)
        node.loop.call_soon_threadsafe(node.loop.create_task, _out_of_scope_async(node))
        return None
    if node.executor is not None:     # a threaded actor
        # The drain that read this may be reading what came after it right
        # now, on the thread that drives: once it is over (the drive lock
        # is free), every call it read is live.
        while not node._drive_lock.acquire(timeout=0.01):
            node.wake_poll()        # (the driving thread may be asleep in poll)
        try:
            node._drain()
        finally:
            node._release_drive()
        # (With a time limit: no message says that a call ended.)
        while not node.wait_until(lambda: len(node.live) <= 1, 0.05):   # this call's oid
            pass
    else:                             # a sync actor: one thread, calls queued in order
        node.drive_nowait()
        if node.tasks:
            node.tasks.append((0, P.method_msg(node.new_oid(), OUT_OF_SCOPE, [], {}, 1, False, 0)))
            return None
    exit_actor()


async def _out_of_scope_async(node):
    await _others_done(node, read_links=True)
    begin_exit(node)


def _exit_when_idle(node):
    # A threaded actor: the calls running on other threads finish first.
    node.wait_until(lambda: not node.live)
    end_process()


async def _exit_when_idle_async(node):
    await _others_done(node)
    end_process()


async def _others_done(node, read_links=False):
    """Until every call task but this one has ended; ``read_links``: before
    each look, read what came meanwhile and let those calls start."""
    me = asyncio.current_task()
    while True:
        if read_links:
            node.drive_nowait()
            await asyncio.sleep(0)
        others = [t for t in node.async_actor.running.values() if t is not me and not t.done()]
        if not others:
            if not node.async_actor.deferred_calls:
                return
            # Calls read and not started yet (3.12+: async_actor.start_call):
            # their starts are queued before this step's next turn.
            await asyncio.sleep(0)
            continue
        # (A concurrency group's call runs on its own loop: see concurrency_groups.)
        await asyncio.wait([t if isinstance(t, asyncio.Future) else t.main_loop_future()
                            for t in others])


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
        give_back_borrowed()
    finally:
        os._exit(0)


def give_back_borrowed():
    """Before ``os._exit``: what this process borrowed goes back to its owners."""
    node = state.node
    if node is not None and not node.closed:
        try:
            node.objects.give_back_borrowed()
        except Exception:   # noqa: BLE001 - ending anyway; the owners keep the objects
            pass


# Ray's worker modes, as its messages print them.
SCRIPT_MODE = 0
WORKER_MODE = 1


def _is_actor(node):
    return node is not None and node.id != 0 and getattr(node, "kind", None) == "actor"


def exit_actor():
    """End the current actor gracefully: the calls running on it finish, the
    queued ones and every later one fail with ``RayActorError``, ``atexit``
    handlers run.  Outside an actor: ``TypeError``, as in Ray."""
    if _backend.RAY:
        return _backend.ENGINE.core.ray.actor.exit_actor()
    node = state.node
    if not _is_actor(node):
        mode = SCRIPT_MODE if node is None or node.id == 0 else WORKER_MODE
        raise TypeError(f"exit_actor API is called on a non-actor worker, {mode}. Call this "
                        f"API inside an actor methodsif you'd like to exit the actor "
                        f"gracefully.")
    if node.loop is not None:
        raise AsyncioActorExit()
    raise ActorExit(0)

