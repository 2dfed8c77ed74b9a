"""The runtime's own lifetime: a driver killed with SIGKILL, or one that never calls shutdown()."""
import os
import signal
import subprocess
import sys
import textwrap

import ray_lite as ray
from ray_lite._fast import shm

from procs import wait_dead

DRIVER = textwrap.dedent("""
    import os, sys
    import ray_lite as ray
    ray.init(num_cpus=2)

    @ray.remote
    class A:
        def pid(self):
            return os.getpid()

    @ray.remote
    def pid():
        return os.getpid()

    a = A.remote()
    pids = {ray.get(a.pid.remote())} | set(ray.get([pid.remote() for _ in range(4)]))
    from ray_lite._private.process import state
    pids.add(state.node.zygote.proc.pid)
    print(" ".join(map(str, sorted(pids))), flush=True)
    sys.stdin.read()   # hold until killed
""")



def test_killed_driver_leaves_no_orphans_and_next_init_cleans_up():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, "-c", DRIVER], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=env)
    try:
        line = proc.stdout.readline()
        pids = [int(p) for p in line.split()]
        assert len(pids) >= 3, line
        driver_segments = shm.list_segments(f"{shm.DEFAULT_PREFIX}{proc.pid}_")
        assert driver_segments, "the runtime should have created its rings"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        proc.stdout.close()
        proc.stdin.close()
    for pid in pids:
        assert wait_dead(pid, 30), f"process {pid} outlived its driver"
    # The killed driver could not unlink its rings: the next init does.
    ray.init(num_cpus=1)
    try:
        assert shm.list_segments(f"{shm.DEFAULT_PREFIX}{proc.pid}_") == []
    finally:
        ray.shutdown()


FORGETFUL_DRIVER = textwrap.dedent("""
    import os, sys, threading
    import ray_lite as ray
    from ray_lite._private.process import state

    @ray.remote
    class Sleeper:
        def pid(self):
            return os.getpid()

        def forever(self):
            threading.Event().wait()

    @ray.remote
    def pid():
        return os.getpid()

    s = Sleeper.remote()                 # starts the runtime without init()
    pids = {ray.get(s.pid.remote())} | set(ray.get([pid.remote() for _ in range(4)]))
    pids.add(state.node.zygote.proc.pid)
    s.forever.remote()                   # still running when the program ends
    print(os.getpid(), flush=True)
    print(" ".join(map(str, sorted(pids))), flush=True)
    # No shutdown(): the program just ends.
""")


def test_program_that_forgets_shutdown_exits_cleanly():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run([sys.executable, "-c", FORGETFUL_DRIVER], capture_output=True,
                          text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    driver_line, pids_line = proc.stdout.splitlines()
    pids = [int(p) for p in pids_line.split()]
    assert len(pids) >= 3, proc.stdout
    for pid in pids:
        assert wait_dead(pid, 30), f"process {pid} outlived a driver that exited normally"
    assert shm.list_segments(f"{shm.DEFAULT_PREFIX}{int(driver_line)}_") == []
