"""How a caller (a ``DeploymentHandle``'s router, or an HTTP proxy's route)
picks a replica: one slot per replica with this caller's in-flight count,
the power of two choices among those under ``max_ongoing_requests``, and,
for the proxies, one replica of choice (a different one for each proxy)
while it is idle.  A proxy packs the requests of a route whose replicas
answer fast onto its first replicas instead (``choose_for_http``).

The caller counts its own calls (``slot.inflight``): Ray's limits are per
caller, and no process needs to ask another how busy a replica is.  Two
things a caller cannot count, each replica keeps in a shared-memory cell of
its own (``ReplicaCell``) that callers map and read when they choose:

- its open streams: a stream holds its replica for as long as it lasts, and
  the proxies sharing the port take the connections of one client at random,
  so a replica with a stream open is not idle, whichever proxy opened it;
- with direct ingress, the requests it took from its own listener: they hold
  its slots without any caller having sent them, so a caller counts them
  against the replica's ``max_ongoing_requests`` beside its own
  (``full_beside_direct``).
"""
import mmap
from random import random as _random
from zlib import crc32 as _crc32

from ray_lite._config import SERVE_PACK_BELOW_S
from ray_lite._fast import shm as _shm

from . import _core


class ReplicaCell:
    """A replica's counts that its callers read (see the module's docstring):
    ``cell[0]``, its open streams; ``cell[1]``, the requests it runs that its
    own listener took (direct ingress).  A shared-memory segment of its own:
    the replica writes it (one writer), callers map it and read it
    (``attach_replica_cell``)."""

    __slots__ = ("name", "cell", "_mm")

    def __init__(self):
        node = _core.current_node()
        self.name, self._mm = _shm.create_segment(mmap.PAGESIZE,
                                                  node.shm_prefix if node else None)
        self.cell = memoryview(self._mm).cast("q")

    def set_streams(self, n):
        self.cell[0] = n

    def set_taken_directly(self, n):
        self.cell[1] = n

    def unlink(self):
        # (mappings stay valid: the proxies' reads go on until they let go)
        _shm.unlink_segment(self.name)


def attach_replica_cell(name):
    """The cell ``name`` (a replica's ``replica_cell()``) as a caller reads it
    (``cell[0]`` and ``cell[1]``, see ``ReplicaCell``); None if it cannot be
    mapped."""
    try:
        return memoryview(_shm.attach_segment(name, 16)).cast("q")
    except (OSError, ValueError):
        return None


class ReplicaSlot:
    """A replica as one caller sees it: its handle, the bound methods the
    caller sends on, and how many of the caller's calls it runs now."""

    __slots__ = ("handle", "actor_id", "inflight", "call", "stream", "http", "model_ranks",
                 "streams")

    def __init__(self, handle):
        self.handle = handle
        self.actor_id = _core.actor_id(handle)
        self.inflight = 0
        self.call = handle.handle_request
        self.stream = handle.handle_request_streaming
        self.http = handle.handle_http
        self.model_ranks = {}     # model id -> this replica's rank for it (for_model)
        self.streams = None       # a caller's view of the replica's ReplicaCell, once mapped


_MAX_RANKS = 4096     # model ranks a slot remembers (they are cheap to compute again)


def slots_for(handles, current):
    """The slots of the replica set ``handles``: a replica already in ``current``
    keeps its slot (and in-flight count); ``(slots, the new ones)``."""
    known = {s.actor_id: s for s in current}
    slots = []
    fresh = []
    for h in handles:
        s = known.get(_core.actor_id(h))
        if s is None:
            s = ReplicaSlot(h)
            fresh.append(s)
        slots.append(s)
    return slots, fresh


def inflight(slot):
    return slot.inflight


def least_loaded(slots):
    return min(slots, key=inflight)


def power_of_two(slots, limit):
    """Of two different slots drawn at random the less loaded, if under
    ``limit``; else the least loaded one under it; None when every one is at
    the limit (or none).

    The two are distinct: drawn with replacement, one replica in n would be
    compared with itself, and a call would join a busy replica while another
    sits idle (with two replicas, one second stream in four did)."""
    n = len(slots)
    if n == 0:
        return None
    i = int(_random() * n)
    a = slots[i]
    if n > 1:
        # The second among the n - 1 others.
        j = int(_random() * (n - 1))
        b = slots[j + 1 if j >= i else j]
        if b.inflight < a.inflight:
            a = b
    if a.inflight < limit:
        return a
    a = min(slots, key=inflight)
    return a if a.inflight < limit else None


_proxy_rank = 0     # this process's index among the proxies (set_proxy_rank)


def set_proxy_rank(rank):
    """Tell the routing of this process that it is proxy number ``rank``: its
    replica of choice while idle is the ``rank``-th (see
    ``first_idle_else_power_of_two``)."""
    global _proxy_rank
    _proxy_rank = int(rank)


def load(slot):
    """How busy ``slot``'s replica is, as a proxy sees it: its requests from
    this proxy, or the replica's open streams (from any caller) if more."""
    cell = slot.streams
    if cell is not None:
        n = cell[0]
        if n > slot.inflight:
            return n
    return slot.inflight


def power_of_two_loaded(slots, limit):
    """``power_of_two`` comparing the slots' ``load`` (a proxy's choice);
    ``limit`` still bounds this caller's own requests."""
    n = len(slots)
    if n == 0:
        return None
    i = int(_random() * n)
    a = slots[i]
    if n > 1:
        j = int(_random() * (n - 1))
        b = slots[j + 1 if j >= i else j]
        # load(a) and load(b), inline (a proxy's every request under load)
        la, lb = a.inflight, b.inflight
        cell = a.streams
        if cell is not None and cell[0] > la:
            la = cell[0]
        cell = b.streams
        if cell is not None and cell[0] > lb:
            lb = cell[0]
        if lb < la:
            a = b
    if a.inflight < limit:
        return a
    under = [s for s in slots if s.inflight < limit]
    return min(under, key=load) if under else None


