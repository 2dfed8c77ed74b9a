"""The stream table: both twins, and the two twins against each other."""
import importlib
import pickle
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ray_lite._fast import _stream_table_py


def take_all(table, limit=10**6):
    """try_next until NOT_READY or the end; the payloads taken."""
    out = []
    for _ in range(limit):
        try:
            item = table.try_next()
        except StopIteration:
            break
        if item is table_module(table).NOT_READY:
            break
        out.append(item)
    return out


def table_module(table):
    return importlib.import_module(type(table).__module__)


def counters(table):
    return (table.num_reported, table.num_consumed, table.num_unconsumed, table.end_index,
            table.is_next_ready(), table.is_finished())


def assert_over(table, late_index=None):
    """The stream has ended: ``try_next`` raises StopIteration (again and
    again), and an item reported at ``late_index`` after the end is refused."""
    for _ in range(2):
        with pytest.raises(StopIteration):
            table.try_next()
    if late_index is not None:
        with pytest.raises(ValueError):
            table.report(late_index, "late")


# -- the sentinel -------------------------------------------------------------

def test_not_ready_is_one_named_object(stream_table_impl):
    nr = stream_table_impl.NOT_READY
    assert repr(nr) == "NOT_READY"
    # One object across both twins and across pickling, so `is NOT_READY`
    # holds whichever twin produced the value.
    assert nr is _stream_table_py.NOT_READY
    assert pickle.loads(pickle.dumps(nr)) is nr
    assert type(nr)() is nr


def test_twins_export_the_same_names(stream_table_impl):
    assert set(stream_table_impl.__all__) == {"StreamTable", "NOT_READY"}


def test_not_ready_cannot_be_a_payload(stream_table_impl):
    t = stream_table_impl.StreamTable()
    with pytest.raises(ValueError, match="NOT_READY"):
        t.report(0, stream_table_impl.NOT_READY)
    assert t.num_reported == 0


# -- taking items ---------------------------------------------------------------

def test_in_order_reports_are_taken_in_order(stream_table_impl):
    NOT_READY = stream_table_impl.NOT_READY
    t = stream_table_impl.StreamTable()
    assert t.try_next() is NOT_READY
    assert not t.is_next_ready()
    payloads = ["a", None, 0, b"x", {"k": [1]}, (1, 2)]
    for i, p in enumerate(payloads):
        t.report(i, p)
        assert t.is_next_ready()
        assert t.try_next() is p          # the very object, no copy
        assert t.try_next() is NOT_READY
    assert counters(t) == (6, 6, 0, -1, False, False)


def test_reports_ahead_of_the_consumer_wait_their_turn(stream_table_impl):
    NOT_READY = stream_table_impl.NOT_READY
    t = stream_table_impl.StreamTable()
    t.report(2, "c")
    t.report(1, "b")
    assert t.try_next() is NOT_READY
    assert not t.is_next_ready()
    assert counters(t) == (2, 0, 2, -1, False, False)
    t.report(0, "a")
    assert t.is_next_ready()
    assert [t.try_next(), t.try_next(), t.try_next()] == ["a", "b", "c"]
    assert t.try_next() is NOT_READY


def test_none_payload_is_an_item_not_a_gap(stream_table_impl):
    t = stream_table_impl.StreamTable()
    t.report(0, None)
    t.report_end(1)
    assert t.is_next_ready()
    assert t.try_next() is None
    assert_over(t)


def test_end_of_stream(stream_table_impl):
    NOT_READY = stream_table_impl.NOT_READY
    t = stream_table_impl.StreamTable()
    t.report_end(2)
    assert t.end_index == 2
    assert t.try_next() is NOT_READY
    assert not t.is_finished()
    t.report(1, "b")
    t.report(0, "a")
    assert t.try_next() == "a"
    assert not t.is_finished()
    assert t.try_next() == "b"
    assert t.is_finished()
    assert t.is_next_ready()      # try_next would not say NOT_READY: it raises StopIteration
    for _ in range(3):            # and keeps raising it
        with pytest.raises(StopIteration):
            t.try_next()
    assert counters(t) == (2, 2, 0, 2, True, True)


