"""Running a ladder: every rung verified by the evaluation engine, the tuned best searched by the tuner, then all
rungs, the tuned best and its staging counterpart timed in ONE interleaved race (neighbour verdicts and the staging
answer come from the same rounds), and the host references timed with the same function on the CPU device.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tilewise.devices.base import Device, Launch
from tilewise.errors import ConfigError, DeviceUnavailable
from tilewise.files import write_atomic
from tilewise.kernels.base import KernelTemplate, Shape
from tilewise.kernels.space import Config, Space
from tilewise.ladder.specs import (
    DEFAULT_MEASURE,
    TUNE_MEASURE,
    LadderSpec,
    get_ladder,
    get_ladder_device,
    torch_or_none,
    validate_shape,
)
from tilewise.tune.measure import Stats, compare, measure, ties


# ---- results ---------------------------------------------------------------------------------------------------
@dataclass
class Rung:
    """One measured (or refused) rung."""

    name: str
    what: str
    config: Config
    status: str = "ok"  # ok | illegal | wrong | compile_error
    reason: str = ""
    stats: Stats | None = None
    rel_err: float | None = None
    speedup_vs_baseline: float | None = None
    speedup_vs_reference: float | None = None
    verdict: str = ""  # a key of VERDICTS (against the previous measured rung) | "" when not measured
    gflops: float | None = None

    def as_json(self) -> dict[str, Any]:
        s = self.stats
        return {"name": self.name, "what": self.what, "config": self.config.key(), "status": self.status,
                "reason": self.reason, "median_ms": s.median_ms if s else None,
                "ci95_ms": list(s.ci95_ms) if s else None, "p20_ms": s.p20_ms if s else None,
                "p80_ms": s.p80_ms if s else None, "samples": s.n if s else 0,
                "speedup_vs_baseline": self.speedup_vs_baseline, "speedup_vs_reference": self.speedup_vs_reference,
                "verdict": self.verdict, "rel_err": self.rel_err, "gflops": self.gflops}


@dataclass
class StagingAnswer:
    """Workgroup vs private staging at one schedule: who won, by what factor, with both intervals."""

    at: str
    workgroup: Stats
    private: Stats
    winner: str  # workgroup | private | tie
    factor: float  # slower median / faster median

    def as_json(self) -> dict[str, Any]:
        return {"at": self.at, "winner": self.winner, "factor": self.factor,
                "workgroup": {"median_ms": self.workgroup.median_ms, "ci95_ms": list(self.workgroup.ci95_ms)},
                "private": {"median_ms": self.private.median_ms, "ci95_ms": list(self.private.ci95_ms)}}

    def sentence(self) -> str:
        w, p = self.workgroup, self.private
        nums = (f"workgroup {w.median_ms:.4g} ms [{w.ci95_ms[0]:.4g}, {w.ci95_ms[1]:.4g}] vs private "
                f"{p.median_ms:.4g} ms [{p.ci95_ms[0]:.4g}, {p.ci95_ms[1]:.4g}]")
        if self.winner == "tie":
            return f"at {self.at}: tie ({nums})"
        return f"at {self.at}: {self.winner} staging wins by {self.factor:.2f}x ({nums})"


@dataclass
class LadderResult:
    """A measured ladder: rungs (baseline first, tuned best last), references and staging answers."""

    primitive: str
    title: str
    device: dict[str, Any]
    timer: str
    shape: Shape
    shape_names: tuple[str, ...]
    rungs: list[Rung]
    references: list[tuple[str, Stats]]
    staging: list[StagingAnswer] = field(default_factory=list)
    tuned: dict[str, Any] = field(default_factory=dict)
    rounds: int = 0
    threads: str = ""  # the host references' thread setup (BLAS pool, torch threads, OpenMP wait policy)

    @property
    def reference_ms(self) -> float | None:
        """The fastest reference's median (the strongest peer)."""
        return min((s.median_ms for _, s in self.references), default=None)

    @property
    def reference_name(self) -> str | None:
        if not self.references:
            return None
        return min(self.references, key=lambda r: r[1].median_ms)[0]

    def as_json(self) -> dict[str, Any]:
        return {"primitive": self.primitive, "title": self.title,
                "device": self.device.get("name"), "device_info": self.device, "timer": self.timer,
                "shape": list(self.shape), "shape_names": list(self.shape_names),
                "reference_ms": self.reference_ms, "reference": self.reference_name,
                "references": [{"name": n, "median_ms": s.median_ms, "ci95_ms": list(s.ci95_ms)}
                               for n, s in self.references],
                "rungs": [r.as_json() for r in self.rungs],
                "staging": [s.as_json() for s in self.staging], "tuned": self.tuned, "rounds": self.rounds,
                "threads": self.threads}

    def table(self, wide: bool = False) -> str:
        """The ladder as a plain-text table (80 columns; `wide` adds each rung's config), then the rungs' configs,
        the verdicts used and the staging answers."""
        shape = " ".join(f"{n}={v}" for n, v in zip(self.shape_names, self.shape))
        lines = [f"{self.primitive}: {self.title}",
                 f"device {self.device.get('name')} ({self.device.get('api')}, timer {self.timer})",
                 f"shape {shape}, {self.rounds} interleaved rounds"]
        if self.threads and self.references:
            lines.append(f"references' threads: {self.threads}")
        for name, s in self.references:
            lines.append(f"reference {name} (host CPU): {_ms(s.median_ms)} ms [{_ms(s.ci95_ms[0])}, "
                         f"{_ms(s.ci95_ms[1])}]")
        head = f"  {'rung':<22} {'median ms':>9} {'95% interval':>21} {'x base':>6} {'x ref':>6}  vs prev"
        if wide:
            head += f"  {'config'}"
        lines += [head, "  " + "-" * (min(len(head), 78) - 2)]
        for r in self.rungs:
            if r.stats is None:
                lines.append(f"  {r.name[:22]:<22} {r.status}: {r.reason}")
                continue
            s = r.stats
            ci = f"[{_ms(s.ci95_ms[0])}, {_ms(s.ci95_ms[1])}]"
            xb = f"{r.speedup_vs_baseline:.2f}" if r.speedup_vs_baseline else "-"
            xr = f"{r.speedup_vs_reference:.2f}" if r.speedup_vs_reference else "-"
            row = f"  {r.name[:22]:<22} {_ms(s.median_ms):>9} {ci:>21} {xb:>6} {xr:>6}  {r.verdict}"
            lines.append(row + (f"  {r.config}" if wide else ""))
        if not wide:
            lines.append("configs:")
            lines += [f"  {r.name}: {r.config}" for r in self.rungs]
        used = [v for v in VERDICTS if v != "baseline" and any(r.verdict == v for r in self.rungs)]
        if used:
            lines.append("verdicts (against the previous rung):")
            lines += [f"  {v}: {VERDICTS[v]}" for v in used]
        for a in self.staging:
            lines.append("staging " + a.sentence())
        if self.tuned.get("note"):
            lines.append("tuned best: " + self.tuned["note"])
        return "\n".join(lines)


