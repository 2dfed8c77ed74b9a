"""``ray_lite.timeline()``: what ran where, as Chrome trace events.

Recording is off unless ``RAY_LITE_TIMELINE=1`` is in the environment of the
processes the runtime starts (read when each worker starts, after the job's
``runtime_env`` env_vars are applied).  Off, nothing on the path of a task
or call changes: not even a flag is looked at per task.  On, each pool worker
and sync or threaded actor runs its calls through a wrapper that notes
[name, oid, start, end, thread, error] in a ring of ``RECORDS`` entries, the
oldest dropped first; that costs about 0.4 microseconds per call.

An entry goes into the ring when its call starts and gets its end when the
call returns.  So a call whose answer the caller already has is always in
the ring (a threaded actor sends a call's answer before its wrapper returns),
and a call still running when the records are collected is reported as
``RUNNING``, ending at the collection.

Nothing is sent until asked: ``collect`` (in the driver) sends a
``TIMELINE`` message to every worker and actor, each answers with its ring
(``OP_TIMELINE``, no reply), and the driver waits a bounded time for them.
A process busy in a long call answers once it reads its links again; one
that does not answer in time is left out of that collection.  Async actors
(Serve replicas among them) are not recorded.
"""
import itertools
import os
import threading
import time
from collections import deque

from ray_lite import _config

from ..links import protocol as P
from ..process import state
from ..process.ids import task_id_hex

__all__ = ["RECORDS", "install", "collect", "chrome_events", "timeline"]

RECORDS = 10000         # per process
COLLECT_TIMEOUT_S = 2.0
# Catapult's colour names (chrome://tracing), as Ray's timeline uses them.
_COLOUR_OK = "rail_response"
_COLOUR_FAILED = "terrible"

_asks = itertools.count(1)
_answers = {}           # ask -> {peer: (pid, kind, records)}
_answers_lock = threading.Lock()


# ------------------------------------------------------------------ a worker
def install(node, kind):
    """In a worker or actor process at start: answer collections, and record
    the calls it runs when ``RAY_LITE_TIMELINE=1``.  ``kind``: "pool" or
    "actor"."""
    ring = deque(maxlen=RECORDS) if _config.read("RAY_LITE_TIMELINE") else None

    def on_collect(peer, msg):
        records = [] if ring is None else _snapshot(ring)
        # An actor's records name the method; the class is known once it is made.
        actor = getattr(node, "actor", None)
        prefix = f"{type(actor).__name__}." if kind == "actor" and actor is not None else ""
        node.notify(P.OP_TIMELINE, msg[1], os.getpid(), kind, prefix, records)

    node.handlers[P.TIMELINE] = on_collect
    if ring is None:
        return
    append = ring.append
    now = time.time
    thread_id = threading.get_native_id
    failures = {}       # oid -> the error's type name, taken when its call ends
    send_failure = node._send_failure

    def noting_send_failure(peer, oid, stream, err, name):
        if len(failures) > 4096:
            failures.clear()    # failures of calls that never ran through a wrapper
        cause = getattr(err, "cause", None)     # a RayTaskError's: the user's error
        failures[oid] = type(cause if cause is not None else err).__name__
        return send_failure(peer, oid, stream, err, name)

    node._send_failure = noting_send_failure
    if kind == "pool":
        run_task = node.run_pool_task

        def timed_task(peer, msg):
            entry = [msg[9], msg[1], now(), None, thread_id(), None]
            append(entry)
            try:
                run_task(peer, msg)
            finally:
                # The error first: an entry with an end is complete (_snapshot).
                entry[5] = failures.pop(msg[1], None)
                entry[3] = now()
        node.run_pool_task = timed_task
    else:
        run_method = node._run_method

        def timed_method(peer, msg):
            entry = [msg[2], msg[1], now(), None, thread_id(), None]
            append(entry)
            try:
                run_method(peer, msg)
            finally:
                entry[5] = failures.pop(msg[1], None)
                entry[3] = now()
        node._run_method = timed_method


def _snapshot(ring):
    """The ring's entries as (name, oid, start, end, thread, error, running)
    tuples; a running call ends now.  Calls on other threads go on meanwhile."""
    t = time.time()
    out = []
    for name, oid, t0, t1, tid, error in list(ring):
        out.append((name, oid, t0, t, tid, None, True) if t1 is None
                   else (name, oid, t0, t1, tid, error, False))
    return out


# ------------------------------------------------------------------ the driver
def _on_records(peer, ask, pid, kind, prefix, records):
    with _answers_lock:
        got = _answers.get(ask)
        if got is not None:
            got[peer] = (pid, kind, prefix, records)


def collect(node=None, timeout=COLLECT_TIMEOUT_S):
    """Every live worker's and actor's records: ``{pid: (kind, [(name, oid,
    start_s, end_s, thread, error_or_None, running)...])}``."""
    node = node or state.get_node()
    node.requests.setdefault(P.OP_TIMELINE, _on_records)
    ask = next(_asks)
    got = {}
    with _answers_lock:
        _answers[ask] = got
    try:
        asked = 0
        for peer in list(node.peer_pids):
            if peer and node.send(peer, (P.TIMELINE, ask)):
                asked += 1
        node.wait_until(lambda: len(got) >= asked, timeout)
    finally:
        with _answers_lock:
            _answers.pop(ask, None)
    out = {}
    for pid, kind, prefix, records in list(got.values()):
        out[pid] = (kind, [(prefix + r[0],) + tuple(r[1:]) for r in records])
    return out


def chrome_events(collected):
    """Chrome trace events (``ph`` "X", times in microseconds) for ``collect``'s
    records, with a ``process_name`` for each process, in start order."""
    events = []
    for pid, (kind, records) in sorted(collected.items()):
        label = "worker" if kind == "pool" else "actor"
        events.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                       "args": {"name": f"{label} {pid}"}})
        for name, oid, t0, t1, tid, error, running in records:
            state_name = "RUNNING" if running else "FAILED" if error else "FINISHED"
            args = {"task_id": task_id_hex(oid), "name": name, "state": state_name}
            if error:
                args["error_type"] = error
            events.append({"cat": f"task::{name}", "name": name, "pid": pid, "tid": tid,
                           "ts": t0 * 1e6, "dur": max(t1 - t0, 0.0) * 1e6, "ph": "X",
                           "cname": _COLOUR_FAILED if error else _COLOUR_OK, "args": args})
    events.sort(key=lambda e: e.get("ts", 0.0))
    return events


def timeline(filename=None):
    """Ray's ``ray.timeline``: the recent tasks and actor calls as a list of
    Chrome trace events, or written to ``filename`` as JSON (then None)."""
    events = chrome_events(collect())
    if filename is None:
        return events
    import json     # here: every worker imports this module at start (B10)
    with open(filename, "w") as f:
        json.dump(events, f)
    return None
