"""Shape sweeps and dispatch tables: which config to run for which M (seed 001: the 96-row cutoff).

A speed-up at one shape can be padding (346 rows fit 11 tiles of 32 but 6 of 64), so configs are compared
across many M values, each with its tile waste (launched tile area / useful area) beside its time, and the
choice per M is fitted into the fewest M ranges whose config is within a tolerance of the per-M best.

Dispatch table JSON (what the runtime loads):
    {"kernel": "gemm", "device": FINGERPRINT, "N": 2560, "K": 1024, "tolerance": 0.03,
     "ranges": [{"m_min": 1, "m_max": 95, "config": {...}, "config_key": "BM=...", "label": "..."}, ...],
     "measured_m": [...], "per_m": {M: {"best": KEY, "median_ms": ...}}}
The ranges cover 1..max measured M without gaps; the last range also serves larger M.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tilewise.devices.base import Device, Launch
from tilewise.errors import ConfigError, LaunchError, ShaderCompileError, TilewiseError
from tilewise.kernels.base import KernelTemplate
from tilewise.kernels.space import Config
from tilewise.tune.measure import Stats, measure
from tilewise.tune.store import Result, Store, shape_key
from tilewise.tune.tuner import config_source_hash
from tilewise.tune.verify import Verifier

MAX_SWEEP_POINTS = 4096


def parse_m_values(text: str) -> list[int]:
    """`1..512` (every M), `1..512:8` (step 8, plus the end), `1,2,4,96` or a mix: `1..16,32,64..512:64`."""
    out: set[int] = set()
    for part in filter(None, (p.strip() for p in str(text).split(","))):
        m = re.fullmatch(r"(\d+)\.\.(\d+)(?::(\d+))?", part)
        if m:
            lo, hi, step = int(m.group(1)), int(m.group(2)), int(m.group(3) or 1)
            if lo < 1 or hi < lo or step < 1:
                raise ConfigError(f"bad M range {part!r}: need 1 <= lo <= hi and step >= 1", "write e.g. --m 1..512:8")
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

    def median(self, cfg: Config, m: int) -> float | None:
        st = self.stats.get(cfg, {}).get(m)
        return st.median_ms if st else None

    def best_at(self, m: int) -> tuple[Config, float] | None:
        cands = [(c, self.median(c, m)) for c in self.configs]
        cands = [(c, t) for c, t in cands if t is not None]
        return min(cands, key=lambda ct: ct[1]) if cands else None


def sweep(template: KernelTemplate, device: Device, ms: Sequence[int], n: int, k: int, configs: Sequence[Config],
          *, store: Store | None = None, force: bool = False, seed: int = 0,
          measure_kw: Mapping[str, Any] | None = None,
          progress: Callable[[int, int, int], None] | None = None) -> SweepResult:
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

    Returns:
        A `SweepResult`.
    """
    if not configs:
        raise ConfigError("no candidate configs to sweep", "pick a space with legal configs for this device")
    rng = np.random.default_rng(seed)
    mkw = {"warmup": 2, "min_rounds": 8, "max_rounds": 30, "budget_s": 2.0, **(measure_kw or {})}
    fp = device.info.fingerprint
    res = SweepResult(template.name, fp, n, k, list(ms), list(configs))
    programs: dict[Config, Any] = {}
    for idx, m in enumerate(ms):
        if progress:
            progress(idx, len(ms), m)
        shape = (m, n, k)
        skey = shape_key(shape)
        todo: list[Config] = []
        for cfg in configs:
            res.waste.setdefault(cfg, {})[m] = template.tile_waste(cfg, shape)
            probs = template.shape_problems(cfg, shape)
            if probs:
                res.failures.setdefault(cfg, {})[m] = "illegal: " + "; ".join(probs)
                continue
            old = None if force or store is None else store.get(fp, template.name, config_source_hash(template, cfg),
                                                                 skey, cfg.key())
            if old is not None and old.status == "ok" and old.median_ms is not None:
                lo = old.ci_lo_ms if old.ci_lo_ms is not None else old.median_ms
                hi = old.ci_hi_ms if old.ci_hi_ms is not None else old.median_ms
                res.stats.setdefault(cfg, {})[m] = Stats(old.median_ms, old.p20_ms or old.median_ms,
                                                         old.p80_ms or old.median_ms, (lo, hi), np.empty(0))
            elif old is not None:
                res.failures.setdefault(cfg, {})[m] = f"{old.status}: {old.message}"
            else:
                todo.append(cfg)
        if not todo:
            continue
        ver = Verifier(template, device, shape, rng)
        launches: dict[Config, list[Launch]] = {}
        checks = {}
        for cfg in todo:
            hsh = config_source_hash(template, cfg)
            status, msg = "ok", ""
            try:
                prog = programs.get(cfg) or template.compile(device, cfg, shape)
                programs[cfg] = prog
                chk = ver.check(prog, cfg)
                if not chk.ok:
                    status, msg = "wrong", chk.message
                checks[cfg] = chk
            except ShaderCompileError as exc:
                status, msg = "compile_error", exc.problem.splitlines()[0]
            except (LaunchError, TilewiseError) as exc:
                status, msg = "launch_error", str(exc).splitlines()[0]
            if status != "ok":
                res.failures.setdefault(cfg, {})[m] = f"{status}: {msg}"
                if store is not None:
                    store.put(Result(fp, template.name, hsh, skey, cfg.key(), status, msg,
                                     tile_waste=res.waste[cfg][m]))
                continue
            launches[cfg] = template.launches(programs[cfg], ver.buffers(), cfg, shape)
        if not launches:
            continue
        meas = measure(device, launches, rng=rng, **mkw)
        for cfg, st in meas.stats.items():
            res.stats.setdefault(cfg, {})[m] = st
            if store is not None:
                chk = checks[cfg]
                store.put(Result(fp, template.name, config_source_hash(template, cfg), skey, cfg.key(), "ok",
                                 chk.message, st.median_ms, st.p20_ms, st.p80_ms, st.ci95_ms[0], st.ci95_ms[1], st.n,
                                 chk.rel_err, chk.max_abs_err, template.flops(shape) / (st.median_ms * 1e6),
                                 res.waste[cfg][m]))
    return res


