"""Fault tolerance one machine can honour: task retries, actor restarts,
runtime_env env_vars (issue 11)."""
import os

import pytest

import ray_lite as ray
from ray_lite.exceptions import ActorDiedError, RayActorError, RayTaskError, WorkerCrashedError

T = 30


def _bump(path):
    """Count a run in file ``path``; the count before this run."""
    n = int(open(path).read()) if os.path.exists(path) else 0
    with open(path, "w") as f:
        f.write(str(n + 1))
    return n


def _count(path):
    return int(open(path).read()) if os.path.exists(path) else 0


@ray.remote
def fail_until(path, good_run, exc_type):
    n = _bump(path)
    if n < good_run:
        raise exc_type(f"run {n}")
    return n


@ray.remote
def die_until(path, good_run):
    if _bump(path) < good_run:
        os._exit(1)
    return "survived"


@ray.remote
def yield_failing(path, good_run, exc_type, n=5, fail_at=3):
    run = _bump(path)
    for i in range(n):
        if i == fail_at and run < good_run:
            raise exc_type(f"run {run}")
        yield (i, run)


# ------------------------------------------------------------------ tasks
def test_a_streaming_task_is_run_again_from_its_start(rt, tmp_path):
    # As Ray: the items the failed run reported are not reported again; the
    # consumer sees each index once (here it took some before the failure).
    path = str(tmp_path / "runs")
    gen = yield_failing.options(max_retries=3, retry_exceptions=[KeyError]).remote(
        path, 2, KeyError)
    first = ray.get(next(gen), timeout=T)
    assert first == (0, 0)
    rest = [ray.get(ref, timeout=T) for ref in gen]
    assert [first] + rest == [(0, 0), (1, 0), (2, 0), (3, 2), (4, 2)]
    assert _count(path) == 3
    # A stream a task owns (its items pass through the driver) likewise.
    nested = str(tmp_path / "nested")
    assert ray.get(_consume_failing.remote(nested), timeout=T) == \
        [(0, 0), (1, 0), (2, 0), (3, 1), (4, 1)]


@ray.remote
def _consume_failing(path):
    gen = yield_failing.options(max_retries=3, retry_exceptions=True).remote(path, 1, KeyError)
    return [ray.get(ref) for ref in gen]


def test_a_streaming_task_not_retried_ends_with_its_error(rt, tmp_path):
    for opts, runs in ((dict(max_retries=3, retry_exceptions=[KeyError]), 1),   # not listed
                       (dict(max_retries=1, retry_exceptions=True), 2)):      # used up
        path = str(tmp_path / f"runs{runs}")
        gen = yield_failing.options(**opts).remote(path, 10, IndexError)
        got = [ray.get(next(gen), timeout=T) for _ in range(3)]
        assert [i for i, _ in got] == [0, 1, 2]
        with pytest.raises(IndexError, match=f"run {runs - 1}"):
            ray.get(next(gen), timeout=T)
        with pytest.raises(StopIteration):
            next(gen)
        assert _count(path) == runs


@ray.remote
def yield_dying(path, good_run, n=5, die_at=3):
    run = _bump(path)
    for i in range(n):
        if i == die_at and run < good_run:
            os._exit(1)
        yield (i, run)


@pytest.mark.parametrize("window", [-1, 1])
def test_a_streaming_task_whose_worker_died_is_run_again_without_repeats(rt, tmp_path, window):
    # As Ray reruns a generator after a system failure: the items the dead
    # run reported are not reported again (they were: "item 0 reported
    # twice" reached the consumer), and with a back-pressure window the new
    # run is told what was taken already instead of waiting for it.
    # (The new run's worker is the producer: acks of items taken later go
    # to it, not to the dead one.)
    path = str(tmp_path / "runs")
    gen = yield_dying.options(max_retries=2, _generator_backpressure_num_objects=window).remote(
        path, 1)
    got = [ray.get(_next(gen), timeout=T) for _ in range(5)]
    assert [i for i, _ in got] == [0, 1, 2, 3, 4]
    assert [run for _, run in got[3:]] == [1, 1] and _count(path) == 2
    with pytest.raises(StopIteration):
        _next(gen)
    # Out of retries: the items so far, then the crash.
    path2 = str(tmp_path / "runs2")
    gen = yield_dying.options(max_retries=1).remote(path2, 5)
    assert [ray.get(_next(gen), timeout=T) for _ in range(3)] == [(0, 0), (1, 0), (2, 0)]
    with pytest.raises(WorkerCrashedError):
        ray.get(_next(gen), timeout=T)
    assert _count(path2) == 2


