"""How ``ray-lite bench`` prints a result: a table a person reads in 100
columns, a summary of the goals per suite, the machine, and a warning when
the machine was busy before the run; ``--verbose`` prints every figure with
all it carries (wider).  The JSON (``--json``) keeps every detail.

The compact table has a heading line per workload (its id, what it
measures and its goal), then a line per implementation measured on it: the
figure, its spread, how it compares with the anchor of the same run, and
whether it meets the goal.  Long texts are abbreviated with "…"; the full
text is in ``--verbose`` and ``--json``.
"""
import math
import re
import textwrap

from ._harness import BYTECODE_NOTE, OK, machine_parts, ratio_text, reference_rows

#: Every line of the compact view fits in this many columns, and in as many
#: bytes of UTF-8 (what a byte-counting ``awk 'length > 100'`` sees): the
#: columns below leave room for the few two- and three-byte characters a
#: line holds (µ, ±, …).
WIDTH = 100

# Unit codes of the JSON (ASCII) as they are printed.
_UNIT_TEXT = {"us": "µs"}
# "5 us", "<= 20 us", "1.2 us/msg": the JSON's ASCII spelling in a text.
_US_WORD = re.compile(r"(?<=[\d ])us\b")

# The columns of a workload's lines (after the indent), and the indent.
_INDENT = 5
_SUBJECT, _VALUE, _SPREAD, _VERSUS, _MET = 28, 16, 12, 20, 3
_GAP = "  "
_REASON = _SPREAD + _VERSUS + _MET + 2 * len(_GAP)


def unit_text(unit):
    return _UNIT_TEXT.get(unit, unit)


def plain_text(text):
    """``text`` with microseconds spelled as printed: µs."""
    if not text:
        return text or ""
    return _US_WORD.sub("µs", text)


def byte_len(text):
    return len(text.encode())


def fit(line, width=WIDTH):
    """``line`` within ``width`` bytes of UTF-8 (and so columns): padding
    (runs of 3 or more spaces) gives way first, then the end is cut."""
    while byte_len(line) > width:
        runs = [m for m in re.finditer(r"(?<=\S)   +", line)]
        if not runs:
            break
        m = max(runs, key=lambda m: len(m.group()))
        line = line[: m.start()] + line[m.start() + 1:]
    while byte_len(line) > width:
        line = line[:-2] + "…"
    return line


def fmt_number(value, unit):
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    u = unit_text(unit)
    if unit == "%":
        return f"{value:.2f} %" if value < 10 else f"{value:.1f} %"
    if isinstance(value, int):
        text = f"{value:,}"
    elif value >= 1000:
        text = f"{value:,.0f}"
    elif value >= 100:
        text = f"{value:.0f}"
    elif value >= 10:
        text = f"{value:.1f}"
    else:
        text = f"{value:.2f}"
    return f"{text} {u}".rstrip()


def fmt_spread(fig):
    """Every spread statistic of ``fig``, in full (the verbose view)."""
    s = fig.spread
    if not s:
        return ""
    parts = []
    if "min" in s and "max" in s and "p99" not in s:
        parts.append(f"{fmt_number(s['min'], fig.unit)} – {fmt_number(s['max'], fig.unit)}")
    if "p99" in s:
        parts.append(f"p99 {fmt_number(s['p99'], fig.unit)}")
    if "trial_p50_min" in s:
        parts.append(f"p50s {fmt_number(s['trial_p50_min'], fig.unit)} – "
                     f"{fmt_number(s['trial_p50_max'], fig.unit)}")
    for key, val in s.items():
        if key not in ("min", "max", "p99", "trial_p50_min", "trial_p50_max"):
            parts.append(f"{key} {fmt_number(val, fig.unit)}")
    return "; ".join(parts)


