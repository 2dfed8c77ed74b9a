"""Actor restarts (``max_restarts``) and the retry of their calls (``max_task_retries``).

The driver keeps what started each restartable actor.  When its process dies
(not by ``ray.kill``, which forbids restarts unless ``no_restart=False``),
the driver starts a new one under the same actor id, which runs the
constructor again, and tells every process (``RESTARTED``): each forgets
the dead incarnation and resends the calls it kept for retrying.  Calls it
did not keep fail with ``ActorDiedError``, as the death of any actor makes
them.  When the restarts are used up, ``RESTARTED`` carries no pid: the
kept calls fail, and the actor is dead for good.

A caller keeps a call for retrying only when the actor was created with
``max_task_retries`` (or the method's ``.options`` say so): those calls are
registered in ``node.retry_calls`` instead of ``node.inflight``, so that
the death of the old process does not fail them.  Streaming calls are
never retried (their items may have been consumed).

A method with ``retry_exceptions`` (``ray_lite.method`` or ``.options``) is
also sent again when it raised an exception that its list names (True: any
of its code's), while ``max_task_retries`` lasts, as in Ray; an actor that is
not restartable too.  Both kinds of retry count against the one number.
"""
from ray_lite.exceptions import ActorDiedError

from ..links import protocol as P
from ..links.transport import Link
from ..scheduling.scheduler import matches_retry


class _ActorRecord:
    __slots__ = ("spec", "label", "left", "count", "info")

    def __init__(self, spec, label, max_restarts, info):
        self.spec = spec            # the spawn spec, less its link
        self.label = label
        self.left = max_restarts    # -1: for ever
        self.count = 0
        self.info = info


class ActorRestarts:
    """The driver's half, a part of its node (``driver.actor_restarts``; runs
    under the driver's ``_sched``): what started each restartable actor."""

    def __init__(self, driver):
        self.driver = driver
        self.records = {}       # actor id -> _ActorRecord (restartable and not dead for good)
        self.attach_later = {}  # actor id being restarted -> [(requester, link names)]

    def __contains__(self, aid):
        return aid in self.records

    def remember(self, aid, spec, label, max_restarts, info):
        if max_restarts:
            self.records[aid] = _ActorRecord(spec, label, max_restarts, info)

    def forbid(self, aid):
        rec = self.records.get(aid)
        if rec is not None:
            rec.left = 0

    def after_actor_died(self, aid):
        """``aid``'s process died: restart it if it may be; tell every process."""
        d = self.driver
        rec = self.records.get(aid)
        if rec is None:
            return
        pid = self._restart(aid, rec) if rec.left != 0 and not d.closed else None
        later = self.attach_later.pop(aid, ())
        if pid is None:
            del self.records[aid]
        else:
            for requester, names in later:
                d.send(aid, P.attach_msg(requester, d.pids.get(requester), names))
        msg = P.restarted_msg(aid, pid)
        for peer in list(d.links):
            if peer != aid:
                d.send(peer, msg)
        on_restarted(d, 0, msg)

    def _restart(self, aid, rec):
        if rec.left > 0:
            rec.left -= 1
        rec.count += 1
        d = self.driver
        link = Link.create(d.shm_prefix)
        spec = dict(rec.spec, link_names=link.names,
                    actor=dict(rec.spec["actor"], restarted=True, await_resources=False),
                    # Objects the new incarnation creates must not reuse the ids
                    # of the old one's (they may still be referenced).
                    seq_start=rec.count << 32)
        try:
            pid = d.zygote.spawn(spec, rec.label)
        except Exception:          # noqa: BLE001 - the actor stays dead
            pid = None
        if not isinstance(pid, int):
            link.close()
            return None
        info = rec.info
        info.pid = pid
        d.dead_peers.pop(aid, None)
        d.pids[aid] = pid
        d.actors[aid] = info
        if info.name is not None:
            d.named[(info.namespace, info.name)] = info
        d.add_link(aid, link, pid)
        return pid


