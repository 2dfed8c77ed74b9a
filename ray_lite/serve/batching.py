"""``@serve.batch``: calls to an async method are gathered into lists.

The decorated method receives a list of the arguments of up to
``max_batch_size`` calls (waiting at most ``batch_wait_timeout_s`` after the
first) and returns a list of results, one per call, in order.
"""
import asyncio
import functools
import inspect


class _Batcher:
    def __init__(self, fn, max_batch_size, batch_wait_timeout_s):
        self.fn = fn
        self.max_batch_size = max_batch_size
        self.timeout = batch_wait_timeout_s
        self.queue = []
        self.flush_handle = None
        self.full = None

    async def submit(self, owner, arg):
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self.queue.append((arg, fut))
        if len(self.queue) >= self.max_batch_size:
            self._flush(owner)
        elif self.flush_handle is None:
            self.flush_handle = loop.call_later(self.timeout, self._flush, owner)
        return await fut

    def _flush(self, owner):
        if self.flush_handle is not None:
            self.flush_handle.cancel()
            self.flush_handle = None
        batch, self.queue = self.queue[:self.max_batch_size], self.queue[self.max_batch_size:]
        if self.queue:
            self.flush_handle = asyncio.get_running_loop().call_later(
                self.timeout, self._flush, owner)
        if batch:
            asyncio.ensure_future(self._run(owner, batch))

    async def _run(self, owner, batch):
        args = [a for a, _ in batch]
        try:
            r = self.fn(owner, args) if owner is not None else self.fn(args)
            if inspect.isawaitable(r):
                r = await r
            results = list(r)
            if len(results) != len(batch):
                raise TypeError(f"Batched function returned {len(results)} results for a "
                                f"batch of {len(batch)} inputs")
        except BaseException as exc:   # noqa: BLE001 - every caller sees the failure
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
            return
        for (_, fut), value in zip(batch, results):
            if not fut.done():
                fut.set_result(value)


def batch(_func=None, *, max_batch_size=10, batch_wait_timeout_s=0.01, max_concurrent_batches=1,
          batch_size_fn=None):
    """``@serve.batch`` or ``@serve.batch(max_batch_size=..., batch_wait_timeout_s=...)``."""
    if not isinstance(max_batch_size, int) or max_batch_size < 1:
        raise ValueError("max_batch_size must be a positive int")
    if not isinstance(batch_wait_timeout_s, (int, float)) or batch_wait_timeout_s < 0:
        raise ValueError("batch_wait_timeout_s must be a non-negative number")

    def decorate(fn):
        if not inspect.iscoroutinefunction(fn):
            raise TypeError("@serve.batch can only decorate async functions and methods")
        params = list(inspect.signature(fn).parameters)
        is_method = bool(params) and params[0] == "self"
        attr = f"__serve_batcher_{fn.__name__}"

        if is_method:
            @functools.wraps(fn)
            async def method_wrapper(self, arg):
                b = self.__dict__.get(attr)
                if b is None:
                    b = self.__dict__[attr] = _Batcher(fn, max_batch_size, batch_wait_timeout_s)
                return await b.submit(self, arg)
            return method_wrapper
        batcher = []

        @functools.wraps(fn)
        async def func_wrapper(arg):
            if not batcher:
                batcher.append(_Batcher(fn, max_batch_size, batch_wait_timeout_s))
            return await batcher[0].submit(None, arg)
        return func_wrapper
    if _func is not None:
        return decorate(_func)
    return decorate