def short_spread(fig):
    """The spread in a few characters: ``±N%``, the widest distance from the
    figure to a trial's own figure (min-max of trials, or of the trials'
    p50s), or the standard deviation; the p99 (or max) of the samples
    where there was one trial."""
    s, value = fig.spread or {}, fig.value
    if not value or not isinstance(value, (int, float)):
        return ""
    lo, hi = s.get("trial_p50_min", s.get("min")), s.get("trial_p50_max", s.get("max"))
    if "p99" in s and "trial_p50_min" not in s:
        lo = hi = None                  # one trial: its max is a sample, not a trial
    gap = None
    if isinstance(lo, (int, float)) and isinstance(hi, (int, float)):
        gap = max(value - lo, hi - value)
    elif isinstance(s.get("std"), (int, float)):
        gap = s["std"]
    if gap is not None:
        return "1 trial" if fig.trials == 1 else f"±{gap / value * 100:.0f}%"
    for key in ("p99", "max"):
        if isinstance(s.get(key), (int, float)):
            return abbreviate(f"{key} {fmt_number(s[key], fig.unit)}", _SPREAD)
    return ""


def abbreviate(text, width):
    """``text`` in at most ``width`` characters: cut at a word's end where
    one is near, marked with "…"."""
    text = text or ""
    if len(text) <= width:
        return text
    cut = text[: width - 1]
    space = cut.rfind(" ")
    if space >= width - 8:
        cut = cut[:space]
    return cut.rstrip(" ,;:(-") + "…"


def _subject(fig):
    """The implementation a line measured: its label, with "anchor",
    "ceiling" or "C" before it; a label too long loses "ray_lite" and the
    parentheses around its twin's name before it is cut."""
    tag = {"anchor": "anchor: ", "ceiling": "ceiling: ", "C": "C: "}.get(fig.impl, "")
    text = tag + fig.label.replace("multiprocessing.", "mp.")
    if len(text) > _SUBJECT:
        text = re.sub(r"^ray_lite ", "", text)
        text = re.sub(r"\((compiled|pure Python)\)", r"\1", text)
    return abbreviate(text, _SUBJECT)


def _value(fig):
    text = fmt_number(fig.value, fig.unit)
    # Percentiles and maxima are named; a median or mean of trials is the default.
    stat = f" {fig.stat}" if fig.stat in ("p50", "p99", "max") else ""
    if len(text + stat) > _VALUE and fig.value >= 1e5:    # "1.23M tokens/s", "191k tokens/s"
        text = (f"{fig.value / 1e6:.2f}M" if fig.value >= 1e6 else
                f"{fig.value / 1e3:.0f}k") + f" {unit_text(fig.unit)}"
    return text + stat


def _versus(fig, refs, width=_VERSUS):
    """The factor over the reference its goal names (when it is not the
    anchor or ceiling), over the anchor and over the ceiling of the same
    run, naming each; else the figure's own note."""
    parts = []
    detail = fig.detail or {}
    shown = {ref.label for kind in ("anchor", "ceiling")
             if (ref := refs[kind].get((fig.bench, fig.name))) is not None}
    if detail.get("x_goal") is not None and detail.get("goal_reference") not in shown:
        parts.append(f"{ratio_text(detail['x_goal'])} "
                     f"{detail['goal_reference'].split(':')[0]}")
    for kind in ("anchor", "ceiling"):
        x = (fig.detail or {}).get(f"x_{kind}")
        ref = refs[kind].get((fig.bench, fig.name))
        if x is not None and ref is not None:
            label = ref.label.replace("multiprocessing.", "mp.")
            if len(ratio_text(x)) + 1 + len(label) > width:
                label = label.split()[0]        # "pickle dumps/loads (protocol 5)": "pickle"
            parts.append(f"{ratio_text(x)} {label}")
    text = "; ".join(parts) if parts else plain_text(fig.note)
    return abbreviate(text, width)


def _met(fig):
    """The verdict column: "yes", "NO", "-" (a goal not judged: its reference
    or the figure is missing), or nothing (no goal, or an informational row)."""
    if getattr(fig, "informational", False):
        return ""
    return {True: "yes", False: "NO", None: "-" if fig.goal else ""}[fig.goal_met]


