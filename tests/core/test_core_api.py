"""Core runtime: init, tasks, objects, errors, options."""
import os
import pickle
import signal
import sys
import warnings

import pytest

import ray_lite as ray
from ray_lite.exceptions import (ActorDiedError, GetTimeoutError, RayError, RayTaskError,
                                 TaskCancelledError, WorkerCrashedError)

# Public API only: these run on Ray too (--backend=ray; see conftest.py).
pytestmark = pytest.mark.both_backends

T = 60  # bound on every wait: a bug fails the test instead of hanging it


@ray.remote
def double(x):
    return 2 * x


@ray.remote
def add(a, b=0):
    return a + b


@ray.remote
def fail(msg):
    raise ValueError(msg)


class CustomError(Exception):
    pass


class UnpicklableError(Exception):
    def __init__(self, msg, code):   # pickles, but cannot be rebuilt from its args
        super().__init__(msg)
        self.code = code


@ray.remote
def fail_custom():
    err = CustomError("custom")
    err.code = 7
    raise err


@ray.remote
def fail_unpicklable():
    raise UnpicklableError("odd", 1)


@pytest.mark.local_only
def test_init_shutdown_and_reinit():
    assert not ray.is_initialized()
    ray.init(num_cpus=1)
    try:
        assert ray.is_initialized()
        with pytest.raises(RuntimeError, match="ignore_reinit_error"):
            ray.init(num_cpus=1)
        ray.init(num_cpus=1, ignore_reinit_error=True)
        assert ray.get(double.remote(2), timeout=T) == 4
    finally:
        ray.shutdown()
    assert not ray.is_initialized()
    ray.shutdown()  # idempotent


@pytest.mark.local_only
def test_init_returns_a_context_that_shuts_down_on_exit():
    # Ray's RayContext: address_info (and the deprecated ctx["..."]), the
    # versions, a context manager; ignore_reinit_error gives one too.
    with ray.init(num_cpus=1) as ctx:
        assert ray.is_initialized()
        assert ctx.address_info["node_id"] == ray.get_runtime_context().get_node_id()
        assert ctx["address"] == "local" and dict(ctx) == ctx.address_info
        assert ctx.ray_version == ray.__version__ and ctx.dashboard_url is None
        again = ray.init(ignore_reinit_error=True)
        assert again.address_info == ctx.address_info
        assert ray.get(double.remote(2), timeout=T) == 4
    assert not ray.is_initialized()


@pytest.mark.local_only
def test_first_remote_starts_the_runtime():
    assert not ray.is_initialized()
    try:
        ref = double.remote(5)
        assert ray.is_initialized()
        assert ray.get(ref, timeout=T) == 10
    finally:
        ray.shutdown()


@pytest.mark.local_only
def test_init_refuses_what_it_cannot_honour():
    with pytest.raises(ValueError, match="runtime_env"):
        ray.init(runtime_env={"pip": ["x"]})
    try:
        import ray as real_ray  # noqa: F401
    except ImportError:
        # a Ray address means the Ray backend, which needs the 'ray' extra
        with pytest.raises(ImportError, match=r"ray_lite\[ray\]"):
            ray.init(address="ray://somewhere:10001")
    with pytest.raises(TypeError, match="no_such_option"):
        ray.init(no_such_option=1)
    assert not ray.is_initialized()


def test_tasks_and_options(rt):
    assert ray.get(double.remote(21), timeout=T) == 42
    assert ray.get([double.remote(i) for i in range(20)], timeout=T) == [2 * i for i in range(20)]
    assert ray.get(add.remote(1, b=2), timeout=T) == 3
    assert ray.get(double.options(name="d2", max_retries=0).remote(4), timeout=T) == 8

    @ray.remote(num_returns=2)
    def pair(x):
        return x, x + 1
    a, b = pair.remote(1)
    assert ray.get([a, b], timeout=T) == [1, 2]
    assert ray.get(pair.options(num_returns=1).remote(3), timeout=T) == (3, 4)


def test_remote_function_cannot_be_called_directly():
    with pytest.raises(TypeError, match=r"double.remote\(\)"):
        double(1)


@pytest.mark.local_only
def test_objectref_semantics(rt):
    r = ray.put({"a": [1, 2]})
    assert ray.get(r) == {"a": [1, 2]}
    assert hash(r) == hash(pickle.loads(pickle.dumps(r)))
    assert r == pickle.loads(pickle.dumps(r))
    assert len({r, r, ray.put(1)}) == 2
    with pytest.raises(TypeError, match="put"):
        ray.put(r)
    with pytest.raises(TypeError):
        ray.get(5)