def _next(gen):
    """``next(gen)``, bounded: a test fails instead of hanging."""
    ref = gen._next_sync(timeout_s=T)
    assert not ref.is_nil(), "no next item in time"
    return ref


def test_retry_exceptions_true_retries_application_errors(rt, tmp_path):
    path = str(tmp_path / "runs")
    ref = fail_until.options(max_retries=3, retry_exceptions=True).remote(path, 2, KeyError)
    assert ray.get(ref, timeout=T) == 2
    assert _count(path) == 3


def test_retries_used_up_raise_the_last_error(rt, tmp_path):
    path = str(tmp_path / "runs")
    ref = fail_until.options(max_retries=2, retry_exceptions=True).remote(path, 10, KeyError)
    with pytest.raises(KeyError, match="run 2"):
        ray.get(ref, timeout=T)
    assert _count(path) == 3


def test_retry_exceptions_list_retries_only_those(rt, tmp_path):
    listed, other = str(tmp_path / "listed"), str(tmp_path / "other")
    opts = dict(max_retries=3, retry_exceptions=[KeyError, IndexError])
    assert ray.get(fail_until.options(**opts).remote(listed, 1, IndexError), timeout=T) == 1
    with pytest.raises(ValueError):
        ray.get(fail_until.options(**opts).remote(other, 1, ValueError), timeout=T)
    assert _count(other) == 1


def test_without_retry_exceptions_errors_are_not_retried(rt, tmp_path):
    path = str(tmp_path / "runs")
    with pytest.raises(RayTaskError):
        ray.get(fail_until.remote(path, 1, KeyError), timeout=T)
    assert _count(path) == 1


def test_max_retries_on_a_dying_worker(rt, tmp_path):
    path = str(tmp_path / "runs")
    assert ray.get(die_until.options(max_retries=2).remote(path, 2), timeout=T) == "survived"
    path2 = str(tmp_path / "runs2")
    with pytest.raises(WorkerCrashedError):
        ray.get(die_until.options(max_retries=1).remote(path2, 5), timeout=T)
    assert _count(path2) == 2
    # Ray's default is 3 retries.
    path3 = str(tmp_path / "runs3")
    assert ray.get(die_until.remote(path3, 3), timeout=T) == "survived"


def test_nested_task_retries_exceptions(rt, tmp_path):
    @ray.remote
    def parent(path):
        return ray.get(fail_until.options(max_retries=1, retry_exceptions=True)
                       .remote(path, 1, KeyError), timeout=T)
    assert ray.get(parent.remote(str(tmp_path / "n")), timeout=T) == 1


def test_bad_retry_options_are_refused():
    for value in ("yes", [ValueError, "x"], [], 3):
        with pytest.raises(ValueError, match="retry_exceptions"):
            fail_until.options(retry_exceptions=value)
    # Ray's checks and words: the wrong type is a TypeError.
    with pytest.raises(ValueError, match="The keyword 'max_retries' only accepts None, 0, -1"):
        fail_until.options(max_retries=-2)
    for key in ("max_retries", "num_returns"):
        with pytest.raises(TypeError, match=f"The type of keyword '{key}' must be"):
            fail_until.options(**{key: 0.5})
    with pytest.raises(ValueError, match="The keyword 'num_returns' only accepts None"):
        fail_until.options(num_returns=-1)


def test_none_is_rays_default_for_counting_options(tmp_path):
    ray.init(num_cpus=1)
    try:
        assert ray.get(read_env.options(max_retries=None, num_returns=None).remote("X"),
                       timeout=T) == [None]
        a = Phoenix.options(max_restarts=None, max_task_retries=None,
                            max_concurrency=None).remote(str(tmp_path / "n"))
        assert ray.get(a.who.remote(), timeout=T)[0] == 0
    finally:
        ray.shutdown()


