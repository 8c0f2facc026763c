"""Search strategies: exhaustive covers the legal space, random respects its budget, climb finds what a sample
misses, bad budgets refused."""

import functools
from collections.abc import Callable

import numpy as np
import pytest

from tilewise.devices.profiles import PROFILES
from tilewise.errors import ConfigError
from tilewise.kernels.gemm.webgpu import gemm_space
from tilewise.kernels.space import Config, Rule, Space
from tilewise.tune.search import (
    FLUSH,
    STRATEGIES,
    Budget,
    Feedback,
    climb,
    exhaustive,
    get_strategy,
    neighbours,
    random_search,
)

LIMITS = PROFILES["lavapipe"]


def test_exhaustive_is_the_legal_space():
    sp = gemm_space("seed")
    got = list(exhaustive(sp, LIMITS, Budget()))
    assert got == sp.legal(LIMITS) and len(got) == 14


def test_random_budget_count_distinct_and_legal():
    sp = gemm_space("full")
    got = list(random_search(sp, LIMITS, Budget(count=25), seed=4))
    assert len(got) == 25 == len(set(got))
    assert all(sp.is_legal(c, LIMITS) for c in got)
    again = list(random_search(sp, LIMITS, Budget(count=25), seed=4))
    assert got == again  # seeded
    assert got != list(random_search(sp, LIMITS, Budget(count=25), seed=5))


def test_random_small_space_is_a_permutation_of_the_legal_configs():
    sp = gemm_space("seed")
    got = list(random_search(sp, LIMITS, Budget(), seed=1))
    assert sorted(map(str, got)) == sorted(map(str, sp.legal(LIMITS)))


def test_seconds_budget_stops_the_strategy():
    b = Budget(seconds=1e-9)
    assert list(exhaustive(gemm_space("seed"), LIMITS, b)) == []


@pytest.mark.parametrize("count,seconds", [(0, None), (-3, None), (None, 0.0)])
def test_empty_budgets_are_refused(count, seconds):
    with pytest.raises(ConfigError, match="measures nothing"):
        Budget(count, seconds)


def test_strategies_are_plugins_with_one_signature():
    assert set(STRATEGIES) >= {"exhaustive", "random", "climb"}
    with pytest.raises(ConfigError, match="unknown strategy"):
        get_strategy("annealing")


def test_a_config_survives_pickling_into_another_process():
    """Configs travel to compile and device workers: equal, same hash there, attribute access intact."""
    import pickle
    import subprocess
    import sys

    from tilewise.kernels.space import Config

    cfg = Config([("BM", 64), ("BN", 128), ("SA", "workgroup")])
    again = pickle.loads(pickle.dumps(cfg))
    assert again == cfg and hash(again) == hash(cfg) and again.BN == 128 and dict(again) == dict(cfg)
    code = ("import pickle, sys; c = pickle.loads(sys.stdin.buffer.read()); "
            "print(c.BM, c['SA'], hash(c) == hash(tuple(c.items())))")
    out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(cfg), capture_output=True, check=True,
                         env={"PYTHONHASHSEED": "123", **{k: v for k, v in __import__("os").environ.items()
                                                          if k != "PYTHONHASHSEED"}}).stdout.decode().split()
    assert out == ["64", "workgroup", "True"]


# ---- climb: hill-climbing steered by what was measured ---------------------------------------------------------
def bowl_depth(c: Config) -> float:
    return 1.0 + (c.A - 11) ** 2 + (c.B - 5) ** 2 + (0 if c.C == "y" else 3)


def bowl() -> tuple[Space, Callable[[Config], float]]:
    """A 16 x 16 x 3 grid (A + B <= 28 legal) whose time falls toward (11, 5, y) one step at a time, as tile sizes
    next to each other tend to run alike; 1% noise."""
    sp = Space("bowl", {"A": list(range(1, 17)), "B": list(range(1, 17)), "C": ["x", "y", "z"]},
               [Rule("sum_28", lambda c, L: c.A + c.B <= 28, lambda c, L: f"A + B = {c.A + c.B} > 28")])
    noise = np.random.default_rng(3)

    def ms(c: Config) -> float:
        return bowl_depth(c) * (1 + 0.01 * noise.standard_normal())

    return sp, ms


def drive(strategy, sp, ms, budget, seed, limits=None) -> tuple[list[Config], int]:
    """Run a strategy as the tuner does: configs pile up, FLUSH measures them into the feedback. Returns every
    config yielded, in order, and the number of flushes."""
    fb = Feedback()
    got: list[Config] = []
    pending: list[Config] = []
    flushes = 0
    for c in strategy(sp, limits, budget, seed, feedback=fb):
        if c is FLUSH:
            flushes += 1
            for p in pending:
                fb.record(p, ms(p))
            pending = []
            continue
        got.append(c)
        pending.append(c)
    return got, flushes