def _ms(x: float) -> str:
    """Milliseconds in four significant digits."""
    return f"{x:.4g}"


VERDICTS = {
    "baseline": "the rung every speed-up is measured against",
    "win": "faster than the previous rung and than the baseline (95% intervals apart)",
    "tie": "within noise of the previous rung (95% intervals overlap)",
    "loss": "slower than the previous rung",
    "regained": "faster than the previous rung, but not faster than the baseline",
    "noisy": "samples too scattered to rank (p80/p20 or the interval too wide; see --json)",
}


def verdict(prev: Stats, cur: Stats, base: Stats | None = None) -> str:
    """A rung against the previous rung (one of `VERDICTS`): `win` only when it is faster than the previous rung
    AND than the baseline `base` (intervals apart from both), so a slower-than-baseline or tied rung is never a
    win; `regained` when it beats the previous rung but not the baseline; `noisy` when either sample set is too
    scattered to rank (`tilewise.tune.measure.noise_note`)."""
    step = compare(prev, cur)
    if step.verdict in ("noisy", "tie"):
        return step.verdict
    if step.verdict == "slower":
        return "loss"
    if base is not None and base is not prev:
        vs_base = compare(base, cur)
        if vs_base.verdict == "noisy":
            return "noisy"
        if vs_base.verdict != "faster":
            return "regained"
    return "win"


