"""What a proxy holds after many requests: bounded, however many it served.

The soak (``ray-lite bench soak``) saw a proxy's resident memory grow by
~1.4 MB/s under load: the shared pages of its rings to the replicas, each
lap of a ring touching the next of its 256 pages.  A ring whose consumer
keeps up now stays in its first pages (``_ring_py.HOT_BYTES``); these tests
count those pages (``RssShmem``: pages, not timings) across thousands of
requests."""
import os
import socket
import time

from starlette.requests import Request

from ray_lite import serve
from ray_lite.serve import context
from ray_lite.serve._core import get

BATCH = 50


@serve.deployment(num_replicas=2, ray_actor_options={"num_cpus": 0})
def hi(request: Request):
    return "hi"


def _proxy_shared_kb():
    pid, = get(context.get_controller().process_ids.remote())["proxies"]
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssShmem:"))


def _requests(port, n):
    """``n`` keep-alive requests, pipelined ``BATCH`` at a time, on one connection."""
    request = b"GET / HTTP/1.1\r\nHost: t\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        for _ in range(n // BATCH):
            s.sendall(request * BATCH)
            got = b""
            while got.count(b"\r\n\r\nhi") < BATCH:
                chunk = s.recv(65536)
                assert chunk, "the proxy closed the connection"
                got += chunk
            assert got.count(b"HTTP/1.1 200 OK") == BATCH


def test_a_busy_proxy_touches_a_bounded_number_of_shared_pages(serve_port):
    serve.run(hi.bind())
    _requests(serve_port, 500)          # warm-up: the links are open, the code paths run
    before = _proxy_shared_kb()
    _requests(serve_port, 8000)         # ~2 MB each way: each ring lapped without the bound
    grown = _proxy_shared_kb() - before
    # 2 replicas x 2 rings x HOT_BYTES (64 kB) at most; without the bound, ~4 MB.
    assert grown < 1024, f"the proxy's shared pages grew by {grown} kB"


# ------------------------------------------------------------- spin policy
def test_spin_policy_spins_only_while_most_waits_are_short():
    from ray_lite.serve._spin import SpinPolicy
    p = SpinPolicy(0.001)
    assert not p.worth_it()                 # nothing learnt yet: no spin
    for _ in range(20):
        p.observe(0.0001)
    assert p.worth_it()
    p.observe(0.01)                         # one long wait: a pause ...
    assert not p.worth_it()
    for _ in range(8):
        p.observe(0.0001)                   # ... until short waits pull the mean back
    assert p.worth_it()
    for _ in range(10):
        p.observe(0.01)
    assert not p.worth_it()


def test_a_preempted_spin_stops_spinning_until_short_waits_come_again():
    from ray_lite.serve._spin import SpinPolicy
    p = SpinPolicy(0.001)
    for _ in range(20):
        p.observe(0.0001)
    p.spun(True, 0.0001)                    # caught it
    p.spun(False, 0.0011)                   # ran its budget out: a miss, no verdict
    assert p.worth_it()
    p.spun(False, 0.0002)                   # gave up early, empty-handed: a busy CPU
    assert not p.worth_it()
    for _ in range(20):
        p.observe(0.0001)
    assert p.worth_it()


def test_a_long_tail_of_waits_stops_spinning_though_most_are_short():
    # 48 replicas behind wrk -c100: most idle gaps are short, a tail is long.
    from ray_lite.serve._spin import SpinPolicy
    p = SpinPolicy(0.001)
    for _ in range(5):
        for _ in range(8):
            p.observe(0.0001)
        p.observe(0.05)
        for _ in range(3):
            p.observe(0.0001)
    assert p.hits >= 0.75                    # the share alone would spin
    assert not p.worth_it()


def test_a_spin_switched_out_stops_spinning_when_it_missed_its_event():
    from ray_lite.serve._spin import SpinPolicy
    p = SpinPolicy(0.001)
    for _ in range(20):
        p.observe(0.0001)
    p.spun(True, 0.0001, switched=True)     # yielded to another thread, still caught it
    assert p.worth_it()
    p.spun(False, 0.0011, switched=True)    # yielded, ran its budget out: contended
    assert not p.worth_it()


def test_involuntary_switches_counts_a_yield_that_let_another_process_run():
    import subprocess
    import sys
    from ray_lite.serve._spin import involuntary_switches
    # A CPU-bound process pinned to this thread's CPU: a yield hands it the CPU.
    cpu = next(iter(os.sched_getaffinity(0)))
    old = os.sched_getaffinity(0)
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(hog.pid, {cpu})
        os.sched_setaffinity(0, {cpu})
        before = involuntary_switches()
        deadline = time.monotonic() + 10
        while involuntary_switches() == before and time.monotonic() < deadline:
            os.sched_yield()
        assert involuntary_switches() > before
    finally:
        os.sched_setaffinity(0, old)
        hog.kill()
        hog.wait(10)


def test_a_zero_budget_never_spins():
    from ray_lite.serve._spin import SpinPolicy
    p = SpinPolicy(0)
    for _ in range(20):
        p.observe(0.0)
    assert not p.worth_it()


# ------------------------------------------------------ the breakdown tool
class _Done:
    def wait(self, timeout=None):
        return 0


def test_breakdown_attributes_each_sample_to_its_innermost_stage(tmp_path):
    from ray_lite.bench import serve_cpu
    raw = tmp_path / "spy.txt"
    raw.write_text(
        "main (a.py:1);HttpConnection.data_received (p.py:2);"
        "HttpConnection.on_message_complete (p.py:3);ProxyActor._send (p.py:4);"
        "Link.send (t.py:5) 6\n"
        "main (a.py:1);HttpConnection.data_received (p.py:2) 2\n"
        "main (a.py:1) 2\n")
    shares = serve_cpu._stage_shares([(_Done(), str(raw))], serve_cpu.PROXY_STAGES)
    assert shares == {"ring send (encode, publish, wake)": 0.6, "HTTP parse": 0.2,
                      "event loop (uvloop, tasks, epoll), other": 0.2}
    assert not raw.exists()


def test_the_stage_costs_run_the_real_paths():
    # The in-process stages drive the proxy's connection and the replica's
    # handle_http themselves: they must keep working as those change.
    from ray_lite.bench import serve_cpu
    assert serve_cpu.proxy_http_us(200) > 0
    assert serve_cpu.ring_round_trip_us(200) > 0
    assert serve_cpu.replica_http_us(50) > 0


def test_the_cpu_hog_burns_until_ended_by_its_pid():
    import ray_lite.bench as bench
    from ray_lite.bench import serve_cpu
    assert bench._parser().parse_args(["serve", "--beside-hog"]).beside_hog
    hog = serve_cpu.start_hog()
    try:
        assert hog.poll() is None
        assert os.getpriority(os.PRIO_PROCESS, hog.pid) == os.getpriority(os.PRIO_PROCESS, 0)
    finally:
        serve_cpu.stop_hog(hog)
    assert hog.returncode is not None


def test_run_times_the_spin_and_learns_from_it():
    from ray_lite.serve._spin import SpinPolicy
    p = SpinPolicy(0.001)
    for _ in range(20):
        p.observe(0.0001)
    assert p.run(lambda x: x, True) is True        # caught its event: keeps spinning
    assert p.worth_it()
    assert p.run(lambda: False) is False           # gave up at once, empty-handed
    assert not p.worth_it()
