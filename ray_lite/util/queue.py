"""``Queue``: a first-in, first-out queue that any task, actor or driver can use.

The items live in an async actor (the queue's owner); every operation is one
call to it, so a ``put`` or ``get`` costs one actor round trip (one that the
owner answers without an asyncio Task when it need not wait).  A blocking
``get`` or ``put`` waits *in the actor* (a future on its event loop, with a
timer for the timeout), so a blocked caller sends nothing more until its
answer arrives.  Passing the queue to a task or an actor passes its actor
handle: every copy talks to the same owner.  If the owner dies, calls raise
the ``RayActorError`` the core raises for a dead actor, never hang.
"""
import asyncio
import collections
import functools
import queue as _stdlib_queue
from collections.abc import Iterable

import ray_lite
from ray_lite._private import backend as _backend

__all__ = ["Queue", "Empty", "Full"]


class Empty(_stdlib_queue.Empty):
    """``get`` found the queue empty (at once, or until its timeout)."""


class Full(_stdlib_queue.Full):
    """``put`` found the queue full (at once, or until its timeout)."""


def _check_timeout(timeout):
    if timeout is not None and timeout < 0:
        raise ValueError("'timeout' must be a non-negative number")


@_backend.ray_counterpart("Queue")
class Queue:
    """A FIFO queue of at most ``maxsize`` items (0: unbounded).

    ``actor_options`` are passed to the owner actor's ``options(...)``.

        q = Queue(maxsize=100)
        q.put(1); q.get()               # 1
        q.get(timeout=0.5)              # Empty after 0.5 s
        await q.put_async(2); await q.get_async()
    """

    def __init__(self, maxsize=0, actor_options=None):
        self.maxsize = maxsize
        self.actor = _queue_actor_class().options(**(actor_options or {})).remote(maxsize)

    def __reduce__(self):
        return (_rebuild_queue, (self.maxsize, self.actor))

    def __len__(self):
        return self.size()

    def size(self):
        """The number of items in the queue."""
        return ray_lite.get(self.actor.qsize.remote())

    def qsize(self):
        """The number of items in the queue."""
        return self.size()

    def empty(self):
        return ray_lite.get(self.actor.empty.remote())

    def full(self):
        return ray_lite.get(self.actor.full.remote())

    # ------------------------------------------------------------------ put
    def put(self, item, block=True, timeout=None):
        """Add ``item``; when full, wait (at most ``timeout`` s) unless not ``block``.

        Raises ``Full`` when no room was found.  With several producers
        waiting on a full queue, their items go in in the order they came.
        """
        if not block:
            timeout = 0
        _check_timeout(timeout)
        if not ray_lite.get(self.actor.put.remote(item, timeout)):
            raise Full
        return None

    async def put_async(self, item, block=True, timeout=None):
        """``put`` for asyncio code: awaits the room instead of blocking the thread."""
        if not block:
            timeout = 0
        _check_timeout(timeout)
        if not await self.actor.put.remote(item, timeout):
            raise Full

    def put_nowait(self, item):
        """``put(item, block=False)``."""
        return self.put(item, block=False)

    def put_nowait_batch(self, items):
        """Add every item of ``items`` in order, or none: ``Full`` if they do not all fit."""
        if not isinstance(items, Iterable):
            raise TypeError("Argument 'items' must be an Iterable")
        items = list(items)
        room = ray_lite.get(self.actor.put_nowait_batch.remote(items))
        if room is not None:
            raise Full(f"Cannot add {len(items)} items to queue of size {room} and "
                       f"maxsize {self.maxsize}.")

    # ------------------------------------------------------------------ get
    def get(self, block=True, timeout=None):
        """The oldest item; when empty, wait (at most ``timeout`` s) unless not ``block``.

        Raises ``Empty`` when no item came.
        """
        if not block:
            timeout = 0
        _check_timeout(timeout)
        found, item = ray_lite.get(self.actor.get.remote(timeout))
        if not found:
            raise Empty
        return item

    async def get_async(self, block=True, timeout=None):
        """``get`` for asyncio code: awaits the item instead of blocking the thread."""
        if not block:
            timeout = 0
        _check_timeout(timeout)
        found, item = await self.actor.get.remote(timeout)
        if not found:
            raise Empty
        return item

    def get_nowait(self):
        """``get(block=False)``."""
        return self.get(block=False)

    def get_nowait_batch(self, num_items):
        """The ``num_items`` oldest items, in order, or none: ``Empty`` if there are fewer."""
        if not isinstance(num_items, int):
            raise TypeError("Argument 'num_items' must be an int")
        if num_items < 0:
            raise ValueError("'num_items' must be nonnegative")
        found, items = ray_lite.get(self.actor.get_nowait_batch.remote(num_items))
        if not found:
            raise Empty(f"Cannot get {num_items} items from queue of size {items}.")
        return items

    # ------------------------------------------------------------- shutdown
    def shutdown(self, force=False, grace_period_s=5):
        """End the owner actor; the queue's items are lost and later calls raise.

        Without ``force``, calls already sent to it are answered first (for
        at most ``grace_period_s`` seconds; a call blocked on an empty or full
        queue is not waited for).
        """
        actor = self.actor
        if actor is None:
            return
        if not force:
            try:
                ray_lite.wait([actor.qsize.remote()], timeout=grace_period_s)
            except Exception:   # already dead: nothing to wait for
                pass
        ray_lite.kill(actor)


