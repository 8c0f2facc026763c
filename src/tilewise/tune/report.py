"""Tables and plots for tuning runs, sweeps and the store (rich for text, matplotlib for PNGs)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tilewise.errors import ConfigError
from tilewise.tune.measure import ties
from tilewise.tune.sweep import SweepResult
from tilewise.tune.tuner import TuneResult

_STATUS_ORDER = {"wrong": 0, "timeout": 1, "launch_error": 2, "compile_error": 3, "illegal": 4}


def tune_table(result: TuneResult) -> Any:
    """A rich Table of the ranked `ok` rows (GFLOP/s, % of best, interval, tie group); see `failure_lines`.

    With a peer (`result.peer`), a `% of <peer>` column holds 100 * peer median / config median for the
    configs that ran in the final race with it ("-" for the rest: their times come from other measurements),
    and the peer's own row closes the table.
    """
    from rich.table import Table

    t = Table(title=f"{result.kernel} {'x'.join(map(str, result.shape))} on {result.fingerprint} "
                    f"(space {result.space})")
    peer = result.peer
    cols = [("#", "right"), ("config", "left"), ("median ms", "right"), ("GFLOP/s", "right"), ("% best", "right")]
    if peer is not None:
        cols.append((f"% of {peer.name}", "right"))
    cols += [("95% interval ms", "right"), ("tie", "right"), ("waste", "right"), ("rel err", "right")]
    for col, just in cols:
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    ranked = result.ranked
    best = ranked[0].stats.median_ms if ranked and ranked[0].stats else None
    for i, r in enumerate(ranked, 1):
        s = r.stats
        assert s is not None and best is not None
        cells = [str(i), str(r.config) + (" (stored)" if r.cached else ""), f"{s.median_ms:.4f}",
                 f"{r.gflops:.1f}" if r.gflops else "-", f"{100 * best / s.median_ms:.0f}%"]
        if peer is not None:
            cells.append(f"{r.pct_of_peer:.1f}%" if r.pct_of_peer is not None else "-")
        cells += [f"{s.ci95_ms[0]:.4f}..{s.ci95_ms[1]:.4f}", str(r.tie_group),
                  f"{r.tile_waste:.2f}" if r.tile_waste else "-", f"{r.rel_err:.1e}" if r.rel_err is not None else "-"]
        t.add_row(*cells)
    if peer is not None:
        ps = peer.stats
        t.add_row("-", f"{peer.name} (peer)", f"{ps.median_ms:.4f}", f"{peer.gflops:.1f}",
                  f"{100 * best / ps.median_ms:.0f}%" if best else "-", "100.0%",
                  f"{ps.ci95_ms[0]:.4f}..{ps.ci95_ms[1]:.4f}", "-", "-", "-", style="dim")
    return t


def failure_lines(result: TuneResult) -> list[str]:
    """One line per config that was not ranked: `skipped (illegal: <rule>: <numbers>)`, compile errors with
    their first line, wrong answers with their error (printed as plain lines so nothing wraps mid-number)."""
    fails = sorted((r for r in result.rows if r.status != "ok"), key=lambda r: _STATUS_ORDER.get(r.status, 9))
    out = []
    for r in fails:
        what = f"skipped (illegal: {r.reason})" if r.status == "illegal" else f"{r.status}: {r.reason}"
        out.append(f"  {r.config}  {what}")
    return out


def tune_summary(result: TuneResult) -> list[str]:
    """Lines under the table: the winners (a tie group, not a single winner when it is a tie), counts."""
    lines = []
    ranked = result.ranked
    if ranked:
        winners = [r for r in ranked if r.tie_group == ranked[0].tie_group]
        if len(winners) > 1:
            lines.append(f"tie for first ({len(winners)} configs, intervals overlap): "
                         + "; ".join(str(r.config) for r in winners))
        else:
            lines.append(f"fastest: {winners[0].config} (its interval is clear of the rest)")
        worst = ranked[-1].stats.median_ms if ranked[-1].stats else None
        if worst and ranked[0].stats:
            lines.append(f"spread best..worst legal: {worst / ranked[0].stats.median_ms:.2f}x")
        peer, top = result.peer, ranked[0]
        if peer is not None and top.pct_of_peer is not None and top.stats is not None:
            verdict = "a tie: the intervals overlap" if ties(top.stats, peer.stats) else (
                "faster" if top.stats.median_ms < peer.stats.median_ms else "slower")
            lines.append(f"fastest vs {peer.name}: {top.pct_of_peer:.1f}% of {peer.name} "
                         f"({top.stats.median_ms:.4f} vs {peer.stats.median_ms:.4f} ms in one interleaved race; "
                         f"{verdict})")
    if result.peer_error:
        lines.append(f"peer not timed: {result.peer_error}")
    counts: dict[str, int] = {}
    for r in result.rows:
        counts[r.status] = counts.get(r.status, 0) + 1
    lines.append("results: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    cached = sum(r.cached for r in result.rows)
    if cached:
        lines.append(f"{cached} results came from the store (marked 'stored'; --force re-measures them)")
    if result.illegal_in_grid:
        lines.append(f"{result.illegal_in_grid} configs of the grid are illegal on this device (never compiled); "
                     "examples:")
        lines += [f"  {c}: {'; '.join(why)}" for c, why in result.illegal_examples[:6]]
    return lines


def sweep_table(result: SweepResult, ranges: Sequence[Mapping[str, Any]] | None = None, max_rows: int = 40) -> Any:
    """Time and tile waste per (M, config), best per M marked."""
    from rich.table import Table

    t = Table(title=f"{result.kernel} sweep N={result.n} K={result.k} on {result.fingerprint}")
    t.add_column("M", justify="right")
    labels = [str(c) for c in result.configs]
    for i, _ in enumerate(labels):
        t.add_column(f"c{i} ms (waste)", justify="right")
    t.add_column("dispatch", justify="left")
    step = max(1, len(result.ms) // max_rows)
    shown = result.ms[::step] + ([result.ms[-1]] if result.ms[-1] not in result.ms[::step] else [])
    for m in shown:
        best = result.best_at(m)
        cells = []
        for c in result.configs:
            med = result.median(c, m)
            w = result.waste.get(c, {}).get(m)
            cell = "-" if med is None else f"{med:.4f} ({w:.2f})"
            if best and best[0] == c:
                cell = f"[bold]{cell}[/bold]"
            cells.append(cell)
        pick = ""
        for r in ranges or []:
            if r["m_min"] <= m <= r["m_max"]:
                pick = f"c{[str(c) for c in result.configs].index(r['label'])}"
        t.add_row(str(m), *cells, pick)
    return t, [f"c{i}: {lab}" for i, lab in enumerate(labels)]


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ConfigError("plots need matplotlib", "pip install 'tilewise[plot]' (or matplotlib)") from exc
    return plt


def plot_sweep(result: SweepResult, path: str | Path, ranges: Sequence[Mapping[str, Any]] | None = None) -> None:
    """Time against M per config (the padding saw-tooth), tile waste below, dispatch cutoffs marked."""
    plt = _pyplot()
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(11, 7), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    for c in result.configs:
        pts = sorted((m, st.median_ms) for m, st in result.stats.get(c, {}).items())
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", ms=3, lw=1, label=str(c))
            w = sorted(result.waste.get(c, {}).items())
            ax2.plot([p[0] for p in w], [p[1] for p in w], lw=1)
    for r in (ranges or [])[1:]:
        for a in (ax, ax2):
            a.axvline(r["m_min"] - 0.5, color="k", ls="--", lw=0.8)
        ax.text(r["m_min"], ax.get_ylim()[0], f" M>={r['m_min']}", va="bottom", fontsize=7, rotation=90)
    ax.set_ylabel("median time (ms)")
    ax.set_title(f"{result.kernel} N={result.n} K={result.k}: time vs M ({result.fingerprint})", fontsize=9)
    ax.legend(fontsize=6, loc="best", framealpha=0.8)
    ax2.set_yscale("log")
    ax2.set_ylabel("tile waste (log)")
    ax2.set_xlabel("M")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_tune(result: TuneResult, path: str | Path) -> None:
    """Median with p20..p80 bars and the 95% interval per ranked config, tie groups coloured."""
    plt = _pyplot()
    ranked = result.ranked
    if not ranked:
        raise ConfigError("nothing to plot: no config ran correctly", "see the table for each config's status")
    fig, ax = plt.subplots(figsize=(10, 0.35 * len(ranked) + 1.5))
    for i, r in enumerate(ranked):
        s = r.stats
        assert s is not None
        color = f"C{(r.tie_group or 1) - 1}"
        ax.plot([s.p20_ms, s.p80_ms], [i, i], color=color, lw=6, alpha=0.35)
        ax.plot(list(s.ci95_ms), [i, i], color=color, lw=2)
        ax.plot([s.median_ms], [i], "o", color=color)
    ax.set_yticks(range(len(ranked)), [str(r.config) for r in ranked], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("ms (dot: median, thin: 95% interval, thick: p20..p80; colour: tie group)")
    ax.set_title(f"{result.kernel} {'x'.join(map(str, result.shape))}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def dry_run_lines(tpl: Any, space: Any, shape: tuple[int, ...], target: str, seed: int = 0) -> list[str]:
    """What `tune --dry-run` prints: legal and illegal configs with every broken rule, under a limits profile and
    without a device. Raises the no-legal-config error (with the most broken rules) when nothing is legal."""
    from tilewise.devices.profiles import get_profile
    from tilewise.tune.tuner import illegal_examples, no_legal_config_error, split_configs

    limits = get_profile(target)
    lines = [f"{tpl.name} on {tpl.backend}, space {space.name}, shape {','.join(map(str, shape))}, "
             f"limits {target} (no device used)"]
    if space.points is not None:
        legal, illegal = split_configs(tpl, space, limits, shape, list(space))
        lines += [f"  legal    {c}" for c in legal]
        lines += [f"  skipped  {c}  (illegal: {'; '.join(why)})" for c, why in illegal]
        lines.append(f"{len(legal)} legal, {len(illegal)} illegal of {space.size}")
        if not legal:
            raise no_legal_config_error(tpl, space, shape, illegal, f"under {target}")
        return lines
    all_legal = space.legal(limits)
    legal, bad_shape = split_configs(tpl, space, limits, shape, all_legal)
    lines.append(f"{len(legal)} legal of {space.size} in the grid ({space.size - len(all_legal)} break a rule, "
                 f"{len(bad_shape)} more refuse this shape)")
    counts: dict[str, int] = {}
    examples = illegal_examples(space, limits, seed, n=400)
    for c in examples:
        first = space.why_illegal(c, limits)[0].split(":", 1)[0]
        counts[first] = counts.get(first, 0) + 1
    lines.append("first broken rule among random illegal configs: "
                 + ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])))
    lines += [f"  skipped  {c}  (illegal: {'; '.join(space.why_illegal(c, limits))})" for c in examples[:10]]
    lines += [f"  legal    {c}" for c in legal[:10]]
    if not legal:
        raise no_legal_config_error(tpl, space, shape, bad_shape, f"under {target}")
    return lines
