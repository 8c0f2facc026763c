"""Plots a person can read, checked on the figure objects of synthetic results: every config its own (colour,
marker), the legend outside the axes, cutoffs naming the config they pick, the dispatch choice drawn thick, titles
with kernel, shape and device, ladder bars on a linear axis; and the checks that run before any measuring."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from tilewise.errors import ConfigError
from tilewise.kernels.space import Config
from tilewise.tune import plot as tplot
from tilewise.tune.measure import summarize

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

FP = "webgpu:Vulkan:llvmpipe-LLVM-19.1.7-256-bits:mesa-25.0:0123456789"


def _st(ms: float, rng: np.random.Generator):
    return summarize(ms * (1 + 0.02 * rng.standard_normal(12)), rng)


def _sweep(n_configs: int, seed: int = 0):
    from tilewise.tune.sweep import SweepResult

    rng = np.random.default_rng(seed)
    configs = [Config({"BM": 16 * (i + 1), "VEC": 1 + i % 2}) for i in range(n_configs)]
    ms = list(range(1, 129, 7))
    res = SweepResult("gemm", FP, 256, 128, ms, configs)
    for i, c in enumerate(configs):
        base = rng.uniform(0.05, 0.5)
        res.stats[c] = {m: _st(base * (1 + m / (40 + 10 * i)), rng) for m in ms}
        res.waste[c] = {m: float(np.ceil(m / c["BM"]) * c["BM"] / m) for m in ms}
    labels = [str(c) for c in configs]
    ranges = [{"m_min": 1, "m_max": 40, "label": labels[2]}, {"m_min": 41, "m_max": 90, "label": labels[5]},
              {"m_min": 91, "m_max": None, "label": labels[11]}]
    return res, ranges


def _outside(fig, ax, legend) -> bool:
    fig.canvas.draw()
    box, area = legend.get_window_extent(), ax.get_window_extent()
    return box.x0 >= area.x1 or box.x1 <= area.x0 or box.y0 >= area.y1 or box.y1 <= area.y0


def test_styles_are_unique_for_many_configs():
    pairs = [tplot.style(i) for i in range(len(tplot.PALETTE) * len(tplot.MARKERS))]
    assert len(set(pairs)) == len(pairs)
    assert len({c for c, _ in pairs[:10]}) == 10  # the first ten configs differ in colour as well


def test_sweep_plot_is_readable(tmp_path):
    res, ranges = _sweep(13)  # more configs than colours: markers must tell the repeats apart
    fig = tplot.draw_sweep(res, ranges)
    ax = fig.axes[0]
    legend = ax.get_legend()
    handles = legend.legend_handles
    assert len(handles) == 13
    styles = {(matplotlib.colors.to_hex(h.get_color()), h.get_marker()) for h in handles}
    assert len(styles) == 13
    assert _outside(fig, ax, legend)
    cutoffs = [t.get_text() for t in ax.texts if t.get_gid() == "cutoff"]
    assert len(cutoffs) == len(ranges)
    labels = [str(c) for c in res.configs]
    for r, text in zip(ranges, cutoffs):
        assert f"M≥{r['m_min']}" in text and r["label"] in text and f"c{labels.index(r['label'])}" in text
    thick = [ln for ln in ax.get_lines() if ln.get_label() == "_chosen"]
    assert len(thick) == len(ranges) and all(ln.get_linewidth() > 2 for ln in thick)
    for ln, r in zip(thick, ranges):  # each thick line covers its range's rows only, in its config's colour
        xs = ln.get_xdata()
        hi = r["m_max"] or max(res.ms)
        assert min(xs) >= r["m_min"] and max(xs) <= hi
        i = labels.index(r["label"])
        assert matplotlib.colors.to_hex(ln.get_color()) == tplot.style(i)[0]
    title = ax.get_title()
    assert "gemm" in title and "N=256 K=128" in title and "llvmpipe" in title and FP not in title
    matplotlib.pyplot.close(fig)
    out = tmp_path / "sweep.png"
    tplot.plot_sweep(res, out, ranges)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["sweep.png"]  # no temporary file left behind


def test_tune_plot_names_tie_groups_outside_the_axes(tmp_path):
    from tilewise.kernels.gemm.webgpu import WgslGemm
    from tilewise.tune.engine import Item, Outcome
    from tilewise.tune.tuner import TuneResult

    rng = np.random.default_rng(1)
    tpl = WgslGemm()
    rows = []
    for i in range(6):
        oc = Outcome(Item(tpl, Config({"BM": 16 * (i + 1)}), (64, 64, 64)), "ok", stats=_st(0.1 * (1 + i // 2), rng))
        oc.tie_group = 1 + i // 2
        rows.append(oc)
    res = TuneResult("gemm", FP, (64, 64, 64), "seed", rows)
    fig = tplot.draw_tune(res)
    ax = fig.axes[0]
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["tie group 1 (fastest)", "tie group 2", "tie group 3"]
    assert _outside(fig, ax, legend)
    assert "gemm 64x64x64" in ax.get_title() and "llvmpipe" in ax.get_title()
    matplotlib.pyplot.close(fig)
    tplot.plot_tune(res, tmp_path / "tune.png")
    assert (tmp_path / "tune.png").stat().st_size > 1000


def test_ladder_bars_are_on_a_linear_axis(tmp_path):
    from tilewise.ladder import LadderResult, Rung, plot
    from tilewise.ladder.run import draw

    rng = np.random.default_rng(2)
    rungs = [Rung(n, "", Config({"X": i}), stats=_st(ms, rng), verdict=v, speedup_vs_baseline=4.0 / ms)
             for i, (n, ms, v) in enumerate((("baseline", 4.0, "baseline"), ("tile", 1.0, "win"),
                                             ("stage", 1.6, "loss")))]
    res = LadderResult("gemm-gpu", "GEMM", {"name": "llvmpipe", "api": "Vulkan", "fingerprint": FP}, "timestamps",
                       (64, 64, 64), ("M", "N", "K"), rungs, [("numpy.matmul", _st(0.5, rng))])
    fig = draw(res)
    ax = fig.axes[0]
    assert ax.get_xscale() == "linear" and ax.get_xlim()[0] == 0
    bars = ax.patches
    assert len(bars) == 4
    widths = sorted(b.get_width() for b in bars)  # bar lengths keep the medians' ratios
    assert widths[-1] / widths[0] == pytest.approx(rungs[0].stats.median_ms / res.references[0][1].median_ms)
    top_down = sorted(zip(ax.get_yticks(), (t.get_text() for t in ax.get_yticklabels())), reverse=True)
    assert [name for _, name in top_down] == ["baseline", "tile", "stage", "ref: numpy.matmul"]
    assert "gemm-gpu" in ax.get_title() and "M=64 N=64 K=64" in ax.get_title()
    matplotlib.pyplot.close(fig)
    plot(res, str(tmp_path / "ladder.png"))
    assert (tmp_path / "ladder.png").stat().st_size > 1000


def test_require_plot_refuses_bad_paths_before_any_work(tmp_path):
    assert tplot.require_plot(tmp_path / "ok.png") == str(tmp_path / "ok.png")
    for bad, words in ((tmp_path, "is a folder"), (tmp_path / "missing" / "x.png", "does not exist"),
                       (tmp_path / "x.txt", "does not end in an image format")):
        with pytest.raises(ConfigError, match=words):
            tplot.require_plot(bad)
    assert list(tmp_path.iterdir()) == []


def test_missing_matplotlib_names_the_clone_and_the_pip_fix(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ConfigError) as err:
        tplot.require_plot(tmp_path / "x.png")
    assert "bash scripts/run extras plot" in err.value.fix and "pip install 'tilewise[plot]'" in err.value.fix


def test_ladder_cli_checks_the_plot_path_before_measuring(tmp_path, capsys):
    from tilewise.cli import main

    target = tmp_path / "no-such-folder" / "ladder.png"
    assert main(["ladder", "gemm-gpu", "--small", "--plot", str(target)]) == 2
    err = capsys.readouterr()
    assert "does not exist" in err.err and "device:" not in err.out + err.err  # refused before a device started
    assert list(tmp_path.iterdir()) == []


def test_scripts_run_extras_checks_names_against_pyproject():
    """`bash scripts/run extras plot` is the clone's fix; a wrong name is refused with the list, nothing installed."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    if not (root / ".venv" / "bin" / "python").exists():
        pytest.skip("no .venv in this checkout (scripts/run would create one)")
    stamps = sorted(p.name for p in (root / ".venv").glob(".tilewise-*"))
    bad = subprocess.run(["bash", "scripts/run", "extras", "plot,plotz"], cwd=root, capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown extra 'plotz'" in bad.stderr and "plot" in bad.stderr
    usage = subprocess.run(["bash", "scripts/run", "extras"], cwd=root, capture_output=True, text=True)
    assert usage.returncode == 2 and "usage: bash scripts/run extras NAME" in usage.stderr
    assert "plot: --plot on tune, sweep and ladder" in usage.stderr
    assert sorted(p.name for p in (root / ".venv").glob(".tilewise-*")) == stamps
