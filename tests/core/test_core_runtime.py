"""The runtime around the calls: a busy driver still serves its workers,
cancelling running work, Ctrl-C in blocking calls, worker output, and the
async actors' concurrency limit."""
import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

import ray_lite as ray
from ray_lite.exceptions import TaskCancelledError

T = 60


def _run_driver(code, timeout=120):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, env=env)


@ray.remote
def inc(x):
    return x + 1


@ray.remote
def nested(x):
    # Goes through the driver: the submission, then the result's forwarding.
    return ray.get(inc.remote(x))


@ray.remote
class Spawner:
    def spawn_and_call(self):
        # Creating an actor from an actor is a request the driver answers.
        @ray.remote
        class Child:
            def ping(self):
                return "pong"
        return ray.get(Child.remote().ping.remote())


@ray.remote
class Turnstile:
    """Counts arrivals and holds them until opened."""

    def __init__(self):
        self.arrived = 0
        self.changed = asyncio.Condition()
        self.opened = False

    async def pass_(self):
        async with self.changed:
            self.arrived += 1
            self.changed.notify_all()
            await self.changed.wait_for(lambda: self.opened)

    async def until(self, n):
        async with self.changed:
            await self.changed.wait_for(lambda: self.arrived >= n)
        return self.arrived

    async def open(self):
        async with self.changed:
            self.opened = True
            self.changed.notify_all()


def test_driver_serves_its_workers_while_busy(rt):
    """The user's thread is outside ray_lite (here: blocked on an Event that
    only the runtime can set); workers' requests are served all the same."""
    for make in (lambda: nested.remote(1), lambda: Spawner.remote().spawn_and_call.remote()):
        done = threading.Event()
        ref = make()
        ref.future().add_done_callback(lambda _f: done.set())
        assert done.wait(T), "nobody served the workers while the driver was busy"
    assert ray.get(nested.remote(1), timeout=T) == 2


def test_driver_serves_while_computing(rt):
    ref = nested.remote(41)
    done = threading.Event()
    ref.future().add_done_callback(lambda _f: done.set())
    # Pure Python computation holding the GIL most of the time (bounded:
    # a bug fails the test instead of hanging it).
    import time
    deadline = time.monotonic() + T
    x = 0
    while not done.is_set() and time.monotonic() < deadline:
        for i in range(10000):
            x += i
    assert done.is_set(), "nobody served the workers while the driver computed"
    assert ray.get(ref, timeout=0) == 42


def test_cancel_interrupts_a_running_task(rt):
    node = rt

    @ray.remote
    class Started:
        def __init__(self):
            self.pid = None
            self.event = asyncio.Event()

        async def started(self, pid):
            self.pid = pid
            self.event.set()

        async def wait(self):
            await self.event.wait()
            return self.pid

    @ray.remote(max_retries=0)
    def spin(gate):
        ray.get(gate.started.remote(os.getpid()))
        i = 0
        while True:      # pure computation: never calls into ray_lite
            i += 1

    gate = Started.remote()
    ref = spin.remote(gate)
    pid = ray.get(gate.wait.remote(), timeout=T)      # the task is inside its loop
    (wid,) = [w for w, p in node.pids.items() if p == pid]
    ray.cancel(ref)
    with pytest.raises(TaskCancelledError):
        ray.get(ref, timeout=T)
    # The worker was interrupted (a KeyboardInterrupt in the task), not
    # killed: it finishes the task and is free again.
    assert node.wait_until(lambda: node.pool[wid].task is None, T)
    assert wid in node.pool and node.pids[wid] == pid
    assert ray.get([inc.remote(1), inc.remote(2)], timeout=T) == [2, 3]


def test_cancel_interrupts_a_task_waiting_in_get(rt):
    @ray.remote
    class Never:
        async def wait(self):
            await asyncio.Event().wait()

    @ray.remote(max_retries=0)
    def waits(n):
        return ray.get(n.wait.remote())
    n = Never.remote()
    ref = waits.remote(n)
    ready, _ = ray.wait([ref], timeout=0.1)
    assert ready == []
    ray.cancel(ref)
    with pytest.raises(TaskCancelledError):
        ray.get(ref, timeout=T)
    assert ray.get([inc.remote(1), inc.remote(2)], timeout=T) == [2, 3]


