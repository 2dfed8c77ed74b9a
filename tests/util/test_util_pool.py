"""ray_lite.util.multiprocessing.Pool: the standard library's Pool semantics."""
import itertools
import multiprocessing
import os
import pickle
import threading

import pytest

import ray_lite
from ray_lite.exceptions import RayActorError
from ray_lite.util.multiprocessing import Pool, TimeoutError
from ray_lite.util.queue import Queue


def square(x):
    return x * x


def add(a, b):
    return a + b


def inverse(x):
    return 1 / x


def die_at(x, bad):
    if x == bad:
        os._exit(1)
    return x


def pid(_):
    return os.getpid()


def take_from(q):
    return q.get(timeout=30)


_greeting = None


def set_greeting(word, punctuation):
    global _greeting
    _greeting = word + punctuation


def greeting(_):
    return _greeting


@pytest.fixture
def pool(rt):
    p = Pool(2)
    try:
        yield p
    finally:
        p.terminate()


def test_the_timeout_error_is_multiprocessings():
    assert TimeoutError is multiprocessing.TimeoutError


def test_map_in_order(pool):
    assert pool.map(square, range(100)) == [x * x for x in range(100)]
    assert pool.map(square, range(10), chunksize=3) == [x * x for x in range(10)]
    assert pool.map(square, (x for x in range(5))) == [0, 1, 4, 9, 16]
    assert pool.map(square, []) == []


def test_a_lambda_works(pool):
    offset = 10
    assert pool.map(lambda x: x + offset, range(5)) == [10, 11, 12, 13, 14]
    assert pool.apply(lambda a, b=0: a - b, (5,), {"b": 2}) == 3


def test_map_raises_the_functions_error(pool):
    with pytest.raises(ZeroDivisionError):
        pool.map(inverse, [1, 2, 0, 4])
    assert pool.map(inverse, [1, 2]) == [1.0, 0.5]   # the pool goes on


def test_bad_arguments(pool):
    with pytest.raises(ValueError, match="Chunksize"):
        pool.map(square, range(3), chunksize=0)
    with pytest.raises(ValueError, match="Chunksize"):
        pool.imap(square, range(3), chunksize=0)
    with pytest.raises(TypeError):
        pool.map(42, range(3))
    with pytest.raises(ValueError, match="at least 1"):
        Pool(0)
    with pytest.raises(ValueError, match="maxtasksperchild"):
        Pool(1, maxtasksperchild=0)
    with pytest.raises(TypeError, match="initializer"):
        Pool(1, initializer="not callable")
    with pytest.raises(NotImplementedError):
        pickle.dumps(pool)


def test_starmap(pool):
    assert pool.starmap(add, [(1, 2), (3, 4), (5, 6)]) == [3, 7, 11]
    assert pool.starmap(add, [(i, i) for i in range(30)], chunksize=4) == \
        [2 * i for i in range(30)]
    result = pool.starmap_async(add, [("a", "b")])
    assert result.get(timeout=30) == ["ab"]


def test_imap_keeps_the_order(pool):
    assert list(pool.imap(square, range(40))) == [x * x for x in range(40)]
    assert list(pool.imap(square, range(40), chunksize=7)) == [x * x for x in range(40)]
    assert list(pool.imap(square, [])) == []


def test_imap_unordered_returns_every_result(pool):
    assert sorted(pool.imap_unordered(square, range(40))) == [x * x for x in range(40)]
    assert sorted(pool.imap_unordered(square, range(40), chunksize=6)) == \
        [x * x for x in range(40)]


def test_imap_consumes_an_endless_iterable_lazily(pool):
    it = pool.imap(square, itertools.count())
    assert list(itertools.islice(it, 25)) == [x * x for x in range(25)]


def test_imap_next_with_a_timeout(pool):
    q = Queue()
    it = pool.imap(take_from, [q])
    with pytest.raises(TimeoutError):
        it.next(timeout=0.05)
    q.put("item")
    assert it.next(timeout=30) == "item"
    with pytest.raises(StopIteration):
        next(it)


