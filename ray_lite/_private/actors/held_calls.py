"""A sync actor's calls that wait for a ref argument, held aside.

A sync actor runs one call at a time: a call that waited there for a ref
argument would hold back every caller's calls.  As in Ray, whose callers
send a call once its arguments are ready, such a call waits aside instead,
with the calls of its caller that come after it (one caller's calls run in
order), and joins the queue of calls to run when its arguments are ready;
other callers' calls run meanwhile.  (Async and threaded actors wait for a
ref in their own task or thread: they need none of this.)
"""
import collections

from ray_lite.exceptions import TaskCancelledError

from ..objects.refs import ObjectRef


class HeldCallsMixin:
    """Part of ``WorkerNode``: ``held_calls`` (peer -> deque of METHOD
    messages) under ``_held_lock`` (reentrant: an entry that is ready
    already runs its callback at once, inside ``_release_held``)."""

    def _unready_arg(self, msg):
        """The entry of the first ref among ``msg``'s arguments that is not
        ready (its value asked for from its owner), or None."""
        for a in msg[3]:
            if type(a) is ObjectRef and not a._e.ready:
                self.objects.ensure_fetch(a)
                return a._e
        if msg[4]:
            for a in msg[4].values():
                if type(a) is ObjectRef and not a._e.ready:
                    self.objects.ensure_fetch(a)
                    return a._e
        return None

    def _hold(self, peer, msg):
        with self._held_lock:
            held = self.held_calls.get(peer)
            if held is None:
                held = self.held_calls[peer] = collections.deque()
            held.append(msg)
            if len(held) == 1:
                self._release_held(peer)

    def _release_held(self, peer):
        """Queue ``peer``'s held calls that are ready, in order, up to the
        first that is not (whose entry calls this again when it is)."""
        with self._held_lock:
            held = self.held_calls.get(peer)
            while held:
                e = self._unready_arg(held[0])
                if e is not None:
                    e.add_callback(lambda _e: self._release_held(peer))
                    return
                self.tasks.append((peer, held.popleft()))
            self.held_calls.pop(peer, None)

    def _cancel_held(self, oid):
        """Drop the held call ``oid`` (cancelled before it could run): its
        caller hears at once, as from Ray, not when its argument is ready."""
        with self._held_lock:
            for peer, held in self.held_calls.items():
                for i, msg in enumerate(held):
                    if msg[1] == oid:
                        del held[i]
                        break
                else:
                    continue
                self.live.discard(oid)
                self.cancelled.discard(oid)
                self._send_failure(peer, oid, msg[6], TaskCancelledError(),
                                   self._call_name(msg[2]))
                self._release_held(peer)     # the next may be ready
                return True
        return False
