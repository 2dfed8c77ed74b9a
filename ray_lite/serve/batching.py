"""``@serve.batch``: calls to an async method are gathered into lists.

The decorated method receives, for each of its parameters, the list of that
argument over up to ``max_batch_size`` calls (waiting at most
``batch_wait_timeout_s`` after the first) and returns a list of results, one
per call, in order.  An async-generator handler yields such lists instead:
item i of each goes to caller i, whose own call is an async generator; a
``StopIteration`` in caller i's place ends that caller's stream while the
others go on.

At most ``max_concurrent_batches`` batches run at once (default 1: a model
never sees two batches at a time); calls arriving meanwhile wait for the next
batch.  ``set_max_batch_size`` and ``set_batch_wait_timeout_s`` on the
decorated function (or the bound method) change the two limits at run time.

An error in the handler reaches every caller of that batch; a caller that is
cancelled leaves the batch (its result is dropped) without disturbing the
others.  The batch queue belongs to the decorated function, as in Ray (a
replica has one instance), and to the event loop it first ran on.
"""
import asyncio
import collections
import functools
import inspect

from .exceptions import RayServeException

_ITEM, _END, _ERROR = 0, 1, 2
# What a streaming handler puts in a caller's place to end that caller's stream.
_STREAM_END = (StopIteration, StopAsyncIteration)


def _ends_stream(value):
    return value in _STREAM_END or isinstance(value, _STREAM_END)


def _check_max_batch_size(n):
    """``n`` as an int (2.0 is 2, as in Ray): ``TypeError`` for what is not a
    whole number, ``ValueError`` below 1."""
    if isinstance(n, float) and n.is_integer():
        n = int(n)
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"max_batch_size must be an integer >= 1, got {n!r}")
    if n < 1:
        raise ValueError(f"max_batch_size must be an integer >= 1, got {n!r}")
    return n


def _check_timeout(t):
    if isinstance(t, bool) or not isinstance(t, (int, float)):
        raise TypeError(f"batch_wait_timeout_s must be a number >= 0, got {t!r}")
    if t < 0:
        raise ValueError(f"batch_wait_timeout_s must be a number >= 0, got {t!r}")
    return t


def _check_concurrency(n):
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"max_concurrent_batches must be an integer >= 1, got {n!r}")


def _check_output(out, n, streaming):
    """What a handler returned (or yielded) for a batch of ``n`` calls must be
    a list of ``n``: one result (item) per call."""
    kind, verb, verbed, noun = (("generator", "yield", "yielded", "items") if streaming
                                else ("function", "return", "returned", "results"))
    if isinstance(out, (str, bytes)) or not hasattr(out, "__len__"):
        raise TypeError(f"a @serve.batch {kind} must {verb} a list (one of its {noun} per "
                        f"call), not {type(out).__name__}")
    if len(out) != n:
        raise RayServeException(f"Batched {kind} doesn't preserve batch size: it got a batch "
                                f"of {n} inputs and {verbed} {len(out)} {noun}")


class _Call:
    """One caller's arguments, and where its result (or its items) go."""

    __slots__ = ("owner", "args", "kwargs", "arrived", "fut", "items", "left")

    def __init__(self, owner, args, kwargs, arrived, fut, items):
        self.owner, self.args, self.kwargs = owner, args, kwargs
        self.arrived = arrived
        self.fut = fut            # unary calls: the caller's future
        self.items = items        # streaming calls: the caller's queue of (kind, value)
        self.left = False         # the stream ended or the caller went away

    def gone(self):
        return self.fut.done() if self.fut is not None else self.left


class _Limits:
    """The two limits the user can change at run time, shared by every queue
    of the decorated function."""

    __slots__ = ("max_batch_size", "timeout_s", "max_concurrent", "size_fn", "queue")

    def __init__(self, max_batch_size, timeout_s, max_concurrent, size_fn):
        self.max_batch_size = max_batch_size
        self.timeout_s = timeout_s
        self.max_concurrent = max_concurrent
        self.size_fn = size_fn    # batch_size_fn: the size of a list of inputs (else its length)
        self.queue = None         # the _BatchQueue of the running loop

    def fits(self, batch, call):
        """Whether ``call`` may join ``batch``."""
        if self.size_fn is None:
            return len(batch) < self.max_batch_size
        return self.size(batch + [call]) <= self.max_batch_size

    def size(self, calls):
        if self.size_fn is None:
            return len(calls)
        return self.size_fn([c.args[0] if c.args else next(iter(c.kwargs.values()), None)
                             for c in calls])