def test_imap_unordered_returns_the_ready_one_first(pool):
    q = Queue()
    it = pool.imap_unordered(lambda x: x if x == "fast" else q.get(timeout=30),
                             ["slow", "fast"])
    assert it.next(timeout=30) == "fast"
    with pytest.raises(TimeoutError):
        it.next(timeout=0.05)
    q.put("slow")
    assert next(it) == "slow"


def test_imap_error_one_item_per_chunk_goes_on(pool):
    # As Ray's pool: the item's error is its result (more in test_multiprocessing_parity.py).
    it = pool.imap(inverse, [1, 0, 2])
    assert next(it) == 1.0
    assert isinstance(next(it), ZeroDivisionError)
    assert next(it) == 0.5


def test_imap_error_in_a_larger_chunk_goes_on(pool):
    results = list(pool.imap(inverse, [1, 0, 2, 4], chunksize=2))
    assert results[0] == 1.0 and results[2:] == [0.5, 0.25]
    assert isinstance(results[1], ZeroDivisionError)


def test_apply_and_apply_async(pool):
    assert pool.apply(add, (2, 3)) == 5
    assert pool.apply(add, kwds={"a": 1, "b": 2}) == 3
    result = pool.apply_async(square, (9,))
    assert result.get(timeout=30) == 81
    assert result.ready() and result.successful()


def test_apply_async_callback_and_error_callback(pool):
    done = threading.Event()
    values, errors = [], []

    def on_error(exc):
        errors.append(exc)
        done.set()
    ok = pool.apply_async(square, (4,), callback=values.append)
    bad = pool.apply_async(inverse, (0,), callback=values.append, error_callback=on_error)
    assert ok.get(timeout=30) == 16
    assert values == [16]               # the callback ran before get returned
    with pytest.raises(ZeroDivisionError):
        bad.get(timeout=30)
    assert done.wait(30)
    assert len(errors) == 1 and isinstance(errors[0], ZeroDivisionError)
    assert not bad.successful()
    assert values == [16]


def test_callbacks_run_without_anyone_waiting(pool):
    # The driver's runtime reads the answers itself; the callback comes
    # although nobody calls get.
    fired = threading.Event()
    pool.apply_async(square, (3,), callback=lambda v: fired.set())
    assert fired.wait(30)


def test_a_callback_may_submit_more_work(pool):
    chained = []
    first = pool.apply_async(square, (2,),
                             callback=lambda v: chained.append(pool.apply(square, (v,))))
    first.get(timeout=30)
    assert chained == [16]


def test_map_async_callbacks_get_the_whole_list_or_the_error(pool):
    lists, errors = [], []
    result = pool.map_async(square, range(10), callback=lists.append)
    assert result.get(timeout=30) == [x * x for x in range(10)]
    assert lists == [[x * x for x in range(10)]]
    failing = pool.map_async(inverse, [1, 0], callback=lists.append,
                             error_callback=errors.append)
    failing.wait(30)
    assert failing.ready() and not failing.successful()
    assert len(errors) == 1 and isinstance(errors[0], ZeroDivisionError)
    assert len(lists) == 1


def test_async_result_not_ready_yet(pool):
    q = Queue()
    result = pool.apply_async(take_from, (q,))
    assert not result.ready()
    with pytest.raises(ValueError, match="not ready"):
        result.successful()
    with pytest.raises(TimeoutError):
        result.get(timeout=0.05)
    result.wait(0.01)
    q.put(5)
    assert result.get(timeout=30) == 5


def test_initializer_runs_in_every_worker(rt):
    with Pool(2, initializer=set_greeting, initargs=("hi", "!")) as p:
        assert p.map(greeting, range(8), chunksize=1) == ["hi!"] * 8


def test_a_failing_initializer_fails_the_pool(rt):
    # As Ray's: the pool waits for its workers' initializer (its workers go).
    with pytest.raises(RayActorError, match="division by zero"):
        Pool(2, initializer=inverse, initargs=(0,))


def mark_started(directory):
    open(os.path.join(directory, str(os.getpid())), "w").close()


def test_every_worker_ran_the_initializer_when_the_pool_is_returned(rt, tmp_path):
    with Pool(2, initializer=mark_started, initargs=(str(tmp_path),)):
        assert len(os.listdir(tmp_path)) == 2


