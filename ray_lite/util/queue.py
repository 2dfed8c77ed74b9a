"""``Queue``: a first-in, first-out queue that any task, actor or driver can use.

The queue belongs to an async actor (its owner), which creates a
shared-memory ring for the items (``_queue_ring``).  The common operations
skip the owner: a ``put`` that finds room copies the item into the ring, a
``get`` that finds an item copies it out, each under the ring's lock, in the
caller's process (a few microseconds instead of an actor round trip).  The
owner is called only when the ring alone cannot decide: the queue is empty
or full and the call must wait, calls already wait in the owner (so that an
item or a free place goes to the oldest waiter), or items too large for the
ring wait in the owner.  A blocking ``get`` on an empty ring (``put`` on a
full one) first polls it for a few microseconds (on the calling thread, then
a few yields) before it asks the owner.  A blocked call waits *in the owner*
(a future on its event loop, with a timer for the timeout), so it sends
nothing more until its answer arrives.

Passing the queue to a task or an actor passes the owner's handle and the
ring's name: every copy talks to the same owner and maps the same ring.  Every
direct operation first checks that the owner lives (its pidfd, and whether
this process saw it killed); once it is dead, calls go to the owner and raise
the ``RayActorError`` the core raises for a dead actor, never hang.
"""
import asyncio
import collections
import functools
import os
import weakref
from collections.abc import Iterable

import ray_lite
from ray_lite._fast import codec as _codec
from ray_lite._private.process import backend as _backend
from ray_lite._private.process import state as _state
from ray_lite.exceptions import Empty, Full
from ray_lite.util._queue_ring import QueueRing

__all__ = ["Queue", "Empty", "Full"]

# Below this timeout a blocked get or put does not poll the ring before it
# asks the owner (the poll would outlast the timeout).
_SPIN_MIN_TIMEOUT_S = 0.001


def _may_spin(timeout):
    return timeout is None or timeout >= _SPIN_MIN_TIMEOUT_S


def _check_timeout(timeout):
    if timeout is not None and timeout < 0:
        raise ValueError("'timeout' must be a non-negative number")


def _wait_s(block, timeout):
    """How long a get or put may wait: 0 unless ``block``, else ``timeout``
    (None: for ever), checked."""
    if not block:
        timeout = 0
    _check_timeout(timeout)
    return timeout


def _got(answer):
    """The item of the owner's ``(found, item)`` answer to a get; ``Empty`` if none."""
    found, item = answer
    if not found:
        raise Empty
    return item


# What a get straight from the ring returns when it took no item (an item
# may be None).
_NOTHING = object()


# This process's mappings of queue rings, one per ring whatever the number of
# Queue copies (unpickled in each call that receives one) that use it.
_ATTACHED = weakref.WeakValueDictionary()