def test_refs_as_arguments(rt):
    x = ray.put(10)
    # A top-level ref argument arrives as its value...
    assert ray.get(add.remote(x, b=double.remote(1)), timeout=T) == 12

    # ...a nested one as a ref that the task can get.
    @ray.remote
    def total(refs):
        assert all(isinstance(r, ray.ObjectRef) for r in refs)
        return sum(ray.get(refs))
    assert ray.get(total.remote([x, double.remote(5)]), timeout=T) == 20

    # A chain of dependencies resolves before each call.
    r = ray.put(1)
    for _ in range(5):
        r = double.remote(r)
    assert ray.get(r, timeout=T) == 32


def test_nested_tasks_do_not_deadlock_the_pool(rt):
    @ray.remote
    def outer(n):
        return sum(ray.get([double.remote(i) for i in range(n)]))
    # More outer tasks than workers, each blocked in get on inner tasks.
    assert ray.get([outer.remote(3) for _ in range(4)], timeout=T) == [6] * 4

    @ray.remote
    def deep(n):
        return 0 if n == 0 else 1 + ray.get(deep.remote(n - 1))
    assert ray.get(deep.remote(4), timeout=T) == 4


@pytest.mark.local_only
def test_task_error_is_the_user_exception_with_traceback(rt):
    with pytest.raises(ValueError, match="bad input") as info:
        ray.get(fail.remote("bad input"), timeout=T)
    err = info.value
    assert isinstance(err, RayTaskError) and isinstance(err, RayError)
    assert "fail" in str(err) and "raise ValueError(msg)" in str(err)
    with pytest.raises(CustomError) as info:
        ray.get(fail_custom.remote(), timeout=T)
    assert info.value.code == 7
    assert isinstance(info.value.cause, CustomError)
    # An exception that cannot be rebuilt still arrives, as text.
    with pytest.raises(RayTaskError, match="UnpicklableError"):
        ray.get(fail_unpicklable.remote(), timeout=T)
    # An error flows through a dependent task.
    with pytest.raises(ValueError):
        ray.get(double.remote(fail.remote("x")), timeout=T)


def _failing_helper():
    raise KeyError("from the helper")


@ray.remote
class FailsEveryWay:
    def sync(self):
        _failing_helper()

    def stream(self):
        yield 1
        _failing_helper()


@ray.remote
class FailsAsync:
    async def coro(self):
        _failing_helper()


@pytest.mark.local_only
def test_a_remote_traceback_starts_at_the_users_code(rt):
    # The runtime's frames that call the task (the task runner, an actor's
    # loop, the stream's drain) are left out, as Ray leaves out its own.
    @ray.remote
    def task():
        _failing_helper()

    actor = FailsEveryWay.remote()
    threaded = FailsEveryWay.options(max_concurrency=2).remote()
    gen = actor.stream.options(num_returns="streaming").remote()
    assert ray.get(next(gen), timeout=T) == 1
    for ref in (task.remote(), actor.sync.remote(), FailsAsync.remote().coro.remote(),
                threaded.sync.remote(), next(gen)):
        with pytest.raises(RayTaskError) as info:
            ray.get(ref, timeout=T)
        frames = [ln.strip() for ln in info.value.traceback_str.splitlines()
                  if ln.strip().startswith('File "')]
        assert frames and all(__file__ in f for f in frames), frames
        assert "_failing_helper()" in str(info.value) and "from the helper" in str(info.value)


@ray.remote
def raise_this(err):
    raise err


def test_a_remote_os_error_is_that_os_error(rt):
    # OSError's subclasses have a layout only OSError.__new__ makes: they came
    # back as a RayTaskError(RuntimeError) carrying the text.
    for err in (FileNotFoundError(2, "no such file"), TimeoutError("slow"),
                ConnectionResetError("reset"), OSError("plain")):
        with pytest.raises(type(err)) as info:
            ray.get(raise_this.remote(err), timeout=T)
        assert isinstance(info.value, RayTaskError) and type(info.value.cause) is type(err)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception groups are Python 3.11's")
def test_a_remote_exception_group_keeps_its_exceptions(rt):
    group = ExceptionGroup("two", [ValueError("v"), TypeError("t")])  # noqa: F821 (3.11+)
    with pytest.raises(ExceptionGroup) as info:  # noqa: F821
        ray.get(raise_this.remote(group), timeout=T)
    assert [type(e) for e in info.value.exceptions] == [ValueError, TypeError]


