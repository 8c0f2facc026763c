"""PNGs of tuning runs and sweeps (matplotlib, the `plot` extra), and the checks a command runs before it measures.

Plots are for reading: every config gets its own (colour, marker) pair, the legend sits outside the axes, dispatch
cutoffs name the config they pick and the chosen config is drawn thick over the rows it serves, titles name the
kernel, the shape and the device.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tilewise.errors import ConfigError
from tilewise.tune.sweep import SweepResult
from tilewise.tune.tuner import TuneResult

PLOT_FIX = "in a clone: bash scripts/run extras plot; installed from an index: pip install 'tilewise[plot]'"
# matplotlib's tab10: ten qualitative colours told apart in print and by most colour-blind readers
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*", "h", "p")  # 12: with 10 colours, 120 distinct pairs


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend, or a ConfigError with the install command."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ConfigError(f"plots need matplotlib, which is not installed ({exc})", PLOT_FIX) from exc
    return plt


def require_plot(path: str | os.PathLike[str]) -> str:
    """Check, before any measuring, that a plot can be written to `path`: matplotlib imports, the name ends in a
    format matplotlib writes (.png, .svg, .pdf, ...), and its folder exists and is writable. Returns `path`.

    Raises:
        ConfigError: the problem and the fix (the install command, or another path).
    """
    pyplot()
    from matplotlib.backend_bases import FigureCanvasBase

    p = Path(path)
    formats = FigureCanvasBase.get_supported_filetypes()
    if p.is_dir():
        raise ConfigError(f"plot path {str(p)!r} is a folder", f"give a file name, e.g. {p / 'plot.png'}")
    suffix = p.suffix.lower().lstrip(".")
    if suffix not in formats:
        raise ConfigError(f"plot path {str(p)!r} does not end in an image format matplotlib writes",
                          f"end it in .png (or one of: {', '.join('.' + f for f in sorted(formats))})")
    folder = p.parent if str(p.parent) else Path(".")
    if not folder.is_dir():
        raise ConfigError(f"plot path {str(p)!r}: the folder {str(folder)!r} does not exist",
                          "create the folder first or write the plot somewhere else")
    if not os.access(folder, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise ConfigError(f"plot path {str(p)!r} is not writable", "write the plot somewhere you can write to")
    return str(path)


def style(i: int) -> tuple[str, str]:
    """(colour, marker) of the i-th config: unique for the first len(PALETTE) * len(MARKERS) configs.

    The marker moves one step per config and one more per pass through the palette, so configs sharing a colour
    never share a marker."""
    return PALETTE[i % len(PALETTE)], MARKERS[(i + i // len(PALETTE)) % len(MARKERS)]


def device_short(fingerprint: str, width: int = 32) -> str:
    """A device's name from its fingerprint (`backend:api:name:driver:hash` -> `name (backend)`), cut to `width`."""
    parts = str(fingerprint).split(":")
    if len(parts) < 3:
        return str(fingerprint)[:width]
    name = parts[2].replace("-", " ")
    name = name if len(name) <= width else name[: width - 1] + "…"
    return f"{name} ({parts[0]})"


def save_figure(fig: Any, path: str | os.PathLike[str]) -> None:
    """Write atomically (a temporary file in the same folder, then a rename), legend outside included, and close the
    figure."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.tmp{p.suffix}")
    try:
        fig.savefig(tmp, dpi=120, bbox_inches="tight")
        os.replace(tmp, p)
    finally:
        tmp.unlink(missing_ok=True)
        pyplot().close(fig)


def _range_of(r: Mapping[str, Any]) -> tuple[int, float]:
    hi = r.get("m_max")
    return int(r["m_min"]), float("inf") if hi is None else float(hi)


def draw_sweep(result: SweepResult, ranges: Sequence[Mapping[str, Any]] | None = None) -> Any:
    """The sweep figure (time vs M per config, tile waste below, cutoffs named, the dispatch choice thick)."""
    plt = pyplot()
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(11, 7), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    labels = [str(c) for c in result.configs]
    for i, c in enumerate(result.configs):
        colour, marker = style(i)
        pts = sorted((m, st.median_ms) for m, st in result.stats.get(c, {}).items())
        if not pts:
            continue
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        ax.plot(xs, ys, color=colour, marker=marker, ms=4, lw=1, label=f"c{i}: {labels[i]}")
        for r in ranges or []:
            if r.get("label") == labels[i]:
                lo, hi = _range_of(r)
                chosen = [(x, y) for x, y in pts if lo <= x <= hi]
                if chosen:  # the dispatch serves this config over these rows: drawn thick, left out of the legend
                    ax.plot([p[0] for p in chosen], [p[1] for p in chosen], color=colour, lw=4, alpha=0.5,
                            solid_capstyle="round", label="_chosen")
        w = sorted(result.waste.get(c, {}).items())
        if w:
            ax2.plot([p[0] for p in w], [p[1] for p in w], color=colour, marker=marker, ms=3, lw=1)
    top = ax.get_ylim()[1]
    for j, r in enumerate(ranges or []):
        lo, _ = _range_of(r)
        name = f"c{labels.index(r['label'])}" if r.get("label") in labels else ""
        text = f"M≥{lo}: {name} {r.get('label', r.get('config_key', ''))}".replace("  ", " ")
        if j > 0:
            for a in (ax, ax2):
                a.axvline(lo - 0.5, color="k", ls="--", lw=0.8)
        ax.text(lo, top, " " + text, va="top", ha="left", fontsize=7, rotation=90, gid="cutoff")
    ax.set_ylabel("median time (ms)")
    ax.set_title(f"{result.kernel} sweep, N={result.n} K={result.k}, on {device_short(result.fingerprint)}: "
                 "time vs M (thick: the dispatch choice)", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, title="config")
    ax2.set_yscale("log")
    ax2.set_ylabel("tile waste (log)")
    ax2.set_xlabel("M (rows)")
    fig.tight_layout()
    return fig


def plot_sweep(result: SweepResult, path: str | Path, ranges: Sequence[Mapping[str, Any]] | None = None) -> None:
    """Write the sweep plot (`draw_sweep`) to `path`."""
    save_figure(draw_sweep(result, ranges), path)


def draw_tune(result: TuneResult) -> Any:
    """The tuning figure: per ranked config its median, 95% interval and p20..p80, coloured by tie group."""
    plt = pyplot()
    ranked = result.ranked
    if not ranked:
        raise ConfigError("nothing to plot: no config ran correctly", "see the table for each config's status")
    fig, ax = plt.subplots(figsize=(10, 0.35 * len(ranked) + 1.5))
    seen: set[int] = set()
    for i, r in enumerate(ranked):
        s = r.stats
        assert s is not None
        group = r.tie_group or 1
        colour, marker = style(group - 1)
        label = f"tie group {group}{' (fastest)' if group == 1 else ''}" if group not in seen else "_"
        seen.add(group)
        ax.plot([s.p20_ms, s.p80_ms], [i, i], color=colour, lw=6, alpha=0.3)
        ax.plot(list(s.ci95_ms), [i, i], color=colour, lw=2)
        ax.plot([s.median_ms], [i], marker, color=colour, label=label)
    ax.set_yticks(range(len(ranked)), [str(r.config) for r in ranked], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("ms (marker: median, thin: 95% interval, thick: p20..p80)")
    ax.set_title(f"{result.kernel} {'x'.join(map(str, result.shape))} on {device_short(result.fingerprint)}",
                 fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    return fig


def plot_tune(result: TuneResult, path: str | Path) -> None:
    """Write the tuning plot (`draw_tune`) to `path`."""
    save_figure(draw_tune(result), path)
