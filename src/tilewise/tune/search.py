"""Search strategies as plug-ins: each one orders (a subset of) the legal configs of a space.

Signature of a strategy: `strategy(space, limits, budget, seed, feedback) -> Iterator[Config | None]`. It yields
legal configs in the order they should be tried; the tuner stops pulling when the budget says so. A strategy that
steers by what was measured yields `FLUSH` (None) when it needs the outcomes of everything it yielded so far: the
tuner then measures them and records each one's median in `feedback` before it pulls the next config. Register a
new strategy by adding it to `STRATEGIES`.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from tilewise.devices.base import Limits
from tilewise.errors import ConfigError
from tilewise.kernels.space import Config, Space


@dataclass
class Budget:
    """How much a search may spend: a count of configs and/or wall-clock seconds (None = unbounded)."""

    count: int | None = None
    seconds: float | None = None
    started: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        if self.count is not None and self.count < 1:
            raise ConfigError(f"a budget of {self.count} configs measures nothing", "give --budget N with N >= 1")
        if self.seconds is not None and self.seconds <= 0:
            raise ConfigError(f"a budget of {self.seconds} seconds measures nothing", "give a positive time budget")

    def out_of_time(self) -> bool:
        return self.seconds is not None and time.perf_counter() - self.started > self.seconds

    def allows(self, taken: int) -> bool:
        """True when another config may be taken after `taken` configs."""
        return (self.count is None or taken < self.count) and not self.out_of_time()


LAZY_ABOVE = 100_000  # grid size above which random search samples lazily instead of listing the legal space
MAX_MISSES = 200_000  # consecutive rejected draws before falling back to the full legal list

#: what a strategy yields when it needs the outcomes of the configs it yielded before it goes on
FLUSH = None


class Feedback:
    """What the tuner measured of the configs a strategy yielded: config -> median ms (None: not ok)."""

    def __init__(self) -> None:
        self.median_ms: dict[Config, float | None] = {}

    def record(self, config: Config, median_ms: float | None) -> None:
        self.median_ms[config] = median_ms

    def record_outcomes(self, outcomes: Iterable[Any]) -> None:
        """Each engine outcome's median (None where it did not run ok)."""
        for oc in outcomes:
            self.record(oc.config, oc.stats.median_ms if oc.status == "ok" and oc.stats is not None else None)

    def best(self, among: Iterable[Config]) -> Config | None:
        """The fastest measured config of `among` (None when none of them measured ok)."""
        timed = [(ms, i, c) for i, c in enumerate(among) if (ms := self.median_ms.get(c)) is not None]
        return min(timed)[2] if timed else None


Strategy = Callable[..., Iterator["Config | None"]]


def exhaustive(space: Space, limits: Limits | None, budget: Budget, seed: int = 0,
               feedback: Feedback | None = None) -> Iterator[Config]:
    """Every legal config of the space, in grid order (the budget can still cut it short)."""
    yield from _take(space.legal(limits), budget)


def random_search(space: Space, limits: Limits | None, budget: Budget, seed: int = 0,
                  feedback: Feedback | None = None) -> Iterator[Config]:
    """Legal configs drawn uniformly without replacement until the budget is spent.

    Small spaces are shuffled; large grids are sampled lazily (uniform draws from the grid, illegal ones
    rejected, which is uniform over the legal configs) so that the first candidate comes at once.
    """
    rnd = random.Random(seed)
    if space.points is not None or space.size <= LAZY_ABOVE:
        legal = space.legal(limits)
        rnd.shuffle(legal)
        yield from _take(legal, budget)
        return
    keys = list(space.params)
    seen: set[Config] = set()
    misses = 0
    while budget.allows(len(seen)):
        cfg = space.config({k: rnd.choice(space.params[k]) for k in keys})
        if cfg in seen or not space.is_legal(cfg, limits):
            misses += 1
            if misses > MAX_MISSES:  # nearly exhausted (or nearly all illegal): finish from the full list
                rest = [c for c in space.legal(limits) if c not in seen]
                rnd.shuffle(rest)
                yield from _take(rest, budget, len(seen))
                return
            continue
        misses = 0
        seen.add(cfg)
        yield cfg


