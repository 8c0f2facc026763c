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

Optional template hooks (`KernelTemplate`): `precompile` compiles each batch at once before it is verified
(CUDA: NVRTC on a thread pool); `verify_shape` names a cheaper shape with the same edge structure to verify
at (fresh inputs, NaN poison, float64 reference) while timing stays at the real shape, and the stored
message says which shape was verified; `peer_program`/`peer_launches` give a reference implementation
(cuBLAS) that joins the final race when `tune(..., peer=True)`, so "% of peer" comes from the same
interleaved measurement as the candidates' times.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tilewise.devices.base import Device, Launch, Limits, Program, source_hash
from tilewise.errors import ConfigError, DeviceLost, ShaderCompileError
from tilewise.kernels.base import DeviceBuffers, KernelTemplate, Shape
from tilewise.kernels.space import Config, Space
from tilewise.tune.measure import Stats, measure, tie_groups
from tilewise.tune.search import Budget, get_strategy
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
    #: the shape the output was checked at (the template's `verify_shape`); None when unknown or not verified
    verified_shape: Shape | None = None
    #: 100 * peer median / this median, when this row ran in the same final race as the peer
    pct_of_peer: float | None = None

    def as_json(self, with_peer: bool = False) -> dict[str, Any]:
        s = self.stats
        out = {"config": self.config.key(), "status": self.status, "reason": self.reason,
               "median_ms": s.median_ms if s else None, "p20_ms": s.p20_ms if s else None,
               "p80_ms": s.p80_ms if s else None, "ci95_ms": list(s.ci95_ms) if s else None,
               "gflops": self.gflops, "rel_err": self.rel_err, "tie_group": self.tie_group}
        if with_peer:
            out["pct_of_peer"] = self.pct_of_peer
        return out


@dataclass
class PeerResult:
    """The peer (e.g. cuBLAS) as timed in the final race, next to the candidates it raced."""

    name: str
    stats: Stats
    gflops: float

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "median_ms": self.stats.median_ms, "ci95_ms": list(self.stats.ci95_ms),
                "gflops": self.gflops}


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
    #: the peer's timing from the final race (None: no peer asked for, the template has none, or it failed)
    peer: PeerResult | None = None
    #: why a requested peer was not timed (e.g. its launch failed); "" otherwise
    peer_error: str = ""

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
        out: dict[str, Any] = {"kernel": self.kernel, "device": self.fingerprint, "shape": list(self.shape),
                               "results": [r.as_json(self.peer is not None) for r in rows]}
        if self.peer is not None:  # additive: without a peer the keys stay exactly as they were
            out["peer"] = self.peer.as_json()
        return out


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


class _Peer:
    """The peer's key in the final race's candidate mapping (never equal to a Config)."""

    def __repr__(self) -> str:
        return "<peer>"


_PEER = _Peer()


class _Inputs:
    """Buffers for verification (one `Verifier` per verification shape) and for timing (the real shape).

    When a config is verified at the real shape, timing reuses that verifier's buffers, as before the
    `verify_shape` hook existed. When every config verifies elsewhere, timing gets its own random inputs at
    the real shape (uploaded once, no reference computed: timing needs none).
    """

    def __init__(self, template: KernelTemplate, device: Device, shape: Shape, rng: np.random.Generator) -> None:
        self.template, self.device, self.shape, self.rng = template, device, tuple(shape), rng
        self.verifiers: dict[Shape, Verifier] = {}
        self._timing: DeviceBuffers | None = None

    def verify_shape(self, cfg: Config) -> Shape:
        hook = getattr(self.template, "verify_shape", None)
        vshape = tuple(int(s) for s in hook(cfg, self.shape)) if hook is not None else self.shape
        # a shape the config refuses would fail for the wrong reason: check at the real shape instead
        if vshape != self.shape and (len(vshape) != len(self.shape) or self.template.shape_problems(cfg, vshape)):
            return self.shape
        return vshape

    def verifier(self, vshape: Shape) -> Verifier:
        if vshape not in self.verifiers:
            self.verifiers[vshape] = Verifier(self.template, self.device, vshape, self.rng)
        return self.verifiers[vshape]

    def timing_buffers(self) -> DeviceBuffers:
        if self.shape in self.verifiers:
            return self.verifiers[self.shape].buffers()
        if self._timing is None:
            host = self.template.make_inputs(self.shape, self.rng)
            self._timing = self.template.upload(self.device, host, self.shape)
        return self._timing


