"""GEMM legality rules: each rule has a config that breaks only it, explanations show the numbers, the rule
order never divides by zero, and the fast legal enumeration agrees with the generic one."""

import random

import pytest

from tilewise.devices.profiles import PROFILES
from tilewise.kernels.gemm.webgpu import BASE, PARAMS, RULES, GemmSpace, fmt, gemm_space
from tilewise.kernels.space import Config, Rule, RuleOrderError, Space

LAVAPIPE = PROFILES["lavapipe"]
DEFAULT = PROFILES["webgpu-default"]

# rule -> (limits profile, overrides of the base config that break only that rule, a number the explanation shows)
BREAKS_ONLY = {
    "warp_tile_m": (LAVAPIPE, {"BM": 96, "BN": 128}, "96 % 64 = 32"),
    "warp_tile_n": (LAVAPIPE, {"BN": 48, "NT": 64}, "48 % 32 = 16"),
    "threads": (LAVAPIPE, {"NT": 64}, "= 128 != NT 64"),
    "warp_steps": (LAVAPIPE, {"BM": 32, "WM": 16}, "512/1024"),
    "wmiter_divides": (LAVAPIPE, {"WN": 48, "TM": 1, "BN": 96}, "WM % WMITER"),
    "wniter_divides": (LAVAPIPE, {"BM": 96, "WM": 48, "WNITER": 3, "TN": 2, "VEC": 1}, "32 % 3 = 2"),
    "sub_tile_m": (DEFAULT, {"WN": 48, "BN": 96, "TM": 3}, "% 3"),
    "sub_tile_n": (LAVAPIPE, {"TN": 3, "WM": 24, "VEC": 1, "BM": 48}, "% 3"),
    "vec4_bk": (LAVAPIPE, {"SB": "private", "BK": 2, "SA": "private"}, "BK = 2"),
    "vec4_tn": (LAVAPIPE, {"TN": 1}, "TN = 1"),
    "load_a": (LAVAPIPE, {"BM": 48, "WM": 24, "TM": 1}, "1.5"),
    "load_b": (LAVAPIPE, {"BK": 4}, "0.5"),
    "prefetch_staged": (LAVAPIPE, {"SA": "private", "SB": "private", "PF": 1}, "SA = SB = private"),
    "prefetch_registers": (LAVAPIPE, {"BK": 32, "PF": 1}, "= 48 > 32"),
    "accumulators": (LAVAPIPE, {"BN": 256, "WN": 128}, "= 256 > 128"),
    "workgroup_storage": (DEFAULT, {"BK": 32}, "24576 bytes > max_workgroup_storage_bytes 16384"),
    "invocations": (DEFAULT, {"SA": "private", "NT": 512, "BN": 256}, "NT = 512 > max_invocations_per_workgroup 256"),
}


def base() -> Config:
    return gemm_space("full").config(BASE)


def test_every_rule_has_a_single_break_case():
    assert set(BREAKS_ONLY) == {r.name for r in RULES}


@pytest.mark.parametrize("rule", sorted(BREAKS_ONLY))
def test_config_breaks_only_this_rule_and_explains_numbers(rule):
    limits, overrides, numbers = BREAKS_ONLY[rule]
    space = gemm_space("full")
    assert space.why_illegal(base(), limits) == []
    cfg = base().replace(**overrides)
    why = space.why_illegal(cfg, limits)
    assert [w.split(":", 1)[0] for w in why] == [rule], why
    assert numbers in why[0], why[0]


def test_threads_message_matches_the_issue_format():
    cfg = base().replace(NT=256)
    (msg,) = gemm_space("full").why_illegal(cfg, LAVAPIPE)
    assert msg == "threads: threads = (BM/WM)*(BN/WN)*32 = (128/64)*(64/32)*32 = 128 != NT 256"


def test_rule_order_never_divides_by_zero_on_the_grid():
    # why_illegal raises RuleOrderError when a rule fails to evaluate although earlier rules passed
    space = gemm_space("full")
    rng = random.Random(0)
    keys = list(PARAMS)
    for _ in range(3000):
        cfg = space.config({k: rng.choice(PARAMS[k]) for k in keys})
        space.why_illegal(cfg, LAVAPIPE)