def test_processes_against_the_runtimes_cpus(rt):
    with pytest.raises(ValueError, match="3 processes on a runtime with 2 CPUs"):
        Pool(3)
    with Pool() as p:
        assert p._processes == 2


def test_a_pool_starts_the_runtime_with_a_cpu_per_process():
    try:
        with Pool(1) as p:
            assert ray_lite.cluster_resources()["CPU"] == 1
            assert p.map(square, range(3)) == [0, 1, 4]
    finally:
        ray_lite.shutdown()


def test_joinable_queue_is_there_as_in_rays_module():
    from ray_lite.util.multiprocessing import JoinableQueue
    assert JoinableQueue is multiprocessing.JoinableQueue


def test_a_worker_that_dies_mid_map_raises_and_is_replaced(pool):
    with pytest.raises(RayActorError):
        pool.map(lambda x: die_at(x, 7), range(20), chunksize=5)
    with pytest.raises(RayActorError):
        pool.starmap(die_at, [(x, 7) for x in range(20)])
    # The dead worker is replaced: the pool works on.
    assert pool.map(square, range(10)) == [x * x for x in range(10)]
    assert len(set(pool.map(pid, range(8), chunksize=1))) == 2


@ray_lite.remote
class Victim:
    def ping(self):
        return "pong"


def test_a_dead_actor_called_by_the_function_is_not_the_workers_death(pool):
    victim = Victim.remote()
    ray_lite.kill(victim)
    workers = set(pool.map(pid, range(8), chunksize=1))
    with pytest.raises(RayActorError):
        pool.map(lambda x: ray_lite.get(victim.ping.remote()), range(4))
    with pytest.raises(RayActorError):
        pool.apply(lambda: ray_lite.get(victim.ping.remote()))
    assert set(pool.map(pid, range(8), chunksize=1)) == workers   # none replaced


def test_a_worker_that_dies_under_imap_fails_its_items(pool):
    # The items the dead worker held have its death as their result (as on
    # Ray); the others their value.
    got = list(pool.imap(lambda x: die_at(x, 3), range(6)))
    assert len(got) == 6 and isinstance(got[3], RayActorError)
    assert all(v == x or isinstance(v, RayActorError) for x, v in enumerate(got))
    assert pool.map(square, range(4), chunksize=1) == [0, 1, 4, 9]   # replaced


def test_maxtasksperchild_replaces_the_worker(rt):
    with Pool(1, maxtasksperchild=1) as p:
        pids = p.map(pid, range(4), chunksize=1)
        assert len(set(pids)) == 4
        assert p.apply(square, (3,)) == 9


def test_close_then_join_waits_for_the_work(rt):
    p = Pool(2)
    pending = p.map_async(square, range(50))
    it = p.imap(square, range(30))
    p.close()
    with pytest.raises(ValueError, match="not running"):
        p.map(square, [1])
    with pytest.raises(ValueError, match="not running"):
        p.apply_async(square, (1,))
    p.join()
    assert pending.ready() and pending.get() == [x * x for x in range(50)]
    assert list(it) == [x * x for x in range(30)]


def test_join_before_close_is_refused(pool):
    with pytest.raises(ValueError, match="still running"):
        pool.join()


def test_terminate_fails_pending_results(rt):
    p = Pool(1)
    q = Queue()
    blocked = p.apply_async(take_from, (q,))
    p.terminate()
    with pytest.raises(RayActorError):
        blocked.get(timeout=30)
    p.join()
    with pytest.raises(ValueError, match="not running"):
        p.map(square, [1])


def test_context_manager_terminates(rt):
    with Pool(2) as p:
        assert p.apply(square, (6,)) == 36
    with pytest.raises(ValueError, match="not running"):
        p.apply(square, (1,))
    with pytest.raises(ValueError, match="not running"):
        with p:
            pass


def test_starts_ray_lite_when_it_is_not_running():
    assert not ray_lite.is_initialized()
    try:
        with Pool(1) as p:
            assert ray_lite.is_initialized()
            assert p.map(square, [1, 2]) == [1, 4]
    finally:
        ray_lite.shutdown()