def test_get_of_many_raises_a_failure_without_waiting_for_the_rest(rt):
    @ray.remote
    def block():
        import time
        time.sleep(300)   # the workload, not synchronisation: it is cancelled below
    slow = block.remote()
    try:
        # As Ray's: the failed ref raises at once; it waited for every ref.
        with pytest.raises(ValueError, match="early"):
            ray.get([slow, fail.remote("early"), double.remote(1)], timeout=T)
        failed = fail.remote("already")
        with pytest.raises(ValueError):
            ray.get(failed, timeout=T)
        with pytest.raises(ValueError, match="already"):
            ray.get([slow, failed], timeout=T)
    finally:
        ray.cancel(slow, force=True)


@pytest.mark.local_only
def test_wait_on_ready_refs_answers_in_list_order(rt):
    # (Ray's order of ready refs is its own: not the list's.)
    refs = [ray.put(i) for i in range(5)]
    ready, not_ready = ray.wait(refs, num_returns=3, timeout=0)
    assert ready == refs[:3] and not_ready == refs[3:]
    ready, not_ready = ray.wait(refs[::-1], num_returns=2)
    assert ready == refs[:2:-1] and not_ready == refs[2::-1]
    assert ray.wait([refs[0]], timeout=0) == ([refs[0]], [])
    mine = refs[:2]
    ready, not_ready = ray.wait(mine, num_returns=2)
    assert ready == mine and ready is not mine and not_ready == []     # a list of its own


def test_wait_takes_refs_and_generators_together(rt):
    r = ray.put(1)
    gen = ray.remote(lambda: (yield 1)).options(num_returns="streaming").remote()
    ready, not_ready = ray.wait([r, gen], num_returns=2, timeout=T)
    assert set(ready) == {r, gen} and not_ready == []


def test_wait_refuses_bad_input_with_rays_errors(rt):
    r, s = ray.put(1), ray.put(2)
    with pytest.raises(TypeError, match="expected a list of ray.ObjectRef or "
                                        "ray.ObjectRefGenerator, got a single ray.ObjectRef"):
        ray.wait(r)
    assert ray.wait((r, s), num_returns=2, timeout=T)[1] == []      # any iterable (both backends)
    with pytest.raises(TypeError, match="got list containing <class 'int'>"):
        ray.wait([r, 3])
    with pytest.raises(ValueError, match="unique ray_waitables"):
        ray.wait([r, s, r])
    with pytest.raises(ValueError, match="unique ray_waitables"):
        ray.wait([r, pickle.loads(pickle.dumps(r))])       # two refs to one object
    with pytest.raises(ValueError, match="num_returns cannot be greater than the number of "
                                         "ray_waitables"):
        ray.wait([r, s], num_returns=3)
    with pytest.raises(ValueError, match="'timeout' argument must be nonnegative. Received -1"):
        ray.wait([r], timeout=-1)


def test_get_timeout_and_wait(rt):
    @ray.remote
    def block():
        import time
        time.sleep(300)   # the workload, not synchronisation: it is cancelled below
    slow = block.remote()
    fast = double.remote(1)
    with pytest.raises(GetTimeoutError):
        ray.get(slow, timeout=0.05)
    ready, not_ready = ray.wait([slow, fast], num_returns=1, timeout=T)
    assert ready == [fast] and not_ready == [slow]
    ready, not_ready = ray.wait([slow, fast], num_returns=2, timeout=0.05)
    assert ready == [fast] and not_ready == [slow]
    ready, not_ready = ray.wait([slow], timeout=0)
    assert ready == [] and not_ready == [slow]
    with pytest.raises(ValueError):
        ray.wait([fast], num_returns=2)
    with pytest.raises(ValueError, match="Invalid number of objects to return 0"):
        ray.wait([fast], num_returns=0)
    assert ray.wait([]) == ([], []) and ray.wait([], num_returns=0) == ([], [])   # as Ray
    ray.cancel(slow, force=True)
    with pytest.raises(TaskCancelledError):
        ray.get(slow, timeout=T)
    # The pool replaced the killed worker.
    assert ray.get(double.remote(3), timeout=T) == 6


def test_cancel_queued_task(rt):
    @ray.remote
    def block():
        import time
        time.sleep(300)
    blockers = [block.remote() for _ in range(2)]
    queued = double.remote(1)
    ray.cancel(queued)
    with pytest.raises(TaskCancelledError):
        ray.get(queued, timeout=T)
    for b in blockers:
        ray.cancel(b, force=True)


