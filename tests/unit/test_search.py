"""Search strategies: exhaustive covers the legal space, random respects its budget, bad budgets refused."""

import pytest

from tilewise.devices.profiles import PROFILES
from tilewise.errors import ConfigError
from tilewise.kernels.gemm.webgpu import gemm_space
from tilewise.tune.search import STRATEGIES, Budget, exhaustive, get_strategy, random_search

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
    assert set(STRATEGIES) >= {"exhaustive", "random"}
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
