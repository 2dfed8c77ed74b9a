"""``ray-lite bench --plot FILE.png``: each suite's figures as bars beside
their anchors and ceilings, on a log scale (needs the ``plot`` extra:
``pip install 'ray_lite[plot]'``, i.e. matplotlib).

One panel per suite; in it, one group of bars per workload (bench id and
name, with its unit), one bar per implementation measured on it, the
min-max over trials as an error bar where the figure has one.  Units differ
between groups, so bars compare within a group: the log scale keeps a 100x
gap and a 10 % one both readable.
"""

EXTRA_HINT = "pip install 'ray_lite[plot]'"
# One colour per kind of row, the same in every panel.
IMPL_COLOURS = {"compiled": "tab:blue", "ray_lite": "tab:blue", "python": "tab:cyan",
                "anchor": "tab:orange", "ceiling": "tab:green", "C": "tab:gray"}
_HEADING_CHARS = 70


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def _matplotlib_figure():
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise PlotUnavailable(f"--plot needs matplotlib, which is not installed "
                              f"({exc}): {EXTRA_HINT}") from None
    return Figure


def require_matplotlib():
    """Raise :class:`PlotUnavailable` (naming the extra) unless matplotlib imports."""
    _matplotlib_figure()


def _groups(figures):
    """[(heading, [figure dict, ...])] of the measured figures, in first-seen order."""
    from ._report import unit_text
    groups, index = [], {}
    for f in figures:
        value = f.get("value")
        if f.get("status", "ok") != "ok" or not value or value <= 0:
            continue
        key = (f["bench"], f["name"], f.get("unit", ""))
        if key not in index:
            index[key] = len(groups)
            heading = f"{f['bench']}  {f['name']}"
            if len(heading) > _HEADING_CHARS:
                heading = heading[:_HEADING_CHARS - 1] + "…"
            groups.append((f"{heading} [{unit_text(f.get('unit', ''))}]", []))
        groups[index[key]][1].append(f)
    return groups


def _row_label(f):
    label, impl = f.get("label", ""), f.get("impl", "")
    return label if impl in label else f"{label} ({impl})"


def _draw_suite(ax, name, groups):
    import math

    from ._report import fmt_number
    ticks, labels, bold = [], [], []
    lowest, highest = math.inf, 0.0
    y = 0
    for heading, rows in groups:
        ticks.append(y)
        labels.append(heading)
        bold.append(True)
        y += 1
        for f in rows:
            value = f["value"]
            spread = f.get("spread") or {}
            lo, hi = spread.get("min"), spread.get("max")
            xerr, right = None, value
            if isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and 0 < lo <= value <= hi:
                xerr, right = [[value - lo], [hi - value]], hi
            lowest, highest = min(lowest, lo if xerr else value), max(highest, right)
            ax.barh(y, value, xerr=xerr, color=IMPL_COLOURS.get(f.get("impl"), "tab:purple"),
                    capsize=3, height=0.8)
            ax.annotate(fmt_number(value, f.get("unit", "")), (right, y), xytext=(4, 0),
                        textcoords="offset points", va="center", fontsize=7)
            ticks.append(y)
            labels.append(_row_label(f))
            bold.append(False)
            y += 1
        y += 0.5
    ax.set_xscale("log")
    # Every bar starts at the same power of ten below the smallest value (a
    # log axis has no zero), and room is left right of the longest for its label.
    ax.set_xlim(10 ** math.floor(math.log10(lowest)), highest * 4)
    ax.set_yticks(ticks)
    ax.set_yticklabels(labels, fontsize=7)
    for tick, is_heading in zip(ax.get_yticklabels(), bold):
        if is_heading:
            tick.set_fontweight("bold")
    ax.invert_yaxis()
    ax.set_title(f"{name} (log scale; compare bars within a group)", fontsize=9)
    ax.grid(axis="x", which="both", alpha=0.3)


# Inches: per row of bars, per panel (its title and the x axis under it),
# and per line of the figure's title.
_ROW_IN, _PANEL_IN, _TITLE_LINE_IN = 0.22, 1.0, 0.22


def _title(result):
    """The figure's title: the run, then the machine (CPU, cores, how idle
    CPUs wait, ...) in lines short enough for the figure's width."""
    import textwrap
    title = f"ray-lite bench ({result.get('scale', '?')} run)"
    machine = result.get("machine") or {}
    if machine:
        from ._harness import machine_parts
        try:
            text = ", ".join(machine_parts(machine))
        except KeyError:        # a result written without some of the machine's keys
            hot = {True: "compiled", False: "pure-Python"}.get(machine.get("compiled"), "?")
            text = (f"{machine.get('cpu', '?')}, {machine.get('cores', '?')} cores, "
                    f"{machine.get('python', '?')}, {hot} hot paths, {machine.get('date', '')}")
        title += "\n" + "\n".join(textwrap.wrap(text, 110))
    return title


def plot_result(result, path):
    """Draw ``result`` (what :func:`ray_lite.bench.run_suites` returns, or its
    JSON) into the image ``path``; returns the number of bars drawn."""
    Figure = _matplotlib_figure()
    suites = [(name, _groups(s["figures"])) for name, s in result["suites"].items()]
    suites = [(name, g) for name, g in suites if g]
    if not suites:
        raise ValueError("no measured figure to plot")
    heights = [sum(1 + len(rows) for _, rows in g) * _ROW_IN + _PANEL_IN for _, g in suites]
    title = _title(result)
    title_in = (title.count("\n") + 1) * _TITLE_LINE_IN + 0.2
    # Constrained layout places the title above the first panel's own title
    # (tight_layout of some matplotlib versions lets them overlap), and the
    # title's height is added to the figure's so that no panel is squeezed.
    fig = Figure(figsize=(11, sum(heights) + title_in), layout="constrained")
    axes = fig.subplots(len(suites), 1, squeeze=False,
                        gridspec_kw={"height_ratios": heights})[:, 0]
    bars = 0
    for ax, (name, groups) in zip(axes, suites):
        _draw_suite(ax, name, groups)
        bars += sum(len(rows) for _, rows in groups)
    fig.suptitle(title, fontsize=9)
    fig.savefig(path, dpi=110)
    return bars
