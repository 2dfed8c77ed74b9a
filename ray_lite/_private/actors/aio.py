"""asyncio helpers of the runtime's processes: a cheap semaphore, the actors' loop."""
import collections

from ray_lite._lazy import lazy_module

asyncio = lazy_module("asyncio", globals())


class AsyncSlots:
    """A FIFO semaphore for one event loop whose uncontended acquire costs no
    coroutine call: the caller takes a slot itself::

        if slots.free > 0 and not slots.waiters: slots.free -= 1
        else: await slots.wait()
        try: ... finally: slots.release()

    (or ``async with slots``, off the hot paths).
    """

    __slots__ = ("free", "waiters", "capacity")

    def __init__(self, n):
        self.free = n
        self.waiters = collections.deque()
        self.capacity = n

    def resize(self, n):
        """Make it ``n`` slots, in place (Serve's lightweight update of
        ``max_ongoing_requests``).  Grown: the waiters take the new slots at
        once.  Shrunk below what is taken: ``free`` goes negative, and the
        slots given back pay that off before any waiter gets one."""
        self.free += n - self.capacity
        self.capacity = n
        waiters = self.waiters
        while self.free > 0 and waiters:
            fut = waiters.popleft()
            if not fut.done():
                self.free -= 1
                fut.set_result(None)

    async def wait(self):
        fut = asyncio.get_running_loop().create_future()
        self.waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()      # the slot was handed over just before the cancel
            raise

    async def __aenter__(self):
        if self.free > 0 and not self.waiters:
            self.free -= 1
        else:
            await self.wait()

    async def __aexit__(self, *exc):
        self.release()

    def release(self):
        if self.free >= 0:              # (below 0: over a shrunk capacity)
            waiters = self.waiters
            while waiters:
                fut = waiters.popleft()
                if not fut.done():          # a cancelled waiter is skipped
                    fut.set_result(None)    # the slot passes to it
                    return
        self.free += 1


def new_event_loop():
    """A new event loop for an async actor: uvloop's when it is installed."""
    # uvloop (when installed) runs an async actor's loop in C: its wake-ups,
    # callbacks and socket writes cost a fraction of the pure-Python loop's.
    # RAY_LITE_NO_EXTENSIONS=1 means no compiled code of ours or theirs
    # (and gives CI a run on asyncio's own loop).
    from ray_lite._fast import NO_EXTENSIONS
    if not NO_EXTENSIONS:
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()