def tune(template: KernelTemplate, device: Device, shape: Shape, *, space: str = "seed",
         strategy: str = "exhaustive", budget: Budget | None = None, store: Store | None = None,
         force: bool = False, seed: int = 0, batch: int = 16, final_race: int = 8, timeout_s: float = 30.0,
         measure_kw: dict[str, Any] | None = None, progress: Progress | None = None,
         configs: Sequence[Config] | None = None, peer: bool = False) -> TuneResult:
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
        batch: configs compiled (`template.precompile`), verified and timed together (and committed) per step.
        final_race: how many of the fastest are re-timed together at the end (0: none).
        timeout_s: a first (verification) run longer than this is recorded as `timeout` and not timed.
        measure_kw: extra arguments for `measure` (warmup, min_rounds, max_rounds, budget_s, ...).
        progress: callback(stage, done, total).
        configs: explicit candidates instead of the strategy's (e.g. earlier winners); illegal ones are listed.
        peer: race the template's peer (`peer_program`, e.g. cuBLAS) with the final race's candidates and
            report each raced config's percentage of it; ignored for templates without a peer. A peer race
            runs even when nothing new was measured (a resume), since a percentage needs one measurement.

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
    # ask for the peer first: a refusal (e.g. cuBLAS with TF32 on) should come before the sweep, not after
    peer_prog = getattr(template, "peer_program", lambda _d: None)(device) if peer and final_race >= 1 else None

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

    inputs = _Inputs(template, device, tuple(shape), rng)
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
            _run_batch(template, device, shape, pending, inputs, programs, record, mkw, rng, timeout_s, progress,
                       taken, budget.count)
            pending = []
    if pending:
        _run_batch(template, device, shape, pending, inputs, programs, record, mkw, rng, timeout_s, progress,
                   taken, budget.count)
    if not any(r.status != "illegal" for r in rows):
        raise no_legal_config_error(template, sp, shape, illegal + shape_bad, f"on {device.info.name}")

    ok = sorted((r for r in rows if r.status == "ok" and r.stats), key=lambda r: r.stats.median_ms)  # type: ignore
    measured_together = len(ok) <= batch and not any(r.cached for r in ok) and taken <= batch
    nothing_new = all(r.cached for r in ok)  # a pure resume re-measures nothing (use force for that)
    with_peer = peer_prog is not None and len(ok) >= 1
    if with_peer or (final_race > 1 and len(ok) > 1 and not measured_together and not nothing_new):
        race = ok[:max(final_race, 1)]
        launches: dict[Any, list[Launch]] = {}
        bufs = inputs.timing_buffers()
        for r in race:
            prog = programs.get(r.config) or template.compile(device, r.config, shape)
            programs[r.config] = prog
            launches[r.config] = template.launches(prog, bufs, r.config, shape)
        if progress:
            progress("final race" + (f" with {_peer_name(template)}" if with_peer else ""), 0, len(race))
        m = None
        if with_peer:
            try:
                m = measure(device, {**launches, _PEER: template.peer_launches(peer_prog, bufs, shape)},
                            rng=rng, **mkw)
            except DeviceLost:
                raise
            except Exception as exc:  # the peer failing must not cost the sweep its final race
                result.peer_error = f"{type(exc).__name__}: {_first_line(str(exc))}"
        if m is None:
            m = measure(device, launches, rng=rng, **mkw)
        peer_st = m.stats.get(_PEER)
        if peer_st is not None:
            result.peer = PeerResult(_peer_name(template), peer_st, template.flops(shape) / (peer_st.median_ms * 1e6))
        for r in race:
            st = m.stats[r.config]
            r.stats = st
            r.gflops = template.flops(shape) / (st.median_ms * 1e6)
            r.cached = False
            if peer_st is not None:
                r.pct_of_peer = 100.0 * peer_st.median_ms / st.median_ms
            if store is not None:
                store.put(Result(fp, template.name, config_source_hash(template, r.config), skey, r.config.key(), "ok",
                                 r.reason, st.median_ms, st.p20_ms, st.p80_ms, st.ci95_ms[0], st.ci95_ms[1], st.n,
                                 r.rel_err, r.max_abs_err, r.gflops, r.tile_waste))
    for key, _st, group in tie_groups({id(r): r.stats for r in ok if r.stats}):
        next(r for r in ok if id(r) == key).tie_group = group
    result.seconds = time.perf_counter() - t_start
    return result


def _peer_name(template: KernelTemplate) -> str:
    return getattr(template, "peer_name", "") or "peer"


_VERIFIED_AT = re.compile(r"^verified at (\d+(?:x\d+)*): ")


