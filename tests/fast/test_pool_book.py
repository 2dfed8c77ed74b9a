"""The driver's pool book (``_fast/pool_book``), both twins, against a
stand-in driver: what the common task's two per-call steps send, book,
queue and free, and what they leave to the driver's other methods."""
import collections
import threading

import pytest

from ray_lite._private.objects.entries import _Entry, _FrozenEntry, _IMMUTABLE
from ray_lite._private.links.protocol import RESULT, TASK, PlacedTaskSpec, TaskSpec
from ray_lite._private.objects.refs import LoadedValue


class FakeLink:
    def __init__(self, book, fail=None):
        self.book, self.fail, self.sent = book, fail, []

    def send(self, msg):
        # Everything the book does happens under the scheduler's lock.
        assert self.book._sched._is_owned()
        if self.fail is not None:
            raise self.fail
        self.sent.append(msg)


class Target:
    peer = None


def make_book(impl, workers=2, cpu_cap=2):
    class Driver(impl.PoolBook):
        def __init__(self):
            self._sched = threading.RLock()
            self.idle = []
            self.queue = collections.deque()
            self.nested_queue = collections.deque()
            self.placed_queue = []
            self.res_waiters = []
            self.busy = 0
            self.cpu_cap = cpu_cap
            self.links = {}
            self.task_op, self.spec_type = TASK, TaskSpec
            self.pending, self.inflight, self.forward = {}, {}, {}
            self.entry_type, self.kept_types = _Entry, _IMMUTABLE
            self.calls = []
            # The driver's parts, as the book is given them: bound methods.
            self.enqueue, self.unsent = self._enqueue, self._unsent
            self.free_worker, self.dispatch_queued = self._free_worker, self._dispatch
            self.used_up, self.resources_freed = self._used_up, self._resources_freed
            self.on_result = self._on_result

        def _on_result(self, peer, msg):
            self.calls.append(("on_result", peer, msg))

        # The driver's other methods: recorded.
        def _enqueue(self, spec):
            self.calls.append(("enqueue", spec))

        def _unsent(self, spec, w, exc):
            self.calls.append(("unsent", spec, w, exc))

        def _free_worker(self, w, spec):
            self.calls.append(("free", w, spec))

        def _used_up(self, w, spec):
            self.calls.append(("used_up", w, spec))
            return True

        def _dispatch(self):
            self.calls.append(("dispatch",))

        def _resources_freed(self):
            self.calls.append(("resources_freed",))

    book = Driver()
    book.workers = book.pool = {}
    for wid in range(1, workers + 1):
        w = book.workers[wid] = impl.PoolWorker(wid, 1000 + wid)
        book.idle.append(w)
        book.links[wid] = FakeLink(book)
    return book


def submit(book, oid, fn_id="f1", args=(1,)):
    target = Target()
    book.submit_plain(oid, fn_id, b"blob", list(args), {}, 0, 3, "f", target)
    return target


def test_pool_worker_starts_idle(pool_book_impl):
    w = pool_book_impl.PoolWorker(7, 4242)
    assert (w.id, w.pid, w.shipped, w.task, w.blocked, w.calls) == (7, 4242, set(), None, False,
                                                                     None)
    w.blocked = True
    w.calls = {"f": 1}
    assert w.blocked is True and w.calls == {"f": 1}


def test_submit_plain_sends_to_an_idle_worker_and_books_it(pool_book_impl):
    book = make_book(pool_book_impl)
    target = submit(book, 11)
    assert book.links[2].sent == [(TASK, 11, "f1", b"blob", [1], {}, 1, False, 0, "f")]
    assert [w.id for w in book.idle] == [1]
    assert target.peer == 2 and book.busy == 1 and not book.calls
    booked = book.workers[2].task
    assert type(booked) is TaskSpec
    assert (booked.oid, booked.fn_id, booked.args, booked.retries, booked.name, booked.owner,
            booked.has_refs) == (11, "f1", [1], 3, "f", 0, False)
    assert book.workers[2].shipped == {"f1"}


def test_a_worker_gets_the_function_once(pool_book_impl):
    book = make_book(pool_book_impl, workers=1)
    submit(book, 1)
    book._task_finished(book.workers[1], 1)
    submit(book, 2)
    blobs = [msg[3] for msg in book.links[1].sent]
    assert blobs == [b"blob", None]


@pytest.mark.parametrize("why", ["no idle worker", "queued tasks", "nested queued tasks",
                                 "CPUs taken"])