@pytest.mark.local_only
def test_unserialisable_argument_and_result(rt):
    import threading
    with pytest.raises(TypeError, match="serialize"):
        double.remote(threading.Lock())

    @ray.remote
    def bad_result():
        return threading.Lock()
    with pytest.raises(TypeError, match="serialize"):
        ray.get(bad_result.remote(), timeout=T)
    # The worker lives on.
    assert ray.get([double.remote(i) for i in range(4)], timeout=T) == [0, 2, 4, 6]


@pytest.mark.local_only
def test_a_generator_cannot_be_passed_on_and_the_error_says_what_to_pass(rt):
    """As in Ray, an ObjectRefGenerator stays in the process that made the
    call; its refs travel."""
    import pickle

    @ray.remote
    def count(n):
        yield from range(n)

    gen = count.remote(2)
    for attempt in (lambda: double.remote([gen]), lambda: ray.put(gen),
                    lambda: pickle.dumps(gen)):
        with pytest.raises(TypeError, match="ObjectRefGenerator cannot be passed"):
            attempt()
    assert ray.get(double.remote(next(gen)), timeout=T) == 0
    assert ray.get(list(gen), timeout=T) == [1]


@pytest.mark.local_only
def test_an_actor_method_with_an_unserialisable_result_raises_and_the_actor_lives_on(rt):
    import threading

    @ray.remote
    class Keeper:
        def lock(self):
            return threading.Lock()

        def echo(self, x):
            return x
    k = Keeper.remote()
    assert ray.get(k.echo.remote(1), timeout=T) == 1     # its method is bound and cached now
    with pytest.raises(TypeError, match="could not serialize the result of Keeper.lock"):
        ray.get(k.lock.remote(), timeout=T)
    assert ray.get([k.echo.remote(i) for i in range(3)], timeout=T) == [0, 1, 2]


def test_remote_with_empty_parentheses_is_refused():
    # As Ray: @remote() is neither the bare decorator nor one with options.
    with pytest.raises(AssertionError, match="no arguments and no parentheses"):
        @ray.remote()
        def f():
            pass


@ray.remote
class Signed:
    def __init__(self, a, *, label="x"):
        self.a = a

    def take(self, x, y=1):
        return x + y

    @staticmethod
    def twice(x):
        return 2 * x

    def rest(self, *xs, k):
        return sum(xs) + k


@ray.remote
class NoInit:
    def ping(self):
        return "pong"


def test_arguments_are_bound_at_the_call(rt):
    # As Ray: a call whose arguments do not fit the signature raises at
    # .remote(), with inspect.Signature.bind's message; nothing is started.
    with pytest.raises(TypeError, match="missing a required argument: 'a'"):
        add.remote()
    with pytest.raises(TypeError, match="too many positional arguments"):
        add.remote(1, 2, 3)
    with pytest.raises(TypeError, match="unexpected keyword argument 'c'"):
        add.remote(1, c=2)
    with pytest.raises(TypeError, match="too many positional arguments"):
        add.options(num_cpus=1).remote(1, 2, 3)
    assert ray.get([add.remote(1), add.remote(1, 2), add.remote(1, b=3), add.remote(a=4)],
                   timeout=T) == [1, 3, 4, 4]

    with pytest.raises(TypeError, match="missing a required argument: 'a'"):
        Signed.remote()
    with pytest.raises(TypeError, match="unexpected keyword argument 'lable'"):
        Signed.remote(1, lable="y")
    with pytest.raises(TypeError, match="too many positional arguments"):
        NoInit.remote(1)
    s = Signed.remote(1, label="y")
    with pytest.raises(TypeError, match="missing a required argument: 'x'"):
        s.take.remote()
    with pytest.raises(TypeError, match="too many positional arguments"):
        s.take.options(num_returns=1).remote(1, 2, 3)
    with pytest.raises(TypeError, match="missing a required argument: 'x'"):
        s.twice.remote()
    with pytest.raises(TypeError, match="missing a required argument: 'k'"):
        s.rest.remote(1, 2)
    assert ray.get([s.take.remote(1), s.take.remote(1, y=5), s.twice.remote(4),
                    s.rest.remote(1, 2, k=3), NoInit.remote().ping.remote()],
                   timeout=T) == [2, 6, 8, 6, "pong"]


@ray.remote
def use_passed_handle(h):
    try:
        h.take.remote(1, 2, 3)
    except TypeError as err:
        return str(err)
    return "no error"


