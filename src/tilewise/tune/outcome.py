"""What the engine takes and gives: work items, their outcomes, and the stats of a final race."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tilewise.devices.base import source_hash
from tilewise.kernels.base import KernelTemplate, Shape
from tilewise.kernels.space import Config
from tilewise.tune.measure import Stats


@dataclass(frozen=True)
class Item:
    """One candidate: a kernel implementation, one of its configs, and the shape to run it at."""

    kernel: KernelTemplate
    config: Config
    shape: Shape

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))


@dataclass(eq=False)
class Outcome:
    """What happened to one item (the tuner's table rows are outcomes)."""

    item: Item
    status: str
    reason: str = ""
    stats: Stats | None = None
    gflops: float | None = None
    rel_err: float | None = None
    max_abs_err: float | None = None
    tile_waste: float | None = None
    #: the result came from the store, not from this run
    cached: bool = False
    #: the shape the output was checked at (the kernel's `verify_shape`); None when unknown or not verified
    verified_shape: Shape | None = None
    #: rank group of ties among the ranked ok outcomes (1 = the winners); set by the tuner
    tie_group: int | None = None
    #: 100 * peer median / this median, when this outcome ran in the same race as the peer
    pct_of_peer: float | None = None
    #: the cluster worker that measured it (None: this process)
    worker: str | None = None

    @property
    def config(self) -> Config:
        return self.item.config

    @property
    def shape(self) -> Shape:
        return self.item.shape

    @property
    def median_ms(self) -> float | None:
        return self.stats.median_ms if self.stats is not None else None

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
class Race:
    """A final race: every item's stats (in the order raced) from one interleaved measurement, with the peer's."""

    stats: list[Stats]
    peer: Stats | None = None
    peer_name: str = ""
    peer_error: str = ""
    rounds: int = 0


def first_line(text: str) -> str:
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    return lines[0] if lines else ""


def item_source_hash(item: Item) -> str:
    """Hash of the code one item runs (its generated source); configs that cannot generate get a kernel-level
    hash (they are illegal and never compile)."""
    try:
        return source_hash(item.kernel.source(item.config, item.shape))
    except Exception:
        return source_hash(item.kernel.name, item.kernel.backend, "ungenerated")