def test_submit_plain_queues_when_it_cannot_send(pool_book_impl, why):
    book = make_book(pool_book_impl)
    if why == "no idle worker":
        book.idle.clear()
    elif why == "queued tasks":
        book.queue.append("earlier")      # first come, first served
    elif why == "nested queued tasks":
        book.nested_queue.append("earlier")
    else:
        book.busy = 2
    submit(book, 5)
    assert not book.links[1].sent and not book.links[2].sent
    [(what, spec)] = book.calls
    assert what == "enqueue" and type(spec) is TaskSpec and spec.oid == 5


def test_fractional_cpu_cap_is_respected(pool_book_impl):
    # Actors and placement groups hold part of the node's CPUs.
    book = make_book(pool_book_impl, cpu_cap=1.5)
    book.busy = 0.75
    submit(book, 5)
    assert book.calls[0][0] == "enqueue"


def test_a_failed_send_undoes_nothing_it_did_not_book(pool_book_impl):
    book = make_book(pool_book_impl)
    err = ConnectionError("worker gone")
    book.links[2].fail = err
    submit(book, 9)
    [(what, spec, w, exc)] = book.calls
    assert what == "unsent" and spec.oid == 9 and w is book.workers[2] and exc is err
    # Not booked: _unsent (the driver's) puts the worker and its CPU back.
    assert w.task is None and w.shipped == set() and book.busy == 1


def test_a_keyboard_interrupt_in_the_send_reaches_unsent(pool_book_impl):
    book = make_book(pool_book_impl)
    book.links[2].fail = KeyboardInterrupt()
    submit(book, 9)
    assert book.calls[0][0] == "unsent" and type(book.calls[0][3]) is KeyboardInterrupt


def test_task_finished_frees_the_worker(pool_book_impl):
    book = make_book(pool_book_impl)
    submit(book, 3)
    w = book.workers[2]
    book._task_finished(w, 3)
    assert w.task is None and book.busy == 0 and book.idle[-1] is w and not book.calls


def test_task_finished_ignores_a_stale_result(pool_book_impl):
    book = make_book(pool_book_impl)
    submit(book, 3)
    w = book.workers[2]
    book._task_finished(w, 99)            # not the task it runs now
    assert w.task.oid == 3 and book.busy == 1 and w not in book.idle
    idle = book.workers[1]
    book._task_finished(idle, 3)          # a worker with no task
    assert idle.task is None and book.busy == 1 and book.idle == [idle]


def test_task_finished_leaves_a_blocked_worker_to_the_driver(pool_book_impl):
    book = make_book(pool_book_impl)
    submit(book, 3)
    w = book.workers[2]
    w.blocked = True
    spec = w.task
    book._task_finished(w, 3)
    assert book.calls == [("free", w, spec)] and w.task is None and book.idle[-1] is w


def test_task_finished_of_a_placed_task_with_max_calls(pool_book_impl):
    book = make_book(pool_book_impl)
    w = book.idle.pop()
    spec = PlacedTaskSpec(None, None, 1, 4, "g", b"", [], {}, 1, False, 0, 0, "g", owner=0)
    w.task = spec
    book._task_finished(w, 4)
    # The driver frees what it held; used_up says it was the worker's last
    # call, so it does not go back to the idle list.
    assert book.calls == [("free", w, spec), ("used_up", w, spec)]
    assert w.task is None and w not in book.idle


def test_task_finished_dispatches_what_waits(pool_book_impl):
    book = make_book(pool_book_impl)
    submit(book, 3)
    book.queue.append("waiting")
    book.placed_queue.append("placed")
    book._task_finished(book.workers[2], 3)
    assert book.calls == [("dispatch",), ("resources_freed",)]


PLAIN = [0, -3, 2**70, 1.5, float("nan"), "", "s", b"", b"b", True, False, None]
NOT_PLAIN = [[1], (1,), {"a": 1}, {1}, bytearray(b"x"), object(), 1j, type("I", (int,), {})(3)]


