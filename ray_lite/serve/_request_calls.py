"""The handle calls that one replica call (one request) has made: passed
its id and route, and cancelled with it, as Ray Serve cancels a request's
downstream calls with the request.  And requests' ids: made here, read
from an HTTP request's ``x-request-id``."""
import asyncio
import contextvars
import itertools
import os
import sys
import uuid

# The handle calls the replica call that runs now has made (a list, set by
# ``calls_of_this_request`` in the call's own context): cancelled with it,
# as Ray Serve cancels a request's downstream calls with the request.
_request_calls = contextvars.ContextVar("serve_request_calls", default=None)


class _Calls(list):
    """A replica call's handle calls, those done dropped now and then: a
    long call (a loop that calls another deployment for ever) must not keep
    every response it ever made.  Also which request the call serves: its
    id and route, passed on to those calls (``ids``)."""

    __slots__ = ("prune_at", "request_id", "route", "scope")

    def __init__(self, request_id=None, route="", scope=None):
        # (no list.__init__: a new list is empty already; one per request)
        self.prune_at = 64
        self.request_id = request_id
        self.route = route
        self.scope = scope

    def ids(self):
        """``(request_id, route)``; the id is made on first use for a call
        that came without one (from a driver: a fresh one per call, as Ray)."""
        request_id = self.request_id
        if request_id is None:
            scope = self.scope
            if scope is not None:
                request_id = scope_request_id(scope)
                self.route = scope.get("root_path") or "/"
            if not request_id:
                request_id = new_request_id()
            self.request_id = request_id
        return request_id, self.route

    def note(self, response):
        if len(self) >= self.prune_at:
            self[:] = [r for r in self if not r._done()]
            self.prune_at = max(64, 2 * len(self))     # amortised: many may run at once
        self.append(response)


def calls_of_this_request(meta=None, scope=None):
    """A fresh list that the handle calls made from now on in this context
    (one replica call's: each runs in a copy) are added to.  ``meta``: what
    the call came with (``_call_meta``); ``scope``: the HTTP request's."""
    calls = _Calls(scope=scope) if meta is None else _Calls(meta[1], meta[2])
    _request_calls.set(calls)
    return calls


def current_request_calls():
    """The running replica call's ``_Calls``, or None outside one."""
    return _request_calls.get()


if sys.version_info >= (3, 11):
    def cancel_requested():
        """Whether the running task was asked to cancel (its code may have
        caught the CancelledError and returned)."""
        return asyncio.current_task().cancelling() > 0
else:
    def cancel_requested():
        return False        # (3.10 cannot tell: only a CancelledError that propagates)


def cancel_calls(calls):
    """Cancel the handle calls ``calls`` (those done already ignore it), and
    forget them: each is cancelled once.  A cancelled request is seen
    twice in the replica when its CancelledError propagates (the
    ``except`` that catches it, then the ``finally`` that asks whether a
    cancel came), and a second cancel would interrupt the cleanup that the
    called replica runs on the first."""
    for response in calls:
        try:
            response.cancel()
        except Exception:   # noqa: BLE001 - its replica is gone: nothing to stop
            pass
    calls.clear()


def request_id_maker():
    """A function making this process's fresh request ids (bytes), shaped as
    Ray's (a UUID 4): a random UUID made here (after the fork: each proxy its
    own) whose last 12 hex digits are a counter, a few hundred ns per id
    where ``uuid4()`` costs several microseconds."""
    prefix = str(uuid.UUID(bytes=os.urandom(16), version=4))[:24].encode()
    count = itertools.count(1).__next__
    return lambda: prefix + b"%012x" % count()


_id_maker = None     # (pid, function): this process's request-id maker


def new_request_id():
    """A fresh request id (UUID 4-shaped), for a handle call that came
    without one; made per process (a forked child makes its own)."""
    global _id_maker
    maker = _id_maker
    if maker is None or maker[0] != os.getpid():
        maker = _id_maker = (os.getpid(), request_id_maker())
    return maker[1]().decode()


def scope_request_id(scope):
    """The HTTP request's id: its ``x-request-id`` header ("" without one)."""
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            return value.decode("latin-1")
    return ""


def _noted(response):
    calls = _request_calls.get()
    if calls is not None:
        calls.note(response)
    return response