def test_cancel_of_queued_and_running_actor_calls(rt):
    @ray.remote
    class Slow:
        def __init__(self):
            self.ran = []

        def block(self, turnstile):
            ray.get(turnstile.pass_.remote())
            self.ran.append("block")
            return "done"

        def record(self, tag):
            self.ran.append(tag)
            return tag

        def log(self):
            return self.ran

    t = Turnstile.remote()
    s = Slow.remote()
    running = s.block.remote(t)
    queued = s.record.remote("queued")
    assert ray.get(t.until.remote(1), timeout=T) == 1     # `block` is running
    ray.cancel(queued)
    with pytest.raises(ValueError, match="force"):
        ray.cancel(running, force=True)
    ray.cancel(running)      # a sync actor's running call is not interrupted ...
    ray.get(t.open.remote(), timeout=T)
    # ... but it read the cancel (its get did): its caller gets the
    # cancellation, not what it returned, as in Ray.
    with pytest.raises(TaskCancelledError):
        ray.get(running, timeout=T)
    with pytest.raises(TaskCancelledError):
        ray.get(queued, timeout=T)
    assert ray.get(s.log.remote(), timeout=T) == ["block"]      # it ran to its end


def test_cancel_running_async_actor_call(rt):
    @ray.remote
    class Waiter:
        async def wait_forever(self):
            await asyncio.Event().wait()

        async def ping(self):
            return "pong"
    w = Waiter.remote()
    ref = w.wait_forever.remote()
    assert ray.get(w.ping.remote(), timeout=T) == "pong"    # the call is running
    ray.cancel(ref)
    with pytest.raises(TaskCancelledError):
        ray.get(ref, timeout=T)
    assert ray.get(w.ping.remote(), timeout=T) == "pong"


def test_async_actor_concurrency_limit(rt):
    @ray.remote(max_concurrency=2)
    class Limited:
        def __init__(self, turnstile):
            self.turnstile = turnstile
            self.running = 0
            self.peak = 0

        async def hold(self):
            self.running += 1
            self.peak = max(self.peak, self.running)
            await self.turnstile.pass_.remote()
            self.running -= 1
            return self.peak

    t = Turnstile.remote()
    a = Limited.remote(t)
    held = [a.hold.remote() for _ in range(5)]
    assert ray.get(t.until.remote(2), timeout=T) == 2
    # A third call would arrive within microseconds if it were let in.
    third = t.until.remote(3)
    ready, _ = ray.wait([third], timeout=0.3)
    assert ready == []
    ray.get(t.open.remote(), timeout=T)
    assert max(ray.get(held, timeout=T)) == 2
    assert ray.get(third, timeout=T) >= 3


def test_async_actor_keeps_waking_after_a_blocking_wait(rt):
    @ray.remote
    class Mixed:
        def __init__(self, first, second):
            self.first, self.second = first, second

        async def connect(self):
            # Links to both exist before the test (a new link re-arms all).
            return [await self.first.until.remote(0), await self.second.until.remote(0)]

        async def block_then_await(self):
            # A sync wait on the loop's thread sleeps on the links itself...
            ray.wait([self.first.pass_.remote()])
            # ...and the loop, asleep in its selector below, must still be
            # woken by the reply.
            await self.second.pass_.remote()
            return "woken"

    first, second = Turnstile.remote(), Turnstile.remote()
    m = Mixed.remote(first, second)
    assert ray.get(m.connect.remote(), timeout=T) == [0, 0]
    ref = m.block_then_await.remote()
    assert ray.get(first.until.remote(1), timeout=T) == 1
    ray.get(first.open.remote(), timeout=T)
    assert ray.get(second.until.remote(1), timeout=T) == 1   # the loop awaits it
    ray.get(second.open.remote(), timeout=T)
    assert ray.get(ref, timeout=T) == "woken"


def test_driver_loop_streams_while_another_thread_waits(rt):
    """An event loop and a thread blocked in get/wait share the links: neither
    may take the other's wake-up (each iteration used to hang now and then)."""
    @ray.remote
    class Producer:
        async def agen(self, n):
            for i in range(n):
                yield i
                await asyncio.sleep(0.001)   # the workload: a stream that trickles

    @ray.remote
    def slowish():
        import time
        time.sleep(0.02)                   # the workload: a get that sleeps
        return 1

    p = Producer.remote()
    stop = threading.Event()
    errors = []

    def other():
        try:
            while not stop.is_set():
                ray.get(slowish.remote(), timeout=T)
                ray.wait([slowish.remote()], timeout=0.01)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    t = threading.Thread(target=other)
    t.start()

    async def consume():
        for _ in range(4):
            assert [await r async for r in p.agen.remote(150)] == list(range(150))
        return True
    try:
        assert asyncio.run(asyncio.wait_for(consume(), T))
    finally:
        stop.set()
        t.join(T)
    assert not t.is_alive() and not errors