def test_rule_order_error_is_raised_for_misordered_rules():
    rules = [Rule("divides", lambda c, L: 8 % c.x == 0, lambda c, L: "8 % x"),
             Rule("nonzero", lambda c, L: c.x != 0, lambda c, L: "x = 0")]
    sp = Space("t", {"x": [0, 1, 2]}, rules)
    with pytest.raises(RuleOrderError):
        sp.why_illegal(sp.config(x=0))
    ok = Space("t", {"x": [0, 1, 2]}, rules[::-1])
    assert [w.split(":")[0] for w in ok.why_illegal(ok.config(x=0))] == ["nonzero"]


def test_config_prints_compactly_and_is_hashable():
    c = base()
    assert str(c) == "128x64x16 W64x32 WN2 T4x4 128t wg vec4"
    assert fmt(c.replace(SA="private", SB="private", PF=0)) == "128x64x16 W64x32 WN2 T4x4 128t priv vec4"
    assert "A:priv B:wg" in str(c.replace(SA="private"))
    assert len({c, base(), c.replace(BK=8)}) == 2
    assert gemm_space("full").parse(c.key()) == c


def test_config_attributes_read_parameters_and_leave_its_own_names_alone():
    rng = random.Random(7)
    values = {k: rng.choice(v) for k, v in PARAMS.items()}
    c = Config(values)
    assert all(getattr(c, k) == v == c[k] for k, v in values.items())
    # parameters named like Config's methods or private names are items only; the methods still work
    odd = Config({"get": 3, "replace": 4, "_hidden": 5, "BM": 6})
    assert (odd["get"], odd["replace"], odd["_hidden"], odd.BM) == (3, 4, 5, 6)
    assert odd.get("get") == 3 and odd.replace(BM=7).BM == 7
    with pytest.raises(AttributeError):
        odd._hidden  # noqa: B018
    with pytest.raises(AttributeError):
        c.BM = 1
    with pytest.raises(AttributeError):
        c.NOT_A_PARAM  # noqa: B018


def test_seed_space_has_16_points_and_at_least_two_illegal():
    sp = gemm_space("seed")
    points = list(sp)
    assert len(points) == 16 == sp.size
    _, illegal = sp.split(LAVAPIPE)
    assert len(illegal) >= 2
    assert len(set(points)) == 16
    # one or two dimensions away from the base (the probe tile aside)
    b = base()
    dims = [sum(1 for k in b if p[k] != b[k]) for p in points]
    assert sum(d <= 2 for d in dims) >= 14


def test_fast_legal_enumeration_matches_the_generic_filter():
    params = {**{k: list(v) for k, v in PARAMS.items()}, "BM": [32, 64, 128], "BN": [32, 64], "BK": [8, 16],
              "WM": [16, 32, 64], "WN": [16, 32], "TM": [2, 4], "TN": [4, 8], "SA": ["workgroup"], "PF": [0, 1, 2]}
    fast = GemmSpace("small", params, list(RULES), fmt)
    generic = Space("small", params, list(RULES), fmt)
    assert set(fast.legal(LAVAPIPE)) == set(generic.legal(LAVAPIPE))
    assert len(fast.legal(LAVAPIPE)) > 10


def test_full_space_is_mostly_illegal():
    sp = gemm_space("full")
    rng = random.Random(1)
    draws = [sp.config({k: rng.choice(v) for k, v in PARAMS.items()}) for _ in range(4000)]
    legal = sum(sp.is_legal(c, PROFILES["h200-vulkan"]) for c in draws)
    assert 0 < legal < len(draws) / 10


def test_points_space_iterates_points_only():
    sp = Space("p", {"a": [1, 2, 3], "b": ["x", "y"]}, points=[{"a": 1, "b": "y"}, {"a": 3, "b": "x"}])
    assert [c.key() for c in sp] == ["a=1,b=y", "a=3,b=x"]
    assert sp.size == 2
    assert len(sp.sample(5, seed=1)) == 2
    assert next(iter(sp))["b"] == "y"