def test_climb_finds_the_optimum_of_a_structured_space_where_a_random_sample_of_the_same_size_does_not():
    sp, ms = bowl()
    best = sp.config(A=11, B=5, C="y")
    found = {"climb": 0, "random": 0}
    for seed in range(10):
        for name in found:
            got, _ = drive(STRATEGIES[name], sp, ms, Budget(count=90), seed)
            assert len(got) == 90 == len(set(got)) and all(sp.is_legal(c) for c in got)
            found[name] += best in got
    assert found["climb"] == 10 and found["random"] <= 4, found  # 90 of 738 legal configs: 12% each for random


def test_climb_measures_every_untried_neighbour_of_where_it_stands_before_it_moves():
    sp, ms = bowl()
    got, flushes = drive(climb, sp, ms, Budget(count=60), seed=5)
    assert flushes >= 5
    start = got[: max(2, min(8, 60 // 8))]
    here = min(start, key=bowl_depth)
    following = got[len(start): len(start) + len(neighbours(sp, here, None))]
    assert set(following) == set(neighbours(sp, here, None)) - set(start)


def test_neighbours_step_numbers_to_the_next_value_and_words_to_every_other():
    sp, _ = bowl()
    got = neighbours(sp, sp.config(A=16, B=12, C="x"), None)
    assert {(c.A, c.B, c.C) for c in got} == {(15, 12, "x"), (16, 11, "x"), (16, 12, "y"), (16, 12, "z"),
                                              (15, 13, "x")}
    # A has no value above 16; (16, 13) breaks A + B <= 28, so A's step down repairs it


def test_climb_without_feedback_is_the_random_search():
    sp = gemm_space("full")
    assert list(climb(sp, LIMITS, Budget(count=20), seed=2)) == list(random_search(sp, LIMITS, Budget(count=20), 2))
    got, _ = drive(climb, sp, lambda c: float(c.BM), Budget(count=40), seed=2, limits=LIMITS)
    assert len(got) == 40 == len(set(got)) and all(sp.is_legal(c, LIMITS) for c in got)


def test_climb_starts_from_the_given_configs_and_climbs_from_the_fastest_of_them():
    sp, ms = bowl()
    start = [sp.config(A=3, B=3, C="x"), sp.config(A=9, B=6, C="y"), sp.config(A=16, B=16, C="y")]  # last illegal
    got, _ = drive(functools.partial(climb, start=start), sp, ms, Budget(count=30), seed=0)
    assert got[:2] == start[:2]
    assert set(got[2:2 + len(neighbours(sp, start[1], None))]) == set(neighbours(sp, start[1], None))
    assert sp.config(A=11, B=5, C="y") in got


def test_climb_takes_what_the_feedback_already_holds_as_measured():
    sp, ms = bowl()
    start = [sp.config(A=3, B=3, C="x"), sp.config(A=9, B=6, C="y")]
    fb = Feedback()
    for c in start:
        fb.record(c, ms(c))
    got = []
    for c in climb(sp, None, Budget(count=20), 0, feedback=fb, start=start):
        if c is FLUSH:
            continue
        got.append(c)
        fb.record(c, ms(c))
    assert not set(start) & set(got) and len(got) == 20
    assert set(got[:len(neighbours(sp, start[1], None))]) == set(neighbours(sp, start[1], None))


def test_a_move_that_breaks_a_rule_tying_parameters_together_is_repaired_by_a_second_step():
    # threads = A * B must be 16: no single step of A or B is legal, a step of each is
    sp = Space("tied", {"A": [1, 2, 4, 8, 16], "B": [1, 2, 4, 8, 16], "C": [0, 1]},
               [Rule("threads_16", lambda c, L: c.A * c.B == 16, lambda c, L: f"A * B = {c.A * c.B} != 16")])
    got = {(c.A, c.B, c.C) for c in neighbours(sp, sp.config(A=4, B=4, C=0), None)}
    assert got == {(2, 8, 0), (8, 2, 0), (4, 4, 1)}
    assert all(sp.is_legal(sp.config(A=a, B=b, C=c)) for a, b, c in got)


def test_climb_on_a_hand_picked_space_keeps_to_its_points():
    sp = gemm_space("seed")
    points = set(sp.legal(LIMITS))
    got, _ = drive(climb, sp, lambda c: float(c.BM * c.BN), Budget(count=12), seed=1, limits=LIMITS)
    assert got and set(got) <= points and len(got) == len(set(got))
