"""What the benchmark workloads written against Ray's API share
(``_core_workloads.py``, ``_util_workloads.py``, ``_store_workloads.py`` and
Serve's B2 in ``_serve_workloads.py``): the runtime ``RAYMOD`` names, started as
the benchmarks measure it, the sizes of a scale, and the token-streaming
caller of B1 and B2.

Standalone on purpose, like the workloads: the standard library only and
no ray_lite import, so that a Python with Ray but without ray_lite runs them
(they import this file as a sibling when run as files).
"""
import asyncio
import functools
import importlib
import os
import sys
import time

RAYMOD = os.environ.get("RAYMOD", "ray_lite")
# Ray itself (--compare-ray), or ray_lite on its Ray backend.
ON_RAY = RAYMOD == "ray" or os.environ.get("RAY_LITE_BACKEND") == "ray"


def runtime():
    """The module ``RAYMOD`` names: ``ray_lite`` or ``ray``."""
    return importlib.import_module(RAYMOD)


def pick(scale, full, quick, smoke):
    """The size of a workload at ``scale`` ("full", "quick" or "smoke")."""
    return {"full": full, "quick": quick, "smoke": smoke}[scale]


def command_line(argv=None):
    """``(NAME, SCALE, pick)`` of ``script.py NAME [SCALE]``: the workload,
    the scale (default "full") and ``pick(full, quick, smoke)`` at it."""
    argv = sys.argv if argv is None else argv
    scale = argv[2] if len(argv) > 2 else "full"
    return argv[1], scale, functools.partial(pick, scale)


def init(ray):
    """``ray.init`` on 2 CPUs; on Ray as Ray is measured: no dashboard."""
    extra = {"include_dashboard": False, "log_to_driver": False} if ON_RAY else {}
    ray.init(num_cpus=2, **extra)


def ship_with_classes(ray):
    """On Ray, send this module's code with the classes built on it, by
    value: Ray's workers may not have this folder on their ``sys.path``."""
    cloudpickle = getattr(ray, "cloudpickle", None)
    if RAYMOD == "ray" and cloudpickle is not None:
        cloudpickle.register_pickle_by_value(sys.modules[__name__])


class TokenStreamCaller:
    """The caller of B1 and B2 (the workload of Ray's
    ``streaming_handle_throughput.py``): ``batch`` streams of ``tokens``
    items read at once, batch after batch, for ``trials`` trials of
    ``trial_s`` seconds.  A subclass (an actor, or a Serve deployment) says
    how one stream is read to its end: ``_read_stream``."""

    async def _read_stream(self):
        raise NotImplementedError

    async def _timed_stream(self, durations):
        t = time.monotonic()
        await self._read_stream()
        durations.append((time.monotonic() - t) * 1000)

    async def measure(self, trials, trial_s, batch, tokens):
        """``(tokens/s of each trial, [p50, p75, p99] ms to read a stream)``,
        after 0.1 s of warm-up."""
        durations = []

        async def one_batch():
            await asyncio.gather(*[self._timed_stream(durations) for _ in range(batch)])

        end = time.monotonic() + 0.1
        while time.monotonic() < end:
            await one_batch()
        durations.clear()
        rates = []
        for _ in range(trials):
            t0 = time.monotonic()
            n = 0
            while time.monotonic() - t0 < trial_s:
                await one_batch()
                n += 1
            rates.append(batch * tokens * n / (time.monotonic() - t0))
        d = sorted(durations)
        return rates, [d[min(len(d) - 1, int(len(d) * p))] for p in (0.5, 0.75, 0.99)]