def retained_calls(node, aid):
    calls = node.retry_calls.get(aid)
    if calls is None:
        calls = node.retry_calls[aid] = {}
    elif len(calls) > 64:
        # Calls whose result came are dropped here, not on the result's path.
        for oid in [o for o in calls if o not in node.pending]:
            del calls[oid]
    return calls


def keep_for_exceptions(node, aid, oid, kept, retry_on):
    """Keep call ``oid`` to ``aid`` (``kept``: ``[msg, retries left]``, shared
    with a restart's) for a retry after an exception ``retry_on`` names."""
    calls = node.exc_retries
    if len(calls) > 64:
        # Calls whose result came are dropped here, not on the result's path.
        for o in [o for o in calls if o not in node.pending]:
            del calls[o]
    calls[oid] = (aid, kept, retry_on)


def retry_on_exception(node, oid, error):
    """Call ``oid`` failed with ``error``: True if it was sent again (its
    retry_exceptions names the error and it has retries left)."""
    rec = node.exc_retries.get(oid)
    if rec is None or oid not in node.pending:
        return False
    aid, kept, retry_on = rec
    left = kept[1]
    if left == 0 or not matches_retry(retry_on, error) or not node.send(aid, kept[0]):
        # (Not sent: the actor is gone, its death fails its other calls; this one
        # ends with its error.)
        del node.exc_retries[oid]
        return False
    if left > 0:
        kept[1] = left - 1
    return True


def reach(node, aid, pid_hint):
    """Make sure ``aid`` (a restartable actor) can be sent to; False if it is dead."""
    if node.id != 0:
        node.known_pids.setdefault(aid, pid_hint)
    if aid not in node.dead_peers and node.connect(aid):
        return True
    # Dead, or restarted and this process has not heard yet: ask the driver.
    if node.id == 0:
        return aid in node.links
    pid = node.request(P.OP_ACTOR_PID, aid)
    if pid is None or pid == pid_hint and aid in node.dead_peers:
        return False
    node.dead_peers.pop(aid, None)
    node.known_pids[aid] = pid
    return node.connect(aid)


def _fail(node, oid, err):
    target = node.pending.pop(oid, None)
    for e in (target if type(target) is list else [target] if target is not None else ()):
        e.set_error(err)


def on_restarted(node, peer, msg):
    """``RESTARTED``: forget the dead incarnation; resend (or fail) the kept calls."""
    _, aid, pid = msg
    if pid is not None and aid in node.links and node.peer_pids.get(aid) != pid:
        node._on_peer_died(aid)      # the old incarnation, not noticed yet here
    calls = node.retry_calls.pop(aid, None) or {}
    if pid is None:
        for oid in calls:
            _fail(node, oid, ActorDiedError("The actor died and used up its restarts "
                                            "(max_restarts).", actor_id=aid))
        return
    node.dead_peers.pop(aid, None)
    if node.id != 0:
        node.known_pids[aid] = pid
    keep = {}
    for oid, kept in calls.items():
        if oid not in node.pending:
            continue
        left = kept[1]
        if left == 0:
            _fail(node, oid, ActorDiedError(
                "The actor died and was restarted, but this call used up its retries "
                "(max_task_retries).", actor_id=aid))
            continue
        if left > 0:
            kept[1] = left - 1      # (in place: an exception retry counts from the same)
        keep[oid] = kept
    if keep:
        node.retry_calls[aid] = keep
        if not node.connect(aid):
            return
        for oid, (m, _) in keep.items():
            if not node.send(aid, m):
                _fail(node, oid, ActorDiedError("The restarted actor died.", actor_id=aid))


def install(node):
    """Every process handles ``RESTARTED`` and keeps ``retry_calls``."""
    node.retry_calls = {}
    node.exc_retries = {}   # oid -> (actor id, [msg, retries left], retry_exceptions)
    node.handlers[P.RESTARTED] = lambda peer, msg: on_restarted(node, peer, msg)