def staging_answer(at: str, wg: Stats, pv: Stats) -> StagingAnswer:
    """Compare one workgroup/private pair."""
    if ties(wg, pv):
        winner = "tie"
    else:
        winner = "private" if pv.median_ms < wg.median_ms else "workgroup"
    lo, hi = sorted((wg.median_ms, pv.median_ms))
    return StagingAnswer(at, wg, pv, winner, hi / lo if lo > 0 else float("inf"))


# ---- running -----------------------------------------------------------------------------------------------------
def time_references(spec: LadderSpec, host: dict[str, np.ndarray], shape: Shape,
                    measure_kw: dict[str, Any]) -> tuple[list[tuple[str, Stats]], str]:
    """Time each host reference (numpy, torch) on the CPU device with the tuner's `measure`; returns the stats and
    the thread setup in words.

    torch and numpy's BLAS run interleaved in one process, so neither may slow the other: torch's OpenMP threads
    sleep instead of spinning after each call (OMP_WAIT_POLICY=PASSIVE, set before torch is imported where the
    caller has not imported it yet) and torch gets as many threads as the BLAS pool. With a pool of more than one
    thread the torch references are timed once more on one thread: on a loaded machine extra threads can make
    small shapes far slower, and the report shows both rather than picking the flattering one.
    """
    from tilewise.devices import get_device
    from tilewise.devices.cpu import match_torch_threads, quiet_torch_threads, thread_setup

    omp = quiet_torch_threads()
    cpu = get_device("cpu")
    torch = torch_or_none()
    blas = thread_setup()
    pool = blas.threads
    setup = f"BLAS {pool} ({blas.source.replace(' available', '')})"
    refs = spec.references(host, shape)
    passes: list[tuple[int, list[tuple[str, Callable[[], Any]]]]] = [(pool, refs)]
    if torch is not None and pool > 1:
        passes.append((1, [(n, f) for n, f in refs if n.startswith("torch")]))
    out: list[tuple[str, Stats]] = []
    saved = torch.get_num_threads() if torch is not None else None
    try:
        for threads, group in passes:
            if not group:
                continue
            launches: dict[str, list[Launch]] = {}
            for name, fn in group:
                def kernel(buffers: Sequence[Any], grid: Any, _fn: Callable[[], Any] = fn) -> None:
                    _fn()

                label = name
                if name.startswith("torch") and torch is not None:
                    label = f"{name} ({threads} thread{'s' if threads > 1 else ''})"
                launches[label] = [Launch(cpu.compile(kernel, name=label), (1, 1, 1), [])]
            if torch is not None:
                if threads == pool:
                    match_torch_threads(torch)
                else:
                    torch.set_num_threads(threads)
            m = measure(cpu, launches, **measure_kw)
            out += [(label, m.stats[label]) for label in launches]
    finally:
        if torch is not None and saved is not None:
            torch.set_num_threads(saved)
    if torch is not None:
        wait = os.environ.get("OMP_WAIT_POLICY")
        spins = "may spin" in omp or not wait  # torch was imported before the policy could be set
        setup += f", torch {pool}, " + ("OpenMP may spin (torch came first)" if spins else f"OMP_WAIT_POLICY={wait}")
    return out, setup


def _search_points(spec: LadderSpec, tpl: KernelTemplate, space: Space, limits: Any, shape: Shape, count: int,
                   seed: int) -> list[Config]:
    """Up to `count` legal configs for the tuned rung: a named space's points, or a uniform sample of the grid."""
    if spec.tune_strategy == "exhaustive":
        cands = list(tpl.space(spec.tune_space))
    else:
        cands = tpl.space(spec.tune_space).sample(4 * count, seed=seed, limits=limits)
    ok = [c for c in cands if not space.why_illegal(c, limits) and not tpl.shape_problems(c, shape)]
    return ok[:count]


