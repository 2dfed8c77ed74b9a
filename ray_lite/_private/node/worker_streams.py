"""A worker's side of streaming generators: each item sent as it is yielded,
held back by the caller's window, ended (or failed) with a message.  (Part
of ``WorkerNode``.)"""

from ray_lite._lazy import lazy_module

from ..links import protocol as P
from ..links.protocol import ITEM   # per item: a global, not an attribute
from ..process.errors import sendable_error, unpicklable_task_error

asyncio = lazy_module("asyncio", globals())


class GeneratorsMixin:
    """Runs a call's generator (sync or async) to the end, item by item."""

    def _wait_backpressure(self, sid, produced, bp):
        self.wait_until(lambda: produced - self.stream_acks.get(sid, 0) < bp
                        or sid in self.cancelled)

    def _drain_gen(self, peer, sid, gen, bp, name):
        # Whatever happens, the owner (or the driver, for a pool task: it
        # frees the worker on it) gets an end message.
        i = 0
        try:
            while True:
                try:
                    self._enter_user_code()
                    item = next(gen)
                except StopIteration:
                    break
                finally:
                    self._in_user_code = False
                if sid in self.cancelled:
                    gen.close()
                    break
                if not self.reply(peer, (ITEM, sid, i, True, item), name):
                    gen.close()      # reply() sent item i as an error, and the end
                    return
                i += 1
                if bp > 0 and i - self.stream_acks.get(sid, 0) >= bp:
                    self._wait_backpressure(sid, i, bp)
                elif i & 31 == 0:
                    self.drive_nowait()   # notices a cancel without a syscall per item
        except BaseException as exc:
            # A KeyboardInterrupt of a cancelled stream is the cancel itself.
            if not self._end_failed_stream(peer, sid, i, name, exc) and \
                    isinstance(exc, (SystemExit, KeyboardInterrupt)):
                raise
            return
        finally:
            self.stream_acks.pop(sid, None)
        self.send(peer, P.end_msg(sid, i))

    def _end_failed_stream(self, peer, sid, i, name, exc):
        """The generator of stream ``sid`` raised ``exc`` at item ``i``: item
        ``i`` is the error, then the stream ends; a cancelled stream just
        ends.  True when it was cancelled."""
        if sid in self.cancelled:
            self.send(peer, P.end_msg(sid, i))
            return True
        err = sendable_error(self._failure(sid, name, exc), unpicklable_task_error(name))
        for m in P.stream_failed_msgs(sid, i, err):
            self.send(peer, m)
        return False

    async def _drain_async_gen(self, peer, sid, agen, bp, name):
        i = 0
        cancelled = self.cancelled
        link = self.links.get(peer)
        send = link.send if link is not None else None
        try:
            async for item in agen:
                if cancelled and sid in cancelled:
                    break
                msg = (ITEM, sid, i, True, item)
                try:
                    send(msg)          # the common case, without reply()'s checks
                except Exception:      # noqa: BLE001 - reply() tells what went wrong
                    if not self.reply(peer, msg, name):
                        break
                i += 1
                if bp > 0:
                    while i - self.stream_acks.get(sid, 0) >= bp and sid not in self.cancelled:
                        bridge = self.bridges.for_running_loop()
                        fut = bridge.loop.create_future()
                        self.ack_waiters[sid] = bridge.waker(fut)
                        await fut
            else:
                self.send(peer, P.end_msg(sid, i))
                return
            await agen.aclose()
            self.send(peer, P.end_msg(sid, i))
        except asyncio.CancelledError:
            self.send(peer, P.end_msg(sid, i))
            return
        except BaseException as exc:
            self._end_failed_stream(peer, sid, i, name, exc)
            if isinstance(exc, (SystemExit, KeyboardInterrupt)):
                raise
        finally:
            self.stream_acks.pop(sid, None)
            self.ack_waiters.pop(sid, None)
