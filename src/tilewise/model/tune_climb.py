"""`tilewise tune model --climb N`: after a matmul shape's candidates are measured, N more configs of the kernel
that was fastest at the decision's rows, hill-climbing from the configs of it that were measured
(`tune.search.climb`: the untried neighbours of the fastest, measured together, again from a faster one).

Seeds and a random sample find a good kernel kind and a good region of its space; the neighbours of the best
config are where a few more measurements pay most (a tile size one step up or down, one stage more, split-K
halved). The climb's configs are measured at the decision's lengths only (`rows`), so the dispatch table may pick
one there and keeps what the full sweep measured everywhere else.

The fastest config is where a climb starts, but a lead inside the noise does not make it the better start: the
configs of that kernel whose median's 95% interval overlaps the fastest's (`ties`, up to `MAX_STARTS`) each start
a climb, and the steps are split between them. Noise then cannot choose the one basin the whole climb explores:
two climbs of the same shape from starts a percent apart have ended on tiles 17% apart.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tilewise.tune.engine import Engine, Item
from tilewise.tune.measure import ties
from tilewise.tune.outcome import Outcome
from tilewise.tune.search import Budget, Feedback, climb, run_search

#: most climbs one shape's steps are split between: the fastest config and the configs it ties with
MAX_STARTS = 3


def climb_matmul(eng: Engine, evaluate: Callable[[list[Item]], list[Outcome]], outcomes: list[Outcome], n: int,
                 k: int, seq: int, rows: list[int], count: int, seed: int) -> tuple[list[Outcome], dict[str, Any]]:
    """Up to `count` more configs of the kernel fastest at `seq` rows, each measured at `rows` (which hold `seq`).

    `evaluate(items)` measures engine items (the caller's progress and deadline go with it). Returns the new
    outcomes and a record: the kernel, where the climb started, how many it measured and the best at `seq` after.
    """
    at_seq = [oc for oc in outcomes if oc.shape[0] == seq]
    timed = sorted((oc for oc in at_seq if oc.status == "ok" and oc.stats is not None),
                   key=lambda oc: oc.stats.median_ms)  # type: ignore[union-attr]
    if count <= 0 or not timed:
        return [], {}
    start = timed[0]
    tpl = start.item.kernel
    starts = [oc.config for oc in timed if oc.item.kernel is tpl and ties(start.stats, oc.stats)]  # type: ignore
    starts = list(dict.fromkeys(starts))[:min(MAX_STARTS, count)]  # the fastest first
    fb = Feedback()
    fb.record_outcomes(oc for oc in at_seq if oc.item.kernel is tpl)  # failures too: not tried again
    new: list[Outcome] = []

    def measure(configs: list[Any]) -> None:
        got = evaluate([Item(tpl, c, (m, n, k)) for m in rows for c in configs])
        fb.record_outcomes(oc for oc in got if oc.shape[0] == seq)
        new.extend(got)

    limits = eng.device.info.limits
    taken = 0
    for i, c in enumerate(starts):  # the steps left, split evenly over the starts left
        share = (count - taken) // (len(starts) - i)
        taken += run_search(climb(tpl.space(), limits, Budget(count=share), seed + i, feedback=fb, start=[c]),
                            measure)
    best = fb.best(fb.median_ms)
    return new, {"kernel": tpl.name, "from": start.config.key(), "from_ms": start.stats.median_ms,  # type: ignore
                 "starts": [c.key() for c in starts], "measured": taken,
                 "best": best.key() if best is not None else None,
                 "best_ms": fb.median_ms.get(best) if best is not None else None}