def _steps(space: Space, config: Config, key: str) -> list[Any]:
    """The values one step from `config[key]`: the one before and after it in the space's list for numbers (listed
    in order, so a step is the next size up or down), every other value for words."""
    values = space.params[key]
    i = values.index(config[key])
    if all(isinstance(v, int | float) for v in values):
        return [values[j] for j in (i - 1, i + 1) if 0 <= j < len(values)]
    return [v for v in values if v != config[key]]


def neighbours(space: Space, config: Config, limits: Limits | None) -> list[Config]:
    """The legal configs one step from `config`: one parameter moved one step (`_steps`). Where that move alone
    breaks a rule that ties parameters together (threads = tile / per-thread tile, a workgroup a multiple of the
    subgroup size), the first legal config that also moves one other parameter one step stands in for it, so a
    climb is not stuck where every single move is illegal. A hand-picked space (`points`) keeps to its points."""
    points = set(space) if space.points is not None else None
    out: list[Config] = []
    for key in space.params:
        for v in _steps(space, config, key):
            moved = {**dict(config), key: v}
            c = space.config(moved)
            if not space.is_legal(c, limits):
                c = next((r for other in space.params if other != key for w in _steps(space, c, other)
                          if space.is_legal(r := space.config({**moved, other: w}), limits)), None)
            if c is not None and c != config and c not in out and (points is None or c in points):
                out.append(c)
    return out


def climb(space: Space, limits: Limits | None, budget: Budget, seed: int = 0,
          feedback: Feedback | None = None, start: Sequence[Config] = ()) -> Iterator[Config | None]:
    """Hill-climbing with random restarts: a few random legal configs (or the legal ones of `start`, e.g. a
    family's seed points), then every untried neighbour of the fastest of them (`neighbours`), measured together,
    and again from the fastest neighbour while one is faster than where the climb stands; at a local optimum (no
    neighbour faster, or none left untried) a fresh random start. Large spaces with a structure (tile sizes next to
    each other run alike) reach a good config in far fewer measurements than a random sample. A config `feedback`
    already holds is taken as measured, not yielded again (a climb from configs measured before it). Without
    feedback (a caller that cannot measure in between) it is the random search."""
    if feedback is None:
        yield from random_search(space, limits, budget, seed)
        return
    draws = random_search(space, limits, Budget(), seed)  # the random starts, drawn lazily without repeats
    seen: set[Config] = set()
    taken = 0
    starts = max(2, min(8, (budget.count or 64) // 8))

    def fresh() -> list[Config]:
        return list(itertools.islice((c for c in draws if c not in seen), starts))

    batch = list(dict.fromkeys(c for c in start if space.is_legal(c, limits))) or fresh()
    here = None
    while batch:
        for c in batch:
            if c in feedback.median_ms:  # measured before the climb (e.g. its start): known, not measured again
                seen.add(c)
                continue
            if not budget.allows(taken):
                return
            seen.add(c)
            taken += 1
            yield c
        yield FLUSH
        best = feedback.best(batch if here is None else [here, *batch])
        if best is None or best == here:  # nothing measured ok, or a local optimum: start afresh
            batch, here = fresh(), None
            continue
        here = best
        batch = [c for c in neighbours(space, here, limits) if c not in seen]
        if not batch:
            batch, here = fresh(), None


def run_search(configs: Iterable[Config | None], evaluate: Callable[[list[Config]], None],
               step: int | None = None) -> int:
    """Pull a strategy's configs and hand them to `evaluate` in lists of `step` (None: no limit), and whenever the
    strategy yields FLUSH (so that `evaluate` can record what it measured in the strategy's feedback before the
    next pull). Returns how many configs were evaluated."""
    pending: list[Config] = []
    taken = 0
    for cfg in configs:
        if cfg is not FLUSH:
            pending.append(cfg)
            taken += 1
        if pending and (cfg is FLUSH or (step is not None and len(pending) >= step)):
            evaluate(pending)
            pending = []
    if pending:
        evaluate(pending)
    return taken


def _take(configs: list[Config], budget: Budget, taken: int = 0) -> Iterator[Config]:
    for cfg in configs:
        if not budget.allows(taken):
            return
        taken += 1
        yield cfg


STRATEGIES: dict[str, Strategy] = {"exhaustive": exhaustive, "random": random_search, "climb": climb}


def get_strategy(name: str) -> Strategy:
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ConfigError(f"unknown strategy {name!r}", f"use one of: {', '.join(STRATEGIES)}") from None