# ----------------------------------------------------------------- actors
@ray.remote
class Phoenix:
    def __init__(self, path):
        self.path = path
        self.incarnation = _bump(path)

    def who(self):
        return self.incarnation, os.getpid()

    def die(self):
        os._exit(1)

    def die_first_time(self, marker):
        if _bump(marker) == 0:
            os._exit(1)
        return self.incarnation

    def die_then_raise(self, marker):
        if _bump(marker) == 0:
            os._exit(1)
        raise KeyError("after the restart")


def test_a_crashed_actor_is_restarted_and_its_constructor_rerun(rt, tmp_path):
    path = str(tmp_path / "inits")
    a = Phoenix.options(max_restarts=1).remote(path)
    first, pid1 = ray.get(a.who.remote(), timeout=T)
    assert first == 0
    with pytest.raises(RayActorError):        # the call in flight fails
        ray.get(a.die.remote(), timeout=T)
    second, pid2 = ray.get(a.who.options(max_task_retries=-1).remote(), timeout=T)
    assert (second, pid2 != pid1) == (1, True)
    assert _count(path) == 2
    # Its restarts used up, it is dead for good.
    with pytest.raises(RayActorError):
        ray.get(a.die.remote(), timeout=T)
    with pytest.raises(ActorDiedError):
        ray.get(a.who.remote(), timeout=T)
    assert _count(path) == 2


def test_max_task_retries_retries_the_calls_in_flight(rt, tmp_path):
    a = Phoenix.options(max_restarts=2, max_task_retries=1).remote(str(tmp_path / "inits"))
    marker = str(tmp_path / "marker")
    assert ray.get(a.die_first_time.remote(marker), timeout=T) == 1
    assert _count(marker) == 2


def test_a_call_out_of_retries_fails(rt, tmp_path):
    a = Phoenix.options(max_restarts=-1, max_task_retries=1).remote(str(tmp_path / "inits"))
    # Dies on every run: the first run and its one retry.
    with pytest.raises(RayActorError, match="max_task_retries"):
        ray.get(a.die.remote(), timeout=T)
    # max_restarts=-1: the actor lives on.
    assert ray.get(a.who.remote(), timeout=T)[0] == 2


def test_kill_forbids_a_restart_unless_asked(rt, tmp_path):
    a = Phoenix.options(max_restarts=3, name="phoenix").remote(str(tmp_path / "a"))
    _, pid1 = ray.get(a.who.remote(), timeout=T)
    ray.kill(a, no_restart=False)
    n, pid2 = ray.get(a.who.options(max_task_retries=-1).remote(), timeout=T)
    assert (n, pid2 != pid1) == (1, True)
    assert ray.get(ray.get_actor("phoenix").who.remote(), timeout=T) == (1, pid2)
    ray.kill(a)
    with pytest.raises(RayActorError):
        ray.get(a.who.remote(), timeout=T)
    with pytest.raises(ValueError):
        ray.get_actor("phoenix")


def test_the_call_right_after_kill_without_no_restart_reaches_the_new_actor(rt, tmp_path):
    # As in Ray, without max_task_retries: the call is not lost to the dead
    # incarnation (it failed with ActorDiedError).
    a = Phoenix.options(max_restarts=1).remote(str(tmp_path / "inits"))
    _, pid1 = ray.get(a.who.remote(), timeout=T)
    ray.kill(a, no_restart=False)
    n, pid2 = ray.get(a.who.remote(), timeout=T)
    assert n == 1 and pid2 != pid1
    ray.kill(a, no_restart=False)       # its restarts are used up: dead for good
    with pytest.raises(RayActorError):
        ray.get(a.who.remote(), timeout=T)


def test_a_restarted_actor_is_reached_from_a_task(rt, tmp_path):
    a = Phoenix.options(max_restarts=1).remote(str(tmp_path / "inits"))

    @ray.remote
    def ask(h):
        return ray.get(h.who.options(max_task_retries=-1).remote(), timeout=T)[0]
    assert ray.get(ask.remote(a), timeout=T) == 0
    ray.kill(a, no_restart=False)
    assert ray.get(a.who.options(max_task_retries=-1).remote(), timeout=T)[0] == 1
    assert ray.get(ask.remote(a), timeout=T) == 1