def _stored_search_points(tpl: KernelTemplate, space: Space, limits: Any, shape: Shape, count: int,
                          usual: list[Config]) -> tuple[list[Config], str]:
    """For a TVM-emitted template on a machine without TVM: up to `count` legal configs that have a stored source
    (those of the usual search first, then the other stored ones), and a sentence saying so. With TVM: `usual`.
    """
    from tilewise.kernels.tvm import sources as tvm_sources
    from tilewise.kernels.tvm.cuda import arch_of

    if tvm_sources.tvm_available():
        return usual, ""
    arch = arch_of(getattr(limits, "compute_capability", None))
    store = tvm_sources.store_dir()
    stored: list[Config] = []
    for values in tvm_sources.stored_configs(tpl.name, shape, arch, store) if store is not None else []:
        try:
            stored.append(space.config(values))
        except ConfigError:  # stored by an older version of the template: not a config of this space
            continue
    ok = [c for c in stored if not space.why_illegal(c, limits) and not tpl.shape_problems(c, shape)]
    in_store = set(ok)
    ordered = list(dict.fromkeys([*(c for c in usual if c in in_store), *ok]))
    picked = ordered[:count]
    where = f"store {store}" if store is not None else f"no store ({tvm_sources.ENV} is not set)"
    note = (f"TVM is not importable, so the tuned best chose only among configs with a pre-emitted source: "
            f"{len(picked)} of the {len(ok)} legal configs stored for {tpl.name} at shape "
            f"{','.join(map(str, shape))} for {arch} ({where})")
    return picked, note