def _attach(name, owner_pid):
    """This process's ``QueueRing`` called ``name``, or False when it cannot be
    mapped (the owner is gone and its ring with it)."""
    if name is None:
        return False
    ring = _ATTACHED.get(name)
    if ring is None:
        try:
            ring = QueueRing.attach(name, owner_pid)
        except (OSError, ValueError):
            return False
        _ATTACHED[name] = ring
    return ring


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
        self._owner = _queue_actor_class().options(**(actor_options or {})).remote(maxsize)
        self._ring_name, self._owner_pid = ray_lite.get(self._owner.ring_info.remote())
        self._ring = None       # mapped at first use; False when it cannot be
        self._shut_down = False

    @property
    def actor(self):
        """The owner actor's handle; None once this copy shut the queue down
        (as Ray's).  Calls after that raise ``RayActorError``."""
        return None if self._shut_down else self._owner

    def __reduce__(self):
        return (_rebuild_queue, (self.maxsize, self._owner, self._ring_name, self._owner_pid))

    def _direct(self):
        """The ring, when this process may use it without calling the owner,
        else None.  (The ring's operations also check that the owner process
        lives; this process may know sooner, from a ``kill`` it sent.)"""
        ring = self._ring
        if ring is None:
            ring = self._ring = _attach(self._ring_name, self._owner_pid)
        if not ring:
            return None
        node = _state.node
        aid = self._owner._info.actor_id
        if node is None or aid in node.death_causes or aid in node.dead_peers:
            return None
        return ring

    def __len__(self):
        return self.size()

    def size(self):
        """The number of items in the queue."""
        ring = self._direct()
        if ring is not None:
            n = ring.size()
            if n is not None:
                return n
        return ray_lite.get(self._owner.qsize.remote())

    def qsize(self):
        """The number of items in the queue."""
        return self.size()

    def empty(self):
        return self.size() == 0

    def full(self):
        return 0 < self.maxsize <= self.size()

    # ------------------------------------------------------------------ put
    def put(self, item, block=True, timeout=None):
        """Add ``item``; when full, wait (at most ``timeout`` s) unless not ``block``.

        Raises ``Full`` when no room was found.  With several producers
        waiting on a full queue, their items go in in the order they came.
        """
        timeout = _wait_s(block, timeout)
        if not self._ring_put(item, timeout, spin=True) and \
                not ray_lite.get(self._owner.put.remote(item, timeout)):
            raise Full
        return None

    async def put_async(self, item, block=True, timeout=None):
        """``put`` for asyncio code: awaits the room instead of blocking the thread."""
        timeout = _wait_s(block, timeout)
        if not self._ring_put(item, timeout, spin=False) and \
                not await self._owner.put.remote(item, timeout):
            raise Full

    def _ring_put(self, item, timeout, spin):
        """Put ``item`` straight into the ring, without the owner; False if
        there is no ring or no room (with ``spin``, and a wait long enough,
        after polling a while for room)."""
        ring = self._direct()
        if ring is None:
            return False
        data = _codec.dumps(item, readonly_arrays=True)
        return ring.try_put(data, self.maxsize) or (
            spin and self.maxsize > 0 and _may_spin(timeout)
            and ring.spin_until_room(self.maxsize) and ring.try_put(data, self.maxsize))

    def put_nowait(self, item):
        """``put(item, block=False)``."""
        return self.put(item, block=False)

    def put_nowait_batch(self, items):
        """Add every item of ``items`` in order, or none: ``Full`` if they do not all fit."""
        if not isinstance(items, Iterable):
            raise TypeError("Argument 'items' must be an Iterable")
        items = list(items)
        room = ray_lite.get(self._owner.put_nowait_batch.remote(items))
        if room is not None:
            raise Full(f"Cannot add {len(items)} items to queue of size {room} and "
                       f"maxsize {self.maxsize}.")

    # ------------------------------------------------------------------ get
    def get(self, block=True, timeout=None):
        """The oldest item; when empty, wait (at most ``timeout`` s) unless not ``block``.

        Raises ``Empty`` when no item came.
        """
        timeout = _wait_s(block, timeout)
        item = self._ring_get(timeout, spin=True)
        if item is _NOTHING:
            item = _got(ray_lite.get(self._owner.get.remote(timeout)))
        return item

    async def get_async(self, block=True, timeout=None):
        """``get`` for asyncio code: awaits the item instead of blocking the thread."""
        timeout = _wait_s(block, timeout)
        item = self._ring_get(timeout, spin=False)
        if item is _NOTHING:
            item = _got(await self._owner.get.remote(timeout))
        return item

    def _ring_get(self, timeout, spin):
        """The oldest item, taken straight from the ring without the owner;
        ``_NOTHING`` if there is no ring or no item (with ``spin``, and a
        wait long enough, after polling a while for one)."""
        ring = self._direct()
        if ring is None:
            return _NOTHING
        data = ring.try_get()
        if data is None and spin and _may_spin(timeout) and ring.spin_until_items():
            data = ring.try_get()
        return _NOTHING if data is None else _codec.loads(data)

    def get_nowait(self):
        """``get(block=False)``."""
        return self.get(block=False)

    def get_nowait_batch(self, num_items):
        """The ``num_items`` oldest items, in order, or none: ``Empty`` if there are fewer."""
        if not isinstance(num_items, int):
            raise TypeError("Argument 'num_items' must be an int")
        if num_items < 0:
            raise ValueError("'num_items' must be nonnegative")
        found, items = ray_lite.get(self._owner.get_nowait_batch.remote(num_items))
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
        if self._shut_down:
            return
        actor = self._owner
        if not force:
            try:
                ray_lite.wait([actor.qsize.remote()], timeout=grace_period_s)
            except Exception:   # already dead: nothing to wait for
                pass
        ring = self._direct()
        if ring is not None:
            # Copies in other processes stop using the ring at once, not
            # only once they see the owner's process gone.
            with ring:
                ring.set_closed()
        ray_lite.kill(actor)
        self._shut_down = True


def _rebuild_queue(maxsize, actor, ring_name=None, owner_pid=0):
    q = Queue.__new__(Queue)
    q.maxsize = maxsize
    q._owner = actor
    q._shut_down = False
    q._ring_name = ring_name
    q._owner_pid = owner_pid
    q._ring = None
    return q