def test_async_actor_restarts(rt, tmp_path):
    @ray.remote(max_restarts=1, max_task_retries=1)
    class AsyncPhoenix:
        def __init__(self, path):
            self.n = _bump(path)

        async def who(self):
            return self.n

        async def die_first_time(self, marker):
            if _bump(marker) == 0:
                os._exit(1)
            return self.n
    a = AsyncPhoenix.remote(str(tmp_path / "inits"))
    assert ray.get(a.who.remote(), timeout=T) == 0
    assert ray.get(a.die_first_time.remote(str(tmp_path / "m")), timeout=T) == 1


def test_bad_restart_options_are_refused():
    for key in ("max_restarts", "max_task_retries"):
        with pytest.raises(ValueError, match=f"The keyword '{key}' only accepts"):
            Phoenix.options(**{key: -2})
        for value in ("1", 1.5):
            with pytest.raises(TypeError, match=f"The type of keyword '{key}' must be"):
                Phoenix.options(**{key: value})
    with pytest.raises(ValueError, match="max_restarts"):
        fail_until.options(max_restarts=1)     # an actor's option, not a task's


# ------------------------------------------------------------ runtime_env
@ray.remote
def read_env(*names):
    return [os.environ.get(n) for n in names]


def test_task_env_vars_are_set_for_the_task_only():
    ray.init(num_cpus=1)      # one worker: the second task runs where the first did
    try:
        with_env = read_env.options(runtime_env={"env_vars": {"RL_A": "1", "RL_B": "b"}})
        assert ray.get(with_env.remote("RL_A", "RL_B"), timeout=T) == ["1", "b"]
        assert ray.get(read_env.remote("RL_A", "RL_B"), timeout=T) == [None, None]

        @ray.remote(runtime_env={"env_vars": {"RL_G": "g"}})
        def gen():
            yield os.environ.get("RL_G")
            yield os.environ.get("RL_G")
        assert [ray.get(r, timeout=T) for r in gen.remote()] == ["g", "g"]
        assert ray.get(read_env.remote("RL_G"), timeout=T) == [None]
    finally:
        ray.shutdown()


def test_actor_and_job_env_vars():
    ray.init(num_cpus=1, runtime_env={"env_vars": {"RL_JOB": "job", "RL_X": "job"}})
    try:
        assert ray.get(read_env.remote("RL_JOB"), timeout=T) == ["job"]

        @ray.remote
        class Env:
            def __init__(self):
                self.at_init = os.environ.get("RL_X")

            def get(self):
                return self.at_init, os.environ.get("RL_JOB")
        e = Env.options(runtime_env={"env_vars": {"RL_X": "actor"}}).remote()
        assert ray.get(e.get.remote(), timeout=T) == ("actor", "job")
        assert ray.get(Env.remote().get.remote(), timeout=T) == ("job", "job")
    finally:
        ray.shutdown()


def test_other_runtime_env_keys_are_refused_by_name():
    with pytest.raises(ValueError, match="'pip'"):
        read_env.options(runtime_env={"pip": ["requests"]})
    with pytest.raises(ValueError, match="'working_dir'"):
        Phoenix.options(runtime_env={"env_vars": {}, "working_dir": "."})
    with pytest.raises(ValueError, match="'conda'"):
        ray.init(num_cpus=1, runtime_env={"conda": "env"})
    with pytest.raises(TypeError, match="env_vars"):
        read_env.options(runtime_env={"env_vars": {"A": 1}})
    with pytest.raises(TypeError, match="runtime_env"):
        read_env.options(runtime_env=["env_vars"])
    assert not ray.is_initialized()


@ray.remote
class Flaky:
    """Raises ``exc_type`` on the first ``bad`` calls of ``attempt`` (counted
    in the actor: retries of a call reach the same actor)."""

    def __init__(self):
        self.calls = 0

    def attempt(self, bad, exc_type):
        self.calls += 1
        if self.calls <= bad:
            raise exc_type(f"call {self.calls}")
        return self.calls

    @ray.method(retry_exceptions=[KeyError], max_task_retries=2)
    def declared(self, bad):
        return self.attempt(bad, KeyError)

    def count(self):
        return self.calls


