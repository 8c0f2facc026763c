"""Tiled / split-K matmul rules for the prefetch (PF), column layout (CL) and accumulator parameters: a config
breaking one rule is rejected by that rule alone with the numbers; PF=0 / CL="block" generate today's WGSL
byte for byte; the model tuner's hand-picked seeds are whole configs and include the new variants."""

from __future__ import annotations

import pytest

from tilewise.devices.profiles import PROFILES
from tilewise.kernels.matmul import webgpu as mm
from tilewise.model import tune as model_tune
from tilewise.model import tune_seeds

LAVAPIPE = PROFILES["lavapipe"]
H200 = PROFILES["h200-vulkan"]
F16 = ("shader-f16",)


def _space(kind="tiled", fmt="nf4", epilogue="none", f16=0, norm=False):
    return mm.MatmulTemplate(kind, fmt, epilogue, F16, f16 > 0, f16 == 2, norm=norm).space()


def _cfg(sp, **kw):
    base = {**mm.DEFAULT_TILED, **{k: v[0] for k, v in sp.params.items() if k in ("KS", "F16S", "F16A")}}
    return sp.config({**base, **kw})


# (space arguments, overrides of the default tile, limits, the only rule broken, numbers its message shows)
BREAKS_ONLY = [
    ({}, {"CL": "strided"}, LAVAPIPE, "strided_cols", "TN=4"),
    ({"epilogue": "swiglu"}, {"BK": 32, "TM": 8, "TN": 8, "PF": 1}, LAVAPIPE, "prefetch_registers",
     "= 2*4*2 + 4*8 = 48 > 32"),  # 64 threads: 256 nf4 chunks x 2 sets, 512 activation vec4s
    ({"fmt": "f32", "epilogue": "swiglu"}, {"BM": 32, "BN": 32, "BK": 32, "TM": 2, "TN": 8, "PF": 1}, LAVAPIPE,
     "prefetch_registers", "(f32 words per 8 weights) + 4*ceil(BM*BK/4/threads) = 2*2*8 + 4*4 = 48 > 32"),
    ({"epilogue": "swiglu", "f16": 2}, {"TM": 8, "TN": 8}, LAVAPIPE, "accumulators",
     "2*TM*TN*1.5 (F16A partial sums) = 2*8*8*1.5 = 192 accumulator registers > 128"),
    ({}, {"BN": 256, "BK": 64, "TN": 8}, H200, "workgroup_storage",
     "= 81984 bytes > max_workgroup_storage_bytes 49152"),  # (64*256 + 64*64)*4 + 64
]


@pytest.mark.parametrize("case", BREAKS_ONLY, ids=lambda c: c[3])
def test_config_breaks_only_this_rule_and_explains_numbers(case):
    args, overrides, limits, rule, numbers = case
    sp = _space(**args)
    assert sp.why_illegal(_cfg(sp), limits) == []
    why = sp.why_illegal(_cfg(sp, **overrides), limits)
    assert [w.split(":", 1)[0] for w in why] == [rule], why
    assert numbers in why[0], why[0]


def test_prefetch_registers_count_the_weight_format():
    tile = {"BM": 32, "BN": 32, "BK": 32, "TM": 2, "TN": 8, "PF": 1}  # 64 threads: 2 chunks, 4 vec4s each
    assert mm.prefetch_slots(tile) == (2, 4)
    assert {f: mm.prefetch_registers(tile, f, False) for f in mm.FORMATS} == {"nf4": 20, "f16": 24, "f32": 32}
    sp = _space(fmt="f32")
    assert sp.why_illegal(_cfg(sp, **tile), LAVAPIPE) == []  # 32 is the limit, allowed
    sp = _space(fmt="nf4", epilogue="swiglu")
    assert sp.why_illegal(_cfg(sp, **tile), LAVAPIPE) == []  # 2*2*2 + 16 = 24
    assert sp.why_illegal(_cfg(sp, **{**tile, "PF": 0, "BK": 64}), LAVAPIPE) == []  # PF=0 holds no registers


def test_accumulator_allowance_is_128_for_tiles_and_64_for_rows():
    sp = _space(epilogue="swiglu")
    assert sp.why_illegal(_cfg(sp, TM=8, TN=8), H200) == []  # 2*8*8 = 128 f32 accumulators
    sp = _space(f16=2)
    assert sp.why_illegal(_cfg(sp, TM=8, TN=8), H200) == []  # 8*8*1.5 = 96 with the f16 partial sums
    assert mm.TILED_ACC_BUDGET == 128 and mm.ACC_BUDGET == 64
    rs = mm.rows_space(paired=True)
    (why,) = rs.why_illegal(rs.config(WG=64, NC=2, RM=8, EL=32), H200)
    assert why.startswith("accumulators") and "80 live values > 64" in why


def test_new_parameter_values_are_in_the_space():
    for kind in ("tiled", "splitk"):
        sp = _space(kind)
        assert sp.params["PF"] == [0, 1] and sp.params["CL"] == ["block", "strided"]
        assert 256 in sp.params["BN"] and 64 in sp.params["BK"] and sp.params["TM"] == [1, 2, 4, 8]
        assert {48, 72, 96, 192} <= set(sp.params["BN"]) and {48, 96} <= set(sp.params["BM"])  # not only 2^k
        assert any(c["PF"] == 1 and c["CL"] == "strided" for c in sp.sample(40, seed=1, limits=H200))
    c = _cfg(_space(), TN=8, PF=1, CL="strided")
    assert str(c).endswith(" pf strided")
    assert _space().parse(c.key()) == c