def test_arguments_are_bound_at_the_call_through_a_passed_handle(rt):
    # A process holding only the handle (no class) checks too.
    s = Signed.remote(1)
    assert ray.get(use_passed_handle.remote(s), timeout=T) == "too many positional arguments"


@pytest.mark.local_only
def test_options_accepted_and_refused(rt):
    ok = double.options(num_cpus=1, num_gpus=0, resources={}, scheduling_strategy="SPREAD",
                        memory=10)
    assert ray.get(ok.remote(1), timeout=T) == 2
    with pytest.raises(ValueError, match="runtime_env"):
        double.options(runtime_env={"pip": ["requests"]})
    with pytest.raises(ValueError, match="placement_group"):
        double.options(placement_group=object())
    with pytest.raises(ValueError, match="num_gpus"):
        double.options(num_gpus=1)
    with pytest.raises(ValueError, match="dynamic.*only be used with generator"), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)     # "dynamic" is deprecated too
        double.options(num_returns="dynamic")       # as Ray: a generator's option
    with pytest.raises(ValueError, match="Invalid option"):
        double.options(not_an_option=3)
    # Declared with a GPU, as Ray allows (its task would wait for a GPU node):
    # refused when called, so that a module declaring one still imports.
    gpu_task = ray.remote(num_gpus=1)(lambda: 1)
    gpu_actor = ray.remote(num_gpus=1, accelerator_type="A100")(type("G", (), {}))
    with pytest.raises(ValueError, match="num_gpus=1"):
        gpu_task.remote()
    with pytest.raises(ValueError, match="num_gpus=1|accelerator_type"):
        gpu_actor.remote()
    with pytest.raises(ValueError, match="Invalid option"):
        ray.remote(not_an_option=3)(lambda: 1)      # what Ray refuses too: at once


@pytest.mark.local_only
def test_options_are_made_once_per_set_of_options(rt):
    # f.options(...) per call must not cost a class each time: the same
    # options give back the same bound object, other options another one.
    first = double.options(name="twice", max_retries=0)
    assert double.options(name="twice", max_retries=0) is first
    other = double.options(name="thrice")
    assert other is not first
    assert ray.get([first.remote(2), other.remote(3)], timeout=T) == [4, 6]
    # Equal but not equally valid values are told apart, and refused each time.
    @ray.remote(num_returns=2)
    def pair(x):
        return x, x + 1
    assert ray.get(pair.options(num_returns=1).remote(3), timeout=T) == (3, 4)
    for _ in range(2):
        with pytest.raises(TypeError, match="num_returns"):      # Ray's type
            pair.options(num_returns=1.0)
    # Unhashable values work (they are just not kept).
    assert ray.get(double.options(resources={}).remote(5), timeout=T) == 10

    @ray.remote
    class Box:
        def __init__(self, v):
            self.v = v

        def get(self):
            return self.v
    bound = Box.options(max_concurrency=2)
    assert Box.options(max_concurrency=2) is bound
    assert ray.get(bound.remote(7).get.remote(), timeout=T) == 7
    with pytest.raises(ValueError, match="max_concurrency"):
        Box.options(max_concurrency=0)


