"""Tables for tuning runs, sweeps and the store (rich); the PNGs are `tilewise.tune.plot`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tilewise.tune.measure import ties
from tilewise.tune.sweep import SweepResult
from tilewise.tune.tuner import TuneResult

_STATUS_ORDER = {"wrong": 0, "timeout": 1, "launch_error": 2, "compile_error": 3, "illegal": 4}


SCREENFUL = 20  # ranked rows `tune` shows by default (--top N changes it)


def _table(title: str) -> Any:
    from rich import box
    from rich.table import Table

    return Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, title_justify="left")


def tune_table(result: TuneResult, top: int | None = SCREENFUL, wide: bool = False) -> Any:
    """A rich Table of the best `top` ranked `ok` rows, sized for 80 columns (`wide` adds the interval, tile
    waste and error columns); see `failure_lines`.

    With a peer (`result.peer`), a `%peer` column holds 100 * peer median / config median for the configs that ran
    in the final race with it ("-" for the rest: their times come from other measurements), and the peer's own row
    closes the table. Configs marked `*` come from the store.
    """
    t = _table(f"{result.kernel} {'x'.join(map(str, result.shape))} on {short_fingerprint(result.fingerprint)} "
               f"(space {result.space})")
    peer = result.peer
    cols = [("#", "right"), ("config", "left"), ("ms", "right"), ("GFLOP/s", "right"), ("%best", "right")]
    if peer is not None:
        cols.append(("%peer", "right"))
    cols.append(("tie", "right"))
    if wide:
        cols += [("95% interval ms", "right"), ("waste", "right"), ("rel err", "right")]
    for col, just in cols:
        t.add_column(col, justify=just, no_wrap=col != "config", overflow="fold")  # type: ignore[arg-type]
    ranked = result.ranked
    best = ranked[0].stats.median_ms if ranked and ranked[0].stats else None
    for i, r in enumerate(ranked[:top] if top else ranked, 1):
        s = r.stats
        assert s is not None and best is not None
        cells = [str(i), str(r.config) + (" *" if r.cached else ""), _ms(s.median_ms),
                 f"{r.gflops:.1f}" if r.gflops else "-", f"{100 * best / s.median_ms:.0f}%"]
        if peer is not None:
            cells.append(f"{r.pct_of_peer:.1f}%" if r.pct_of_peer is not None else "-")
        cells.append(str(r.tie_group))
        if wide:
            cells += [f"{_ms(s.ci95_ms[0])}..{_ms(s.ci95_ms[1])}", f"{r.tile_waste:.2f}" if r.tile_waste else "-",
                      f"{r.rel_err:.1e}" if r.rel_err is not None else "-"]
        t.add_row(*cells)
    if peer is not None:
        ps = peer.stats
        cells = ["-", f"{peer.name} (peer)", _ms(ps.median_ms), f"{peer.gflops:.1f}",
                 f"{100 * best / ps.median_ms:.0f}%" if best else "-", "100.0%", "-"]
        if wide:
            cells += [f"{_ms(ps.ci95_ms[0])}..{_ms(ps.ci95_ms[1])}", "-", "-"]
        t.add_row(*cells, style="dim")
    return t


def table_notes(result: TuneResult, top: int | None = SCREENFUL) -> list[str]:
    """The lines that explain the table: rows left out, the store marker."""
    lines = []
    left = len(result.ranked) - top if top else 0
    if left > 0:
        lines.append(f"{left} more ranked configs not shown (--top {len(result.ranked)} shows all; --json has them)")
    if any(r.cached for r in result.rows):
        lines.append("* measured earlier, taken from the store (--force re-measures)")
    return lines


def short_fingerprint(fp: str, width: int = 36) -> str:
    """A device fingerprint cut to `width` characters for titles, keeping its hash (the end) so it stays unique."""
    if len(fp) <= width:
        return fp
    head, _, tail = fp.rpartition(":")
    return f"{head[: max(8, width - len(tail) - 2)]}…:{tail}"


def _ms(x: float) -> str:
    """Milliseconds with four significant digits (0.01234, 1.234, 123.4)."""
    return f"{x:.4g}" if x < 1000 else f"{x:.0f}"


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
        from tilewise.tune.measure import noise_note

        noisy = [r for r in winners if r.stats is not None and noise_note(r.stats)]
        if noisy and noisy[0].stats is not None:
            lines.append(f"note: {noise_note(noisy[0].stats, str(noisy[0].config))}; the ranking above it may not "
                         "repeat (a quieter machine or --rounds help)")
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


def sweep_table(result: SweepResult, ranges: Sequence[Mapping[str, Any]] | None = None, max_rows: int = 40,
                wide: bool = False) -> Any:
    """Per M: the fastest config, the dispatch table's pick, the pick's time and its slowdown vs the fastest, and
    the pick's tile waste; `wide` adds every config's time as its own column. Returns (table, legend lines)."""
    labels = [str(c) for c in result.configs]
    t = _table(f"{result.kernel} sweep N={result.n} K={result.k} on {short_fingerprint(result.fingerprint)}")
    for col in ("M", "fastest", "ms", "pick", "pick ms", "slower", "waste"):
        t.add_column(col, justify="left" if col in ("fastest", "pick") else "right", no_wrap=True)
    if wide:
        for i, _ in enumerate(labels):
            t.add_column(f"c{i} ms", justify="right", no_wrap=True)
    step = max(1, len(result.ms) // max_rows)
    shown = result.ms[::step] + ([result.ms[-1]] if result.ms[-1] not in result.ms[::step] else [])
    for m in shown:
        best = result.best_at(m)
        pick = next((labels.index(r["label"]) for r in ranges or [] if r["m_min"] <= m <= r["m_max"]
                     and r["label"] in labels), None)
        pick_ms = result.median(result.configs[pick], m) if pick is not None else None
        waste = result.waste.get(result.configs[pick], {}).get(m) if pick is not None else None
        cells = [str(m), f"c{labels.index(str(best[0]))}" if best else "-", _ms(best[1]) if best else "-",
                 f"c{pick}" if pick is not None else "-", _ms(pick_ms) if pick_ms is not None else "-",
                 f"{100 * (pick_ms / best[1] - 1):.1f}%" if pick_ms is not None and best else "-",
                 f"{waste:.2f}" if waste is not None else "-"]
        if wide:
            cells += ["-" if result.median(c, m) is None else _ms(result.median(c, m) or 0.0) for c in result.configs]
        t.add_row(*cells)
    return t, [f"c{i}: {lab}" for i, lab in enumerate(labels)]


def dry_run(tpl: Any, space: Any, shape: tuple[int, ...], target: str, seed: int = 0) -> dict[str, Any]:
    """What `tune --dry-run` finds, as data: legal and illegal configs with every broken rule, under a limits
    profile and without a device (a large grid: counts, the first broken rule among random illegal configs, and
    examples). Raises the no-legal-config error (with the most broken rules) when nothing is legal."""
    from tilewise.devices.profiles import get_profile
    from tilewise.tune.tuner import illegal_examples, no_legal_config_error, split_configs

    limits = get_profile(target)
    out: dict[str, Any] = {"kernel": tpl.name, "backend": tpl.backend, "space": space.name, "shape": list(shape),
                           "target": target, "grid_size": space.size}

    def entry(c: Any, why: Sequence[str] = ()) -> dict[str, Any]:
        return {"config": c.key(), "label": str(c), **({"reasons": list(why)} if why else {})}

    if space.points is not None:
        legal, illegal = split_configs(tpl, space, limits, shape, list(space))
        if not legal:
            raise no_legal_config_error(tpl, space, shape, illegal, f"under {target}")
        return {**out, "enumerated": True, "legal_count": len(legal), "legal": [entry(c) for c in legal],
                "illegal": [entry(c, why) for c, why in illegal]}
    all_legal = space.legal(limits)
    legal, bad_shape = split_configs(tpl, space, limits, shape, all_legal)
    if not legal:
        raise no_legal_config_error(tpl, space, shape, bad_shape, f"under {target}")
    counts: dict[str, int] = {}
    examples = illegal_examples(space, limits, seed, n=400)
    for c in examples:
        first = space.why_illegal(c, limits)[0].split(":", 1)[0]
        counts[first] = counts.get(first, 0) + 1
    return {**out, "enumerated": False, "legal_count": len(legal), "rule_breakers": space.size - len(all_legal),
            "shape_refusals": len(bad_shape), "first_broken_rule_counts": counts,
            "legal": [entry(c) for c in legal[:10]],
            "illegal": [entry(c, space.why_illegal(c, limits)) for c in examples[:10]]}


def dry_run_lines(found: Mapping[str, Any]) -> list[str]:
    """The lines `tune --dry-run` prints for `dry_run`'s data."""
    lines = [f"{found['kernel']} on {found['backend']}, space {found['space']}, shape "
             f"{','.join(map(str, found['shape']))}, limits {found['target']} (no device used)"]
    legal = [f"  legal    {e['label']}" for e in found["legal"]]
    illegal = [f"  skipped  {e['label']}  (illegal: {'; '.join(e['reasons'])})" for e in found["illegal"]]
    if found["enumerated"]:
        return [*lines, *legal, *illegal,
                f"{found['legal_count']} legal, {len(found['illegal'])} illegal of {found['grid_size']}"]
    counts = found["first_broken_rule_counts"]
    lines.append(f"{found['legal_count']} legal of {found['grid_size']} in the grid ({found['rule_breakers']} break "
                 f"a rule, {found['shape_refusals']} more refuse this shape)")
    lines.append("first broken rule among random illegal configs: "
                 + ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])))
    return [*lines, *illegal, *legal]