def run_ladder(primitive: str, device: Device | None = None, shape: Shape | None = None, *,
               tune_count: int = 24, tune_seconds: float | None = 60.0, measure_kw: dict[str, Any] | None = None,
               tune_measure_kw: dict[str, Any] | None = None, seed: int = 0,
               progress: Callable[[str], None] | None = None) -> LadderResult:
    """Verify and measure one primitive's ladder.

    Args:
        primitive: a key of `LADDERS` (conv1d-cpu, conv1d-gpu, gemm-gpu, dwsep-conv2d-gpu).
        device: where to run (default: the ladder's device).
        shape: problem shape (default: the ladder's seed-sized shape).
        tune_count: configs the search adds to the rungs for the "tuned best" rung (0: no tuned rung).
        tune_seconds: wall-clock budget of that search.
        measure_kw: arguments of the final interleaved `measure` (default `DEFAULT_MEASURE`).
        tune_measure_kw: arguments of the tuner's per-batch `measure` (default `TUNE_MEASURE`).
        seed: inputs, search order and bootstrap.
        progress: callback with one line per stage.

    Returns:
        A `LadderResult` (rungs baseline first, tuned best last).

    Raises:
        ConfigError: unknown primitive, bad shape, or a baseline the shape refuses.
    """
    from tilewise.tune.engine import Engine, Item
    from tilewise.tune.search import Budget
    from tilewise.tune.tuner import tune

    spec = get_ladder(primitive, device.info.backend if device is not None else None)
    say = progress or (lambda _msg: None)
    dev = device if device is not None else get_ladder_device(spec, None)
    tpl = spec.template()
    shape = validate_shape(spec, shape or spec.shape)
    space = tpl.space("full")
    limits = dev.info.limits
    eng = Engine(dev, None, seed=seed, measure_kw={**TUNE_MEASURE, **(tune_measure_kw or {})})
    rungs: list[Rung] = []
    extras: list[Rung] = []  # raced for the staging answer at the tuned tile, not a rung of the ladder

    def add(entries: list[tuple[str, str, Config]], to: list[Rung] = rungs) -> list[Rung]:
        """Verify rungs (the engine: rules first, never compiled when illegal; every output value checked)."""
        for name, _, cfg in entries:
            say(f"compile + verify {name}: {cfg}")
        outs = eng.evaluate([Item(tpl, cfg, shape) for _, _, cfg in entries], batch=None, timed=False)
        made = [Rung(name, what, cfg, oc.status, "" if oc.status == "ok" else oc.reason, rel_err=oc.rel_err)
                for (name, what, cfg), oc in zip(entries, outs)]
        to.extend(made)
        return made

    add([(r.name, r.what, spec.rung_config(space, r)) for r in spec.rungs])
    if rungs[0].status != "ok":
        prog = eng.program(Item(tpl, rungs[0].config, shape)) if rungs[0].status == "compile_error" else None
        if isinstance(prog, DeviceUnavailable):  # e.g. no TVM and no stored source: its fix says how to get one
            raise prog
        raise ConfigError(f"the {primitive} baseline cannot run at shape {shape}: {rungs[0].reason}",
                          f"use another shape, e.g. --shape {','.join(str(s) for s in spec.shape)}")

    tuned_info: dict[str, Any] = {}
    if tune_count > 0:
        search = _search_points(spec, tpl, space, limits, shape, tune_count, seed)
        note = ""
        if spec.emitted_by_tvm:
            search, note = _stored_search_points(tpl, space, limits, shape, tune_count, search)
            if note:
                say(note)
        # the rungs seed the search: by the tuner's own measurement the tuned best is never slower than the best rung
        points = list(dict.fromkeys([*(r.config for r in rungs), *search]))
        say(f"tuning {tpl.name}: the {len(rungs)} rungs + {len(search)} configs of a {spec.tune_strategy} search "
            f"of space {spec.tune_space!r} ({tune_seconds} s at most)")
        res = tune(tpl, dev, shape, space="full", configs=points, budget=Budget(None, tune_seconds), seed=seed,
                   final_race=4, engine=eng)
        best = res.best
        counts: dict[str, int] = {}
        for row in res.rows:
            counts[row.status] = counts.get(row.status, 0) + 1
        tuned_info = {"strategy": spec.tune_strategy, "space": spec.tune_space, "searched": len(search),
                      "with_rungs": True, "seconds": round(res.seconds, 2), "statuses": counts,
                      "best": best.config.key() if best else None}
        if spec.emitted_by_tvm:
            tuned_info.update(sources="store" if note else "tvm", note=note)
        if best is not None:
            what = (f"best of {counts.get('ok', 0)} verified configs (the rungs + {len(search)} from a "
                    f"{spec.tune_strategy} search of space {spec.tune_space!r})")
            if note:
                what = (f"best of {counts.get('ok', 0)} verified configs (the rungs + {len(search)} configs with a "
                        f"stored source; TVM is not importable, so nothing else was a candidate)")
            add([("tuned best", what, best.config)])
            # the tuned best with its staging flipped answers the staging question at the tuned tile too
            if spec.restage is not None and spec.stage_of is not None and spec.stage_of(best.config) in (
                    "workgroup", "private"):
                other = "private" if spec.stage_of(best.config) == "workgroup" else "workgroup"
                flipped = spec.restage(best.config, other)
                if not tpl.why_illegal(flipped, limits, shape):
                    add([("tuned best, staging flipped", "", flipped)], extras)

    measured = [r for r in rungs + extras if r.status == "ok"]
    say(f"timing {len(measured)} schedules interleaved")
    final_kw = {**DEFAULT_MEASURE, **(measure_kw or {})}
    race = eng.race([Item(tpl, r.config, shape) for r in measured], measure_kw=final_kw)
    stats = {r.name: st for r, st in zip(measured, race.stats)}
    say("timing the host references")
    host = tpl.make_inputs(shape, np.random.default_rng(seed))
    refs, threads = time_references(spec, host, shape, final_kw)
    ref_ms = min((s.median_ms for _, s in refs), default=None)
    base = stats[rungs[0].name]
    prev: Stats | None = None
    for r in rungs:
        st = stats.get(r.name)
        if st is None:
            continue
        r.stats = st
        r.gflops = tpl.flops(shape) / (st.median_ms * 1e6)
        r.speedup_vs_baseline = base.median_ms / st.median_ms
        r.speedup_vs_reference = ref_ms / st.median_ms if ref_ms else None
        r.verdict = "baseline" if prev is None else verdict(prev, st, base)
        prev = st

    staging: list[StagingAnswer] = []
    for wg_name, pv_name in spec.staging_pairs:
        if wg_name in stats and pv_name in stats:
            cfg = next(r.config for r in rungs if r.name == pv_name)
            staging.append(staging_answer(f"{cfg} (rungs {wg_name!r} vs {pv_name!r})", stats[wg_name],
                                          stats[pv_name]))
    tuned = next((r for r in rungs if r.name == "tuned best"), None)
    flipped_st = stats.get("tuned best, staging flipped")
    if extras and tuned is not None and spec.stage_of is not None and tuned.stats is not None and flipped_st:
        pair = {spec.stage_of(tuned.config): tuned.stats, spec.stage_of(extras[0].config): flipped_st}
        staging.append(staging_answer(f"the tuned best tile ({tuned.config})", pair["workgroup"], pair["private"]))
    return LadderResult(spec.primitive, spec.title, dev.info.as_dict(), dev.timer, shape, tuple(tpl.shape_names),
                        rungs, refs, staging, tuned_info, race.rounds, threads)


