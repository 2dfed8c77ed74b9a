"""A worker's task runner (``_fast/task_runner``), both twins, against a
stand-in worker: what a task's and an actor call's steps run, send and leave
behind, and what they hand to the worker's other methods."""
import asyncio
import collections
import itertools
import threading

import pytest

RESULT = "RESULT"


class Ref:
    """Stands in for ObjectRef: an argument the worker must resolve."""

    def __init__(self, value):
        self.value = value


class FakeLink:
    def __init__(self, fail=None):
        self.fail, self.sent = fail, []

    def send(self, msg):
        if self.fail is not None:
            raise self.fail
        self.sent.append(msg)


def make_worker(impl, kind="pool", link=None):
    class Worker(impl.TaskRunner):
        def __init__(self):
            self.functions = {}
            self.cancelled = set()
            self.live = set()
            self.links = {5: link if link is not None else FakeLink()}
            self.current_oid = self.current_fn = self.current_name = None
            self.current_thread_busy = False
            self._interrupted = True
            self._in_user_code = False
            self._interrupt = None
            self._cancel_signalled = False
            self.blocked_depth = 0
            self._bridges = {}
            self.kind = kind
            self.ref_type, self.result_op = Ref, RESULT
            self.never_stored = frozenset({int, str, type(None)})
            self.store_result = lambda r: ("stored", r)
            self.tasks = collections.deque()
            self.exiting = False
            self._releases = []
            self._drive_lock = threading.Lock()
            self._sleepers = 0
            self._bridge_waiting = False
            self.arrivals = []      # what each _poll receives, in turn
            self.calls = []
            self.oids = itertools.count(100)

        def new_oid(self):
            return next(self.oids)

        # The worker's other methods: recorded.
        def _drain(self):
            assert self._drive_lock.locked()
            self.calls.append(("drain",))

        def _release_drive(self):
            self.calls.append(("release_drive",))
            self._drive_lock.release()

        def _poll(self, timeout):
            assert self._drive_lock.locked()
            self.calls.append(("poll", timeout))
            arrival = self.arrivals.pop(0)
            if arrival == "exit":
                self.exiting = True
            else:
                self._on_task(5, arrival)

        def _wake_after_release(self):
            self.calls.append(("wake", self._sleepers, self._bridge_waiting))

        def wait_until(self, pred):
            self.calls.append(("wait_until", pred()))
            self.tasks.append((5, self.arrivals.pop(0)))
            assert pred()

        def _send_releases(self):
            self.calls.append(("releases", list(self._releases)))
            self._releases = []

        def _load_function(self, fn_id, blob):
            self.calls.append(("load", fn_id))
            if isinstance(blob, BaseException):
                raise blob
            self.functions[fn_id] = blob
            return blob

        def _resolve(self, args, kwargs):
            self.calls.append(("resolve",))
            return ([a.value if type(a) is Ref else a for a in args],
                    {k: v.value if type(v) is Ref else v for k, v in kwargs.items()})

        def _failure(self, oid, name, exc):
            return ("error", name, type(exc).__name__)

        def _send_failure(self, peer, oid, stream, err, name):
            self.calls.append(("failure", peer, oid, stream, err))

        def _send_cancelled(self, peer, oid, name):
            self.calls.append(("cancelled", peer, oid, name))

        def _enter_user_code(self):
            self.calls.append(("enter", self._cancel_signalled, self._interrupt))

        def _await_result(self, coro):
            self.calls.append(("await",))
            return asyncio.run(coro)

        def _run_stream(self, peer, oid, result, bp, name):
            self.calls.append(("stream", peer, oid, list(result), bp, name))

        def _split(self, result, nret, name):
            self.calls.append(("split", nret))
            return tuple(result)

        def _unsendable(self, peer, msg, name, exc):
            self.calls.append(("unsendable", peer, msg, type(exc).__name__))

        def _lend_slot_for_good(self):
            self.calls.append(("lend",))
            self.blocked_depth = 0

        def _close_finished_bridges(self):
            self.calls.append(("bridges",))

    return Worker()