def test_plain_call_takes_plain_values_only(pool_book_impl):
    from ray_lite._fast.pool_book import PLAIN_TYPES
    from ray_lite._private.api.call_options import _SIMPLE_TYPES
    assert _SIMPLE_TYPES is PLAIN_TYPES == {int, float, str, bytes, bool, type(None)}   # one set
    plain_call = pool_book_impl.plain_call
    for v in PLAIN + NOT_PLAIN:
        # What the general path calls simple, and nothing else.
        assert plain_call((v,), {}, None) is (type(v) in _SIMPLE_TYPES), v
        assert plain_call((1, v, "x"), {}, None) is (type(v) in _SIMPLE_TYPES), v
    assert plain_call((), {}, None) is True
    assert plain_call((), None, None) is True


def test_plain_call_refuses_keywords_and_arities_that_do_not_fit(pool_book_impl):
    plain_call = pool_book_impl.plain_call
    assert plain_call((1,), {"x": 1}, None) is False
    one_or_two = (1, 2, ())
    assert [plain_call((1,) * n, {}, one_or_two) for n in range(4)] == [False, True, True, False]
    assert plain_call((1,) * 50, {}, (0, 2**63 - 1, ())) is True      # *args
    # Any sequence, in both twins.
    assert plain_call([1, "a"], {}, [2, 2, ()]) is True
    assert plain_call([1, [2]], None, None) is False


def test_a_result_sets_its_entry_and_frees_the_worker(pool_book_impl):
    book = make_book(pool_book_impl)
    target = submit(book, 3)
    e = book.pending[3] = _Entry(target.peer)
    book.inflight[2] = {3: 0, 4: 0}
    fired = []
    e.callbacks = [lambda entry: fired.append(entry.value)]
    book._on_pool_result(2, (RESULT, 3, True, "value"))
    assert (e.ready, e.value, e.error, fired) == (True, "value", None, ["value"])
    assert 3 not in book.pending and book.inflight == {2: {4: 0}}
    w = book.workers[2]
    assert w.task is None and book.busy == 0 and book.idle[-1] is w and not book.calls


def test_an_actors_result_frees_no_worker_and_a_ready_entry_stays(pool_book_impl):
    book = make_book(pool_book_impl)
    submit(book, 3)
    e = book.pending[8] = _Entry(77)
    book._on_pool_result(77, (RESULT, 8, True, 1))       # 77: an actor, not in the pool
    assert e.value == 1 and book.busy == 1 and not book.calls
    e2 = book.pending[9] = _Entry(77)
    e2.ready, e2.value = True, "first"                   # set already (cancelled, say)
    book._on_pool_result(77, (RESULT, 9, True, "second"))
    assert e2.value == "first" and 9 not in book.pending


@pytest.mark.parametrize("case", ["error", "forwarded", "loaded", "mutable", "list", "subclass",
                                  "none"])
def test_any_other_result_goes_to_the_drivers_general_handler(pool_book_impl, case):
    book = make_book(pool_book_impl)
    submit(book, 3)
    ok, payload, target = True, 5, _Entry(2)
    if case == "error":
        ok, payload = False, ValueError("boom")
    elif case == "forwarded":
        book.forward[12] = 1        # some nested task's result is forwarded
    elif case == "loaded":
        payload = LoadedValue.__new__(LoadedValue)
    elif case == "mutable":
        payload = [5]       # its entry keeps private copies: the general handler's job
    elif case == "list":
        target = [_Entry(2), _Entry(2)]
    elif case == "subclass":
        target = _FrozenEntry.__new__(_FrozenEntry)
    elif case == "none":
        target = None
    if target is not None:
        book.pending[3] = target
    msg = (RESULT, 3, ok, payload)
    book._on_pool_result(2, msg)
    assert book.calls == [("on_result", 2, msg)]
    assert book.busy == 1 and book.workers[2].task is not None      # left to the handler
    if target is not None:
        assert book.pending[3] is target


def test_the_drivers_book_shares_the_nodes_tables_and_parts(rt):
    # The book reads the node's tables on every task: the same objects, and
    # calls the parts' bound methods (given once) when a task is not the
    # common one.
    book = rt.book
    for name in ("links", "pending", "inflight", "pool", "forward", "_sched"):
        assert getattr(book, name) is getattr(rt, name), name
    assert book.enqueue == rt.dispatch.enqueue and book.unsent == rt.dispatch.unsent
    assert book.free_worker == rt.dispatch.free_worker
    assert book.dispatch_queued == rt.dispatch.dispatch_queued
    assert book.used_up == rt.max_calls.used_up and book.resources_freed == rt.resources.freed
    assert book.on_result == rt._on_result
    assert rt.submit_plain == book.submit_plain
    assert rt.dispatch.book is book and rt.resources.book is book
