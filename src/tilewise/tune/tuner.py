"""The tuning loop: legality -> compile -> verify -> time (interleaved) -> store, for any template and device.

Life of a candidate:
    illegal (a rule or the shape refuses it)        -> stored as `illegal` with the rule's numbers
    compile fails                                    -> `compile_error` with the first error line
    the run raises                                   -> `launch_error`
    the first (verification) run takes > timeout_s   -> `timeout`
    any output value off (poisoned NaN, tolerance)   -> `wrong` with its error; never ranked
    otherwise timed in interleaved rounds with its batch -> `ok` with median / p20 / p80 / 95% interval

Configs are processed in batches; each batch's results are committed one by one before the next batch
starts, so an interrupted sweep resumes where it stopped. At the end the fastest candidates are timed
again together (a final race), so the winner's tie verdict comes from one interleaved measurement.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tilewise.devices.base import Device, Launch, Limits, Program, source_hash
from tilewise.errors import ConfigError, DeviceLost, ShaderCompileError
from tilewise.kernels.base import KernelTemplate, Shape
from tilewise.tune.measure import Stats, measure, tie_groups
from tilewise.tune.search import Budget, get_strategy
from tilewise.tune.space import Config, Space
from tilewise.tune.store import Result, Store, shape_key
from tilewise.tune.verify import Verifier

Progress = Callable[[str, int, "int | None"], None]


@dataclass
class Row:
    """One config's outcome in a tuning run."""

    config: Config
    status: str
    reason: str = ""
    stats: Stats | None = None
    gflops: float | None = None
    rel_err: float | None = None
    max_abs_err: float | None = None
    tile_waste: float | None = None
    tie_group: int | None = None
    cached: bool = False

    def as_json(self) -> dict[str, Any]:
        s = self.stats
        return {"config": self.config.key(), "status": self.status, "reason": self.reason,
                "median_ms": s.median_ms if s else None, "p20_ms": s.p20_ms if s else None,
                "p80_ms": s.p80_ms if s else None, "ci95_ms": list(s.ci95_ms) if s else None,
                "gflops": self.gflops, "rel_err": self.rel_err, "tie_group": self.tie_group}


