"""Pieces of ``ray-lite bench serve`` that need no HTTP load tool: the CPU
of a server's process tree (B16) and the figures of interleaved rounds."""
import os
import subprocess
import sys

from ray_lite.bench import serve_suite

# Burns CPU until its own clock shows 0.2 s, says so, then waits for stdin to close.
BURNER = """
import sys, time
while time.process_time() < 0.2:
    pass
print("burnt", flush=True)
sys.stdin.read()
"""


def test_the_cpu_of_a_process_tree_counts_its_descendants():
    before = serve_suite._process_tree_cpu_s(os.getpid())
    # A grandchild: the tree is followed past the first level.
    proc = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', sys.argv[1]]); "
         "sys.exit(p.wait())", BURNER],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "burnt\n"
        during = serve_suite._process_tree_cpu_s(os.getpid())
        alone = serve_suite._process_tree_cpu_s(proc.pid)
    finally:
        proc.stdin.close()
        proc.wait(60)
    assert during - before >= 0.19      # the grandchild's 0.2 s, to a clock tick
    assert alone >= 0.19
    assert serve_suite._process_tree_cpu_s(proc.pid) == 0.0   # gone: nothing to count


def test_a_figure_of_rounds_is_their_median_with_min_and_max():
    rounds = [(900.0, {"failed": 0, "p50_ms": 10, "p99_ms": 30}),
              (1100.0, {"failed": 2, "p50_ms": 12, "p99_ms": 50}),
              (1000.0, {"failed": 0, "p50_ms": 11, "p99_ms": 40})]
    fig = serve_suite._round_figures("B7", "HTTP hi", "req/s", "ray_lite", "ray_lite", rounds,
                                     goals=True)
    assert (fig.value, fig.spread, fig.trials) == (1000.0, {"min": 900.0, "max": 1100.0}, 3)
    assert fig.detail["rounds"] == [900.0, 1100.0, 1000.0]
    assert fig.goal_met is False and "2 failed" in fig.note and "P99 50 ms" in fig.note
    cpu = serve_suite._round_figures("B16", "CPU per request", "us", "anchor", "Ray Serve",
                                     [(80.0, {}), (60.0, {})], goals=False)
    assert cpu.value == 70.0 and cpu.goal is None