def task(oid, fn, args=(1,), kwargs=None, nret=1, stream=False, fn_id="f", name="f"):
    return ("TASK", oid, fn_id, fn, tuple(args), kwargs or {}, nret, stream, 0, name)


def test_a_task_runs_answers_and_leaves_the_worker_idle(task_runner_impl):
    w = make_worker(task_runner_impl)
    seen = []

    def f(x):
        # The worker's state while the user's code runs.
        seen.append((w.current_oid, w.current_fn, w.current_name, w.current_thread_busy,
                     w._in_user_code, w._interrupted))
        return x + 1

    w.live.add(7)
    w.run_pool_task(5, task(7, f, (41,), name="mod.f"))
    assert w.links[5].sent == [(RESULT, 7, True, 42)]
    assert seen == [(7, f, "mod.f", True, True, False)]
    assert (w.current_oid, w.current_fn, w.current_name, w.current_thread_busy,
            w._in_user_code) == (None, None, None, False, False)
    assert w.live == set() and w.calls == [("load", "f")]
    # The function is loaded once: the next task finds it in the table.
    w.run_pool_task(5, task(8, None, (1,)))
    assert w.links[5].sent[-1] == (RESULT, 8, True, 2)
    assert w.calls == [("load", "f")]


def test_the_oids_a_task_makes_are_its_first_oid_on(task_runner_impl):
    """``task_oids_from``: no oid the worker made before the task is as
    large, every one it makes while the task runs is (a recursive cancel
    of the task cancels the actor calls it made by that)."""
    w = make_worker(task_runner_impl)
    before = w.new_oid()
    made = []
    w.live.add(7)
    w.run_pool_task(5, task(7, lambda x: made.append(w.new_oid())))
    assert before < w.task_oids_from <= made[0]


def test_a_result_of_another_type_goes_through_the_store(task_runner_impl):
    w = make_worker(task_runner_impl)
    w.run_pool_task(5, task(1, lambda: [1, 2], ()))
    assert w.links[5].sent == [(RESULT, 1, True, ("stored", [1, 2]))]


@pytest.mark.parametrize("how", ["positional", "keyword"])
def test_refs_and_keywords_are_resolved(task_runner_impl, how):
    w = make_worker(task_runner_impl)
    if how == "positional":
        msg = task(1, lambda a, b: a * b, (Ref(6), 7))
    else:
        msg = task(1, lambda a, b: a * b, (6,), {"b": 7})
    w.run_pool_task(5, msg)
    assert ("resolve",) in w.calls
    assert w.links[5].sent == [(RESULT, 1, True, 42)]


def test_plain_arguments_are_not_resolved(task_runner_impl):
    w = make_worker(task_runner_impl)
    w.run_pool_task(5, task(1, lambda *a: len(a), (1, "x", None)))
    assert ("resolve",) not in w.calls
    assert w.links[5].sent == [(RESULT, 1, True, 3)]


@pytest.mark.parametrize("where", ["load", "resolve", "call"])
def test_a_failure_is_sent_instead_of_a_result(task_runner_impl, where):
    w = make_worker(task_runner_impl)
    called = []

    def f(x):
        called.append(x)
        raise ValueError("boom")

    if where == "load":
        msg = task(3, ImportError("no module"))
    elif where == "resolve":
        w.functions["f"] = f
        w._resolve = lambda args, kwargs: (_ for _ in ()).throw(KeyError("lost"))
        msg = task(3, None, (Ref(1),))
    else:
        msg = task(3, f)
    w.live.add(3)
    w.run_pool_task(5, msg)
    err = {"load": "ImportError", "resolve": "KeyError", "call": "ValueError"}[where]
    assert ("failure", 5, 3, False, ("error", "f", err)) in w.calls
    assert w.links[5].sent == []
    assert called == ([1] if where == "call" else [])
    assert (w.current_oid, w.current_thread_busy, w._in_user_code, w.live) == (None, False, False,
                                                                                set())


