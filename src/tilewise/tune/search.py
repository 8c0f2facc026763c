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
from tilewise.tune.space import Config, Space


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


Strategy = Callable[[Space, "Limits | None", Budget, int], Iterator[Config]]


def exhaustive(space: Space, limits: Limits | None, budget: Budget, seed: int = 0) -> Iterator[Config]:
    """Every legal config of the space, in grid order (the budget can still cut it short)."""
    taken = 0
    for cfg in space.legal(limits):
        if not budget.allows(taken):
            return
        taken += 1
        yield cfg


def random_search(space: Space, limits: Limits | None, budget: Budget, seed: int = 0) -> Iterator[Config]:
    """Legal configs drawn uniformly without replacement until the budget is spent."""
    legal = space.legal(limits)
    order = list(range(len(legal)))
    random.Random(seed).shuffle(order)
    taken = 0
    for i in order:
        if not budget.allows(taken):
            return
        taken += 1
        yield legal[i]


STRATEGIES: dict[str, Strategy] = {"exhaustive": exhaustive, "random": random_search}


def get_strategy(name: str) -> Strategy:
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ConfigError(f"unknown strategy {name!r}", f"use one of: {', '.join(STRATEGIES)}") from None