def test_async_actor_default_limit_allows_many_concurrent_calls(rt):
    @ray.remote
    class Barrier:
        def __init__(self, n):
            self.n = n
            self.arrived = 0
            self.all_here = asyncio.Event()

        async def arrive(self):
            self.arrived += 1
            if self.arrived == self.n:
                self.all_here.set()
            await self.all_here.wait()
            return self.arrived
    n = 300          # well over 1 and under Ray's default of 1000
    b = Barrier.remote(n)
    assert ray.get([b.arrive.remote() for _ in range(n)], timeout=T) == [n] * n


CTRL_C_DRIVER = """
    import os, signal, time
    import ray_lite as ray
    ray.init(num_cpus=1)

    def interrupt_once_it_waits(pid):
        # Ctrl-C must land while the driver is blocked in get/wait/next (asleep
        # in poll), not while .remote() is still returning, which a task can
        # beat on a busy machine. Checked for 60 s at most; then it lands anyway.
        import platform
        asleep = {"x86_64": ("7", "271"), "aarch64": ("73",)}.get(platform.machine(), ())
        deadline = time.monotonic() + 60
        while asleep and time.monotonic() < deadline:
            try:
                with open(f"/proc/{pid}/task/{pid}/syscall") as f:
                    if f.read().split()[0] in asleep:
                        break
            except (OSError, IndexError):
                break
            time.sleep(0.001)
        os.kill(pid, signal.SIGINT)

    @ray.remote(max_retries=0)
    def interrupt_then_hang(pid):
        interrupt_once_it_waits(pid)
        time.sleep(600)     # the workload: it is cancelled below

    @ray.remote(max_retries=0)
    def stream_interrupt_then_hang(pid):
        interrupt_once_it_waits(pid)
        time.sleep(600)
        yield 1

    @ray.remote
    def ping():
        return "pong"

    for what in ("get", "wait", "next"):
        try:
            if what == "next":
                r = stream_interrupt_then_hang.remote(os.getpid())
                next(r)
            else:
                r = interrupt_then_hang.remote(os.getpid())
                ray.get(r) if what == "get" else ray.wait([r])
            print(what, "returned", flush=True)
        except KeyboardInterrupt:
            print(what, "interrupted", flush=True)
        ray.cancel(r, force=True)
        print(what, "still works:", ray.get(ping.remote(), timeout=60), flush=True)
    ray.shutdown()
    print("clean exit", flush=True)
"""


def test_ctrl_c_ends_blocking_calls():
    out = _run_driver(CTRL_C_DRIVER)
    assert out.returncode == 0, out.stdout + out.stderr
    for what in ("get", "wait", "next"):
        assert f"{what} interrupted" in out.stdout, out.stdout + out.stderr
        assert f"{what} still works: pong" in out.stdout
    assert "clean exit" in out.stdout


def _poll_syscalls():
    import platform
    return {"x86_64": {"7", "271"}, "aarch64": {"73"}}.get(platform.machine(), set())


