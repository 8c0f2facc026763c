"""`tilewise tune model --climb N`: after a matmul shape's candidates are measured, N more configs of the kernel
that was fastest at the decision's rows, hill-climbing from the configs of it that were measured
(`tune.search.climb`: the untried neighbours of the fastest, measured together, again from a faster one).

Seeds and a random sample find a good kernel kind and a good region of its space; the neighbours of the best
config are where a few more measurements pay most (a tile size one step up or down, one stage more, split-K
halved). The climb's configs are measured at the decision's lengths only (`rows`), so the dispatch table may pick
one there and keeps what the full sweep measured everywhere else.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tilewise.tune.engine import Engine, Item
from tilewise.tune.outcome import Outcome
from tilewise.tune.search import Budget, Feedback, climb, run_search


def climb_matmul(eng: Engine, evaluate: Callable[[list[Item]], list[Outcome]], outcomes: list[Outcome], n: int,
                 k: int, seq: int, rows: list[int], count: int, seed: int) -> tuple[list[Outcome], dict[str, Any]]:
    """Up to `count` more configs of the kernel fastest at `seq` rows, each measured at `rows` (which hold `seq`).

    `evaluate(items)` measures engine items (the caller's progress and deadline go with it). Returns the new
    outcomes and a record: the kernel, where the climb started, how many it measured and the best at `seq` after.
    """
    at_seq = [oc for oc in outcomes if oc.shape[0] == seq]
    timed = [oc for oc in at_seq if oc.status == "ok" and oc.stats is not None]
    if count <= 0 or not timed:
        return [], {}
    start = min(timed, key=lambda oc: oc.stats.median_ms)  # type: ignore[union-attr]
    tpl = start.item.kernel
    fb = Feedback()
    fb.record_outcomes(oc for oc in at_seq if oc.item.kernel is tpl)  # failures too: not tried again
    new: list[Outcome] = []

    def measure(configs: list[Any]) -> None:
        got = evaluate([Item(tpl, c, (m, n, k)) for m in rows for c in configs])
        fb.record_outcomes(oc for oc in got if oc.shape[0] == seq)
        new.extend(got)

    limits = eng.device.info.limits
    taken = run_search(climb(tpl.space(), limits, Budget(count=count), seed, feedback=fb, start=list(fb.median_ms)),
                       measure)
    best = fb.best(fb.median_ms)
    return new, {"kernel": tpl.name, "from": start.config.key(), "from_ms": start.stats.median_ms,  # type: ignore
                 "measured": taken, "best": best.key() if best is not None else None,
                 "best_ms": fb.median_ms.get(best) if best is not None else None}