def test_empty_stream(stream_table_impl):
    t = stream_table_impl.StreamTable()
    t.report_end(0)
    assert t.is_finished() and t.is_next_ready()
    assert_over(t, late_index=0)


def test_end_reported_after_consuming_everything(stream_table_impl):
    t = stream_table_impl.StreamTable()
    t.report(0, "a")
    assert t.try_next() == "a"
    assert not t.is_finished()
    t.report_end(1)
    assert t.is_finished()
    assert_over(t)


def test_error_surfaces_at_its_index_then_the_stream_is_over(stream_table_impl):
    NOT_READY = stream_table_impl.NOT_READY
    t = stream_table_impl.StreamTable()
    error = KeyError("boom")
    # Reported before the items ahead of it: they still come first.
    t.report_error(2, error)
    assert t.end_index == 3
    assert counters(t) == (1, 0, 1, 3, False, False)
    t.report(0, "a")
    assert t.try_next() == "a"
    assert t.try_next() is NOT_READY
    t.report(1, "b")
    assert t.try_next() == "b"
    assert t.is_next_ready()
    with pytest.raises(KeyError) as info:
        t.try_next()
    assert info.value is error
    assert t.is_finished()
    assert counters(t) == (3, 3, 0, 3, True, True)
    assert_over(t, late_index=3)


def test_error_as_first_item(stream_table_impl):
    t = stream_table_impl.StreamTable()
    t.report_error(0, RuntimeError("at once"))
    with pytest.raises(RuntimeError, match="at once"):
        t.try_next()
    assert_over(t)


# -- bad reports ------------------------------------------------------------------

# (set-up operations, the bad operation, the expected exception)
BAD_REPORTS = [
    ([], ("report", -1, "x"), ValueError),
    ([("report", 0, "x")], ("report", 0, "y"), ValueError),                     # duplicate
    ([("report", 5, "x")], ("report", 5, "y"), ValueError),                     # duplicate ahead
    ([("report", 0, "x"), ("take",)], ("report", 0, "y"), ValueError),          # already consumed
    ([("report", 5000, "x")], ("report", 5000, "y"), ValueError),              # duplicate, spilled
    ([("end", 3)], ("report", 3, "x"), ValueError),                            # at the end
    ([("end", 3)], ("report", 10**6, "x"), ValueError),                        # after the end
    ([("report", 4, "x")], ("end", 4), ValueError),                            # end before a report
    ([("report", 4, "x")], ("end", 2), ValueError),
    ([("end", 4)], ("end", 4), ValueError),                                    # end twice
    ([("end", 4)], ("end", 5), ValueError),
    ([], ("end", -1), ValueError),
    ([], ("error", -1, KeyError()), ValueError),
    ([("report", 2, "x")], ("error", 2, KeyError()), ValueError),              # at a reported index
    ([("report", 2, "x")], ("error", 1, KeyError()), ValueError),              # before a reported index
    ([("end", 3)], ("error", 1, KeyError()), ValueError),                      # end already known
    ([("error", 3, KeyError())], ("end", 4), ValueError),
    ([("error", 3, KeyError())], ("error", 3, KeyError()), ValueError),
    ([("error", 3, KeyError())], ("report", 3, "x"), ValueError),
    ([("error", 3, KeyError())], ("report", 4, "x"), ValueError),
    ([], ("error", 0, "not an exception"), TypeError),
    ([], ("error", 0, KeyError), TypeError),                                    # a class, not an instance
    ([], ("report", 1.0, "x"), TypeError),
    ([], ("report", "1", "x"), TypeError),
    ([], ("end", 2.5), TypeError),
    ([], ("report", 2**63, "x"), OverflowError),
    ([], ("report", -2**63 - 1, "x"), OverflowError),
    ([], ("error", 2**63 - 1, KeyError()), OverflowError),                     # its end would overflow
]