def _groups(figures):
    """``[((bench, name), [figure, ...])]`` in first-seen order."""
    groups, index = [], {}
    for fig in figures:
        key = (fig.bench, fig.name)
        if key not in index:
            index[key] = len(groups)
            groups.append((key, []))
        groups[index[key]][1].append(fig)
    return groups


def _heading(bench, name, goals):
    head = f"{bench:<{_INDENT - 1}} "
    goal = ("goal " + " / ".join(plain_text(g) for g in goals)) if goals else ""
    room = WIDTH - 2 - len(head) - (len(goal) + 2 if goal else 0)
    if goal and room < 30:         # a long goal: shorten it rather than the name
        goal = abbreviate(goal, WIDTH - 2 - len(head) - 32)
        room = WIDTH - 2 - len(head) - len(goal) - 2
    text = head + abbreviate(name, room)
    if not goal:
        return text
    return text + " " * (WIDTH - byte_len(text) - byte_len(goal)) + goal


def _line(cells):
    widths = (_SUBJECT, _VALUE, _SPREAD, _VERSUS, _MET)
    out = " " * _INDENT + _GAP.join(c.ljust(w) for c, w in zip(cells, widths))
    return fit(out.rstrip())


HEADER = _line(("implementation", "figure", "spread", "vs anchor / note", "met"))


def render_table(figures):
    """The figures as the compact table: every line within :data:`WIDTH`."""
    refs = reference_rows(figures)
    out = [HEADER]
    for (bench, name), group in _groups(figures):
        goals = list(dict.fromkeys(f.goal for f in group if f.goal))
        out.append(_heading(bench, name, goals))
        for fig in group:
            if fig.status == OK:
                met = _met(fig)
                # Without a verdict, the comparison or note may take its column.
                versus = _versus(fig, refs, _VERSUS if met else _VERSUS + len(_GAP) + _MET)
                cells = (_subject(fig), abbreviate(_value(fig), _VALUE), short_spread(fig),
                         versus, met)
            else:
                # Not measured: the reason takes the columns of the spread,
                # the comparison and the verdict.
                cells = (_subject(fig), abbreviate(fig.status, _VALUE),
                         abbreviate(plain_text(fig.reason or ""), _REASON))
            out.append(_line(cells))
    return "\n".join(out)


def render_verbose(figures):
    """Every figure with all it carries: a heading per workload, then per
    implementation its label, figure, every spread statistic, the note, the
    goal and verdict, the trials and samples, the reason it was not
    measured, and its detail numbers.  Lines may be wider than the table."""
    out = []
    for (bench, name), group in _groups(figures):
        out.append(f"{bench}  {name}")
        for fig in group:
            if fig.status == OK:
                value = fmt_number(fig.value, fig.unit)
                if fig.stat and fig.stat != "median":
                    value += f" ({fig.stat})"
                parts = [value, fmt_spread(fig), plain_text(fig.note)]
            else:
                parts = [fig.status, plain_text(fig.reason)]
            if fig.goal:
                parts.append(f"goal {plain_text(fig.goal)}: {_met(fig) or '-'}")
            if fig.goal_note:
                parts.append(fig.goal_note)
            if fig.trials or fig.samples:
                parts.append(f"{fig.trials} trials, {fig.samples:,} samples")
            out.append(f"  {fig.label} [{fig.impl}]: " + "; ".join(p for p in parts if p))
            detail = _detail_text(fig)
            if detail:
                out.append(f"      detail: {detail}")
    return "\n".join(out)


def _detail_text(fig):
    parts = []
    for key, val in (fig.detail or {}).items():
        if isinstance(val, float):
            parts.append(f"{key}={val:.4g}")
        elif isinstance(val, (int, str, bool)) or val is None:
            parts.append(f"{key}={val}")
        elif isinstance(val, list) and len(val) <= 12:
            parts.append(f"{key}=[" + ", ".join(f"{v:.4g}" if isinstance(v, float) else str(v)
                                                for v in val) + "]")
        else:
            parts.append(f"{key}=({type(val).__name__} of {len(val)}; --json)")
    return ", ".join(parts)


