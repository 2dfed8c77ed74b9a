"""``ray-lite bench``: ray_lite's benchmarks, with the anchors they are
compared with measured in the same run.

    ray-lite bench [NAME ...] [--quick] [--json FILE] [--verbose] [--compare-ray PYTHON]
                   [--plot FILE.png]

Each NAME is a suite (``DEFAULT_SUITES`` when none is given).  A suite is a module that
defines::

    DESCRIPTION = "one line for --list"
    def run(ctx: Context) -> list[Figure]            # the measurements
    def compare_ray(ctx: Context, python: str) -> list[Figure]   # optional:
        # the same workloads run on Ray by `python` (an interpreter with Ray),
        # as "anchor" rows with the same bench id and name as ours

A row names the goal it measures (``Figure.goal_id``); every goal, and how
it is judged, is in one table: ``_goals.GOALS``.

and is registered in ``SUITES`` below (or with :func:`register_suite`), so a
later suite plugs in with one line and is imported only when asked for.
"""
import contextlib
import os
import signal
import sys
import time

# Nothing heavy at import time: Serve's benchmark app lives in this package
# (``ray_lite.bench.serve_hi_app``), so each of its 48 replicas imports it.
# The runner's modules are imported when a run starts.


def __getattr__(name):
    if name in ("Context", "Figure"):
        from . import _harness
        return getattr(_harness, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["main", "SUITES", "register_suite", "run_suites", "Context", "Figure"]

#: Suite name -> module that implements it (imported lazily).
SUITES = {
    "micro": "ray_lite.bench.micro",
    "core": "ray_lite.bench.core_suite",
    "executor": "ray_lite.bench.executor_suite",
    "serve": "ray_lite.bench.serve_suite",
    "serve_cpu": "ray_lite.bench.serve_cpu",
    "soak": "ray_lite.bench.soak_suite",
    "llm": "ray_lite.bench.llm_suite",
}

#: What `ray-lite bench` runs with no names: the headline figures.  `serve`
#: is left out: it needs ab and wrk (Debian's apache2-utils and wrk); `soak`
#: too (wrk, and a minute).
DEFAULT_SUITES = ("micro", "core", "executor")

#: Set (to anything but "" or "0") to run every suite at its smallest size:
#: the unit tests use it so that running the suite stays a matter of seconds.
SMOKE_ENV = "RAY_LITE_BENCH_SMOKE"


def register_suite(name, module):
    """Make suite ``name`` (implemented by module path ``module``) runnable."""
    SUITES[name] = module


def _load_suite(name):
    import importlib
    return importlib.import_module(SUITES[name])


def run_suites(names, ctx):
    """Run the suites ``names``; return the JSON-ready result."""
    from ._goals import judge
    from ._harness import ERROR, Figure, machine_info, relate_to_anchors
    from ._report import goal_summary
    machine = machine_info()
    # Goals are for the compiled runtime; a run with no compiled hot path
    # (RAY_LITE_NO_EXTENSIONS=1, or none built) is judged on its pure twins.
    pure_run = None
    if machine.get("compiled") is False:
        pure_run = ("RAY_LITE_NO_EXTENSIONS=1" if machine.get("no_extensions_env")
                    else "no compiled hot path built")
    result = {
        "schema": "ray_lite.bench/1",
        "scale": ctx.scale,
        "machine": machine,
        "suites": {},
    }
    if ctx.compare_ray:
        result["compare_ray"] = ctx.compare_ray
    for name in names:
        t0 = time.monotonic()
        notes = []
        try:
            suite = _load_suite(name)
            figures = list(suite.run(ctx))
            if ctx.compare_ray:
                compare = getattr(suite, "compare_ray", None)
                if compare is None:
                    notes.append(f"--compare-ray: the {name} suite has no Ray workload")
                else:
                    figures.extend(compare(ctx, ctx.compare_ray))
            # Anchors and ceilings measured in this run (Ray's with --compare-ray,
            # others such as the standard library's pool always).
            relate_to_anchors(figures)
            judge(figures, pure_run=bool(pure_run), beside_hog=getattr(ctx, "beside_hog", False))
        except Exception as exc:   # noqa: BLE001 - one broken suite must not hide the others
            figures = [Figure(bench="-", name=f"suite {name}", impl="-", label="-", unit="",
                              status=ERROR, reason=f"{type(exc).__name__}: {exc}")]
        result["suites"][name] = {
            "seconds": round(time.monotonic() - t0, 2),
            "notes": notes,
            "goals": goal_summary(figures, pure_run=pure_run),
            "figures": [f.to_json() for f in figures],
            "_figures": figures,
        }
    return result


def format_result(result, verbose=False):
    """The text ``ray-lite bench`` prints: every line within 100 columns, or
    with ``verbose`` every detail of every figure (wider)."""
    from ._report import format_result as render
    return render(result, verbose=verbose)


def _parser():
    import argparse
    parser = argparse.ArgumentParser(
        prog="ray-lite bench",
        description="Run ray_lite's benchmarks beside their anchors, measured in the same run.")
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"suites to run (default: {' '.join(DEFAULT_SUITES)}); see --list")
    parser.add_argument("--quick", action="store_true",
                        help="small sizes: the micro suite finishes well under a minute (CI smoke run)")
    parser.add_argument("--only", metavar="IDS", type=lambda s: s.split(","),
                        help="only these benchmarks of the suites, e.g. B11,B3,B1")
    parser.add_argument("--json", metavar="FILE", help="also write every figure and the machine as JSON")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="print every figure with all it carries (wider than the table)")
    parser.add_argument("--compare-ray", metavar="PYTHON",
                        help="an interpreter with Ray installed: run the suites' Ray workloads with it")
    parser.add_argument("--plot", metavar="FILE.png",
                        help="also draw each suite's figures beside their anchors, log scale "
                             "(needs matplotlib: pip install 'ray_lite[plot]')")
    parser.add_argument("--from-json", metavar="FILE",
                        help="run nothing: show (and --plot) the result a --json run wrote")
    parser.add_argument("--beside-hog", action="store_true",
                        help="serve: run the HTTP loads beside one CPU-bound process (normal priority)")
    parser.add_argument("--http-mode", choices=("proxies", "direct", "both"), default="direct",
                        help="serve: how ray_lite takes HTTP in the HTTP rows: direct "
                             "ingress (the default), through its proxies, or both (each row "
                             "in each mode, interleaved)")
    parser.add_argument("--list", action="store_true", help="list the suites and exit")
    # The unit tests' size, smaller than --quick (also RAY_LITE_BENCH_SMOKE=1).
    parser.add_argument("--smoke", action="store_true", help=argparse.SUPPRESS)
    return parser