def first_idle_else_power_of_two(slots, limit):
    """This proxy's replica whenever it is idle, else ``power_of_two_loaded``.

    At low load every request a proxy takes goes to the same replica, so that
    one process serves them and stays warm (its caches, an awake CPU): tens
    of microseconds a request on a VM.  Under load it is rarely idle, and the
    power of two choices decides.

    Each proxy counts only its own calls, so the replica of choice differs
    from proxy to proxy (the ``rank``-th in the controller's order, which all
    share): were it the same, two long streams taken by two proxies would
    both land on it while the other replicas sat idle."""
    n = len(slots)
    if n:
        s = slots[_proxy_rank % n]
        if s.inflight == 0 and (s.streams is None or s.streams[0] == 0):
            return s
    return power_of_two_loaded(slots, limit)


def for_model(slots, limit, model_id):
    """For a request of a multiplexed model: the first slot under ``limit`` in
    the model's order of the replicas (rendezvous hashing: the same order in
    every process, so every caller sends a model's requests to the replica
    that holds it); None when every one is at the limit (or none)."""
    best = None
    best_rank = -1
    for s in slots:
        if s.inflight < limit:
            rank = s.model_ranks.get(model_id)
            if rank is None:
                rank = s.model_ranks[model_id] = _crc32(f"{model_id}\0{s.actor_id}".encode())
                if len(s.model_ranks) > _MAX_RANKS:
                    s.model_ranks.clear()
            if rank > best_rank:
                best, best_rank = s, rank
    return best


class RouteSubset:
    """A route as a caller sees it when it chooses among some of its
    replicas only (the others are full, or are the caller's own)."""

    __slots__ = ("replicas", "max_ongoing", "service", "multiplexed")

    def __init__(self, route, replicas):
        self.replicas = replicas
        self.max_ongoing = route.max_ongoing
        self.service = route.service
        self.multiplexed = route.multiplexed


def full_beside_direct(slot, limit):
    """Whether ``slot``'s replica is at ``limit`` counting this caller's
    requests and those its own listener took (direct ingress, ``cell[1]``)."""
    cell = slot.streams
    return cell is not None and slot.inflight + cell[1] >= limit


class ServiceTime:
    """How long a route's replicas take per request, as they measure it (the
    handler's time, from taking a slot to the answer; not the queueing in
    front of it): a moving mean of the last ~32 answers, None until one came.

    One answer counts for at most ``ANSWER_CAP_S``: on a busy machine a fast
    handler preempted for a time slice must not turn the route's routing for
    the next hundred requests.  A streamed answer counts as
    ``STREAM_SAMPLE_S``, uncapped: it holds its replica for as long as it
    lasts, so a route that streams is spread.

    ``depth``: how many requests a packed replica takes, so that one waits
    for at most ``PACK_WAIT_S`` of handler time ahead of it (0: the route is
    not fast, it is spread).  ``streams``: the last answer was streamed."""

    __slots__ = ("mean", "depth", "streams")

    PACK_WAIT_S = ANSWER_CAP_S = 5 * SERVE_PACK_BELOW_S
    STREAM_SAMPLE_S = 0.01

    def __init__(self):
        self.mean = None
        self.depth = 0
        self.streams = False

    def observe(self, seconds):
        self.streams = False
        self._add(seconds if seconds < self.ANSWER_CAP_S else self.ANSWER_CAP_S)

    def observe_stream(self):
        self.streams = True
        self._add(self.STREAM_SAMPLE_S)

    def _add(self, seconds):
        m = self.mean
        m = self.mean = seconds if m is None else m + (seconds - m) * 0.03125
        self.depth = 0 if m >= SERVE_PACK_BELOW_S else \
            int(self.PACK_WAIT_S / m) if m > 0 else 1 << 30

    def fast(self):
        return self.depth > 0


def choose_for_http(slots, limit, service):
    """An HTTP proxy's choice for a route.  While the route's replicas answer
    in less than ``RAY_LITE_SERVE_PACK_BELOW_US`` on average: the first
    replica, in the controller's order (the same in every proxy), with fewer
    than ``service.depth`` requests (and ``limit``) in flight; when every
    one has that many, the power of two choices under ``limit``.  Otherwise
    ``first_idle_else_power_of_two``.  None when all are at ``limit``.

    Spread by the power of two choices, a fast route's requests reach each of
    many replicas a few milliseconds apart: each one finds its replica asleep,
    costs a wake-up (a descriptor write, two context switches) and runs on
    caches that the other replicas evicted.  Packed, they queue in a few
    replicas, each of which reads several per wake-up and stays warm: a
    third less CPU per request and 40 % more requests per second with 48
    replicas on 2 cores (docs/performance.md).  A packed request waits
    for the handlers of those ahead of it in its replica, so packing is kept
    to fast routes and to ``PACK_WAIT_S`` of waiting; a slow route (or one
    whose answers are streams) gets its requests spread for concurrency, as
    in Ray."""
    depth = service.depth
    if depth:
        # Packed behind fast answers, not behind a stream (of any proxy).
        cap = depth if depth < limit else limit
        for s in slots:
            if s.inflight < cap and (s.streams is None or s.streams[0] == 0):
                return s
        return power_of_two_loaded(slots, limit)
    return first_idle_else_power_of_two(slots, limit)
