"""Fault tolerance of the runtime itself: a driver killed with SIGKILL."""
import os
import select
import signal
import subprocess
import sys
import textwrap

import ray_lite as ray
from ray_lite._fast import shm

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
    from ray_lite._private import state
    pids.add(state.node.zygote.proc.pid)
    print(" ".join(map(str, sorted(pids))), flush=True)
    sys.stdin.read()   # hold until killed
""")


def _wait_dead(pid, timeout):
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)


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
        assert _wait_dead(pid, 30), f"process {pid} outlived its driver"
    # The killed driver could not unlink its rings: the next init does.
    ray.init(num_cpus=1)
    try:
        assert shm.list_segments(f"{shm.DEFAULT_PREFIX}{proc.pid}_") == []
    finally:
        ray.shutdown()
