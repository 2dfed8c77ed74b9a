"""A sync actor's calls that wait for a ref argument, held aside.

A sync actor runs one call at a time: a call that waited there for a ref
argument would hold back every caller's calls.  As in Ray, whose callers
send a call once its arguments are ready, such a call waits aside instead,
with the calls of its caller that come after it (one caller's calls run in
order), and joins the queue of calls to run when its arguments are ready;
other callers' calls run meanwhile.  (Async and threaded actors wait for a
ref in their own task or thread: they need none of this, but a threaded
actor's calls that come while its constructor runs are held as a sync
actor's; those go to its thread pool when ready, see ``send_to``.)
"""
import collections
import threading

from ray_lite.exceptions import TaskCancelledError

from ..objects.refs import ObjectRef


class HeldCalls:
    """A part of ``WorkerNode`` (``worker.held_calls``): ``by_peer`` (peer ->
    deque of its METHOD messages held) under ``lock`` (reentrant: an entry
    that is ready already runs its callback at once, inside ``release``).
    A held call that becomes ready goes to ``run(peer, msg)``: it joins the
    node's ``tasks``, or whatever ``send_to`` names."""

    def __init__(self, node):
        self.node = node
        self.by_peer = {}
        self.lock = threading.RLock()
        tasks = node.tasks
        self.run = lambda peer, msg: tasks.append((peer, msg))

    def send_to(self, run):
        """From now on, the calls released go to ``run(peer, msg)`` (a
        threaded actor's pool), and so do the calls queued in the node's
        ``tasks`` before, first: no call is left in a queue no one reads."""
        tasks = self.node.tasks
        with self.lock:     # a call released meanwhile is in ``tasks`` or goes to ``run``
            self.run = run
            while tasks:
                peer, msg = tasks.popleft()
                run(peer, msg)

    def unready_arg(self, msg):
        """The entry of the first ref among ``msg``'s arguments that is not
        ready (its value asked for from its owner), or None."""
        for a in msg[3]:
            if type(a) is ObjectRef and not a._e.ready:
                self.node.objects.ensure_fetch(a)
                return a._e
        if msg[4]:
            for a in msg[4].values():
                if type(a) is ObjectRef and not a._e.ready:
                    self.node.objects.ensure_fetch(a)
                    return a._e
        return None

    def hold(self, peer, msg):
        with self.lock:
            held = self.by_peer.get(peer)
            if held is None:
                held = self.by_peer[peer] = collections.deque()
            held.append(msg)
            if len(held) == 1:
                self.release(peer)

    def release(self, peer):
        """Queue ``peer``'s held calls that are ready, in order, up to the
        first that is not (whose entry calls this again when it is)."""
        with self.lock:
            held = self.by_peer.get(peer)
            while held:
                e = self.unready_arg(held[0])
                if e is not None:
                    e.add_callback(lambda _e: self.release(peer))
                    return
                self.run(peer, held.popleft())
            self.by_peer.pop(peer, None)

    def cancel(self, oid):
        """Drop the held call ``oid`` (cancelled before it could run): its
        caller hears at once, as from Ray, not when its argument is ready.
        False when no call held is ``oid``."""
        node = self.node
        with self.lock:
            for peer, held in self.by_peer.items():
                for i, msg in enumerate(held):
                    if msg[1] == oid:
                        del held[i]
                        break
                else:
                    continue
                node.live.discard(oid)
                node.cancelled.discard(oid)
                node._send_failure(peer, oid, msg[6], TaskCancelledError(),
                                   node._call_name(msg[2]))
                self.release(peer)     # the next may be ready
                return True
        return False

    def take_all(self):
        """Every call held, as (peer, msg), in order; none is held after."""
        with self.lock:
            calls = [(peer, msg) for peer, held in self.by_peer.items() for msg in held]
            self.by_peer.clear()
        return calls