@dataclass
class TuneResult:
    """Everything one `tune` call found; `ranked` holds the `ok` rows best first."""

    kernel: str
    fingerprint: str
    shape: Shape
    space: str
    rows: list[Row]
    illegal_in_grid: int = 0
    illegal_examples: list[tuple[Config, list[str]]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ranked(self) -> list[Row]:
        ok = [r for r in self.rows if r.status == "ok" and r.stats is not None]
        return sorted(ok, key=lambda r: (r.tie_group or 0, r.stats.median_ms if r.stats else 0.0))

    @property
    def best(self) -> Row | None:
        ranked = self.ranked
        return ranked[0] if ranked else None

    def as_json(self) -> dict[str, Any]:
        order = {id(r): i for i, r in enumerate(self.ranked)}
        rows = sorted(self.rows, key=lambda r: (order.get(id(r), len(order)), r.status))
        return {"kernel": self.kernel, "device": self.fingerprint, "shape": list(self.shape),
                "results": [r.as_json() for r in rows]}


def config_source_hash(template: KernelTemplate, config: Config) -> str:
    """Hash of the code one config runs (its generated source); illegal configs that cannot generate get a
    template-level hash."""
    try:
        return source_hash(template.source(config))
    except Exception:
        return source_hash(template.name, template.backend, "ungenerated")


def split_configs(template: KernelTemplate, space: Space, limits: Limits | None, shape: Shape,
                  configs: Sequence[Config]) -> tuple[list[Config], list[tuple[Config, list[str]]]]:
    """(legal for this device and shape, [(illegal, reasons)])."""
    ok: list[Config] = []
    bad: list[tuple[Config, list[str]]] = []
    for c in configs:
        why = space.why_illegal(c, limits) + template.shape_problems(c, shape)
        (bad.append((c, why)) if why else ok.append(c))
    return ok, bad


def no_legal_config_error(template: KernelTemplate, space: Space, shape: Shape,
                          illegal: Sequence[tuple[Config, list[str]]], where: str) -> ConfigError:
    counts: dict[str, int] = {}
    for _, why in illegal:
        for w in why:
            name = w.split(":", 1)[0]
            counts[name] = counts.get(name, 0) + 1
    top = ", ".join(f"{n} ({k})" for n, k in sorted(counts.items(), key=lambda kv: -kv[1])[:4])
    return ConfigError(f"every config of {template.name} space {space.name!r} is illegal {where} at shape "
                       f"{shape_key(shape)}; most broken rules: {top or 'none recorded'}",
                       "try --space full, another shape, or `tilewise tune ... --dry-run` to see each reason")


def tune(template: KernelTemplate, device: Device, shape: Shape, *, space: str = "seed",
         strategy: str = "exhaustive", budget: Budget | None = None, store: Store | None = None,
         force: bool = False, seed: int = 0, batch: int = 16, final_race: int = 8, timeout_s: float = 30.0,
         measure_kw: dict[str, Any] | None = None, progress: Progress | None = None,
         configs: Sequence[Config] | None = None) -> TuneResult:
    """Tune one template at one shape on one device.

    Args:
        template: the kernel template.
        device: where to run.
        shape: the problem shape (template.shape_names).
        space: space name ("seed", "full", ...).
        strategy: "exhaustive" or "random" (see `search.STRATEGIES`).
        budget: count and/or seconds for the strategy (default: unbounded).
        store: results store to resume from and write to (None: keep nothing).
        force: re-measure configs the store already holds.
        seed: seeds inputs, search order and bootstrap.
        batch: configs compiled, verified and timed together (and committed) per step.
        final_race: how many of the fastest are re-timed together at the end (0: none).
        timeout_s: a first run longer than this is recorded as `timeout` and not timed.
        measure_kw: extra arguments for `measure` (warmup, min_rounds, max_rounds, budget_s, ...).
        progress: callback(stage, done, total).
        configs: explicit candidates instead of the strategy's (e.g. earlier winners); illegal ones are listed.

    Returns:
        A `TuneResult`.
    """
    t_start = time.perf_counter()
    sp = template.space(space)
    limits = device.info.limits
    fp = device.info.fingerprint
    skey = shape_key(shape)
    budget = budget or Budget()
    rng = np.random.default_rng(seed)
    mkw = {"warmup": 2, "min_rounds": 10, "max_rounds": 40, "budget_s": 5.0, **(measure_kw or {})}
    rows: list[Row] = []
    result = TuneResult(template.name, fp, tuple(shape), sp.name, rows)

    def record(row: Row, hsh: str) -> None:
        rows.append(row)
        if store is not None:
            s = row.stats
            store.put(Result(fp, template.name, hsh, skey, row.config.key(), row.status, row.reason,
                             s.median_ms if s else None, s.p20_ms if s else None, s.p80_ms if s else None,
                             s.ci95_ms[0] if s else None, s.ci95_ms[1] if s else None, s.n if s else None,
                             row.rel_err, row.max_abs_err, row.gflops, row.tile_waste))

    # illegal configs are listed, never compiled
    if configs is not None:
        given, illegal = split_configs(template, sp, limits, shape, list(configs))
        cand_iter: Any = iter(given)
    elif sp.points is not None:
        _, illegal = split_configs(template, sp, limits, shape, list(sp))
    else:
        illegal = []
        result.illegal_in_grid = sp.size - len(sp.legal(limits))
        result.illegal_examples = [(c, sp.why_illegal(c, limits)) for c in _illegal_examples(sp, limits, seed)]
    for c, why in illegal:
        record(Row(c, "illegal", "; ".join(why)), config_source_hash(template, c))

    verifier = Verifier(template, device, shape, rng)
    pending: list[Config] = []
    programs: dict[Config, Program] = {}
    taken = 0
    if configs is None:
        cand_iter = get_strategy(strategy)(sp, limits, budget, seed)
    shape_bad: list[tuple[Config, list[str]]] = []
    for cfg in cand_iter:
        probs = template.shape_problems(cfg, shape)
        if probs:
            shape_bad.append((cfg, probs))
            record(Row(cfg, "illegal", "; ".join(probs)), config_source_hash(template, cfg))
            continue
        taken += 1
        if not force and store is not None:
            old = store.get(fp, template.name, config_source_hash(template, cfg), skey, cfg.key())
            if old is not None:
                rows.append(_row_from_store(cfg, old))
                if progress:
                    progress("cached", taken, budget.count)
                continue
        pending.append(cfg)
        if len(pending) >= batch:
            _run_batch(template, device, shape, pending, verifier, programs, record, mkw, rng, timeout_s, progress,
                       taken, budget.count)
            pending = []
    if pending:
        _run_batch(template, device, shape, pending, verifier, programs, record, mkw, rng, timeout_s, progress,
                   taken, budget.count)
    if not any(r.status != "illegal" for r in rows):
        raise no_legal_config_error(template, sp, shape, illegal + shape_bad, f"on {device.info.name}")

    ok = sorted((r for r in rows if r.status == "ok" and r.stats), key=lambda r: r.stats.median_ms)  # type: ignore
    measured_together = len(ok) <= batch and not any(r.cached for r in ok) and taken <= batch
    nothing_new = all(r.cached for r in ok)  # a pure resume re-measures nothing (use force for that)
    if final_race > 1 and len(ok) > 1 and not measured_together and not nothing_new:
        race = ok[:final_race]
        launches: dict[Config, list[Launch]] = {}
        bufs = verifier.buffers()
        for r in race:
            prog = programs.get(r.config) or template.compile(device, r.config, shape)
            programs[r.config] = prog
            launches[r.config] = template.launches(prog, bufs, r.config, shape)
        if progress:
            progress("final race", 0, len(race))
        m = measure(device, launches, rng=rng, **mkw)
        for r in race:
            st = m.stats[r.config]
            r.stats = st
            r.gflops = template.flops(shape) / (st.median_ms * 1e6)
            r.cached = False
            if store is not None:
                store.put(Result(fp, template.name, config_source_hash(template, r.config), skey, r.config.key(), "ok",
                                 r.reason, st.median_ms, st.p20_ms, st.p80_ms, st.ci95_ms[0], st.ci95_ms[1], st.n,
                                 r.rel_err, r.max_abs_err, r.gflops, r.tile_waste))
    for key, _st, group in tie_groups({id(r): r.stats for r in ok if r.stats}):
        next(r for r in ok if id(r) == key).tie_group = group
    result.seconds = time.perf_counter() - t_start
    return result


def _row_from_store(cfg: Config, old: Result) -> Row:
    stats = None
    if old.median_ms is not None:
        lo = old.ci_lo_ms if old.ci_lo_ms is not None else old.median_ms
        hi = old.ci_hi_ms if old.ci_hi_ms is not None else old.median_ms
        stats = Stats(old.median_ms, old.p20_ms or old.median_ms, old.p80_ms or old.median_ms, (lo, hi),
                      np.full(old.samples or 0, old.median_ms))
    return Row(cfg, old.status, old.message, stats, old.gflops, old.rel_err, old.max_abs_err, old.tile_waste,
               cached=True)


def _run_batch(template: KernelTemplate, device: Device, shape: Shape, configs: Sequence[Config],
               verifier: Verifier, programs: dict[Config, Program], record: Callable[[Row, str], None],
               mkw: dict[str, Any], rng: np.random.Generator, timeout_s: float, progress: Progress | None,
               done: int, total: int | None) -> None:
    good: dict[Config, tuple[Program, Any]] = {}
    for i, cfg in enumerate(configs):
        hsh = config_source_hash(template, cfg)
        waste = template.tile_waste(cfg, shape)
        if progress:
            progress(f"compile+verify {cfg}", done - len(configs) + i, total)
        try:
            prog = template.compile(device, cfg, shape)
        except ShaderCompileError as exc:
            record(Row(cfg, "compile_error", _first_line(exc.problem), tile_waste=waste), hsh)
            continue
        except DeviceLost:
            raise  # not this config's fault: stop, keep what is stored, resume later
        except Exception as exc:  # a sweep never dies on one config
            record(Row(cfg, "compile_error", f"{type(exc).__name__}: {_first_line(str(exc))}", tile_waste=waste), hsh)
            continue
        try:
            t0 = time.perf_counter()
            check = verifier.check(prog, cfg)
            first_s = time.perf_counter() - t0
        except DeviceLost:
            raise
        except Exception as exc:
            record(Row(cfg, "launch_error", _first_line(str(exc)) or type(exc).__name__, tile_waste=waste), hsh)
            continue
        if first_s > timeout_s:
            record(Row(cfg, "timeout", f"first run took {first_s:.1f} s > timeout {timeout_s:g} s",
                       rel_err=check.rel_err, tile_waste=waste), hsh)
            continue
        if not check.ok:
            record(Row(cfg, "wrong", check.message, rel_err=check.rel_err, max_abs_err=check.max_abs_err,
                       tile_waste=waste), hsh)
            continue
        programs[cfg] = prog
        good[cfg] = (prog, check)
    if not good:
        return
    bufs = verifier.buffers()
    launches = {cfg: template.launches(prog, bufs, cfg, shape) for cfg, (prog, _) in good.items()}
    if progress:
        progress(f"timing {len(launches)} candidates", done, total)
    try:
        m = measure(device, launches, rng=rng, **mkw)
    except DeviceLost:
        raise
    except Exception:
        # one bad launch must not sink the batch: time them one at a time to find it
        for cfg in list(launches):
            try:
                m1 = measure(device, {cfg: launches[cfg]}, rng=rng, **mkw)
            except DeviceLost:
                raise
            except Exception as exc:
                record(Row(cfg, "launch_error", _first_line(str(exc)), tile_waste=template.tile_waste(cfg, shape)),
                       config_source_hash(template, cfg))
                del good[cfg]
                continue
            _record_ok(template, shape, cfg, m1.stats[cfg], good[cfg][1], record)
        return
    for cfg, (_, check) in good.items():
        _record_ok(template, shape, cfg, m.stats[cfg], check, record)


def _record_ok(template: KernelTemplate, shape: Shape, cfg: Config, st: Stats, check: Any,
               record: Callable[[Row, str], None]) -> None:
    record(Row(cfg, "ok", check.message, st, template.flops(shape) / (st.median_ms * 1e6), check.rel_err,
               check.max_abs_err, template.tile_waste(cfg, shape)), config_source_hash(template, cfg))


def _illegal_examples(space: Space, limits: Limits | None, seed: int, n: int = 12) -> list[Config]:
    """A few illegal configs of a large grid, drawn at random (listing millions helps nobody)."""
    rng = np.random.default_rng(seed)
    keys = list(space.params)
    out: list[Config] = []
    for _ in range(2000):
        if len(out) >= n:
            break
        c = space.config({k: space.params[k][int(rng.integers(len(space.params[k])))] for k in keys})
        if not space.is_legal(c, limits) and c not in out:
            out.append(c)
    return out


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    return lines[0] if lines else ""