def write_json(result: LadderResult, path: str) -> None:
    """Write the ladder's JSON ({primitive, device, shape, reference_ms, rungs: [...], staging: [...]}) atomically."""
    write_atomic(path, json.dumps(result.as_json(), indent=2) + "\n")


def draw(result: LadderResult) -> Any:
    """The ladder figure: one bar per measured rung, then one per host reference (hatched), on a LINEAR time axis
    (bars on a log axis misstate ratios), 95% interval whiskers, each bar labelled with its median, its speed-up
    over the baseline and its verdict."""
    from tilewise.tune.plot import PALETTE, device_short, pyplot

    plt = pyplot()
    measured = [r for r in result.rungs if r.stats is not None]
    bars: list[tuple[str, Stats, str, str]] = []  # (name, stats, label, colour)
    for r in measured:
        assert r.stats is not None
        speed = f", {r.speedup_vs_baseline:.2f}x base" if r.speedup_vs_baseline else ""
        colour = PALETTE[2] if r.verdict == "win" else PALETTE[3] if r.verdict == "loss" else PALETTE[0]
        bars.append((r.name, r.stats, f"{r.stats.median_ms:.3g} ms{speed}, {r.verdict}", colour))
    for name, st in result.references:
        bars.append((f"ref: {name}", st, f"{st.median_ms:.3g} ms (host reference)", PALETTE[1]))
    med = np.array([b[1].median_ms for b in bars])
    lo = med - np.array([b[1].ci95_ms[0] for b in bars])
    hi = np.array([b[1].ci95_ms[1] for b in bars]) - med
    fig, ax = plt.subplots(figsize=(9, 0.5 * len(bars) + 2.0))
    y = np.arange(len(bars))[::-1]
    patches = ax.barh(y, med, xerr=[lo, hi], color=[b[3] for b in bars], capsize=3)
    for patch, (name, _, _, _) in zip(patches, bars):
        if name.startswith("ref: "):
            patch.set_hatch("//")
    right = float((med + hi).max()) if len(bars) else 1.0
    for yi, (_, st, label, _) in zip(y, bars):
        ax.text(st.ci95_ms[1] + 0.01 * right, yi, label, va="center", fontsize=8)
    ax.set_yticks(y, [b[0] for b in bars])
    ax.set_xscale("linear")
    ax.set_xlim(0, right * 1.6)  # room for the labels right of the longest bar
    ax.set_xlabel("median time per run, ms (whiskers: 95% interval; green: win, red: loss, hatched: reference)")
    shape = " ".join(f"{n}={v}" for n, v in zip(result.shape_names, result.shape))
    fp = str(result.device.get("fingerprint") or "")
    where = device_short(fp) if fp.count(":") >= 2 else str(result.device.get("name"))
    ax.set_title(f"{result.primitive} ladder, {shape}, on {where}", fontsize=10)
    fig.tight_layout()
    return fig


def plot(result: LadderResult, path: str) -> None:
    """Write the ladder plot (`draw`) to `path` (check it first with `tilewise.tune.plot.require_plot`)."""
    from tilewise.tune.plot import save_figure

    save_figure(draw(result), path)