def test_default_size_is_the_cpu_count(rt):
    with Pool() as p:
        assert p._processes >= 1
        assert sorted(p.imap_unordered(square, range(5))) == [0, 1, 4, 9, 16]


@ray_lite.remote
def use_a_pool_inside_a_task(n):
    # A task's process has no thread reading answers in the background:
    # ready() itself must read them, or this loop would never end.
    import time
    with Pool(1) as p:
        result = p.apply_async(square, (n,))
        deadline = time.monotonic() + 30
        while not result.ready():
            if time.monotonic() > deadline:
                return "never ready"
        return result.get(), p.map(square, range(3))


def test_a_pool_inside_a_task(rt):
    assert ray_lite.get(use_a_pool_inside_a_task.remote(5), timeout=60) == (25, [0, 1, 4])


# -- a failing item's error reads like a failing task's ------------------------------

def assert_traceback_starts_at(exc, function_name, filename, line):
    """``exc`` is headed with ``function_name`` and its traceback's first frame
    is ``filename``:``line``; none of the runtime's frames is shown."""
    text = str(exc)
    assert text.startswith(f"ray_lite::{function_name}() (pid="), text
    frames = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("File ")]
    assert frames and frames[0].startswith(f'File "{filename}", line {line}, in '), text
    assert "<dynamic-code>" not in text and "_PoolWorker" not in text
    ray_lite_dir = os.path.dirname(ray_lite.__file__)
    assert not [f for f in frames if ray_lite_dir in f], text


def _raise_first_error(results):
    for result in results:
        if isinstance(result, Exception):
            raise result


def test_a_failing_items_traceback_starts_at_the_users_function(pool):
    # A local function travels by value (cloudpickle), as a function of a
    # script's __main__ does: its frames must keep their file and line.
    def check(x):
        if x == 3:
            raise KeyError(f"item {x}")
        return x
    raise_line = check.__code__.co_firstlineno + 2
    name = check.__qualname__
    for run in (lambda: pool.map(check, range(6), chunksize=2),
                lambda: _raise_first_error(pool.imap(check, range(6))),
                lambda: pool.starmap(check, [(x,) for x in range(6)]),
                lambda: pool.apply(check, (3,)),
                lambda: pool.apply_async(check, (3,)).get(timeout=60)):
        with pytest.raises(KeyError) as info:
            run()
        assert_traceback_starts_at(info.value, name, __file__, raise_line)
    assert pool.map(check, [1, 2]) == [1, 2]     # the pool goes on


def test_a_failing_initializers_traceback_starts_at_it(rt):
    def setup(x):
        return 1 / x
    with pytest.raises(RayActorError) as info:
        Pool(1, initializer=setup, initargs=(0,))
    text = str(info.value)
    assert "ZeroDivisionError" in text and "<dynamic-code>" not in text
    line = setup.__code__.co_firstlineno + 1
    assert f'File "{__file__}", line {line}, in {setup.__name__}' in text
    assert f"ray_lite::{setup.__qualname__}()" in text


_SCRIPT = '''\
import ray_lite
from ray_lite.util.multiprocessing import Pool


def work(x):
    if x == 3:
        raise ValueError(f"bad item {x}")
    return x


if __name__ == "__main__":
    ray_lite.init(num_cpus=2)
    try:
        with Pool(2) as pool:
            try:
                pool.map(work, range(6))
            except ValueError as exc:
                print(exc)
            else:
                print("no error")
    finally:
        ray_lite.shutdown()
'''


def test_a_scripts_function_fails_with_its_file_and_line(twin, tmp_path):
    # The case users meet: the function is in the script run as __main__.
    import subprocess
    import sys
    twin.check()
    script = tmp_path / "pool_script.py"
    script.write_text(_SCRIPT)
    env = dict(os.environ, RAY_LITE_NO_EXTENSIONS="0" if twin.compiled else "1")
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert_traceback_starts_at(out.stdout.strip(), "work", str(script), 7)
    assert 'raise ValueError(f"bad item {x}")' in out.stdout
    assert out.stdout.rstrip().endswith("ValueError: bad item 3")