def apply(table, op):
    kind = op[0]
    if kind == "report":
        return table.report(op[1], op[2])
    if kind == "end":
        return table.report_end(op[1])
    if kind == "error":
        return table.report_error(op[1], op[2])
    if kind == "take":
        return table.try_next()
    if kind == "ready":
        return table.is_next_ready()
    raise AssertionError(op)


@pytest.mark.parametrize("setup, bad, exc", BAD_REPORTS)
def test_bad_reports_raise_and_change_nothing(stream_table_impl, setup, bad, exc):
    t = stream_table_impl.StreamTable()
    for op in setup:
        apply(t, op)
    before = counters(t)
    with pytest.raises(exc):
        apply(t, bad)
    assert counters(t) == before


def test_bool_index_is_an_int(stream_table_impl):
    t = stream_table_impl.StreamTable()
    t.report(False, "a")
    t.report(True, "b")
    assert take_all(t) == ["a", "b"]


# -- memory -----------------------------------------------------------------------

def test_long_stream_consumed_as_it_goes_stays_small(stream_table_impl):
    t = stream_table_impl.StreamTable()
    lag = 50
    n = 100_000
    biggest = 0
    for i in range(n):
        t.report(i, i)
        if i >= lag:
            assert t.try_next() == i - lag
        biggest = max(biggest, t.capacity)
    assert biggest <= 128
    assert take_all(t) == list(range(n - lag, n))


def test_buffer_shrinks_once_a_burst_is_drained(stream_table_impl):
    t = stream_table_impl.StreamTable()
    for i in range(10_000):
        t.report(i, i)
    assert t.capacity >= 10_000
    assert take_all(t) == list(range(10_000))   # ends with NOT_READY: the consumer caught up
    assert t.capacity <= 16
    t.report(10_000, "more")
    assert t.try_next() == "more"


def test_far_ahead_report_does_not_allocate_its_distance(stream_table_impl):
    t = stream_table_impl.StreamTable()
    t.report(10**12, "far")
    t.report(3000, "ahead")
    assert t.capacity <= 1024
    assert t.num_reported == 2
    for i in range(3000):
        t.report(i, i)
        assert t.try_next() == i
    assert t.try_next() == "ahead"
    assert t.capacity <= 1024
    with pytest.raises(ValueError):
        t.report(10**12, "again")
    with pytest.raises(ValueError):
        t.report_end(10**12)          # an item was reported at that index


def test_far_ahead_reports_in_reverse_order(stream_table_impl):
    t = stream_table_impl.StreamTable()
    n = 5000
    for i in reversed(range(n)):
        t.report(i, -i)
    t.report_end(n)
    assert t.num_unconsumed == n
    assert take_all(t) == [-i for i in range(n)]
    assert t.is_finished()


def test_finished_stream_releases_its_buffer(stream_table_impl):
    t = stream_table_impl.StreamTable()
    for i in range(4096):
        t.report(i, i)
    t.report_end(4096)
    assert t.capacity >= 4096
    assert take_all(t) == list(range(4096))
    assert_over(t)
    assert t.capacity <= 16


# -- properties -------------------------------------------------------------------

@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(0, 300), spread=st.sampled_from([1, 40, 3000]),
       seed=st.integers(0, 2**32 - 1), end_fraction=st.floats(0, 1))
