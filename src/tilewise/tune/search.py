"""Search strategies as plug-ins: each one orders (a subset of) the legal configs of a space.

Signature of a strategy: `strategy(space, limits, budget, seed) -> Iterator[Config]`. It yields legal
configs in the order they should be tried; the tuner stops pulling when the budget says so. Register a new
strategy by adding it to `STRATEGIES`.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

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

Strategy = Callable[[Space, "Limits | None", Budget, int], Iterator[Config]]


def exhaustive(space: Space, limits: Limits | None, budget: Budget, seed: int = 0) -> Iterator[Config]:
    """Every legal config of the space, in grid order (the budget can still cut it short)."""
    yield from _take(space.legal(limits), budget)


def random_search(space: Space, limits: Limits | None, budget: Budget, seed: int = 0) -> Iterator[Config]:
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


def _take(configs: list[Config], budget: Budget, taken: int = 0) -> Iterator[Config]:
    for cfg in configs:
        if not budget.allows(taken):
            return
        taken += 1
        yield cfg


STRATEGIES: dict[str, Strategy] = {"exhaustive": exhaustive, "random": random_search}


def get_strategy(name: str) -> Strategy:
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ConfigError(f"unknown strategy {name!r}", f"use one of: {', '.join(STRATEGIES)}") from None