def _rebuild_queue(maxsize, actor):
    q = Queue.__new__(Queue)
    q.maxsize = maxsize
    q.actor = actor
    return q


class _QueueOwner:
    """The actor that holds a ``Queue``'s items.

    Invariant: callers wait in ``getters`` only while ``items`` is empty, and
    in ``putters`` only while the queue is full, so an item or a free place
    goes straight to the oldest waiter.  ``get`` answers ``(found, item)`` and
    ``put`` answers whether it put: timing out is an answer, not an error
    (an error would carry a traceback back for a routine outcome).
    """

    def __init__(self, maxsize):
        self.maxsize = maxsize
        self.items = collections.deque()
        self.getters = collections.deque()      # futures of blocked get calls
        self.putters = collections.deque()      # (future, item) of blocked put calls

    def qsize(self):
        return len(self.items)

    def empty(self):
        return not self.items

    def full(self):
        return 0 < self.maxsize <= len(self.items)

    def waiters(self):
        """``(blocked get calls, blocked put calls)``: what is waiting on the queue."""
        return (sum(1 for f in self.getters if not f.done()),
                sum(1 for f, _ in self.putters if not f.done()))

    def _room_for(self, n):
        return self.maxsize <= 0 or len(self.items) + n <= self.maxsize

    def _deliver(self, item):
        getters = self.getters
        while getters:
            fut = getters.popleft()
            if not fut.done():          # not timed out, not cancelled
                fut.set_result((True, item))
                return
        self.items.append(item)

    def _take(self):
        item = self.items.popleft()
        putters = self.putters
        while putters:
            fut, waiting_item = putters.popleft()
            if not fut.done():
                self.items.append(waiting_item)
                fut.set_result(True)
                break
        return item

    # put and get are plain methods: what they can answer at once is answered
    # without an asyncio Task (the worker runs such calls directly); only a
    # call that has to wait returns a coroutine, which the worker awaits.
    def put(self, item, timeout=None):
        if not self.putters and self._room_for(1):
            self._deliver(item)
            return True
        if timeout == 0:
            return False
        fut = asyncio.get_running_loop().create_future()
        self.putters.append((fut, item))
        return self._wait_for(fut, timeout, False)

    def get(self, timeout=None):
        if self.items:
            return True, self._take()
        if timeout == 0:
            return False, None
        fut = asyncio.get_running_loop().create_future()
        self.getters.append(fut)
        return self._wait_for(fut, timeout, (False, None))

    # An async method (this one) makes the owner an async actor: its calls
    # wait on its event loop, never blocking one another.
    async def _wait_for(self, fut, timeout, timed_out_answer):
        if timeout is None:
            return await fut
        timer = asyncio.get_running_loop().call_later(timeout, _expire, fut, timed_out_answer)
        try:
            return await fut
        finally:
            timer.cancel()

    def put_nowait_batch(self, items):
        """None when all were added, else the queue's size (nothing added)."""
        if self.putters or not self._room_for(len(items)):
            return len(self.items)
        for item in items:
            self._deliver(item)
        return None

    def get_nowait_batch(self, num_items):
        if num_items > len(self.items):
            return False, len(self.items)
        return True, [self._take() for _ in range(num_items)]


def _expire(fut, answer):
    if not fut.done():
        fut.set_result(answer)


# Made on first use: importing this module starts nothing and costs little.
_queue_actor_class = functools.cache(lambda: ray_lite.remote(_QueueOwner))