def test_a_signal_another_thread_takes_wakes_the_main_threads_get(rt):
    # Python runs a handler when the main thread next runs bytecode.  A signal
    # that lands in another thread (or just before the main thread's poll)
    # interrupts no system call: a get with no time limit must still wake.
    node = rt
    main_tid = threading.get_native_id()
    try:
        with open(f"/proc/self/task/{main_tid}/syscall") as f:
            f.read()
    except OSError:
        pytest.skip("needs /proc/self/task/*/syscall")
    if not _poll_syscalls():
        pytest.skip("poll's system call number is not known here")

    @ray.remote
    class Never:
        async def wait(self):
            await asyncio.Event().wait()

    class Woken(Exception):
        pass

    handled, woke_late = threading.Event(), threading.Event()

    def handler(signum, frame):
        handled.set()
        raise Woken

    def main_sleeps_in_poll():
        with open(f"/proc/self/task/{main_tid}/syscall") as f:
            return node._polling and f.read().split()[0] in _poll_syscalls()

    def signal_this_thread_once_main_sleeps():
        pause = threading.Event()
        for _ in range(int(T * 1000)):
            if main_sleeps_in_poll():
                break
            pause.wait(0.001)
        # Python's C-level handler runs on this thread: the main thread's
        # poll sees no EINTR.
        signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)
        if not handled.wait(T):
            woke_late.set()
            ray.kill(never)     # ends the get (and runs the handler): no hang

    previous = signal.signal(signal.SIGUSR1, handler)
    never = Never.remote()
    ray.get(never.__ray_ready__.remote(), timeout=T)
    ref = never.wait.remote()
    sender = threading.Thread(target=signal_this_thread_once_main_sleeps)
    try:
        sender.start()
        with pytest.raises(Woken):
            ray.get(ref)
    finally:
        sender.join(T)
        signal.signal(signal.SIGUSR1, previous)
        ray.kill(never)
    assert not woke_late.is_set(), "the signal did not wake the get"
    assert ray.get(inc.remote(1), timeout=T) == 2


def test_init_sets_the_signal_wakeup_fd_only_when_none_is_set():
    from ray_lite._private.process import interrupts
    ray.init(num_cpus=1)
    try:
        ours = signal.set_wakeup_fd(-1)
        signal.set_wakeup_fd(ours)
        assert ours >= 0 and ours == interrupts._wakeup[1]
        assert interrupts.signal_wakeup_fd() == interrupts._wakeup[0]
    finally:
        ray.shutdown()
    assert signal.set_wakeup_fd(-1) == -1           # put back as it was
    r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        signal.set_wakeup_fd(w)                     # an event loop's, say
        ray.init(num_cpus=1)
        try:
            assert interrupts.signal_wakeup_fd() == -1
        finally:
            ray.shutdown()
        assert signal.set_wakeup_fd(-1) == w        # left alone
    finally:
        os.close(r)
        os.close(w)


def _a_runtime_frame(monkeypatch):
    """A frame of the runtime's own code, called from here: its look at a
    call's arguments, the moment it calls the probe."""
    from ray_lite._private.api import call_options
    frames = []
    monkeypatch.setattr(call_options, "probe_serialisable",
                        lambda value: frames.append(sys._getframe(1)) or 0)
    call_options._check_args_serialisable(([],), {}, "f")
    return frames[0]


def test_sigint_inside_runtime_bookkeeping_is_deferred_not_lost(monkeypatch):
    import signal
    from ray_lite._private.process import interrupts
    # A frame of code "in" the runtime's files that is a sleep point.
    fake = os.path.join(interrupts._RUNTIME_DIRS[0], "_fake_for_test.py")
    ns = {}
    exec(compile("import sys\n"
                 "def sleeping():\n    return sys._getframe()\n", fake, "exec"), ns)
    interrupts.sleep_point(ns["sleeping"])
    resent = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: resent.set())
    try:
        with pytest.raises(KeyboardInterrupt):      # user code: at once
            interrupts._on_sigint(signal.SIGINT, sys._getframe())
        with pytest.raises(KeyboardInterrupt):      # a sleep point: at once
            interrupts._on_sigint(signal.SIGINT, ns["sleeping"]())
        interrupts._on_sigint(signal.SIGINT, _a_runtime_frame(monkeypatch))  # deferred...
        assert resent.wait(T)                                                # ...and sent again
    finally:
        signal.signal(signal.SIGINT, previous)
        interrupts._SLEEP_POINTS.discard(ns["sleeping"].__code__)


def test_a_runtime_section_is_runtime_code_that_user_code_called(monkeypatch):
    """The rule of a pool worker's cancel signal: not raised inside the
    runtime's code that the task called (up to the process's entry), but
    in the task's own code."""
    from ray_lite._private.process.interrupts import in_runtime_section
    assert in_runtime_section(_a_runtime_frame(monkeypatch), None)
    assert not in_runtime_section(sys._getframe(), None)
    # The walk ends at the entry: runtime code that the entry itself called
    # (the task runner) is not a section.
    assert not in_runtime_section(_a_runtime_frame(monkeypatch), _a_runtime_frame.__code__)