def test_an_actor_method_is_retried_on_the_exceptions_it_names(rt):
    a = Flaky.options(max_task_retries=3).remote()
    # Two KeyErrors, then it works: 3 calls, one result.
    assert ray.get(a.attempt.options(retry_exceptions=[KeyError]).remote(2, KeyError),
                   timeout=T) == 3
    # Not named: not retried.
    b = Flaky.options(max_task_retries=3).remote()
    with pytest.raises(ValueError, match="call 1"):
        ray.get(b.attempt.options(retry_exceptions=[KeyError]).remote(5, ValueError), timeout=T)
    assert ray.get(b.count.remote(), timeout=T) == 1
    # True: any exception of its code; the retries run out and the last error is raised.
    c = Flaky.options(max_task_retries=2).remote()
    with pytest.raises(ValueError, match="call 3"):
        ray.get(c.attempt.options(retry_exceptions=True).remote(9, ValueError), timeout=T)
    assert ray.get(c.count.remote(), timeout=T) == 3
    # Without retry_exceptions an exception is never retried (max_task_retries is for deaths).
    d = Flaky.options(max_task_retries=3).remote()
    with pytest.raises(KeyError):
        ray.get(d.attempt.remote(1, KeyError), timeout=T)
    assert ray.get(d.count.remote(), timeout=T) == 1


@ray.remote
def call_flaky(h):
    return ray.get(h.attempt.options(retry_exceptions=[KeyError]).remote(2, KeyError))


def test_a_call_from_a_task_is_retried_on_its_exception(rt):
    a = Flaky.options(max_task_retries=-1).remote()
    assert ray.get(call_flaky.remote(a), timeout=T) == 3


def test_retry_exceptions_declared_with_ray_method(rt):
    a = Flaky.remote()      # the method's own max_task_retries: 2
    assert ray.get(a.declared.remote(2), timeout=T) == 3
    b = Flaky.remote()
    with pytest.raises(KeyError, match="call 3"):
        ray.get(b.declared.remote(5), timeout=T)
    # .options may take it back.
    c = Flaky.remote()
    with pytest.raises(KeyError, match="call 1"):
        ray.get(c.declared.options(retry_exceptions=False).remote(5), timeout=T)


def test_retry_exceptions_and_restarts_share_the_retries(rt, tmp_path):
    a = Phoenix.options(max_restarts=2, max_task_retries=1).remote(str(tmp_path / "inits"))
    marker = str(tmp_path / "m")
    # A death takes the one retry: the exception after it is raised.
    with pytest.raises(KeyError):
        ray.get(a.die_then_raise.options(retry_exceptions=True).remote(marker), timeout=T)
    assert _count(marker) == 2


def test_retry_exceptions_is_checked(rt):
    a = Flaky.remote()
    for bad in ("yes", [1], []):
        with pytest.raises(ValueError, match="retry_exceptions"):
            a.attempt.options(retry_exceptions=bad)


def test_a_call_from_a_task_is_retried_on_the_restarted_actor(rt, tmp_path):
    a = Phoenix.options(max_restarts=1, max_task_retries=1).remote(str(tmp_path / "inits"))

    @ray.remote
    def call(h, marker):
        return ray.get(h.die_first_time.remote(marker), timeout=T)
    assert ray.get(call.remote(a, str(tmp_path / "m")), timeout=T) == 1


def test_a_sentinel_reused_since_it_fired_is_no_death():
    # The race behind a restarted actor left unread: a sentinel fires (the old
    # incarnation exited), then RESTARTED, handled before it, closes it and
    # opens the new incarnation's under the same number.  Only the sentinels
    # readable now are deaths.
    import subprocess
    import sys

    from ray_lite._private.links.drive import DrivingMixin

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    exited = os.pidfd_open(child.pid)
    child.wait(timeout=T)
    alive = os.pidfd_open(os.getpid())

    class Peers:
        sentinels = {exited: "old", alive: "restarted"}
        deaths = []

        def _on_peer_died(self, peer):
            self.deaths.append(peer)
    try:
        DrivingMixin.on_sentinels_fired(Peers(), [alive, exited, 12345])
    finally:
        os.close(exited)
        os.close(alive)
    assert Peers.deaths == ["old"]