@pytest.mark.parametrize("fmt", mm.FORMATS)
def test_pf0_block_is_todays_wgsl_byte_for_byte(fmt):
    tiles = [dict(mm.DEFAULT_TILED), {"BM": 32, "BN": 128, "BK": 32, "TM": 2, "TN": 8, "F16S": False},
             {"BM": 128, "BN": 64, "BK": 8, "TM": 8, "TN": 8, "F16S": False}]
    for tile in tiles:
        old = {k: v for k, v in tile.items() if k not in ("PF", "CL")}
        for epilogue in mm.EPILOGUES:
            for extra, norm in (({}, None), ({}, 1e-5), ({"KS": 2}, None), ({"F16S": True}, 1e-5),
                                ({"F16S": True, "F16A": True}, None), ({"F16S": True, "F16A": True, "KS": 4}, None)):
                kind = "splitk" if "KS" in extra else "tiled"
                a = mm.source(kind, {**old, **extra}, fmt, epilogue, 72, 256, norm)
                b = mm.source(kind, {**old, **extra, "PF": 0, "CL": "block"}, fmt, epilogue, 72, 256, norm)
                assert a == b
                assert "dec8" not in a and "cs0" not in a
                c = mm.source(kind, {**old, **extra, "PF": 1, "CL": "strided"}, fmt, epilogue, 72, 256, norm)
                assert c != a and "pw0_0" in c and "cs0" in c


def test_bad_values_are_refused_by_the_generator():
    with pytest.raises(ValueError, match="PF"):
        mm.tiled_source({**mm.DEFAULT_TILED, "PF": 2}, "nf4", "none", 64, 64)
    with pytest.raises(ValueError, match="CL"):
        mm.tiled_source({**mm.DEFAULT_TILED, "CL": "cyclic"}, "nf4", "none", 64, 64)


def test_hand_picked_seeds_are_whole_configs_with_the_new_variants():
    # a cap on tuning time: every seed compiles (and the driver's compile dominates a model's tuning)
    assert len(tune_seeds.SEED_TILED) <= 43 and len(tune_seeds.SEED_SPLITK) <= 28
    # DB=1 lost at every shape on the H200: only random draws try it
    assert all(v.get("DB", 0) == 0 for v in (*tune_seeds.SEED_TILED, *tune_seeds.SEED_SPLITK))
    for kind, epilogue, norm in (("tiled", "swiglu", True), ("splitk", "residual", False)):  # gate/up, down
        for f16 in (0, 2):
            t = mm.MatmulTemplate(kind, "nf4", epilogue, F16, f16 > 0, f16 == 2, norm=norm)
            cands = model_tune.candidates(t, H200, 0, 0)  # default + hand-picked, legal on the H200
            assert all(set(c) == set(t.space().params) for c in cands)
            assert any(c["PF"] == 1 and c["CL"] == "strided" for c in cands)
            assert any(c["PF"] == 0 and c["CL"] == "block" for c in cands)
            assert len(cands) <= (44 if kind == "tiled" else 29)
            # the unrolled seeds (128x128 with K step 32 for tiles: f16 staging fits its workgroup memory)
            assert any(c["UK"] == 1 for c in cands) == (kind == "splitk" or f16 > 0)
            assert any(c["UK"] == 0 for c in cands)
            fitted = model_tune.candidates(t, H200, 0, 0, seq=346)  # plus the seeds fitted to 346 rows
            assert set(cands) < set(fitted) and len(fitted) <= len(cands) + 4
            assert {c["BM"] for c in fitted} - {c["BM"] for c in cands} <= {176, 120, 88}


def test_fitted_row_tiles_split_the_decision_into_few_blocks_with_little_padding():
    for seq in (17, 100, 299, 346, 512, 1000):
        for blocks in (2, 3, 4):
            bm = tune_seeds.fitted_rows(seq, blocks)
            assert bm % 8 == 0 and -(-seq // bm) <= blocks  # covers seq rows in at most `blocks` tiles
            assert blocks * bm - seq < 8 * blocks  # pads less than one 8-row step per block
    assert [tune_seeds.fitted_rows(346, j) for j in (2, 3, 4)] == [176, 120, 88]
    for kind in ("tiled", "splitk"):
        seeds = tune_seeds.fitted_seeds(346, kind)
        assert seeds and all(s["BM"] in (176, 120, 88) and s["PF"] == 1 for s in seeds)
        assert all(("KS" in s) == (kind == "splitk") for s in seeds)


def test_split_k_beyond_the_scratch_is_refused_before_compiling():
    # the harness's scratch holds the largest listed KS; the paired (gate/up) space lists 2 and 4, and one
    # hand-picked seed has KS=8: it used to compile, write past the scratch and fail verification on the GPU
    t = mm.MatmulTemplate("splitk", "nf4", "swiglu", F16, norm=True)
    seed8 = t.space().config({**mm.DEFAULT_TILED, "BM": 128, "BN": 128, "TM": 8, "TN": 8, "PF": 1,
                              "CL": "strided", "KS": 8})
    why = t.space().why_illegal(seed8, H200)
    assert why and why[0].startswith("scratch_ks: KS=8 is not one of [2, 4]"), why
    assert all(c["KS"] in (2, 4) for c in model_tune.candidates(t, H200, 8, 0))
    down = mm.MatmulTemplate("splitk", "nf4", "residual", F16)
    assert down.space().is_legal(down.space().config(dict(seed8)), H200)  # unpaired: KS=8 fits its scratch