# -- goals ------------------------------------------------------------------------

def goal_summary(figures, pure_run=None):
    """``{"met": N, "of": M, "missed": [...], "unjudged": [...],
    "informational": K, "pure_run": ...}`` over ray_lite's rows with a goal:
    M counts the rows given a verdict; an unjudged row (its reference or its
    figure missing) is listed with why; K counts the pure-Python twin's rows
    of a compiled run, which have no verdict.  ``pure_run``: why the whole
    run is pure Python (its rows are then judged), else None.  Each missed or
    unjudged entry is ``{"bench", "name", "label", "impl"}`` (and ``"why"``)."""
    ours = [f for f in figures if f.goal and f.impl not in ("anchor", "ceiling", "C")]
    informational = [f for f in ours if getattr(f, "informational", False)]
    ours = [f for f in ours if not getattr(f, "informational", False)]
    entry = lambda f: {"bench": f.bench, "name": f.name, "label": f.label, "impl": f.impl}  # noqa: E731
    unjudged = []
    for f in ours:
        if f.goal_met is None:
            why = (f.goal_note or "").removeprefix("not judged: ") or \
                (f"{f.status}: {f.reason}" if f.status != OK else None)
            unjudged.append(dict(entry(f), why=why))
    return {"met": sum(1 for f in ours if f.goal_met is True),
            "of": sum(1 for f in ours if f.goal_met is not None),
            "missed": [entry(f) for f in ours if f.goal_met is False],
            "unjudged": unjudged,
            "informational": len(informational),
            "pure_run": pure_run}


def _who(entry):
    if entry["impl"] in ("compiled", "python"):
        return "compiled" if entry["impl"] == "compiled" else "pure-Python"
    return abbreviate(entry["label"], 24)


def _listing(entries):
    """"B4 (compiled, pure-Python), B12 (compiled x3: why)": by workload, in
    order, with why it was not judged where every entry of it says the same."""
    by_bench = {}
    for e in entries:
        by_bench.setdefault(e["bench"], []).append(e)
    parts = []
    for bench, items in by_bench.items():
        whos = [_who(e) for e in items]
        counted = []
        for who in dict.fromkeys(whos):
            n = whos.count(who)
            counted.append(f"{who} x{n}" if n > 1 else who)
        whys = {e.get("why") for e in items}
        why = f": {abbreviate(plain_text(whys.pop()), 60)}" if whys and None not in whys \
            and len(whys) == 1 else ""
        parts.append(f"{bench} ({', '.join(counted)}{why})")
    return ", ".join(parts)


def summary_lines(summary):
    """The suite's summary line (wrapped within :data:`WIDTH`)."""
    info = summary.get("informational") or 0
    if not summary["of"] and not summary["unjudged"] and not info:
        return ["goals: none in this suite"]
    text = f"goals met: {summary['met']} of {summary['of']}"
    if summary.get("pure_run"):
        text += f" (a pure-Python run, {summary['pure_run']}: its rows are judged)"
    if summary["missed"]:
        text += f"; missed: {_listing(summary['missed'])}"
    if summary["unjudged"]:
        text += f"; not judged: {_listing(summary['unjudged'])}"
    if info:
        text += (f"; {info} pure-Python row{'s' if info > 1 else ''} informational "
                 f"(goals are for the compiled runtime)")
    return wrap(text, indent="  ")


def wrap(text, indent="  ", width=WIDTH):
    """``text`` as lines within ``width``, continuation lines indented (a
    few columns to spare for characters of more than one byte)."""
    return [fit(line, width) for line in
            textwrap.wrap(text, width=width - 4, subsequent_indent=indent,
                          break_on_hyphens=False, break_long_words=True)] or [""]