def test_a_keyboard_interrupt_in_the_call_is_reported_not_raised(task_runner_impl):
    # A cancel lands in the user's code as KeyboardInterrupt: the caller is
    # told (``_failure`` makes it TaskCancelledError), the worker goes on.
    w = make_worker(task_runner_impl)

    def f(x):
        raise KeyboardInterrupt

    w.run_pool_task(5, task(2, f))
    assert ("failure", 5, 2, False, ("error", "f", "KeyboardInterrupt")) in w.calls


def test_sys_exit_in_a_task_ends_the_worker_without_an_answer(task_runner_impl):
    w = make_worker(task_runner_impl)
    w.live.add(4)
    with pytest.raises(SystemExit):
        w.run_pool_task(5, task(4, lambda x: exit(3)))
    assert not [c for c in w.calls if c[0] == "failure"] and w.links[5].sent == []
    assert (w.current_oid, w.current_thread_busy, w.live) == (None, False, set())


def test_sys_exit_in_an_actor_method_answers_then_exits(task_runner_impl):
    w = make_worker(task_runner_impl, kind="actor")
    with pytest.raises(SystemExit):
        w._invoke(5, 4, lambda: exit(0), (), {}, 1, False, 0, "A.stop")
    assert ("failure", 5, 4, False, ("error", "A.stop", "SystemExit")) in w.calls


def test_an_actor_call_with_keywords(task_runner_impl):
    w = make_worker(task_runner_impl, kind="actor")
    w._invoke(5, 9, lambda a, b=0: a - b, (10,), {"b": 3}, 1, False, 0, "A.sub")
    assert w.links[5].sent == [(RESULT, 9, True, 7)]
    # An actor call leaves the pool task's fields alone.
    assert (w.current_oid, w._interrupted) == (None, True)


def test_a_cancel_read_while_the_call_ran_wins_over_its_result(task_runner_impl):
    w = make_worker(task_runner_impl)

    def f(x):
        w.cancelled.add(6)
        return x

    w.live.add(6)
    w.run_pool_task(5, task(6, f))
    assert ("cancelled", 5, 6, "f") in w.calls and w.links[5].sent == []
    assert w.cancelled == set() and w.live == set()


def test_a_pending_cancel_is_looked_at_before_the_user_code(task_runner_impl):
    w = make_worker(task_runner_impl)
    w._cancel_signalled = True
    w.run_pool_task(5, task(1, lambda x: x))
    assert w.calls[1] == ("enter", True, None)
    w = make_worker(task_runner_impl)
    w._interrupt = 99
    w.run_pool_task(5, task(2, lambda x: x))
    assert w.calls[1] == ("enter", False, 99)
    assert w._interrupt is None       # the task's end clears it


def test_a_coroutine_result_is_awaited(task_runner_impl):
    w = make_worker(task_runner_impl)

    async def f(x):
        return x * 2

    w.run_pool_task(5, task(1, f, (21,)))
    assert ("await",) in w.calls and w.links[5].sent == [(RESULT, 1, True, 42)]


def test_a_stream_goes_to_the_worker(task_runner_impl):
    w = make_worker(task_runner_impl)

    def gen(n):
        yield from range(n)

    w.run_pool_task(5, task(1, gen, (3,), stream=True))
    assert ("stream", 5, 1, [0, 1, 2], 0, "f") in w.calls and w.links[5].sent == []
    # A stream that fails to start (not a generator, say) is a failure.
    w._run_stream = lambda *a: (_ for _ in ()).throw(TypeError("not a generator"))
    w.run_pool_task(5, task(2, gen, (3,), stream=True))
    assert ("failure", 5, 2, True, ("error", "f", "TypeError")) in w.calls