class _BatchQueue:
    """Calls waiting for a batch on one event loop, and the batches running."""

    def __init__(self, fn, limits, loop):
        self.fn = fn
        self.limits = limits
        self.loop = loop
        self.streaming = inspect.isasyncgenfunction(fn)
        self.waiting = collections.deque()
        self.running = 0
        self.timer = None

    # -------------------------------------------------------------- calls
    def submit(self, owner, args, kwargs):
        loop = self.loop
        if self.streaming:
            call = _Call(owner, args, kwargs, loop.time(), None, asyncio.Queue())
        else:
            call = _Call(owner, args, kwargs, loop.time(), loop.create_future(), None)
        self.waiting.append(call)
        if self.limits.size(self.waiting) >= self.limits.max_batch_size:
            self.start_batches()
        elif self.timer is None:
            self.timer = loop.call_at(call.arrived + self.limits.timeout_s, self._on_timer)
        return call

    def _on_timer(self):
        self.timer = None
        self.start_batches()

    def limits_changed(self):
        """A limit changed: a full queue starts now; a wait is re-timed."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.start_batches()

    def start_batches(self):
        """Start every batch that may start now; time the next one."""
        lim = self.limits
        waiting = self.waiting
        while waiting and waiting[0].gone():
            waiting.popleft()
        while waiting and self.running < lim.max_concurrent:
            due = waiting[0].arrived + lim.timeout_s
            if lim.size(waiting) < lim.max_batch_size and self.loop.time() < due:
                break
            batch = [waiting.popleft()]     # the first call always goes, whatever its size
            while waiting and lim.fits(batch, waiting[0]):
                call = waiting.popleft()
                if not call.gone():
                    batch.append(call)
            if batch:
                self.running += 1
                run = self._run_stream if self.streaming else self._run
                self.loop.create_task(run(batch))
            while waiting and waiting[0].gone():
                waiting.popleft()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if waiting and self.running < lim.max_concurrent:
            self.timer = self.loop.call_at(waiting[0].arrived + lim.timeout_s, self._on_timer)
        # else: the end of a running batch starts the next one

    def _batch_done(self):
        self.running -= 1
        self.start_batches()

    # ------------------------------------------------------------ batches
    def _call_handler(self, batch):
        first = batch[0]
        nargs = len(first.args)
        keys = first.kwargs.keys()
        for call in batch:
            if len(call.args) != nargs or call.kwargs.keys() != keys:
                raise TypeError("every call of a @serve.batch function in one batch must pass "
                                "the same positional arguments and the same keywords")
        args = [[c.args[i] for c in batch] for i in range(nargs)]
        kwargs = {k: [c.kwargs[k] for c in batch] for k in keys}
        if first.owner is not None:
            return self.fn(first.owner, *args, **kwargs)
        return self.fn(*args, **kwargs)

    async def _run(self, batch):
        try:
            try:
                results = await self._call_handler(batch)
                _check_output(results, len(batch), streaming=False)
            except BaseException as exc:   # noqa: BLE001 - every caller sees the failure
                cancelled = isinstance(exc, asyncio.CancelledError)
                for call in batch:
                    if not call.fut.done():
                        if cancelled:
                            call.fut.cancel()
                        else:
                            call.fut.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise
                return
            for call, value in zip(batch, results):
                if not call.fut.done():     # a cancelled caller's result is dropped
                    call.fut.set_result(value)
        finally:
            self._batch_done()

    async def _run_stream(self, batch):
        gen = None
        try:
            try:
                gen = self._call_handler(batch)
                async for out in gen:
                    _check_output(out, len(batch), streaming=True)
                    for call, value in zip(batch, out):
                        if call.left:
                            continue
                        if _ends_stream(value):
                            call.left = True
                            call.items.put_nowait((_END, None))
                        else:
                            call.items.put_nowait((_ITEM, value))
                    if all(call.left for call in batch):
                        break       # every caller is finished or gone
            except BaseException as exc:   # noqa: BLE001 - every open caller sees it
                for call in batch:
                    if not call.left:
                        call.left = True
                        call.items.put_nowait((_ERROR, exc))
                if not isinstance(exc, Exception):
                    raise
            for call in batch:
                if not call.left:
                    call.left = True
                    call.items.put_nowait((_END, None))
        finally:
            if gen is not None and hasattr(gen, "aclose"):
                await gen.aclose()
            self._batch_done()


def _queue_of(fn, limits):
    loop = asyncio.get_running_loop()
    q = limits.queue
    if q is None or q.loop is not loop:
        q = limits.queue = _BatchQueue(fn, limits, loop)
    return q


async def _result_of(q, owner, args, kwargs):
    call = q.submit(owner, args, kwargs)
    return await call.fut


def _stream_of(fn, limits, owner, args, kwargs):
    """A streaming call's items.  As in Ray, the call joins a batch when it is
    made, not when its items are first asked for: a caller that makes several
    calls and then reads them one after the other gets one batch.  Made
    outside an event loop, it joins when first iterated."""
    try:
        q = _queue_of(fn, limits)
    except RuntimeError:        # no running loop
        return _items_when_iterated(fn, limits, owner, args, kwargs)
    return _items_of(q.submit(owner, args, kwargs))


async def _items_when_iterated(fn, limits, owner, args, kwargs):
    async for item in _items_of(_queue_of(fn, limits).submit(owner, args, kwargs)):
        yield item


async def _items_of(call):
    try:
        while True:
            kind, value = await call.items.get()
            if kind == _ITEM:
                yield value
            elif kind == _END:
                return
            else:
                raise value
    finally:
        call.left = True      # closed or cancelled early: its items are dropped


def batch(_func=None, *, max_batch_size=10, batch_wait_timeout_s=0.01, max_concurrent_batches=1,
          batch_size_fn=None):
    """``@serve.batch`` or ``@serve.batch(max_batch_size=..., batch_wait_timeout_s=...,
    max_concurrent_batches=..., batch_size_fn=...)``.

    ``batch_size_fn(inputs)``, when given, is the size of a list of inputs (say,
    their total tokens): a batch takes calls while it stays within
    ``max_batch_size`` (a first call larger than that goes alone)."""
    max_batch_size = _check_max_batch_size(max_batch_size)
    batch_wait_timeout_s = _check_timeout(batch_wait_timeout_s)
    _check_concurrency(max_concurrent_batches)

    def decorate(fn):
        streaming = inspect.isasyncgenfunction(fn)
        if not (streaming or inspect.iscoroutinefunction(fn)):
            raise TypeError("@serve.batch can only decorate async functions and methods "
                            "('async def', or an async generator)")
        params = list(inspect.signature(fn).parameters)
        is_method = bool(params) and params[0] == "self"
        limits = _Limits(max_batch_size, batch_wait_timeout_s, max_concurrent_batches,
                         batch_size_fn)

        if is_method:
            if streaming:
                @functools.wraps(fn)
                def wrapper(self, *args, **kwargs):
                    return _stream_of(fn, limits, self, args, kwargs)
            else:
                @functools.wraps(fn)
                async def wrapper(self, *args, **kwargs):
                    return await _result_of(_queue_of(fn, limits), self, args, kwargs)
        elif streaming:
            @functools.wraps(fn)
            def wrapper(*args, **kwargs):
                return _stream_of(fn, limits, None, args, kwargs)
        else:
            @functools.wraps(fn)
            async def wrapper(*args, **kwargs):
                return await _result_of(_queue_of(fn, limits), None, args, kwargs)

        def set_max_batch_size(n):
            limits.max_batch_size = _check_max_batch_size(n)
            _limits_changed(limits)

        def set_batch_wait_timeout_s(t):
            limits.timeout_s = _check_timeout(t)
            _limits_changed(limits)

        wrapper.set_max_batch_size = set_max_batch_size
        wrapper.set_batch_wait_timeout_s = set_batch_wait_timeout_s
        wrapper._get_max_batch_size = lambda: limits.max_batch_size
        wrapper._get_batch_wait_timeout_s = lambda: limits.timeout_s
        wrapper._get_max_concurrent_batches = lambda: limits.max_concurrent
        return wrapper
    if batch_size_fn is not None and not callable(batch_size_fn):
        raise TypeError("batch_size_fn must be a callable taking a list of inputs")
    if _func is not None:
        return decorate(_func)
    return decorate


def _limits_changed(limits):
    q = limits.queue
    if q is None:
        return
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is q.loop:
        q.limits_changed()
    elif not q.loop.is_closed():
        q.loop.call_soon_threadsafe(q.limits_changed)
