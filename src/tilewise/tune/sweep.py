"""Shape sweeps: every config at every row count M (seed 001: a speed-up at one shape can be padding).

346 rows fit 11 tiles of 32 but 6 of 64, so configs are compared across many M values, each with its tile waste
(launched tile area / useful area) beside its time; `tilewise.tune.dispatch` then fits the per-M choice into the
fewest row ranges. The work is the engine's: each (config, M) is an item, verified and stored on its own, and
every config of one M is timed in the same interleaved rounds.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tilewise.devices.base import Device
from tilewise.errors import ConfigError
from tilewise.kernels.base import KernelTemplate
from tilewise.kernels.space import Config
from tilewise.tune.engine import Engine, Item
from tilewise.tune.measure import Stats
from tilewise.tune.store import Store

MAX_SWEEP_POINTS = 4096
SWEEP_MEASURE = {"warmup": 2, "min_rounds": 8, "max_rounds": 30, "budget_s": 2.0}


def parse_m_values(text: str) -> list[int]:
    """`1..512` (every M), `1..512:8` (step 8, plus the end), `1,2,4,96` or a mix: `1..16,32,64..512:64`."""
    out: set[int] = set()
    for part in filter(None, (p.strip() for p in str(text).split(","))):
        m = re.fullmatch(r"(\d+)\.\.(\d+)(?::(\d+))?", part)
        if m:
            lo, hi, step = int(m.group(1)), int(m.group(2)), int(m.group(3) or 1)
            if lo < 1 or hi < lo or step < 1:
                raise ConfigError(f"bad M range {part!r}: need 1 <= lo <= hi and step >= 1", "write e.g. --m 1..512:8")
            count = (hi - lo) // step + 1  # counted before building it: a huge range must not fill memory
            if len(out) + count > MAX_SWEEP_POINTS:
                raise ConfigError(f"M range {part!r} holds {count} values; a sweep takes at most {MAX_SWEEP_POINTS}",
                                  f"use a step, e.g. --m {lo}..{hi}:{max(1, (hi - lo) // (MAX_SWEEP_POINTS // 2))}")
            out.update(range(lo, hi + 1, step))
            out.add(hi)
        elif part.isdigit() and int(part) > 0:
            out.add(int(part))
        else:
            raise ConfigError(f"cannot parse M value {part!r} in {text!r}", "write e.g. --m 1..512, --m 1..512:8 "
                              "or --m 1,64,96,346")
    if len(out) > MAX_SWEEP_POINTS:
        raise ConfigError(f"{len(out)} M values is too many", f"use a step: at most {MAX_SWEEP_POINTS} values")
    return sorted(out)


@dataclass
class SweepResult:
    """Times per (config, M), plus the failures and the tile waste."""

    kernel: str
    fingerprint: str
    n: int
    k: int
    ms: list[int]
    configs: list[Config]
    stats: dict[Config, dict[int, Stats]] = field(default_factory=dict)
    waste: dict[Config, dict[int, float]] = field(default_factory=dict)
    failures: dict[Config, dict[int, str]] = field(default_factory=dict)
    #: the template that ran (its problem keys the dispatch entry)
    template: KernelTemplate | None = None

    def median(self, cfg: Config, m: int) -> float | None:
        st = self.stats.get(cfg, {}).get(m)
        return st.median_ms if st else None

    def best_at(self, m: int) -> tuple[Config, float] | None:
        cands = [(c, self.median(c, m)) for c in self.configs]
        cands = [(c, t) for c, t in cands if t is not None]
        return min(cands, key=lambda ct: ct[1]) if cands else None

    def times(self) -> dict[Config, dict[int, float]]:
        """config -> {M: median ms} of every measured pair."""
        return {c: {m: st.median_ms for m, st in per.items()} for c, per in self.stats.items()}


def sweep(template: KernelTemplate, device: Device, ms: Sequence[int], n: int, k: int, configs: Sequence[Config],
          *, store: Store | None = None, force: bool = False, seed: int = 0,
          measure_kw: Mapping[str, Any] | None = None,
          progress: Callable[[int, int, int], None] | None = None, engine: Engine | None = None) -> SweepResult:
    """Verify and time every config at every M (interleaved per M), storing each result.

    Args:
        template: a template with shape (M, N, K).
        device: where to run.
        ms: the M values.
        n, k: the fixed N and K.
        configs: candidates (legal for the device; shape problems are recorded as failures).
        store: resume from / write to (one transaction per result).
        force: re-measure stored results.
        seed: inputs and bootstrap.
        measure_kw: extra arguments for `measure`.
        progress: callback(index of M, number of Ms, M).
        engine: the engine to run on instead of a new one (a cluster's `RayEngine`: then every M is handed over
            at once, so its workers time different Ms side by side; its store and settings apply).

    Returns:
        A `SweepResult`.
    """
    if not configs:
        raise ConfigError("no candidate configs to sweep", "pick a space with legal configs for this device")
    ms = list(ms)
    eng = engine or Engine(device, store, force=force, seed=seed, measure_kw={**SWEEP_MEASURE, **(measure_kw or {})})
    res = SweepResult(template.name, device.info.fingerprint, n, k, ms, list(configs), template=template)
    steps = [ms] if getattr(eng, "width", 1) > 1 else [[m] for m in ms]
    for idx, step in enumerate(steps):
        if progress:
            progress(idx, len(steps), step[0])
        for oc in eng.evaluate([Item(template, c, (m, n, k)) for m in step for c in configs], batch=None):
            m = oc.shape[0]
            res.waste.setdefault(oc.config, {})[m] = template.tile_waste(oc.config, (m, n, k))
            if oc.status == "ok" and oc.stats is not None:
                res.stats.setdefault(oc.config, {})[m] = oc.stats
            else:
                res.failures.setdefault(oc.config, {})[m] = f"{oc.status}: {oc.reason}"
    return res


def sweep_json(result: SweepResult, table: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Every measurement of a sweep (for `--json`), with the dispatch table fitted to it."""
    rows = []
    for c in result.configs:
        for m in result.ms:
            st = result.stats.get(c, {}).get(m)
            rows.append({"config": c.key(), "label": str(c), "M": m, "tile_waste": result.waste.get(c, {}).get(m),
                         "median_ms": st.median_ms if st else None, "p20_ms": st.p20_ms if st else None,
                         "p80_ms": st.p80_ms if st else None, "ci95_ms": list(st.ci95_ms) if st else None,
                         "failure": result.failures.get(c, {}).get(m)})
    return {"kernel": result.kernel, "device": result.fingerprint, "N": result.n, "K": result.k, "results": rows,
            **({"dispatch": table} if table else {})}