OUTPUT_DRIVER = """
    import os, sys
    import ray_lite as ray
    ray.init(num_cpus=1)

    @ray.remote
    def chatty():
        print("task line 1")
        print("task line 2")
        print("task error line", file=sys.stderr)
        sys.stdout.write("no newline at the end")
        return os.getpid()

    @ray.remote
    class Printer:
        def say(self, text):
            print(text)
            print("actor error line", file=sys.stderr)
            return os.getpid()

    tpid = ray.get(chatty.remote())
    apid = ray.get(Printer.remote().say.remote("hello from an actor"))
    ray.shutdown()      # the relay flushes everything before shutdown returns
    print("PIDS", tpid, apid, flush=True)
"""


def test_worker_stdout_and_stderr_reach_the_driver_prefixed():
    out = _run_driver(OUTPUT_DRIVER)
    assert out.returncode == 0, out.stderr
    pids = [ln for ln in out.stdout.splitlines() if ln.startswith("PIDS ")]
    assert pids, out.stdout
    tpid, apid = pids[0].split()[1:]
    lines = out.stdout.splitlines()
    assert f"(pid={tpid}) task line 1" in lines
    assert f"(pid={tpid}) task line 2" in lines
    assert lines.index(f"(pid={tpid}) task line 1") < lines.index(f"(pid={tpid}) task line 2")
    assert f"(Printer pid={apid}) hello from an actor" in lines
    # A last line without a newline is still delivered when the worker exits.
    assert f"(pid={tpid}) no newline at the end" in lines
    err = out.stderr.splitlines()
    assert f"(pid={tpid}) task error line" in err
    assert f"(Printer pid={apid}) actor error line" in err


REPR_DRIVER = """
    import os, sys
    import ray_lite as ray
    ray.init(num_cpus=1)

    @ray.remote
    class Named:
        def __init__(self, index):
            self.index = index

        def say(self):
            print("out line")
            print("err line", file=sys.stderr)
            return os.getpid()

        def __repr__(self):
            return f"Named(index={self.index})\\nsecond line"

    @ray.remote
    class Broken:
        def say(self):
            print("still prefixed")
            return os.getpid()

        def __repr__(self):
            raise RuntimeError("no repr")

    npid = ray.get(Named.remote(7).say.remote())
    bpid = ray.get(Broken.remote().say.remote())
    ray.shutdown()
    print("PIDS", npid, bpid, flush=True)
"""


def test_an_actors_repr_prefixes_its_output():
    # As Ray: the __repr__ (on one line) stands for the class name; one that
    # raises leaves the class name; nothing of the marking shows.
    out = _run_driver(REPR_DRIVER)
    assert out.returncode == 0, out.stderr
    npid, bpid = [ln for ln in out.stdout.splitlines() if ln.startswith("PIDS ")][0].split()[1:]
    assert f"(Named(index=7) second line pid={npid}) out line" in out.stdout.splitlines()
    assert f"(Named(index=7) second line pid={npid}) err line" in out.stderr.splitlines()
    assert f"(Broken pid={bpid}) still prefixed" in out.stdout.splitlines()
    assert "ray_lite-label" not in out.stdout + out.stderr


def test_blocking_get_after_an_event_loop_has_closed(rt):
    """asyncio.run() awaiting refs, then plain get on the same thread: the
    closed loop's wake-up bridge must not be used any more."""
    @ray.remote
    def echo(x):
        return x

    @ray.remote
    def slow():
        import time
        time.sleep(0.05)      # the workload: a get that has to wait
        return "ok"

    async def first():
        return await echo.remote(1)
    assert asyncio.run(first()) == 1
    assert ray.get(slow.remote(), timeout=T) == "ok"
    assert asyncio.run(first()) == 1       # and a new loop works again
    assert ray.get(slow.remote(), timeout=T) == "ok"


def test_a_first_call_starts_the_runtime_unless_ray_enable_auto_connect_is_0(monkeypatch):
    from ray_lite.exceptions import RaySystemError
    assert not ray.is_initialized()
    monkeypatch.setenv("RAY_ENABLE_AUTO_CONNECT", "0")
    with pytest.raises(RaySystemError, match="Ray has not been started yet"):
        nested.remote(1)
    assert not ray.is_initialized()
    monkeypatch.delenv("RAY_ENABLE_AUTO_CONNECT")
    try:
        assert ray.get(nested.remote(1), timeout=T) == 2      # started by it, as Ray does
        assert ray.is_initialized()
    finally:
        ray.shutdown()
