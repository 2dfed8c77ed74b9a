"""The body of a streamed HTTP answer, between what produces it in a replica
(an ASGI app's ``http.response.body`` messages, a ``StreamingResponse``'s
iterator, a generator the deployment returned) and the replica's stream that
the proxy reads (``Replica.http_stream``).

The producer runs as its own task and puts chunks; the stream takes them.
Whatever has queued up when the stream takes goes out as one stream item (a
list of the chunks): an app that yields many small events in a burst
(server-sent events, tokens) costs one stream item, one ring message and one
proxy write per burst instead of one per event (B14).  The proxy still
frames each chunk as its own HTTP chunk, as Ray Serve does (a client that
reads chunk by chunk sees each yield).  Nothing waits for a batch to fill,
so an event the producer puts alone goes out alone, as soon as the stream
takes it.

A producer that puts after its reader closed the stream (the client left)
gets ``serve.exceptions.ClientDisconnected``, an ``OSError``: what an ASGI
server of spec version 2.4 raises from ``send`` on a closed connection.
"""
import asyncio
import collections
import inspect
import sys
import traceback

from ._json import json_body
from .exceptions import ClientDisconnected

# A producer waits while this many chunks, or this many bytes, are not taken
# yet (a slow client must not make a replica buffer without bound); one take
# joins at most BATCH_BYTES, so that a burst of large chunks does not become
# one huge message.
AHEAD_CHUNKS = 16
BATCH_BYTES = 64 * 1024

END = object()          # the producer finished
FAILED = object()       # it failed; no exception to tell (an ASGI app's 500 went out)


class BodyStream:
    """The queued chunks of one answer: ``put`` by the producer, taken by
    ``async for`` (each step takes what has queued: one chunk as bytes,
    several as a list of them), ``aclose`` ends the producer's task."""

    __slots__ = ("_items", "_size", "_end", "_error", "_getter", "_putter", "task", "calls",
                 "closed")

    def __init__(self):
        self._items = collections.deque()
        self._size = 0
        self._end = None
        self._error = None
        self._getter = None
        self._putter = None
        self.task = None
        self.calls = None       # the handle calls of the request streaming this
        self.closed = False     # by its reader (aclose): the client left

    async def put(self, chunk):
        if self.closed:
            raise ClientDisconnected("the client closed the connection")
        items = self._items
        while ((len(items) >= AHEAD_CHUNKS or self._size >= BATCH_BYTES)
               and self._end is None):
            self._putter = asyncio.get_running_loop().create_future()
            await self._putter
        if self.closed:
            raise ClientDisconnected("the client closed the connection")
        if self._end is not None:
            return          # the producer already ended it: taken no more
        items.append(chunk)
        self._size += len(chunk)
        _settle_none(self._getter)

    def end(self, marker=END):
        if self._end is None:
            self._end = marker
            _settle_none(self._getter)
            _settle_none(self._putter)

    def fail(self, exc):
        """The producer raised ``exc``: the stream raises it once the chunks
        put before it are taken."""
        if self._end is None:
            self._error = exc
            self.end(FAILED)

    def __aiter__(self):
        return self

    async def __anext__(self):
        items = self._items
        while not items:
            if self._end is END:
                raise StopAsyncIteration
            if self._end is FAILED:
                if self._error is not None:
                    raise self._error
                raise RuntimeError("the ASGI app failed while it streamed its response")
            self._getter = asyncio.get_running_loop().create_future()
            await self._getter
        return self.take_queued()

    def take_queued(self):
        """What has queued, as one item of the stream (a chunk, or a list
        of chunks), or None when nothing has."""
        items = self._items
        if not items:
            return None
        chunk = items.popleft()
        size = len(chunk)
        if items and size < BATCH_BYTES:
            parts = [chunk]
            while items and size < BATCH_BYTES:
                chunk = items.popleft()
                parts.append(chunk)
                size += len(chunk)
            chunk = parts
        self._size -= size
        _settle_none(self._putter)
        return chunk

    async def aclose(self):
        self.closed = True
        self.end(END)
        self._items.clear()
        self._size = 0
        task = self.task
        if task is not None and not task.done():
            task.cancel()
            if self.calls:       # the handle calls its request made go with it
                from ._request_calls import cancel_calls
                cancel_calls(self.calls)


def pumped(iterator):
    """A ``BodyStream`` of ``iterator``'s items (sync or async; str, bytes or
    JSON-able values), filled by a task started now."""
    stream = BodyStream()
    stream.task = asyncio.get_running_loop().create_task(_pump(iterator, stream))
    return stream


async def _pump(it, stream):
    try:
        if inspect.isasyncgen(it) or hasattr(it, "__anext__"):
            async for item in it:
                await stream.put(to_bytes(item))
                if stream._end is not None:
                    break
        else:
            for item in it:
                await stream.put(to_bytes(item))
                if stream._end is not None:
                    break
    except asyncio.CancelledError:
        stream.end(FAILED)      # (a no-op after aclose, which ended it first)
        raise
    except BaseException as exc:
        stream.fail(exc)
        if not isinstance(exc, Exception):
            raise
    else:
        stream.end(END)
    finally:
        # Closed with the stream: a client that left closes the user's
        # generator at once, not whenever it is collected.
        try:
            close = getattr(it, "aclose", None)
            if close is not None:
                await close()
            else:
                close = getattr(it, "close", None)
                if close is not None:
                    close()
        except Exception as exc:    # noqa: BLE001 - the user's cleanup; the replica goes on
            stream.fail(exc)        # (nothing once the stream ended: what was sent stands)
            print("a streamed response's iterator failed while closing:\n"
                  f"{''.join(traceback.format_exception(exc))}", file=sys.stderr, end="")


def to_bytes(item):
    if isinstance(item, bytes):
        return item
    if isinstance(item, str):
        return item.encode()
    if isinstance(item, (bytearray, memoryview)):
        return bytes(item)
    return json_body(item)


def _settle_none(fut):
    if fut is not None and not fut.done():
        fut.set_result(None)
