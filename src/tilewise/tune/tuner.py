"""Tuning one kernel at one shape: a search strategy feeds the engine in batches, then a final race ranks the best.

Life of a candidate is the engine's (`tilewise.tune.engine`): illegal -> compile_error -> launch_error ->
timeout -> wrong -> ok, each one stored. This module adds what a tuning run needs on top:
- which configs to try: a named space's hand-picked points, its grid through a strategy (exhaustive, random)
  under a count/time budget, or explicit configs;
- a final race: the fastest candidates are timed again together, so the winner's tie verdict comes from one
  interleaved measurement (with the template's peer, e.g. cuBLAS, when asked, so "% of peer" does too);
- the ranking, with ties grouped instead of inventing a winner.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tilewise.devices.base import Device, Limits
from tilewise.errors import ConfigError
from tilewise.kernels.base import KernelTemplate, Shape
from tilewise.kernels.space import Config, Space
from tilewise.tune.engine import Engine, Item, Outcome, item_source_hash
from tilewise.tune.measure import Stats, tie_groups
from tilewise.tune.search import Budget, Feedback, Strategy, get_strategy, run_search
from tilewise.tune.store import Store, shape_key

Progress = Callable[[str, int, "int | None"], None]

#: one config's outcome in a tuning run (the engine's outcome; the old name stays)
Row = Outcome


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
    rows: list[Outcome]
    illegal_in_grid: int = 0
    illegal_examples: list[tuple[Config, list[str]]] = field(default_factory=list)
    seconds: float = 0.0
    #: the peer's timing from the final race (None: no peer asked for, the template has none, or it failed)
    peer: PeerResult | None = None
    #: why a requested peer was not timed (e.g. its launch failed); "" otherwise
    peer_error: str = ""

    @property
    def ranked(self) -> list[Outcome]:
        ok = [r for r in self.rows if r.status == "ok" and r.stats is not None]
        return sorted(ok, key=lambda r: (r.tie_group or 0, r.stats.median_ms if r.stats else 0.0))

    @property
    def best(self) -> Outcome | None:
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


def config_source_hash(template: KernelTemplate, config: Config, shape: Shape = ()) -> str:
    """Hash of the code one config runs (its generated source), as the store keys it."""
    return item_source_hash(Item(template, config, shape))


def split_configs(template: KernelTemplate, space: Space, limits: Limits | None, shape: Shape,
                  configs: Sequence[Config]) -> tuple[list[Config], list[tuple[Config, list[str]]]]:
    """(legal for this device and shape, [(illegal, reasons)]) under the rules of `space`."""
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
    fix = "try --space full, another shape, or `tilewise tune ... --dry-run` to see each reason"
    # a rule every config breaks is about the device or the shape, not the space: its own words are the fix
    # (e.g. gemm-f16 on wgpu-native: no subgroup matrices, so --device dawn)
    everywhere = [w for w in (illegal[0][1] if illegal else []) if counts[w.split(":", 1)[0]] == len(illegal)]
    if everywhere:
        fix = f"every config breaks {everywhere[0]}"
    return ConfigError(f"every config of {template.name} space {space.name!r} is illegal {where} at shape "
                       f"{shape_key(shape)}; most broken rules: {top or 'none recorded'}", fix)


_LEGAL_IN_GRID: dict[tuple[str, str, int, Any], int] = {}


def legal_in_grid(template: KernelTemplate, space: Space, limits: Limits | None) -> int:
    """How many configs of a grid are legal under `limits`: counted once per template, space and limits in a process
    (gemm-f16's 691,200 configs take seconds, which a benchmark of several shapes would otherwise pay per shape)."""
    key = (template.name, space.name, space.size, limits)
    if key not in _LEGAL_IN_GRID:
        _LEGAL_IN_GRID[key] = len(space.legal(limits))
    return _LEGAL_IN_GRID[key]


def illegal_examples(space: Space, limits: Limits | None, seed: int, n: int = 12) -> list[Config]:
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


def seed_starts(template: KernelTemplate, space: Space) -> list[Config]:
    """The template's hand-picked seed points as configs of `space` (a climb's start); points that do not name
    exactly its parameters are left out."""
    out = []
    for point in template.space("seed"):
        with contextlib.suppress(ConfigError):
            out.append(space.config(dict(point)))
    return out


def tune(template: KernelTemplate, device: Device, shape: Shape, *, space: str = "seed",
         strategy: str | Strategy = "exhaustive", budget: Budget | None = None, store: Store | None = None,
         force: bool = False, seed: int = 0, batch: int = 16, final_race: int = 8, timeout_s: float = 30.0,
         measure_kw: dict[str, Any] | None = None, progress: Progress | None = None,
         configs: Sequence[Config] | None = None, peer: bool = False, engine: Engine | None = None) -> TuneResult:
    """Tune one template at one shape on one device.

    Args:
        template: the kernel template.
        device: where to run.
        shape: the problem shape (template.shape_names).
        space: space name ("seed", "full", ...).
        strategy: "exhaustive", "random" or "climb" (see `search.STRATEGIES`), or a strategy itself (e.g. `climb`
            with its `start` configs bound).
        budget: count and/or seconds for the strategy (default: unbounded).
        store: results store to resume from and write to (None: keep nothing).
        force: re-measure configs the store already holds.
        seed: seeds inputs, search order and bootstrap.
        batch: configs compiled (`template.precompile`), verified and timed together (and stored) per step.
        final_race: how many of the fastest are re-timed together at the end (0: none).
        timeout_s: a first (verification) run longer than this is recorded as `timeout` and not timed.
        measure_kw: extra arguments for `measure` (warmup, min_rounds, max_rounds, budget_s, ...).
        progress: callback(stage, done, total).
        configs: explicit candidates instead of the strategy's (e.g. earlier winners); illegal ones are listed.
        peer: race the template's peer (`peer_program`, e.g. cuBLAS) with the final race's candidates and
            report each raced config's percentage of it; ignored for templates without a peer. A peer race
            runs even when nothing new was measured (a resume), since a percentage needs one measurement.
        engine: an engine to share programs and inputs with (its store, force, seed and timeout then apply), e.g.
            a cluster's `RayEngine`.

    Returns:
        A `TuneResult`.
    """
    t_start = time.perf_counter()
    sp = template.space(space)
    limits = device.info.limits
    shape = tuple(int(s) for s in shape)
    budget = budget or Budget()
    eng = engine or Engine(device, store, force=force, seed=seed, timeout_s=timeout_s,
                           measure_kw=measure_kw, progress=progress)
    result = TuneResult(template.name, device.info.fingerprint, shape, sp.name, [])
    feedback = Feedback()
    # ask for the peer first: a refusal (e.g. cuBLAS with TF32 on) should come before the sweep, not after
    with_peer = peer and final_race >= 1 and eng.peer_program(template) is not None

    def item(c: Config) -> Item:
        return Item(template, c, shape)

    # illegal configs are listed (and stored as illegal), never compiled
    if configs is not None:
        given, illegal = split_configs(template, sp, limits, shape, list(configs))
        cand_iter: Any = iter(given)
    else:
        if sp.points is not None:
            _, illegal = split_configs(template, sp, limits, shape, list(sp))
        else:
            illegal = []
            result.illegal_in_grid = sp.size - legal_in_grid(template, sp, limits)
            result.illegal_examples = [(c, sp.why_illegal(c, limits)) for c in illegal_examples(sp, limits, seed)]
        search = get_strategy(strategy) if isinstance(strategy, str) else strategy
        if strategy == "climb" and space != "seed" and "seed" in template.space_names():
            search = functools.partial(search, start=seed_starts(template, sp))  # climb from the seed points
        cand_iter = search(sp, limits, budget, seed, feedback=feedback)
    result.rows += [eng.illegal(item(c), why) for c, why in illegal]

    def run(configs: list[Config]) -> None:
        rows = eng.evaluate([item(c) for c in configs], batch=batch, total=budget.count)
        feedback.record_outcomes(rows)
        result.rows.extend(rows)

    # a cluster's engine runs `width` batches at once; a strategy that steers by what was measured flushes sooner
    taken = run_search(cand_iter, run, batch * getattr(eng, "width", 1))
    if not any(r.status != "illegal" for r in result.rows):
        raise no_legal_config_error(template, sp, shape, [(r.config, r.reason.split("; ")) for r in result.rows],
                                    f"on {device.info.name}")

    ok = sorted((r for r in result.rows if r.status == "ok" and r.stats), key=lambda r: r.stats.median_ms)  # type: ignore
    measured_together = len(ok) <= batch and not any(r.cached for r in ok) and taken <= batch
    nothing_new = all(r.cached for r in ok)  # a pure resume re-measures nothing (use force for that)
    if (with_peer and ok) or (final_race > 1 and len(ok) > 1 and not measured_together and not nothing_new):
        race = ok[:max(final_race, 1)]
        if progress:
            progress("final race" + (f" with {template.peer_name or 'peer'}" if with_peer else ""), 0, len(race))
        got = eng.race([r.item for r in race], peer=with_peer, outcomes=race)
        result.peer_error = got.peer_error
        if got.peer is not None:
            result.peer = PeerResult(got.peer_name, got.peer, template.flops(shape) / (got.peer.median_ms * 1e6))
    for key, _st, group in tie_groups({id(r): r.stats for r in ok if r.stats}):
        next(r for r in ok if id(r) == key).tie_group = group
    result.seconds = time.perf_counter() - t_start
    return result