@dataclass
class Range:
    m_min: int
    m_max: int
    config: Config


def fit_dispatch(times: Mapping[Config, Mapping[int, float]], ms: Sequence[int], tolerance: float = 0.03,
                 ) -> list[Range]:
    """The fewest M ranges, each with one config whose time is within `tolerance` of the per-M best.

    Greedy furthest-reach is optimal for covering a line with the fewest intervals: from the first
    uncovered M, take the config that stays acceptable the longest (ties: the lowest summed time).

    Args:
        times: config -> {M: median ms} (missing M = that config cannot run there).
        ms: the measured M values.
        tolerance: accepted slowdown over the per-M best (0.03 = 3%).

    Returns:
        Ranges covering 1..max(ms) contiguously; a range's m_max is the last measured M it covers.
    """
    if tolerance < 0:
        raise ConfigError(f"tolerance {tolerance} is negative", "give --tolerance 0.03 for 3%")
    ms = sorted(ms)
    best = {}
    for m in ms:
        vals = [t[m] for t in times.values() if m in t]
        if not vals:
            raise ConfigError(f"no config ran at M={m}", "check the sweep's failures")
        best[m] = min(vals)
    ok = {c: {m for m in ms if m in t and t[m] <= (1 + tolerance) * best[m]} for c, t in times.items()}
    ranges: list[Range] = []
    i = 0
    while i < len(ms):
        choice, reach, cost = None, i - 1, float("inf")
        for c, good in ok.items():
            j = i
            while j < len(ms) and ms[j] in good:
                j += 1
            if j - 1 < i:
                continue
            total = sum(times[c][ms[x]] for x in range(i, j))
            if j - 1 > reach or (j - 1 == reach and total < cost):
                choice, reach, cost = c, j - 1, total
        assert choice is not None  # the per-M best is always within tolerance
        lo = ranges[-1].m_max + 1 if ranges else 1
        ranges.append(Range(lo, ms[reach], choice))
        i = reach + 1
    return ranges


def dispatch_table(result: SweepResult, tolerance: float = 0.03) -> dict[str, Any]:
    """The JSON object the runtime loads (see the module docstring)."""
    times = {c: {m: st.median_ms for m, st in per.items()} for c, per in result.stats.items()}
    ranges = fit_dispatch(times, result.ms, tolerance)
    per_m = {}
    for m in result.ms:
        b = result.best_at(m)
        if b:
            per_m[str(m)] = {"best": b[0].key(), "median_ms": b[1]}
    return {"kernel": result.kernel, "device": result.fingerprint, "N": result.n, "K": result.k,
            "tolerance": tolerance,
            "ranges": [{"m_min": r.m_min, "m_max": r.m_max, "config": dict(r.config), "config_key": r.config.key(),
                        "label": str(r.config)} for r in ranges],
            "measured_m": list(result.ms), "per_m": per_m}


def lookup(table: Mapping[str, Any], m: int) -> dict[str, Any]:
    """The config dict a dispatch table picks for M (beyond the last range: the last range's config)."""
    ranges = table["ranges"]
    for r in ranges:
        if r["m_min"] <= m <= r["m_max"]:
            return dict(r["config"])
    if ranges and m > ranges[-1]["m_max"]:
        return dict(ranges[-1]["config"])
    raise ConfigError(f"dispatch table has no range for M={m}", "re-run `tilewise sweep` over this M")


def load_table(path: str | Path) -> dict[str, Any]:
    """Read a dispatch table JSON, refusing files that are not one."""
    try:
        table = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read dispatch table {path}: {exc}", "write one with `tilewise sweep ... --out`") \
            from exc
    if not isinstance(table, dict) or not isinstance(table.get("ranges"), list):
        raise ConfigError(f"{path} is not a dispatch table (no 'ranges')", "write one with `tilewise sweep ... --out`")
    return table


def sweep_json(result: SweepResult, table: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Every measurement of a sweep (for `--json`)."""
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