def _row_from_store(cfg: Config, old: Result) -> Row:
    stats = None
    if old.median_ms is not None:
        lo = old.ci_lo_ms if old.ci_lo_ms is not None else old.median_ms
        hi = old.ci_hi_ms if old.ci_hi_ms is not None else old.median_ms
        stats = Stats(old.median_ms, old.p20_ms or old.median_ms, old.p80_ms or old.median_ms, (lo, hi),
                      np.full(old.samples or 0, old.median_ms))
    where = _VERIFIED_AT.match(old.message or "")
    vshape = tuple(int(s) for s in where.group(1).split("x")) if where else None
    return Row(cfg, old.status, old.message, stats, old.gflops, old.rel_err, old.max_abs_err, old.tile_waste,
               cached=True, verified_shape=vshape)


def _precompile(template: KernelTemplate, device: Device, shape: Shape,
                configs: Sequence[Config]) -> Mapping[Config, Program | Exception]:
    """The template's batch compile, or {} (then each config compiles on its own and keeps its own error)."""
    hook = getattr(template, "precompile", None)
    if hook is None or not configs:
        return {}
    try:
        return hook(device, list(configs), shape) or {}
    except DeviceLost:
        raise
    except Exception:  # a failing batch compile falls back to one compile per config, which records each error
        return {}


def _run_batch(template: KernelTemplate, device: Device, shape: Shape, configs: Sequence[Config],
               inputs: _Inputs, programs: dict[Config, Program], record: Callable[[Row, str], None],
               mkw: dict[str, Any], rng: np.random.Generator, timeout_s: float, progress: Progress | None,
               done: int, total: int | None) -> None:
    if progress:
        progress(f"compiling {len(configs)} configs", done - len(configs), total)
    pre = _precompile(template, device, shape, configs)
    good: dict[Config, tuple[Program, Any, Shape]] = {}
    for i, cfg in enumerate(configs):
        hsh = config_source_hash(template, cfg)
        waste = template.tile_waste(cfg, shape)
        if progress:
            progress(f"compile+verify {cfg}", done - len(configs) + i, total)
        try:
            got = pre.get(cfg)
            if isinstance(got, BaseException):
                raise got  # what compile raised for this config in the batch compile
            prog = got if got is not None else template.compile(device, cfg, shape)
        except ShaderCompileError as exc:
            record(Row(cfg, "compile_error", _first_line(exc.problem), tile_waste=waste), hsh)
            continue
        except DeviceLost:
            raise  # not this config's fault: stop, keep what is stored, resume later
        except Exception as exc:  # a sweep never dies on one config
            record(Row(cfg, "compile_error", f"{type(exc).__name__}: {_first_line(str(exc))}", tile_waste=waste), hsh)
            continue
        vshape = inputs.verify_shape(cfg)
        try:
            t0 = time.perf_counter()
            check = inputs.verifier(vshape).check(prog, cfg)
            first_s = time.perf_counter() - t0
        except DeviceLost:
            raise
        except Exception as exc:
            record(Row(cfg, "launch_error", _first_line(str(exc)) or type(exc).__name__, tile_waste=waste), hsh)
            continue
        where = f"verified at {shape_key(vshape)}: "
        if first_s > timeout_s:
            record(Row(cfg, "timeout", f"first run took {first_s:.1f} s > timeout {timeout_s:g} s"
                       + (f" (at {shape_key(vshape)})" if vshape != tuple(shape) else ""),
                       rel_err=check.rel_err, tile_waste=waste, verified_shape=vshape), hsh)
            continue
        if not check.ok:
            record(Row(cfg, "wrong", where + check.message, rel_err=check.rel_err, max_abs_err=check.max_abs_err,
                       tile_waste=waste, verified_shape=vshape), hsh)
            continue
        programs[cfg] = prog
        good[cfg] = (prog, check, vshape)
    if not good:
        return
    bufs = inputs.timing_buffers()
    launches = {cfg: template.launches(prog, bufs, cfg, shape) for cfg, (prog, *_) in good.items()}
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
            _record_ok(template, shape, cfg, m1.stats[cfg], good[cfg][1], good[cfg][2], record)
        return
    for cfg, (_, check, vshape) in good.items():
        _record_ok(template, shape, cfg, m.stats[cfg], check, vshape, record)


def _record_ok(template: KernelTemplate, shape: Shape, cfg: Config, st: Stats, check: Any, vshape: Shape,
               record: Callable[[Row, str], None]) -> None:
    record(Row(cfg, "ok", f"verified at {shape_key(vshape)}: {check.message}", st,
               template.flops(shape) / (st.median_ms * 1e6), check.rel_err, check.max_abs_err,
               template.tile_waste(cfg, shape), verified_shape=vshape), config_source_hash(template, cfg))


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
