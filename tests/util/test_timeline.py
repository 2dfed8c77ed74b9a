"""ray_lite.timeline(): Chrome trace events of the tasks and actor calls that
ran, recorded by the workers while RAY_LITE_TIMELINE=1 and collected on demand."""
import json

import pytest

import ray_lite
from ray_lite._private.links import protocol as P
from ray_lite._private.node import timeline as tl
from ray_lite.util.state import list_workers

RECORDING = {"env_vars": {"RAY_LITE_TIMELINE": "1"}}


@ray_lite.remote
def square(x):
    return x * x


@ray_lite.remote
def fails():
    raise ValueError("no")


@ray_lite.remote
class Counter:
    def __init__(self):
        self.n = 0

    def incr(self):
        self.n += 1
        return self.n


@ray_lite.remote(max_concurrency=2)
class Threaded:
    def ping(self):
        return "pong"


@pytest.fixture
def recording():
    ray_lite.init(num_cpus=2, runtime_env=RECORDING)
    try:
        yield
    finally:
        ray_lite.shutdown()


def _complete(events):
    return [e for e in events if e["ph"] == "X"]


def test_tasks_and_actor_calls_appear_with_ray_fields(recording, tmp_path):
    assert ray_lite.get([square.remote(i) for i in range(4)]) == [0, 1, 4, 9]
    c = Counter.remote()
    assert ray_lite.get([c.incr.remote() for _ in range(3)]) == [1, 2, 3]
    with pytest.raises(ValueError):
        ray_lite.get(fails.remote())
    events = ray_lite.timeline()
    done = _complete(events)
    names = [e["name"] for e in done]
    assert names.count("square") == 4
    assert names.count("Counter.incr") == 3
    worker_pids = {w["pid"] for w in list_workers() if w["worker_type"] == "WORKER"}
    for e in done:
        assert set(e) >= {"cat", "name", "pid", "tid", "ts", "dur", "ph", "cname", "args"}
        assert e["cat"] == f"task::{e['name']}"
        assert e["pid"] in worker_pids
        assert e["dur"] >= 0 and e["ts"] > 0
        assert e["args"]["task_id"] and e["args"]["state"] in ("FINISHED", "FAILED")
    failed = [e for e in done if e["name"] == "fails"]
    assert len(failed) == 1
    assert failed[0]["args"]["state"] == "FAILED"
    assert failed[0]["args"]["error_type"] == "ValueError"
    assert all(e["args"]["state"] == "FINISHED" for e in done if e["name"] != "fails")
    assert [e["ts"] for e in done] == sorted(e["ts"] for e in done)
    # Each process is named, for the viewer's rows.
    named = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
    assert {e["pid"] for e in done} <= set(named)
    # Written to a file: the JSON array chrome://tracing and Perfetto load.
    path = tmp_path / "trace.json"
    assert ray_lite.timeline(filename=str(path)) is None
    on_disk = json.loads(path.read_text())
    assert len(_complete(on_disk)) >= len(done)


def test_a_threaded_actor_records_the_thread_each_call_ran_on(recording):
    t = Threaded.remote()
    assert ray_lite.get([t.ping.remote() for _ in range(4)]) == ["pong"] * 4
    pings = [e for e in _complete(ray_lite.timeline()) if e["name"] == "Threaded.ping"]
    assert len(pings) == 4
    assert all(isinstance(e["tid"], int) and e["tid"] > 0 for e in pings)


def test_nothing_is_recorded_unless_switched_on(rt):
    ray_lite.get([square.remote(i) for i in range(3)])
    c = Counter.remote()
    ray_lite.get(c.incr.remote())
    events = ray_lite.timeline()
    assert _complete(events) == []
    # The processes answered all the same (their rows are named).
    assert {e["pid"] for e in events if e["ph"] == "M"} >= {
        w["pid"] for w in list_workers() if w["worker_type"] == "WORKER"}


class _FakeWorker:
    """What ``install`` uses of a worker's node."""

    def __init__(self):
        self.handlers = {}
        self.sent = []
        self.ran = []

    def notify(self, op, *args):
        self.sent.append((op,) + args)

    def run_pool_task(self, peer, msg):
        self.ran.append(msg[1])
        if msg[9] == "boom":
            self._send_failure(peer, msg[1], False, KeyError("k"), msg[9])

    def _send_failure(self, peer, oid, stream, err, name):
        pass


def _task(oid, name):
    return (P.TASK, oid, 0, None, (), None, 1, False, 0, name)


def test_the_ring_keeps_the_newest_records_and_notes_failures(monkeypatch):
    monkeypatch.setenv("RAY_LITE_TIMELINE", "1")
    monkeypatch.setattr(tl, "RECORDS", 5)
    w = _FakeWorker()
    tl.install(w, "pool")
    for oid in range(1, 9):
        w.run_pool_task(0, _task(oid, "boom" if oid == 7 else "f"))
    assert w.ran == list(range(1, 9))
    w.handlers[P.TIMELINE](0, (P.TIMELINE, 42))
    (op, ask, pid, kind, prefix, records), = w.sent
    assert (op, ask, kind, prefix) == (P.OP_TIMELINE, 42, "pool", "")
    assert [r[1] for r in records] == [4, 5, 6, 7, 8]
    assert [r[5] for r in records] == [None, None, None, "KeyError", None]
    assert all(r[3] >= r[2] and r[6] is False for r in records)


def test_a_call_is_in_the_records_from_its_start_and_reported_running(monkeypatch):
    # What a threaded actor relies on: its answer goes out before the
    # wrapper returns, so the entry must be there before the call ends.
    monkeypatch.setenv("RAY_LITE_TIMELINE", "1")
    w = _FakeWorker()
    during = []

    def run_pool_task(peer, msg):       # collected while it runs
        w.handlers[P.TIMELINE](0, (P.TIMELINE, 7))
        during.extend(w.sent.pop()[-1])
    w.run_pool_task = run_pool_task
    tl.install(w, "pool")
    w.run_pool_task(0, _task(3, "slow"))
    (name, oid, t0, t1, _, error, running), = during
    assert (name, oid, error, running) == ("slow", 3, None, True) and t1 >= t0
    assert tl.chrome_events({9: ("pool", during)})[1]["args"]["state"] == "RUNNING"
    w.handlers[P.TIMELINE](0, (P.TIMELINE, 8))
    (after,) = w.sent[-1][-1]
    assert after[6] is False and after[3] >= t1


def test_switched_off_the_run_path_is_not_wrapped(monkeypatch):
    monkeypatch.delenv("RAY_LITE_TIMELINE", raising=False)
    w = _FakeWorker()
    original = w.run_pool_task
    tl.install(w, "pool")
    assert w.run_pool_task == original and "run_pool_task" not in vars(w)
    w.handlers[P.TIMELINE](0, (P.TIMELINE, 1))
    assert w.sent[0][-1] == []


def test_chrome_events_of_collected_records():
    collected = {321: ("actor", [("A.m", 5, 10.0, 10.5, 77, None, False),
                                 ("A.m", 6, 9.0, 9.25, 77, "ValueError", False)])}
    events = tl.chrome_events(collected)
    assert events[0] == {"name": "process_name", "ph": "M", "pid": 321, "tid": 0,
                         "args": {"name": "actor 321"}}
    first, second = events[1:]
    assert (first["ts"], first["dur"]) == (9.0e6, 0.25e6)
    assert first["args"]["state"] == "FAILED" and first["cname"] != second["cname"]
    assert (second["ts"], second["dur"], second["tid"]) == (10.0e6, 0.5e6, 77)
