"""``ray-lite bench --plot``: figures beside their anchors, drawn from a result."""
import json
import sys

import pytest

from ray_lite import bench
from ray_lite.bench import plot


def _fig(bench_id, name, impl, label, unit, value, spread=None, status="ok"):
    return {"bench": bench_id, "name": name, "impl": impl, "label": label, "unit": unit,
            "value": value, "stat": "median", "spread": spread or {}, "trials": 3,
            "samples": 0, "goal": None, "goal_met": None, "detail": {}, "note": None,
            "status": status, "reason": None if status == "ok" else "wrk not found"}


def _fake_result():
    return {"schema": "ray_lite.bench/1", "scale": "quick",
            "machine": {"cpu": "Test CPU", "cores": 2, "kernel": "Linux 6", "arch": "x86_64",
                        "python": "CPython 3", "ray_lite": "0",
                        "date": "2026-12-01 00:00 UTC", "compiled": True},
            "suites": {
                "serve": {"seconds": 1.0, "notes": [], "figures": [
                    _fig("B7", "HTTP hi, ab -c 100", "ray_lite", "ray_lite", "req/s", 9000.0,
                         {"min": 8500.0, "max": 9900.0}),
                    _fig("B7", "HTTP hi, ab -c 100", "anchor", "Ray Serve", "req/s", 900.0,
                         {"min": 850.0, "max": 990.0}),
                    _fig("B7", "HTTP hi, ab -c 100", "ceiling", "bare uvicorn", "req/s", 11000.0),
                    _fig("B16", "CPU per HTTP request", "ray_lite", "ray_lite", "us", 80.0),
                    _fig("B8", "HTTP hi, wrk", "ray_lite", "ray_lite", "req/s", None,
                         status="unavailable"),
                ]},
                "micro": {"seconds": 1.0, "notes": [], "figures": [
                    _fig("B4", "ring round trip", "compiled", "ray_lite (compiled)", "us", 3.1,
                         {"min": 3.0, "max": 3.3}),
                    _fig("B4", "ring round trip", "anchor", "multiprocessing.Pipe", "us", 40.0),
                ]},
            }}


def test_a_plot_draws_every_measured_figure_beside_its_anchors(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "bench.png"
    # 6 measured figures; the unavailable one has no bar.
    assert plot.plot_result(_fake_result(), str(out)) == 6
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_command_plots_a_saved_result(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    saved = tmp_path / "result.json"
    saved.write_text(json.dumps(_fake_result()))
    out = tmp_path / "from_json.png"
    assert bench.main(["--from-json", str(saved), "--plot", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "Ray Serve" in printed and f"plotted 6 figures to {out}" in printed
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_result_with_nothing_measured_is_refused(tmp_path):
    pytest.importorskip("matplotlib")
    result = _fake_result()
    for suite in result["suites"].values():
        for f in suite["figures"]:
            f["status"], f["value"] = "error", None
    with pytest.raises(ValueError, match="no measured figure"):
        plot.plot_result(result, str(tmp_path / "empty.png"))
    assert not (tmp_path / "empty.png").exists()


def test_without_matplotlib_the_command_names_the_extra(tmp_path, monkeypatch, capsys):
    # A None entry makes `import matplotlib...` raise ImportError, as if absent.
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    out = tmp_path / "never.png"
    assert bench.main(["--from-json", str(tmp_path / "unread.json"), "--plot", str(out)]) == 2
    err = capsys.readouterr().err
    assert "matplotlib" in err and "ray_lite[plot]" in err
    assert not out.exists()


@pytest.mark.parametrize("suites", [("serve", "micro"), ("micro",)])
def test_the_title_stays_clear_of_the_first_panel(tmp_path, monkeypatch, suites):
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure
    drawn = []
    save = Figure.savefig

    def savefig(self, *args, **kwargs):
        save(self, *args, **kwargs)
        drawn.append(self)
    monkeypatch.setattr(Figure, "savefig", savefig)
    result = _fake_result()
    result["suites"] = {name: result["suites"][name] for name in suites}
    # A tall figure (tight_layout let the title run into the first panel's
    # there), and a long machine line: the title wraps over several lines.
    result["suites"]["micro"]["figures"] += [
        _fig(f"B{i}", f"workload {i}", "compiled", "ray_lite", "us", 1.0 + i) for i in range(60)]
    result["machine"]["cpu"] = "A processor with a model name long enough to wrap the title " * 2
    plot.plot_result(result, str(tmp_path / "title.png"))
    (fig,) = drawn
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    canvas = FigureCanvasAgg(fig)
    canvas.draw()                           # the same layout, on a canvas that can measure it
    renderer = canvas.get_renderer()
    title = fig._suptitle.get_window_extent(renderer)
    first = fig.axes[0]
    panel = first.title.get_window_extent(renderer)
    assert title.y0 >= panel.y1                     # above the first panel's own title
    assert title.y0 >= first.get_window_extent(renderer).y1