MAX_SWEEP_CONFIGS = 32


def sweep_candidates(tpl: KernelTemplate, limits: Any, configs: str | None = None,
                     space: str | None = None) -> list[Config]:
    """The configs a sweep times: `configs` (`NAME=V,...;NAME=V,...`, or a `tune --json` file whose best 8 ok
    configs are taken), else every legal config of `space` (at most MAX_SWEEP_CONFIGS of a grid)."""
    import json
    from pathlib import Path

    if configs:
        p = Path(configs)
        if p.suffix == ".json" and p.exists():
            data = json.loads(p.read_text())
            keys = [r["config"] for r in data.get("results", []) if r.get("status") == "ok"][:8]
        else:
            keys = [k for k in configs.split(";") if k.strip()]
        chosen = [tpl.parse_config(k) for k in keys]
        full = tpl.space("full")
        bad = [(c, full.why_illegal(c, limits)) for c in chosen if full.why_illegal(c, limits)]
        if bad:
            raise ConfigError(f"{bad[0][0]} is illegal here: {'; '.join(bad[0][1])}", "drop it from --configs")
        return chosen
    sp = tpl.named_space(space)
    legal = sp.legal(limits)
    if sp.points is None and len(legal) > MAX_SWEEP_CONFIGS:
        raise ConfigError(f"space {sp.name} has {len(legal)} legal configs; too many to sweep",
                          "sweep --space seed, or pass the best few with --configs (e.g. a tune --json file)")
    return legal