def test_worker_crash_is_retried_or_reported(rt, tmp_path):
    marker = tmp_path / "crashed-once"

    @ray.remote(max_retries=1)
    def crash_once(path):
        if not os.path.exists(path):
            open(path, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return "survived"
    assert ray.get(crash_once.remote(str(marker)), timeout=T) == "survived"

    @ray.remote(max_retries=0)
    def crash():
        os.kill(os.getpid(), signal.SIGKILL)
    with pytest.raises(WorkerCrashedError):
        ray.get(crash.remote(), timeout=T)
    assert ray.get(double.remote(2), timeout=T) == 4


def test_sys_exit_in_a_task_is_a_worker_crash(rt):
    # As in Ray: the worker ends (it sent RayTaskError(SystemExit) first).
    @ray.remote(max_retries=0)
    def leave():
        sys.exit(3)
    with pytest.raises(WorkerCrashedError):
        ray.get(leave.remote(), timeout=T)
    assert ray.get(double.remote(2), timeout=T) == 4


def test_sys_exit_in_an_actor_method_ends_the_actor(rt):
    @ray.remote
    class Leaver:
        def leave(self):
            sys.exit(0)

        def ping(self):
            return "pong"
    a = Leaver.remote()
    assert ray.get(a.ping.remote(), timeout=T) == "pong"
    with pytest.raises(ActorDiedError):       # an intended exit, as exit_actor()'s
        ray.get(a.leave.remote(), timeout=T)
    with pytest.raises(ActorDiedError):
        ray.get(a.ping.remote(), timeout=T)


def test_a_task_failed_by_a_dead_actors_result_is_a_task_error_of_both_classes(rt):
    @ray.remote
    class Leaver:
        def leave(self):
            sys.exit(0)

    @ray.remote
    def consume(x):
        return x

    @ray.remote
    def get_inside(ref_in_list):
        return ray.get(ref_in_list[0], timeout=T)
    dead = Leaver.remote().leave.remote()
    # As in Ray: RayTaskError(ActorDiedError), caught by either class (it was
    # the bare ActorDiedError, which `except RayTaskError` missed).
    for ref in (consume.remote(dead), get_inside.remote([dead])):
        with pytest.raises(ActorDiedError) as info:
            ray.get(ref, timeout=T)
        assert isinstance(info.value, RayTaskError)


def test_keyboard_interrupt_raised_in_a_task_is_a_cancelled_task(rt):
    @ray.remote
    def interrupted():
        raise KeyboardInterrupt
    err = None
    try:
        ray.get(interrupted.remote(), timeout=T)
    except BaseException as exc:      # (not pytest.raises: a KeyboardInterrupt ends pytest)
        err = exc
    # As in Ray: RayTaskError(TaskCancelledError).  It was an error that was
    # also a KeyboardInterrupt, which stops the caller as a Ctrl-C would.
    assert isinstance(err, TaskCancelledError) and isinstance(err, RayTaskError)
    assert not isinstance(err, KeyboardInterrupt)


def test_large_numpy_round_trip(rt):
    np = pytest.importorskip("numpy")
    a = np.arange(1 << 18, dtype=np.float64)
    r = double.remote(a)
    out = ray.get(r, timeout=T)
    assert out.shape == a.shape and float(out[-1]) == 2 * float(a[-1])


@pytest.mark.local_only
def test_worker_output_is_prefixed(capfd):
    ray.init(num_cpus=1)
    try:
        @ray.remote
        def shout():
            print("hello from a task")
            return os.getpid()
        pid = ray.get(shout.remote(), timeout=T)
    finally:
        ray.shutdown()  # the zygote relays everything before it exits
    out = capfd.readouterr().out
    assert f"(pid={pid}) hello from a task" in out


def test_the_older_private_remote_form(rt):
    # Ray's f._remote(args=..., kwargs=..., **options), which libraries call.
    assert ray.get(add._remote(args=[1], kwargs={"b": 2}, num_cpus=1), timeout=T) == 3
    assert ray.get(add._remote(args=[5]), timeout=T) == 5
    s = Signed._remote(args=[1], kwargs={"label": "y"}, max_concurrency=1)
    assert ray.get(s.take.remote(1), timeout=T) == 2
    assert ray.get(s.take._remote(args=[1], kwargs={"y": 5}), timeout=T) == 6
    assert ray.get(s.rest._remote(args=[1, 2], kwargs={"k": 3}, num_returns=1), timeout=T) == 6


@ray.remote
def _call_the_method(method, x):
    return ray.get(method.remote(x))


def test_an_actor_method_passes_to_a_task(rt):
    # As Ray: a bound method travels as its handle and name (with its options).
    s = Signed.remote(1)
    assert ray.get(_call_the_method.remote(s.take, 4), timeout=T) == 5
    assert ray.get(_call_the_method.remote(s.twice, 4), timeout=T) == 8
    assert ray.get(_call_the_method.remote([s.take][0], 0), timeout=T) == 1


def test_rays_other_top_level_names():
    # Reachable after `import ray` in Ray: the worker modes, Ray's
    # cloudpickle, and these modules.
    assert (ray.SCRIPT_MODE, ray.WORKER_MODE, ray.SPILL_WORKER_MODE,
            ray.RESTORE_WORKER_MODE) == (0, 1, 2, 3)
    assert ray.cloudpickle.loads(ray.cloudpickle.dumps(lambda x: x + 1))(2) == 3
    assert ray.runtime_context.get_runtime_context is ray.get_runtime_context
    assert callable(ray.dag.InputNode)
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        ray.not_a_name     # noqa: B018


def test_rays_raylet_names():
    from ray_lite import _raylet
    assert _raylet.ObjectRefGenerator is ray.ObjectRefGenerator
    assert _raylet.ObjectRef is ray.ObjectRef and _raylet.NodeID is ray.NodeID
