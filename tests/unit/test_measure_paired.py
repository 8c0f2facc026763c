"""Round-by-round comparison of alternating races (`tune.measure.paired_compare`) and its interval of a median
(`median_interval`), on random timings with the clock steps seen on GPUs: a speed that changes by a few percent and
stays for many decisions, stepping anywhere inside a round."""

from __future__ import annotations

import numpy as np
import pytest

from tilewise.tune.measure import (
    MIN_PAIRED_ROUNDS,
    compare,
    median_interval,
    paired_compare,
    rounds_of,
    summarize,
)


def alternating_race(rng: np.random.Generator, base_ms: float, new_ms: float, rounds: int, per_round: int,
                     step: float, stretch: int) -> tuple[list[float], list[float]]:
    """Samples of both sides as `race_modes` takes them (round r: base then new, reversed every other round), on a
    machine whose speed is `step` slower in alternate stretches of about `stretch` decisions, with 0.3% noise."""
    edges = np.cumsum(rng.integers(stretch // 2, 3 * stretch // 2, size=4 * rounds * per_round // stretch + 4))
    out: dict[str, list[float]] = {"base": [], "new": []}
    t = 0
    for r in range(rounds):
        for side in (("base", "new") if r % 2 == 0 else ("new", "base")):
            for _ in range(per_round):
                slow = int(np.searchsorted(edges, t, side="right")) % 2 == 1
                ms = (base_ms if side == "base" else new_ms) * (1 + step * slow)
                out[side].append(ms * (1 + 0.003 * rng.standard_normal()))
                t += 1
    return out["base"], out["new"]


def test_the_median_interval_holds_the_true_median_at_least_95_percent_of_the_time(rng):
    n = int(rng.integers(12, 41))
    hits = 0
    trials = 1500
    for _ in range(trials):
        x = rng.lognormal(0.0, 0.5, n)  # true median 1
        lo, hi = median_interval(x)
        assert lo <= float(np.median(x)) <= hi
        hits += lo <= 1.0 <= hi
    assert hits / trials >= 0.94


def test_the_median_interval_is_the_sign_tests_order_statistics():
    assert median_interval(np.arange(1.0, 21.0)) == (6.0, 15.0)  # n = 20: x(6), x(15), 95.9% coverage
    assert median_interval(np.arange(1.0, 41.0)) == (14.0, 27.0)
    assert median_interval([3.0, 1.0, 2.0]) == (1.0, 3.0)  # too few for 95%: all of them


@pytest.mark.parametrize("seed", range(6))
def test_equal_sides_under_clock_steps_are_a_tie_round_by_round(seed):
    rng = np.random.default_rng(seed)
    base, new = alternating_race(rng, 1.05, 1.05, rounds=20, per_round=15, step=0.03, stretch=40)
    got = paired_compare(rounds_of(base, 15), rounds_of(new, 15), ("base", "new"))
    assert got.verdict == "tie" and abs(got.ratio - 1.0) < 0.004
    lo, hi = got.interval
    assert lo <= 1.0 <= hi and got.as_dict()["ratio_interval"] == [lo, hi] and got.level == 0.95


@pytest.mark.parametrize("seed", range(6))
def test_a_two_percent_gain_under_clock_steps_is_found_with_its_size(seed):
    rng = np.random.default_rng(100 + seed)
    base, new = alternating_race(rng, 1.05, 1.05 / 1.02, rounds=20, per_round=3, step=0.03, stretch=30)
    got = paired_compare(rounds_of(base, 3), rounds_of(new, 3))
    assert got.verdict == "faster" and abs(got.ratio - 1.02) < 0.006 and got.interval[0] > 1.0
    back = paired_compare(rounds_of(new, 3), rounds_of(base, 3))
    assert back.verdict == "slower" and back.interval[1] < 1.0


def test_pooled_medians_can_rank_a_clock_step_that_pairing_calls_a_tie():
    """The failure pairing exists for: equal sides, a 3% step landing unevenly between them; pooled medians sit in
    either mode and compare says faster or slower, while the rounds' ratios stay near 1."""
    found = 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        base, new = alternating_race(rng, 1.05, 1.05, rounds=8, per_round=15, step=0.03, stretch=60)
        pooled = compare(summarize(base), summarize(new))
        paired = paired_compare(rounds_of(base, 15), rounds_of(new, 15))
        assert paired.verdict == "tie"
        found += pooled.verdict in ("faster", "slower")
    assert found > 0  # the pooled comparison was fooled at least once where pairing was not


def test_unpaired_or_too_few_rounds_are_refused_or_noisy(rng):
    base = [list(rng.uniform(1.0, 1.1, 3)) for _ in range(MIN_PAIRED_ROUNDS)]
    with pytest.raises(ValueError, match="same rounds"):
        paired_compare(base, base[:-1])
    few = paired_compare(base[:-1], base[:-1])
    assert few.verdict == "noisy" and "too few rounds" in (few.note or "")
    with pytest.raises(ValueError, match="whole rounds"):
        rounds_of([1.0] * 7, 3)
    assert rounds_of(list(range(6)), 3) == [[0, 1, 2], [3, 4, 5]]