def test_any_report_order_is_taken_in_index_order(stream_table_impl, n, spread, seed, end_fraction):
    """Reports in a random order, interleaved with takes: the taken sequence is
    exactly the payloads 0..n-1, NOT_READY exactly when the next index is
    unreported."""
    NOT_READY = stream_table_impl.NOT_READY
    # A shuffle, locally limited by `spread`, so both near and far out-of-order
    # reports (spill) happen; the seed also draws how many takes follow each report.
    rng = random.Random(seed)
    order = sorted(range(n), key=lambda i: i + rng.random() * spread)
    end_at = int(end_fraction * n)               # when report_end comes
    t = stream_table_impl.StreamTable()
    reported = set()
    taken = []
    payloads = [object() if i % 3 else None for i in range(n)]

    def take_some():
        for _ in range(rng.randint(0, 4)):
            expected_ready = len(taken) in reported or (len(taken) == n and t.end_index == n)
            assert t.is_next_ready() == expected_ready
            try:
                item = t.try_next()
            except StopIteration:
                assert t.end_index == n and len(taken) == n
                return
            if item is NOT_READY:
                assert len(taken) not in reported
                return
            assert len(taken) in reported
            assert item is payloads[len(taken)]
            taken.append(item)

    for k, i in enumerate(order):
        if k == end_at:
            t.report_end(n)
        t.report(i, payloads[i])
        reported.add(i)
        assert t.num_reported == len(reported)
        assert t.num_unconsumed == len(reported) - len(taken)
        take_some()
    if end_at == n:
        t.report_end(n)
    while len(taken) < n:
        take_some()
    assert taken == payloads
    assert_over(t)
    assert t.is_finished()
    assert t.capacity <= 1024


index_strategy = st.one_of(
    st.integers(-2, 40),                                  # near: in the window, duplicates
    st.integers(1000, 5000),                              # past the window: grow or spill
    st.sampled_from([10**12, 2**63 - 1, 2**63, -2**63 - 1]),
)
op_strategy = st.one_of(
    st.tuples(st.just("report"), index_strategy, st.sampled_from([None, 0, "p", b"q"])),
    st.tuples(st.just("end"), index_strategy),
    st.tuples(st.just("error"), index_strategy),
    st.tuples(st.just("take")),
    st.tuples(st.just("take")),
    st.tuples(st.just("ready")),
)


def outcome(table, op, error):
    if op[0] == "error":
        op = ("error", op[1], error)
    try:
        value = apply(table, op)
    except StopIteration:
        return ("stop",)
    except Exception as exc:   # noqa: BLE001 - comparing what each twin raised
        if exc is error:
            return ("stored error",)
        # Cython words its own int-conversion errors; the class is what counts there.
        message = str(exc) if isinstance(exc, ValueError) else ""
        return ("raised", type(exc), message)
    if value is _stream_table_py.NOT_READY:
        return ("not ready",)
    return ("value", value)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(op_strategy, max_size=80))
def test_twins_agree_on_any_operation_sequence(twin_pair, ops):
    c_table, py_table = (t.module("stream_table").StreamTable() for t in twin_pair)
    for op in ops:
        error = LookupError("stored")
        got_py = outcome(py_table, op, error)
        got_c = outcome(c_table, op, error)
        assert got_c == got_py, op
        assert counters(c_table) == counters(py_table), op
        assert c_table.capacity == py_table.capacity, op
        assert repr(c_table) == repr(py_table)


# -- threads ----------------------------------------------------------------------

def test_reports_from_one_thread_taken_by_another(stream_table_impl):
    """The runtime reports on the thread driving the links while another takes
    items: every item arrives once and in order, across the buffer growing
    and shrinking under the consumer (the pure twin once lost or repeated
    items when a resize landed mid-take)."""
    import sys
    import threading

    t = stream_table_impl.StreamTable()
    n = 20_000
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)     # preempt between bytecodes as often as possible

    def reporter():
        # Bursts far enough ahead to grow the buffer, then room to shrink it.
        for start in range(0, n, 500):
            for i in reversed(range(start, start + 500)):
                t.report(i, i)
        t.report_end(n)

    th = threading.Thread(target=reporter)
    got = []
    try:
        th.start()
        while True:
            try:
                item = t.try_next()
            except StopIteration:
                break
            if item is not stream_table_impl.NOT_READY:
                got.append(item)
            elif not th.is_alive() and not t.is_next_ready():
                break        # the reporter died: fail below instead of spinning
    finally:
        sys.setswitchinterval(old_interval)
        th.join(30)
    assert not th.is_alive()
    assert got == list(range(n))
