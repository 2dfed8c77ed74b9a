"""``DeploymentHandle.broadcast``: one call to every running replica, as Ray
Serve's (for control work: a cache reset, a configuration reload).

The call goes to each replica the handle's router lists when ``broadcast``
runs, bypassing ``max_ongoing_requests`` and ``max_queued_requests`` (Ray's
does too: it is not for the request path).  A replica found dead when the
call reaches it is skipped, as in Ray; none at all raises
``DeploymentUnavailableError``.  ``results()`` / ``results_async()`` give
one result per replica, in the order the calls went out.
"""
import asyncio
import time
from asyncio import _get_running_loop

from ray_lite.exceptions import GetTimeoutError

from . import _core
from .exceptions import DeploymentUnavailableError

_TIMED_OUT = "Timed out waiting for broadcast results."     # Ray's words


def broadcast(handle, router, method_name, args, kwargs, meta):
    """Send ``method_name(*args, **kwargs)`` to every live replica of ``router``."""
    from .handle import DeploymentResponse, _send_call, _unwrap
    if not isinstance(method_name, str):
        raise TypeError(f"broadcast: method_name must be a str, got "
                        f"{type(method_name).__name__}")
    args = [_unwrap(a) for a in args]
    kwargs = {k: _unwrap(v) for k, v in kwargs.items()}
    router.poll_update()
    reps = router._live_replicas()
    if not reps:
        router.refresh_blocking()
        reps = router._live_replicas()
    responses = []
    for rep in reps:
        with router.lock:
            rep.inflight += 1       # seen by the routing of other calls meanwhile
        try:
            ref = _send_call(rep, meta, method_name, args, kwargs)
        except BaseException:
            router.release(rep)
            raise
        if _core.never_sent(ref):
            router.drop(rep)        # dead before it saw the call: skipped
            continue
        _core.on_ready(ref, lambda _x, rep=rep: router.release(rep))
        responses.append(DeploymentResponse(ref))
    if not responses:
        raise DeploymentUnavailableError(
            f"deployment {handle.deployment_name!r} of application {handle.app_name!r} has no "
            f"running replica to broadcast to")
    return DeploymentBroadcastResponse(responses)


def _check_timeout(timeout_s):
    if timeout_s is not None and timeout_s < 0:
        raise ValueError("timeout_s must be None or non-negative.")


class DeploymentBroadcastResponse:
    """The results of ``handle.broadcast(...)``: one per replica called."""

    __slots__ = ("_responses",)

    def __init__(self, responses):
        self._responses = responses

    def results(self, *, timeout_s=None, return_exceptions=False):
        """Each replica's result; the first error raises unless
        ``return_exceptions``, where errors take their replica's place.
        ``TimeoutError`` when ``timeout_s`` passes first."""
        if _get_running_loop() is not None:
            from .handle import _refuse_sync_wait
            _refuse_sync_wait("`await response.results_async()`")
        _check_timeout(timeout_s)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        out = []
        for response in self._responses:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                out.append(response.result(timeout_s=left, _skip_asyncio_check=True))
            except GetTimeoutError:
                raise TimeoutError(_TIMED_OUT) from None
            except Exception as exc:    # noqa: BLE001 - the replica's error, kept or raised
                if not return_exceptions:
                    raise
                out.append(exc)
        return out

    async def results_async(self, *, timeout_s=None, return_exceptions=False):
        """``results()`` for asyncio code."""
        _check_timeout(timeout_s)

        async def one(response):
            return await response
        gathered = asyncio.gather(*(one(r) for r in self._responses),
                                  return_exceptions=return_exceptions)
        if timeout_s is None:
            return list(await gathered)
        try:
            return list(await asyncio.wait_for(gathered, timeout_s))
        except asyncio.TimeoutError:
            raise TimeoutError(_TIMED_OUT) from None

    def __repr__(self):
        return "DeploymentBroadcastResponse()"
