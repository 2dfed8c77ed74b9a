"""Every goal ``ray-lite bench`` judges, in one table (:data:`GOALS`), and
the judging of a suite's figures against it (:func:`judge`).

The goals are the "goal" column of the manual's benchmarks page
(docs/benchmarks.md).  A suite names the goal a row measures (``Figure.goal_id``, a key of :data:`GOALS`) and
nothing else: the goal's text, the reference it is relative to and the
verdict all come from here.

A goal is either a bound on the figure (``at_most`` / ``at_least``) or a
factor over a reference row measured in the same run (``over``: a row of
the same workload whose implementation and label are given; ``least``: the
factor the row must reach, > 1 meaning better than the reference: more per
second, or less time, memory or CPU).  A reference that was not measured
leaves the row unjudged, saying why, rather than guessing.

Goals are for the compiled runtime: a pure-Python twin's row measured beside
a compiled one is informational (no verdict, not counted).  When the whole
run is pure Python (``RAY_LITE_NO_EXTENSIONS=1``, or no compiled twin
built), its rows are judged.

"Kept" rows of BENCHMARKS.md (met goals that must not regress) keep a goal
here only where the figure "now" is a factor over a reference this run
measures too, less 10 % (two runs on one machine agree within 10 %); where
"now" is an absolute time or rate of another day (B10, B18-B21 rates and
times) there is no goal, and the factor over Ray is printed beside it.
"""
from dataclasses import dataclass

from ._harness import OK

#: Two runs on one machine agree within this share (BENCHMARKS.md): a
#: "kept" factor may fall this much before it counts as a regression.
KEPT_NOISE = 0.10


@dataclass(frozen=True)
class Goal:
    text: str                      # as printed: "<= 0.2 us", ">= 1.2x bare uvicorn"
    at_most: float = None          # the figure's value at most this
    at_least: float = None         # ... at least this
    over: tuple = None             # (impl, label prefix) of the reference row
    least: float = None            # the factor over it (> 1: better than it)
    least_beside_hog: float = None  # the same when the run is beside a CPU hog
    per_array_gb: tuple = None     # (factor, GB): at most factor x (array + GB)

    @property
    def reference(self):
        return self.over[1] if self.over else None


def _kept(now):
    return round(now * (1 - KEPT_NOISE), 1)


#: Goal id (``Figure.goal_id``) -> the goal; ids are the BENCHMARKS.md id,
#: with the aspect after a space where a workload has several rows.
GOALS = {
    "B1": Goal(">= 1,500,000 tokens/s", at_least=1_500_000),
    "B2": Goal(">= 1,000,000 tokens/s", at_least=1_000_000),
    "B3 next+get": Goal("<= 0.2 us", at_most=0.2),
    "B3 wait": Goal("<= 0.5 us", at_most=0.5),
    "B4": Goal("<= 2x the machine floor", over=("C", "machine floor"), least=0.5),
    "B5 cpu": Goal("<= 1 % of a core", at_most=1.0),
    "B5 wake": Goal("<= 50 us", at_most=50.0),
    "B6": Goal("<= 8 us p50", at_most=8.0),
    "B7": Goal(">= 1.2x bare uvicorn", over=("ceiling", "bare uvicorn"), least=1.2),
    "B8": Goal(">= uvicorn with a worker per core", over=("ceiling", "uvicorn, "), least=1.0,
               least_beside_hog=0.8),
    "B9": Goal("<= bare uvicorn", over=("ceiling", "bare uvicorn"), least=1.0),
    "B11 task": Goal("<= 2.5 us", at_most=2.5),
    "B11 actor": Goal("<= 2.5 us", at_most=2.5),
    "B12": Goal("<= 1.0x msgspec", over=("anchor", "msgspec"), least=1.0),
    "B13": Goal("<= 15 MB", at_most=15.0),
    # Kept: 3.58x and 1.81x bare uvicorn "now".
    "B14": Goal(f">= {_kept(3.58)}x bare uvicorn (kept)", over=("ceiling", "bare uvicorn"),
                least=_kept(3.58)),
    "B15": Goal(f">= {_kept(1.81)}x bare uvicorn (kept)", over=("ceiling", "bare uvicorn"),
                least=_kept(1.81)),
    "B16": Goal("<= bare uvicorn's", over=("ceiling", "bare uvicorn"), least=1.0),
    # Kept: 0.17 ms against the standard library's 0.46 ms, 2.7x.
    "B17": Goal(f">= {_kept(0.46 / 0.17)}x stdlib Pool (kept)",
                over=("ceiling", "stdlib multiprocessing.Pool"), least=_kept(0.46 / 0.17)),
    # Kept: 1.12 GB of PSS for a 1.07 GB array, 0.05 GB over it whatever its size.
    "B21 pss": Goal("<= 1.1x (array + 0.05 GB) (kept)",
                    per_array_gb=(1 + KEPT_NOISE, 0.05)),
    # B22, at 64 streams with the ~1 ms step (the suite's first model size).
    "B22 floor": Goal(">= 0.95x the floor's tokens/s", over=("ceiling", "floor"), least=0.95),
    "B22 hand-written": Goal(">= 1.2x the hand-written server", over=("anchor", "hand-written"),
                             least=1.2),
    "B22 ray": Goal(">= 10x Ray Serve", over=("anchor", "Ray Serve"), least=10.0),
    "B22 itl": Goal("<= 0.5 ms", at_most=0.5),
    "B22 ttft": Goal("<= 1 ms", at_most=1.0),
    # The soak suite's own goals (S1: not a BENCHMARKS.md row).
    "S1 p99": Goal("< 20 ms", at_most=20.0),
    "S1 errors": Goal("0", at_most=0),
    "S1 proxy rss": Goal("< 20 MB", at_most=20.0),
}