def main(argv=None):
    """Entry point of ``ray-lite bench``; returns the exit status.

    Output piped into a reader that stops early (``| head``) ends the run
    quietly, with status 1, as Python's documentation recommends for a
    command line tool: no traceback, and nothing more written to stdout.
    """
    try:
        status = _main(argv)
        sys.stdout.flush()       # a closed pipe shows here, not at exit
        return status
    except BrokenPipeError:
        _discard_stdout()
        return 1


def _discard_stdout():
    """Point stdout at /dev/null: the interpreter flushes it once more at
    exit, and that flush into the closed pipe would print an error."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):   # stdout replaced, not a file
        pass


def _main(argv):
    import json

    from ._harness import ERROR, Context, print_err
    args = _parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    if args.list:
        for name in SUITES:
            try:
                description = getattr(_load_suite(name), "DESCRIPTION", "")
            except Exception as exc:   # noqa: BLE001
                description = f"(cannot import: {exc})"
            print(f"{name:10s} {description}")
        return 0
    if args.plot:
        from .plot import PlotUnavailable, require_matplotlib
        try:
            require_matplotlib()    # before a run of minutes, not after
        except PlotUnavailable as exc:
            print_err(f"ray-lite bench: {exc}")
            return 2
    if args.from_json:
        from ._harness import Figure
        with open(args.from_json) as f:
            result = json.load(f)
        for suite in result["suites"].values():
            suite["_figures"] = [Figure(**fig) for fig in suite["figures"]]
        print(format_result(result, args.verbose), flush=True)
        return _plot(result, args.plot) if args.plot else 0
    names = args.names or list(DEFAULT_SUITES)
    unknown = [n for n in names if n not in SUITES]
    if unknown:
        print_err(f"ray-lite bench: unknown suite(s) {', '.join(unknown)}; "
                  f"known: {', '.join(SUITES)}")
        return 2
    smoke = args.smoke or os.environ.get(SMOKE_ENV, "") not in ("", "0")
    scale = "smoke" if smoke else ("quick" if args.quick else "full")
    ctx = Context(scale=scale, compare_ray=args.compare_ray, log=print_err, only=args.only)
    ctx.beside_hog = args.beside_hog
    ctx.http_mode = args.http_mode
    load = check_load(sample_s=0.2 if smoke else 0.5)
    with _ended_through_finally_on_sigterm():
        result = run_suites(names, ctx)
    result["load_before"] = load
    print(format_result(result, args.verbose), flush=True)
    if args.json:
        for suite in result["suites"].values():
            del suite["_figures"]
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
        print(f"\nwrote {args.json}")
    errors = [f for s in result["suites"].values() for f in s["figures"] if f["status"] == ERROR]
    if args.plot and _plot(result, args.plot) != 0:
        return 1
    return 1 if errors else 0


def check_load(sample_s=0.5, reading=None):
    """Before a run: how busy the machine is (``reading``, default: sampled
    now for ``sample_s`` s), with a warning on stderr when it is too busy
    for the figures to mean anything.  Returns the reading (kept in the
    JSON as ``load_before``)."""
    from ._harness import load_reading, print_err
    from ._report import busy_lines
    if reading is None:
        reading = load_reading(sample_s)
    for line in busy_lines(reading):
        print_err(line)
    return reading


def _end_run(signum, frame):
    signal.signal(signum, signal.SIG_DFL)
    raise SystemExit(128 + signum)


def _default_sigterm_after_fork():
    # A process forked during a run (the standard library pool B17 times)
    # would inherit _end_run, which runs only at its next check for signals:
    # a SIGTERM that lands as a pool worker is about to block (on the queue
    # lock that terminate() holds) is never acted on, and the pool's
    # terminate() waits for that worker for ever.
    try:
        if signal.getsignal(signal.SIGTERM) is _end_run:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
    except ValueError:
        pass


_fork_hook = []


@contextlib.contextmanager
def _ended_through_finally_on_sigterm():
    """While a run lasts, SIGTERM (``timeout``, a job scheduler, ``kill``)
    ends it as Ctrl-C does: through each suite's ``finally``, which stops the
    servers, CPU hogs and clusters the suite started.  Python's default ends
    the process at once and leaves them running (a ``serve run`` in a
    session of its own is not ended with its parent).  A second SIGTERM ends
    at once.  A process forked meanwhile keeps the default."""
    try:
        before = signal.signal(signal.SIGTERM, _end_run)
    except ValueError:      # not the main thread: leave the signal alone
        yield
        return
    if not _fork_hook:
        os.register_at_fork(after_in_child=_default_sigterm_after_fork)
        _fork_hook.append(True)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def _plot(result, path):
    from ._harness import print_err
    from .plot import plot_result
    try:
        bars = plot_result(result, path)
    except (ValueError, OSError) as exc:
        print_err(f"ray-lite bench: cannot plot: {exc}")
        return 1
    print(f"plotted {bars} figures to {path}")
    return 0