# -- the machine and its load --------------------------------------------------------

def machine_lines(info, width=WIDTH):
    """``machine: ...`` in lines within ``width``, and a note when ray_lite
    compiles from source in every process."""
    lines, line = [], "machine:"
    for i, part in enumerate(machine_parts(info)):
        sep = " " if i == 0 else ", "
        if byte_len(line) + len(sep) + byte_len(part) + 1 > width and i > 0:
            lines.append(line + ",")
            line = "         " + part
        else:
            line += sep + part
    lines.append(fit(line, width))
    if info.get("bytecode_cached") is False:
        lines += wrap(BYTECODE_NOTE, width=width)
    return lines


# A machine is busy when, before the run, the load average of the last
# minute or what other processes used over the sample reaches this share of
# its cores: on 2 cores one busy process is half the machine, and every
# cross-process latency then waits for a core.
BUSY_SHARE = 0.25
# A process is named as the busiest from this share of a core over the sample.
BUSIEST_CORES = 0.1


def busy_warning(reading):
    """The warning's text (one paragraph) if ``reading`` (what
    :func:`ray_lite.bench._harness.load_reading` returns) shows a busy
    machine, else None."""
    if not reading:
        return None
    cores = reading.get("cores") or 1
    load = reading.get("loadavg_1min")
    others = reading.get("others_cores")
    reasons = []
    if load is not None and load >= BUSY_SHARE * cores:
        reasons.append(f"load average {load:.2f} over the last minute on {cores} cores")
    if others is not None and others >= BUSY_SHARE * cores:
        reasons.append(f"other processes used {others:.2f} cores over "
                       f"{reading.get('sample_s', 0):g} s")
    if not reasons:
        return None
    busiest = [p for p in reading.get("busiest") or [] if p["cores"] >= BUSIEST_CORES]
    if busiest:
        top = busiest[0]
        reasons.append(f"the busiest: pid {top['pid']} ({top['cores']:.2f} cores) {top['name']}")
    elif "others_cores" in reading:
        reasons.append(f"no other process was busy over the {reading.get('sample_s', 0):g} s "
                       f"sample (a load that just ended, or short processes coming and going)")
    return ("warning: this machine is busy before the run: " + "; ".join(reasons) +
            ". Figures measured now are not meaningful: they measure the waits for a core "
            "as much as ray_lite. Run again on a quiet machine.")


def busy_lines(reading):
    text = busy_warning(reading)
    return wrap(text) if text else []


# -- the whole result --------------------------------------------------------------

LEGEND = "spread: ±widest gap to one trial's figure, or p99/max of one trial; --verbose: all details"


def format_result(result, verbose=False):
    """What ``ray-lite bench`` prints for ``result`` (``run_suites``'s, or
    its JSON with each suite's figures as ``_figures``)."""
    lines = machine_lines(result["machine"])
    lines += busy_lines(result.get("load_before"))
    if not verbose:
        lines += wrap(LEGEND)
    for name, suite in result["suites"].items():
        figures = suite["_figures"]
        lines.append("")
        lines.append(f"== {name} ({result['scale']} run, {suite['seconds']:.1f} s)")
        lines.append(render_verbose(figures) if verbose else render_table(figures))
        if not verbose:
            # Reasons the table had to shorten, in full (once each).
            seen = set()
            for f in figures:
                reason = plain_text(f.reason)
                if f.status != OK and reason and len(reason) > _REASON \
                        and reason not in seen:
                    seen.add(reason)
                    lines += wrap(f"  {f.bench} {f.label}: {f.status}: {reason}", indent="    ")
        for note in suite["notes"]:
            lines += wrap(f"  note: {note}", indent="    ")
        lines += summary_lines(suite.get("goals") or goal_summary(figures))
    if not verbose:
        lines = [fit(line) for chunk in lines for line in chunk.split("\n")]
    return "\n".join(lines)