INFORMATIONAL = "informational: pure-Python twin (goals are for the compiled runtime)"


def _reference(fig, figures, goal):
    """The row ``goal`` is relative to for ``fig`` (same workload), or
    ``(None, why not)``."""
    impl, prefix = goal.over
    rows = [f for f in figures if f.bench == fig.bench and f.name == fig.name
            and f.impl == impl and f.label.startswith(prefix)]
    measured = [f for f in rows if f.status == OK and f.value]
    if measured:
        return measured[-1], None
    if rows and rows[-1].reason:
        return None, rows[-1].reason
    return None, f"{prefix.rstrip(', ')} not measured in this run"


def factor_over(fig, ref):
    """How much better ``fig`` is than ``ref`` (> 1: more per second, or less
    time, memory or CPU)."""
    if fig.unit.endswith("/s"):
        return fig.value / ref.value
    return ref.value / fig.value


def judge(figures, pure_run=False, beside_hog=False):
    """Give each ray_lite row with a ``goal_id`` its goal's text and verdict
    (``goal_met``), or why it has none (``goal_note``; ``informational`` for
    a pure-Python twin's row in a compiled run)."""
    for fig in figures:
        goal = GOALS.get(fig.goal_id) if fig.goal_id else None
        if goal is None or fig.impl in ("anchor", "ceiling", "C"):
            continue
        fig.goal = goal.text
        fig.goal_met = None
        fig.informational = fig.impl == "python" and not pure_run
        if fig.informational:
            fig.goal_note = INFORMATIONAL
            continue
        if fig.status != OK or fig.value is None:
            continue
        if goal.over:
            ref, why = _reference(fig, figures, goal)
            if ref is None:
                fig.goal_note = f"not judged: {why}"
                continue
            x = factor_over(fig, ref)
            least = goal.least
            if beside_hog and goal.least_beside_hog is not None:
                least = goal.least_beside_hog
                fig.goal = f"beside a CPU hog: >= {least:g}x {goal.reference.rstrip(', ')}"
            fig.detail = dict(fig.detail or {}, x_goal=round(x, 3),
                              goal_reference=ref.label)
            fig.goal_met = x >= least
        elif goal.per_array_gb:
            array_gb = (fig.detail or {}).get("array_gb")
            if array_gb is None:
                fig.goal_note = "not judged: the array's size was not recorded"
                continue
            factor, extra = goal.per_array_gb
            fig.goal_met = fig.value <= factor * (array_gb + extra)
        elif goal.at_most is not None:
            fig.goal_met = fig.value <= goal.at_most
        elif goal.at_least is not None:
            fig.goal_met = fig.value >= goal.at_least
    return figures