class _QueueOwner:
    """The actor that owns a ``Queue``: its ring, what the ring cannot hold
    (``overflow``, after the ring's items) and the calls that wait.

    Invariant: callers wait in ``getters`` only while the queue is empty, and
    in ``putters`` only while it is full, so an item or a free place goes
    straight to the oldest waiter; the ring's header counts them so that the
    other processes leave those cases to the owner.  Every method holds the
    ring's lock while it looks at the queue.  ``get`` answers ``(found,
    item)`` and ``put`` answers whether it put: timing out is an answer, not
    an error (an error would carry a traceback back for a routine outcome).
    """

    def __init__(self, maxsize):
        self.maxsize = maxsize
        self.ring = QueueRing.create(_state.get_node().shm_prefix)
        # (item, its encoding, or None when the ring can never take it)
        self.overflow = collections.deque()
        self.getters = collections.deque()      # futures of blocked get calls
        self.putters = collections.deque()      # (future, item) of blocked put calls

    def ring_info(self):
        """``(ring name, owner pid)``: what a ``Queue`` needs to map the ring."""
        return self.ring.name, os.getpid()

    def qsize(self):
        with self.ring:
            return self._size()

    def empty(self):
        return self.qsize() == 0

    def full(self):
        return 0 < self.maxsize <= self.qsize()

    def waiters(self):
        """``(blocked get calls, blocked put calls)``: what is waiting on the queue."""
        return (sum(1 for f in self.getters if not f.done()),
                sum(1 for f, _ in self.putters if not f.done()))

    # The helpers below run with the ring's lock held.
    def _size(self):
        return self.ring.state()[0] + len(self.overflow)

    def _room_for(self, n):
        return self.maxsize <= 0 or self._size() + n <= self.maxsize

    def _putters_wait(self):
        putters = self.putters
        while putters and putters[0][0].done():      # timed out or cancelled
            putters.popleft()
        return bool(putters)

    def _append(self, item):
        """``item`` at the tail: in the ring when nothing waits in ``overflow``."""
        overflow = self.overflow
        try:
            data = _codec.dumps(item, readonly_arrays=True)
        except Exception:       # came through a call, but may not encode again
            data = None
        if data is not None and len(data) > self.ring.item_limit:
            data = None
        if not overflow and data is not None and self.ring.push(data):
            return
        overflow.append((item, data))
        self.ring.set_overflow(len(overflow))

    def _refill(self):
        """Move what waits in ``overflow`` into the ring while it has room, so
        that the other processes can use the ring alone again."""
        overflow = self.overflow
        if not overflow:
            return
        ring = self.ring
        while overflow:
            data = overflow[0][1]
            if data is None or not ring.push(data):
                break
            overflow.popleft()
        ring.set_overflow(len(overflow))

    def _deliver(self, item):
        getters = self.getters
        while getters:
            fut = getters.popleft()
            if not fut.done():          # not timed out, not cancelled
                fut.set_result((True, item))
                return
        self._append(item)

    def _take(self):
        if self.ring.state()[0]:
            item = _codec.loads(self.ring.pop())
        else:
            item = self.overflow.popleft()[0]
            self.ring.set_overflow(len(self.overflow))
        putters = self.putters
        while putters:
            fut, waiting_item = putters.popleft()
            if not fut.done():
                self._append(waiting_item)
                fut.set_result(True)
                break
        self._refill()
        return item

    def _getter_done(self, _fut):
        with self.ring:
            self.ring.add_getters(-1)

    def _putter_done(self, _fut):
        with self.ring:
            self.ring.add_putters(-1)

    # put and get are plain methods: what they can answer at once is answered
    # without an asyncio Task (the worker runs such calls directly); only a
    # call that has to wait returns a coroutine, which the worker awaits.
    def put(self, item, timeout=None):
        with self.ring:
            self._refill()
            if not self._putters_wait() and self._room_for(1):
                self._deliver(item)
                return True
            if timeout == 0:
                return False
            fut = asyncio.get_running_loop().create_future()
            self.putters.append((fut, item))
            self.ring.add_putters(1)
        fut.add_done_callback(self._putter_done)
        return self._wait_for(fut, timeout, False)

    def get(self, timeout=None):
        with self.ring:
            self._refill()
            if self._size():
                return True, self._take()
            if timeout == 0:
                return False, None
            fut = asyncio.get_running_loop().create_future()
            self.getters.append(fut)
            self.ring.add_getters(1)
        fut.add_done_callback(self._getter_done)
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
        with self.ring:
            self._refill()
            if self._putters_wait() or not self._room_for(len(items)):
                return self._size()
            for item in items:
                self._deliver(item)
        return None

    def get_nowait_batch(self, num_items):
        with self.ring:
            self._refill()
            size = self._size()
            if num_items > size:
                return False, size
            return True, [self._take() for _ in range(num_items)]


def _expire(fut, answer):
    if not fut.done():
        fut.set_result(answer)


# Made on first use: importing this module starts nothing and costs little.
_queue_actor_class = functools.cache(lambda: ray_lite.remote(_QueueOwner))