def test_several_returns_are_split(task_runner_impl):
    w = make_worker(task_runner_impl)
    w.run_pool_task(5, task(1, lambda: [1, 2], (), nret=2))
    assert ("split", 2) in w.calls
    assert w.links[5].sent == [(RESULT, 1, True, ("stored", (1, 2)))]


@pytest.mark.parametrize("fail, told", [(ConnectionError("gone"), False),
                                        (BrokenPipeError("gone"), False),
                                        (TypeError("can't pickle"), True)])
def test_a_result_that_cannot_be_sent(task_runner_impl, fail, told):
    w = make_worker(task_runner_impl, link=FakeLink(fail))
    w.run_pool_task(5, task(1, lambda x: x))
    unsendable = [c for c in w.calls if c[0] == "unsendable"]
    assert unsendable == ([("unsendable", 5, (RESULT, 1, True, 1), "TypeError")] if told else [])


def test_a_caller_without_a_link_gets_nothing(task_runner_impl):
    w = make_worker(task_runner_impl)
    w.run_pool_task(6, task(1, lambda x: x))     # peer 6: no link (it died)
    assert w.links[5].sent == [] and w.current_oid is None


def test_the_end_of_a_task_lends_the_slot_and_closes_bridges(task_runner_impl):
    w = make_worker(task_runner_impl)

    def f(x):
        w.blocked_depth = 1     # interrupted inside a get
        w._bridges["loop"] = "bridge"
        return x

    w.run_pool_task(5, task(1, f))
    assert ("lend",) in w.calls and ("bridges",) in w.calls and w.blocked_depth == 0


def test_a_malformed_task_message_is_refused(task_runner_impl):
    w = make_worker(task_runner_impl)
    with pytest.raises(ValueError):
        w.run_pool_task(5, ("TASK", 1, "f"))
    assert w.current_oid is None and w.links[5].sent == []


def test_a_task_message_is_queued_after_the_releases_it_brought(task_runner_impl):
    w = make_worker(task_runner_impl)
    w._releases.append(("owner", 1, 2))
    msg = task(3, None)
    w._on_task(5, msg)
    assert w.calls == [("releases", [("owner", 1, 2)])]
    assert list(w.tasks) == [(5, msg)] and w.live == {3}
    w._on_task(5, task(4, None))
    assert len(w.calls) == 1 and w.live == {3, 4}


def test_the_main_loop_runs_calls_in_order_until_the_worker_exits(task_runner_impl):
    w = make_worker(task_runner_impl)
    ran = []

    def run(peer, msg):
        ran.append((peer, msg[1]))
        if msg[1] == 3:
            w._sleepers = 1       # a thread waits to drive: it is woken after the poll

    w.tasks.extend([(5, task(1, None)), (5, task(2, None))])
    w.arrivals = [task(3, None), "exit"]
    w.serve_calls(run)
    assert ran == [(5, 1), (5, 2), (5, 3)]
    # Between two queued calls the links are read first (a cancel of the
    # next, say); idle, the loop drives them itself.
    assert w.calls == [("drain",), ("release_drive",), ("poll", None), ("poll", None),
                       ("wake", 1, False)]
    assert not w._drive_lock.locked() and not w.tasks


def test_the_main_loop_waits_while_another_thread_drives(task_runner_impl):
    w = make_worker(task_runner_impl)
    ran = []

    def run(peer, msg):
        ran.append(msg[1])
        w.exiting = True

    w._drive_lock.acquire()       # another thread drives the links
    w.arrivals = [task(8, None)]
    w.serve_calls(run)
    assert ran == [8] and w.calls == [("wait_until", False)]
    w._drive_lock.release()


def test_an_exit_raised_by_a_call_ends_the_main_loop(task_runner_impl):
    w = make_worker(task_runner_impl, kind="actor")

    class Exit(SystemExit):
        pass

    def run(peer, msg):
        raise Exit

    w.tasks.extend([(5, task(1, None)), (5, task(2, None))])
    with pytest.raises(Exit):
        w.serve_calls(run)
    assert len(w.tasks) == 1 and not w._drive_lock.locked()
