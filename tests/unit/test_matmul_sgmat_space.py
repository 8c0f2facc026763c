"""The subgroup-matrix matmul (kind sgmat) without a device: its rules and their messages, its names in dispatch
tables, its bindings against the executor's buffer order, its registration in `tilewise tune model`, and that the
f16 tolerance it is verified under separates f16 rounding from a real bug at the model's K."""

from __future__ import annotations

import dataclasses
import re
from types import SimpleNamespace

import numpy as np
import pytest

from tilewise.devices.profiles import get_profile
from tilewise.errors import ConfigError
from tilewise.kernels.matmul import sgmat as sg
from tilewise.kernels.matmul.problem import MatmulProblem
from tilewise.kernels.matmul.webgpu import MatmulTemplate
from tilewise.model.dispatch import matmul_key, range_choice
from tilewise.quant.nf4 import weight_values
from tilewise.tune.verify import TOLERANCES, compare

H200 = get_profile("h200-dawn")
VARIANTS = [(f, e, nm) for f in ("nf4", "f16", "f32") for e in ("none", "residual", "swiglu") for nm in (False, True)]


def tpl(fmt="nf4", epilogue="none", norm=False):
    return sg.SgmatMatmul(fmt, epilogue, None, norm)


@pytest.mark.parametrize(("fmt", "epilogue", "norm"), VARIANTS)
def test_default_and_most_seeds_are_legal_on_the_h200(fmt, epilogue, norm):
    t = tpl(fmt, epilogue, norm)
    assert t.space().is_legal(t.default_config(), H200)
    seeds = t.seed_configs(H200)
    legal = [c for c in seeds if t.space().is_legal(c, H200)]
    # swiglu refuses the 128x128 seed (256 accumulator floats), split-K in 8 slices (scratch_ks; the 192x64 down
    # tile's four, accumulators) and the two buffers of a 64x128 gate and up tile (workgroup storage)
    assert len(legal) >= len(seeds) - (7 if epilogue == "swiglu" else 0)
    assert all(c["SG"] == 32 for c in seeds)  # the H200's fragments are 32-wide subgroups


def test_rules_name_the_numbers():
    t = tpl("nf4", "swiglu", True)
    sp = t.space()
    why = sp.why_illegal(sp.config({**sg.BASE, "SM": 1, "SN": 2}), H200)
    assert any(w.startswith("workgroup_x: workgroup x = SM*SN*SG = 1*2*32 = 64 is not a multiple") for w in why)
    why = sp.why_illegal(sp.config({**sg.BASE, "FM": 4, "FN": 4}), H200)
    assert "accumulators: accumulators = 2*FM*FN*m*n/SG = 2*4*4*16*16/32 = 256 floats per invocation > 128 " \
           "(certain spill)" in why
    why = sp.why_illegal(sp.config({**sg.BASE, "SM": 4, "SN": 1, "FM": 8, "FN": 1, "BK": 64}), H200)
    assert "norm_slots: x slots = ceil(BM*BK/4 / (SM*SN*SG)) = 64, 64 sums of squares > 16 registers of the " \
           "fused norm" in why
    why = sp.why_illegal(sp.config({**sg.BASE, "SM": 4, "SN": 1, "FM": 8, "FN": 1, "BK": 64, "VS": 1}), H200)
    assert "norm_slots: x slots = ceil(BM*BK/8 / (SM*SN*SG)) = 32, 64 sums of squares > 16 registers of the " \
           "fused norm" in why
    why = sp.why_illegal(sp.config({**sg.BASE, "BK": 8, "FRAG": "16x16x16"}), H200)
    assert "k_step: BK=8 is not a multiple of the fragment's k=16" in why
    # no fragment rule passes where there are no subgroup matrices, and the message says where to go
    why = sp.why_illegal(t.default_config(), get_profile("webgpu-default"))
    assert why and why[0].startswith("fragment_offered:") and "--device dawn" in why[0]


def test_workgroup_storage_counts_both_weight_tiles():
    small = dataclasses.replace(H200, max_workgroup_storage_bytes=16384)
    sp = tpl("nf4", "swiglu").space()
    cfg = sp.config({**sg.BASE, "BK": 64})  # 64x64x64: 8192 + 16384 + 8192 + 64 bytes
    why = sp.why_illegal(cfg, small)
    assert "workgroup_storage: workgroup storage = 2*BM*BK + 4*BN*BK + 8*SM*SN*m*n + 64 = 32832 bytes > " \
           "max_workgroup_storage_bytes 16384 (BMxBNxBK = 64x64x64)" in why
    assert sp.is_legal(cfg, H200)


def test_shape_rules():
    t = tpl("nf4")
    cfg = t.default_config()
    assert t.why_illegal(cfg, H200, (346, 1024, 1000)) == [
        "K=1000 is not a multiple of 64 (one NF4 absmax block per 64 inputs of a row)",
        "K=1000 is not a multiple of BK=32: the K loop takes whole steps"]
    assert t.why_illegal(cfg, H200, (346, 1000, 1024)) == []  # any N and M: guarded stores
    assert tpl("f16").why_illegal(cfg, H200, (5, 8, 96)) == []
    split = cfg.replace(KS=4)
    assert t.why_illegal(split, H200, (346, 1024, 1024)) == []
    assert t.why_illegal(split, H200, (346, 1024, 1088)) == [
        "K=1088 is not a multiple of KS*BK = 4*32: the K slices take whole steps"]
    assert "scratch_ks: KS=8 is not one of [1, 2, 4]" in " ".join(tpl("nf4", "swiglu").space().why_illegal(
        tpl("nf4", "swiglu").default_config().replace(KS=8), H200))


@pytest.mark.parametrize(("fmt", "epilogue", "norm"), VARIANTS)
def test_names_round_trip_and_dispatch_entries_pass_the_executors_checks(fmt, epilogue, norm):
    t = tpl(fmt, epilogue, norm)
    back = MatmulTemplate.from_name(t.name)
    assert isinstance(back, sg.SgmatMatmul) and back.name == t.name and back.dtype == "f16"
    assert back.problem.name == MatmulProblem(fmt, epilogue, norm).name
    key = matmul_key(fmt, epilogue, 4608, 1024, norm)
    got, cfg = range_choice(key, t.name, dict(sg.SEEDS[0]), (1, 512), H200, (sg.SUBGROUP_MATRIX,))
    assert got.name == t.name and cfg["WL"] == sg.SEEDS[0]["WL"]


def test_dispatch_checks_refuse_a_broken_sgmat_entry():
    key = matmul_key("nf4", "none", 1024, 1024)
    with pytest.raises(ConfigError, match=r"breaks workgroup_x: workgroup x = SM\*SN\*SG = 1\*1\*32 = 32"):
        range_choice(key, "nf4_matmul.sgmat.none", {**sg.BASE, "SM": 1, "SN": 1}, (1, 8), H200)
    with pytest.raises(ConfigError, match=re.escape("BK='32' is a str; nf4_matmul.sgmat.none takes int values")):
        range_choice(key, "nf4_matmul.sgmat.none", {**sg.BASE, "BK": "32"}, (1, 8), H200)
    with pytest.raises(ConfigError, match=re.escape("takes no flags but .norm")):
        MatmulTemplate.from_name("nf4_matmul.sgmat.none.f16s")
    with pytest.raises(ConfigError, match="not a matmul kernel name"):
        MatmulTemplate.from_name("nf4_matmul.sgmat.gelu")
    with pytest.raises(ConfigError, match="does not compute"):
        range_choice(key, "nf4_matmul.sgmat.residual", dict(sg.BASE), (1, 8), H200)


@pytest.mark.parametrize(("fmt", "epilogue", "norm"), VARIANTS)
def test_shader_bindings_are_the_executors_buffers_in_order(fmt, epilogue, norm):
    """The executor binds buffers by `binding_names()`; the shader's declarations must be the same, in order."""
    t = tpl(fmt, epilogue, norm)
    src = t.source(t.default_config(), (346, 4608, 1024))
    decl = re.findall(r"@binding\((\d+)\) var<[^>]*> (\w+):", src)
    assert [int(i) for i, _ in decl] == list(range(len(decl)))
    shader = {"dims": "dims", "x": "x", "norm_w": "norm_w", "w": "w0", "absmax": "am0", "w_up": "w1",
              "absmax_up": "am1", "out": "out"}
    assert [name for _, name in decl] == [shader[b] for b in t.binding_names()]
    assert src.count("subgroupMatrixLoad<Left") == 4  # BK/k = 32/16 steps x FM = 2 fragments
    assert "&x" not in src and "&out" not in src  # fragments only from/to workgroup memory


def _device(features, limits):
    return SimpleNamespace(enabled_features=frozenset(features), info=SimpleNamespace(limits=limits, backend="webgpu"))


def test_tune_model_offers_the_sgmat_kernel_only_with_subgroup_matrices():
    from tilewise.model.tune import candidates, matmul_templates

    dawn = _device({"shader-f16", "subgroups", sg.SUBGROUP_MATRIX}, H200)
    kinds = [t.kind for t in matmul_templates(dawn, "nf4", "swiglu", [1, 8, 346], norm=True)]
    assert kinds == ["tiled", "rows", "splitk", "sgmat"]
    t = matmul_templates(dawn, "nf4", "swiglu", [1, 8, 346], norm=True)[-1]
    cands = candidates(t, H200, 4, seed=0)
    assert cands[0] == t.default_config() and len(cands) >= 10
    assert all(t.space().is_legal(c, H200) for c in cands)
    plain = _device({"shader-f16"}, get_profile("webgpu-default"))
    assert "sgmat" not in [t.kind for t in matmul_templates(plain, "nf4", "swiglu", [1, 8])]
    no_configs = _device({"shader-f16", "subgroups", sg.SUBGROUP_MATRIX},
                         dataclasses.replace(H200, subgroup_matrix_configs=()))
    assert "sgmat" not in [t.kind for t in matmul_templates(no_configs, "nf4", "none", [1])]


def _emulated(host, shape, problem, drop_block=None):
    """The kernel's arithmetic in float64: x * g and W rounded to f16 once, exact products and sums (f32
    accumulation adds far less error than the f16 rounding), the norm's rsqrt from the unrounded x."""
    _, n, k = shape
    x = host["x"].astype(np.float64)
    xs = x * host["norm_w"] if problem.norm else x
    xh = xs.astype(np.float16).astype(np.float64)
    sets = []
    for suffix in ("", "_up")[: problem.sets]:
        w = weight_values({"w": host["w" + suffix], "absmax": host.get("absmax" + suffix)}, problem.fmt, n, k)
        wh = w.astype(np.float16).astype(np.float64)
        if drop_block is not None:
            wh[:, drop_block * 64:(drop_block + 1) * 64] = 0.0
        y = xh @ wh.T
        if problem.norm:
            y = y / np.sqrt((x * x).mean(-1, keepdims=True) + problem.eps)
        sets.append(y)
    if problem.epilogue == "swiglu":
        return sets[0] / (1 + np.exp(-sets[0])) * sets[1]
    return sets[0] + host["residual"] if problem.epilogue == "residual" else sets[0]


@pytest.mark.parametrize(("epilogue", "norm"), [("none", False), ("residual", False), ("swiglu", True)])
def test_the_f16_tolerance_holds_f16_rounding_at_k_4608_and_catches_one_lost_block(epilogue, norm, rng):
    problem = MatmulProblem("nf4", epilogue, norm)
    shape = (64, 256, 4608)
    host = problem.make_inputs(shape, rng)
    ref = problem.reference(host, shape)
    good = compare(_emulated(host, shape, problem).astype(np.float32), ref, "f16")
    tol = TOLERANCES["f16"]
    assert good.ok and good.rel_err < tol.rel_fro / 10, good.message  # an order of magnitude of headroom
    lost = compare(_emulated(host, shape, problem, drop_block=17).astype(np.float32), ref, "f16")
    assert not lost.ok, lost.message  # 64 of 4608 inputs dropped: ~12% error


# sha256 over the WGSL of BASE and the first twelve seeds of every variant at two shapes, as generated before KS and
# PAD existed: KS=1, PAD=0 must generate those shaders byte for byte (stored results of them stay valid)
BEFORE_SPLIT_K = "1afa06a661406725888a10937cc75919c07dbfb3c889debb22e9e8d08cef735a"


def test_without_split_k_the_shaders_are_those_of_before():
    import hashlib

    h = hashlib.sha256()
    for fmt, epilogue, norm in VARIANTS:
        t = tpl(fmt, epilogue, norm)
        for v in (sg.BASE, *[v for v in sg.SEEDS if (v["KS"], v["PAD"], v["PIPE"]) == (1, 0, 1)][:12]):
            cfg = t.space().config(v)
            assert (cfg["KS"], cfg["PAD"], cfg["PIPE"]) == (1, 0, 1)
            for shape in ((346, 1024, 4608), (7, 4608, 1024)):
                h.update(t.source(cfg, shape).encode())
    assert h.hexdigest() == BEFORE_SPLIT_K


@pytest.mark.parametrize(("epilogue", "norm"), [("residual", False), ("swiglu", True), ("none", True)])
def test_split_k_writes_the_fma_reduces_scratch_layout_and_launches_it(epilogue, norm):
    """KS slices in grid z write raw sums at (z, set, row, col) of the FMA split-K scratch (and, with a norm, each
    slice's row sums of squares after them); the second launch is the FMA kind's reduction, bound to the scratch."""
    from tilewise.kernels.matmul.wgsl import splitk_scratch_bytes

    t = tpl("nf4", epilogue, norm)
    sets = 2 if epilogue == "swiglu" else 1
    cfg = t.default_config().replace(KS=4)
    m, n, k = 346, 1024, 4608
    src = t.source(cfg, (m, n, k))
    assert f"let kz = wid.z * {k // 4}u;" in src and f"k0 < kz + {k // 4}u;" in src
    for s in range(sets):
        assert f"out[(wid.z * {sets}u + {s}u) * M * N + gr * N + gc]" in src
    assert ("inverseSqrt" in src) is False and "silu" not in src and "out[gr * N + gc]" not in src  # raw sums only
    if norm:
        assert f"out[{4 * sets}u * M * N + wid.z * M + m0 + r] = q;" in src
    assert t.scratch_bytes(cfg, m, n) == splitk_scratch_bytes(cfg, epilogue, m, n, norm) > 0
    assert t.scratch_bytes(t.default_config(), m, n) == 0

    class Dev:
        enabled_features = frozenset({sg.SUBGROUP_MATRIX})

        def compile(self, source, entry, name):
            return SimpleNamespace(meta={}, source=source, name=name)

    prog = t.compile(Dev(), cfg, (m, n, k))
    assert "part[" in prog.meta["reduce"].source and "KS=4" in prog.meta["reduce"].name
    bufs = {b: b for b in t.binding_names()} | {"part": "part"}
    main, reduce = t.launches(prog, bufs, cfg, (m, n, k))
    assert main.grid[2] == 4 and "part" in main.buffers and "out" not in main.buffers
    assert list(reduce.buffers) == ["dims", "part", "out"]
    assert len(t.launches(prog, bufs, t.default_config(), (m, n, k))) == 1
    assert t.scratch_buffers == ("part",) and "splitk4" in str(cfg)


@pytest.mark.parametrize(("fmt", "epilogue", "norm"), VARIANTS)
def test_seeds_fit_an_adapter_of_8x8x8_fragments_and_8_wide_subgroups(fmt, epilogue, norm):
    """An adapter offering only 8x8x8 fragments in subgroups of 8, with a max subgroup size of 128 (lavapipe on
    Dawn; Apple GPUs offer 8x8x8 too), gets seeds it can run: the fragment replaced by the one offered and 16
    subgroups so that the workgroup is a multiple of 128; on the H200 the seeds stay as written."""
    t = tpl(fmt, epilogue, norm)
    lvp = get_profile("lavapipe-dawn-coopmat")
    seeds = t.seed_configs(lvp)
    legal = [c for c in seeds if t.space().is_legal(c, lvp)]
    # swiglu refuses a few: 16 subgroups' gate and up result fragments outgrow 32 KiB of workgroup memory; and the
    # seeds with six fragments along M (tall tiles) or the 346-row gate/up pick's 2 x 8 hold too many accumulators
    # in 8-wide subgroups; the gate/up pick's packed nk twins (K step 32 too) outgrow its 32 KiB, and so do its 4 x 4
    # twins
    assert len(legal) >= len(seeds) - (26 if epilogue == "swiglu" else 7) and len(legal) >= 10, \
        [t.space().why_illegal(c, lvp) for c in seeds]
    assert all(c["FRAG"] == "8x8x8" and c["SG"] == 8 and c["SM"] * c["SN"] == 16 for c in seeds)
    assert any(c["KS"] > 1 for c in legal)
    h200 = t.seed_configs(H200)
    assert [dict(c) for c in h200] == [dict(t.space().config({**v, "SG": 32})) for v in (sg.BASE, *sg.SEEDS)]


@pytest.mark.parametrize(("wl", "pipe", "norm"), [("nk", 1, False), ("nk", 2, True), ("kn", 1, True),
                                                  ("kn", 2, False)])
def test_packed_stores_store_whole_vec4s_and_count_their_registers(wl, pipe, norm):
    """VS 1 declares the staged tiles as `vec4<u32>` arrays and stores nothing into them one half at a time; its
    fragment loads step in elements of 8 halves; PIPE 2 holds 4 words per 8 staged halves (32 per kn unit of 8
    columns x 8 k), VS 0 one f32 per half; the norm keeps one sum of squares per vec4 of x either way."""
    from tilewise.kernels.matmul.sgmat_stage import norm_registers, pipe_registers, pipe_slots, w_units

    t = tpl("nf4", "swiglu", norm)
    base = t.space().config({**sg.BASE, "WL": wl, "PIPE": pipe, "PAD": 8})  # 64x64x32, 128 invocations
    packed = base.replace(VS=1)
    src, src0 = t.source(packed, (346, 4608, 1024)), t.source(base, (346, 4608, 1024))
    assert "var<workgroup> Xs: array<vec4<u32>, " in src and "var<workgroup> Ws1: array<vec4<u32>, " in src
    assert "var<workgroup> Xs: array<f16, " in src0
    assert not re.search(r"\b(Xs|Ws0|Ws1)\[[^\]]*\] = (f16\(|h\.)", src)  # no half-at-a-time stores
    assert re.search(r"\b(Xs|Ws0)\[[^\]]*\] = (f16\(|h\.)", src0)
    assert "subgroupMatrixLoad<Left, row_major>(&Xs, " in src and ", 5u);" in src  # x rows 40 halves = 5 elements
    assert w_units(packed) == 64 * 32 // (64 if wl == "kn" else 8) and w_units(base) == 64 * 32 // 8
    xs, ws = pipe_slots(packed)
    assert (xs, ws) == (-(-64 * 32 // 8 // 128), -(-w_units(packed) // 128))
    assert pipe_registers(packed, 2) == 4 * xs + (32 if wl == "kn" else 4) * 2 * ws
    assert pipe_registers(base, 2) == 4 * pipe_slots(base)[0] + 8 * 2 * pipe_slots(base)[1]
    assert norm_registers(packed) == norm_registers(base) == 64 * 32 // 4 // 128
    assert str(packed).endswith(" vs") and not str(base).endswith(" vs")
    assert t.config_of({k: v for k, v in base.items() if k != "VS"}) == base  # tables written before VS read as VS 0


def test_pipe3_holds_two_steps_and_takes_two_steps_an_iteration():
    """PIPE 3 keeps PIPE 2's two buffers (the same workgroup storage) and doubles the registers: its rule says so
    with the numbers; its WGSL declares two register sets and steps K by two steps, ending on either half."""
    from tilewise.kernels.matmul.sgmat_stage import pipe_registers
    from tilewise.kernels.matmul.sgmat_wgsl import mm_storage_bytes

    t = tpl("nf4", "swiglu", True)
    two = t.space().config({**sg.BASE, "PIPE": 2, "VS": 1, "PAD": 8})
    three = two.replace(PIPE=3)
    assert mm_storage_bytes(three, "nf4", True, True) == mm_storage_bytes(two, "nf4", True, True)
    assert pipe_registers(three, 2) == 2 * pipe_registers(two, 2)
    src = t.source(three, (346, 4608, 1024))
    assert "var px0b = vec4<u32>();" in src and "var pw1_0b = vec4<u32>();" in src
    assert "k0 = k0 + 64u" in src and "let has1 = k0 + 32u < K;" in src and "two of them (PIPE=3" in src
    assert str(three).split()[-3:] == ["pipe3", "pad8", "vs"]
    plain = t.space().config({**sg.BASE, "PIPE": 2})  # 64x64x32: 4 x vec4s + 2 sets x 2 chunks = 48 words a step
    assert t.space().is_legal(plain, H200)
    why = t.space().why_illegal(plain.replace(PIPE=3), H200)
    assert "pipe_registers: PIPE=3 holds 2 x (4 x slots + 2*2 W units) = 96 words per invocation for the next two " \
           "steps > 64" in why, why
    assert t.space().is_legal(plain.replace(PIPE=3, VS=1), H200)  # packed: 2 x (2*4 + 2*2*4) = 48


def test_epilogue_batches_pass_ep_fragments_between_two_barriers():
    """EP result fragments per subgroup go through Cs at once: Cs grows EP times (in the storage rule too), the
    epilogue has FM * FN / EP barrier pairs instead of FM * FN, and EP must divide FN."""
    from tilewise.kernels.matmul.sgmat_wgsl import mm_storage_bytes

    t = tpl("nf4", "residual", False)
    one = t.space().config({**sg.BASE, "FN": 4})  # 2x2 subgroups of 2x4 16x16 fragments
    four = one.replace(EP=4)
    assert t.space().is_legal(four, H200)
    assert mm_storage_bytes(four, "nf4", False, False) - mm_storage_bytes(one, "nf4", False, False) == 3 * 4 * 4 * 256
    src1, src4 = (t.source(c, (346, 1024, 4608)) for c in (one, four))
    assert "var<workgroup> Cs: array<f32, 1024>;" in src1 and "var<workgroup> Cs: array<f32, 4096>;" in src4
    tail1, tail4 = (x[x.index("subgroupMatrixStore"):] for x in (src1, src4))
    assert tail1.count("workgroupBarrier()") == 2 * 2 * 4 and tail4.count("workgroupBarrier()") == 2 * 2
    assert tail4.count("subgroupMatrixStore") == 2 * 4 and "let jj = e / 1024u;" in src4
    why = t.space().why_illegal(t.space().config({**sg.BASE, "FN": 2, "EP": 4}), H200)
    assert "epilogue_batch: EP=4 does not divide FN=2: the epilogue takes whole batches of a subgroup's fragments " \
           "along N" in why
    assert str(four).endswith(" ep4")


@pytest.mark.parametrize("fmt", ["nf4", "f16"])
def test_gate_up_has_a_square_fragment_seed_within_the_accumulator_limit(fmt):
    """The 128x128 SwiGLU tile as 2x4 subgroups of 4x4 16x8 fragments: legal (two sets of 4x4 fragments are 128
    accumulator floats) and fewer fragment loads per multiply than 4x2 subgroups of 2x8."""
    t = tpl(fmt, "swiglu", True)
    square = [c for c in t.seed_configs(H200) if (c.FRAG, c.SM, c.SN, c.FM, c.FN) == ("16x8x16", 2, 4, 4, 4)]
    assert {(c.PIPE, c.VS) for c in square} == {(2, 0), (3, 1)}
    for c in square:
        assert t.space().is_legal(c, H200), t.space().why_illegal(c, H200)
        rows, cols = c.SM * c.FM * 16, c.SN * c.FN * 8
        assert (rows, cols) == (128, 128)
        loads, mults = c.FM + 2 * c.FN, 2 * c.FM * c.FN  # per subgroup and K step: A, B of both sets; multiplies
        assert loads / mults < (2 + 2 * 8) / (2 * 2 * 8)


@pytest.mark.parametrize(("epilogue", "norm", "want"), [
    ("swiglu", True, {"FRAG": "16x8x16", "SM": 4, "SN": 2, "FM": 2, "FN": 8, "BK": 32, "WL": "nk", "PIPE": 1,
                      "VS": 1, "PAD": 8, "KS": 1}),
    ("residual", False, {"FRAG": "16x16x16", "SM": 2, "SN": 2, "FM": 3, "FN": 2, "BK": 32, "WL": "nk", "KS": 4,
                         "PIPE": 1, "VS": 1, "PAD": 8}),
])
def test_the_climbs_winners_are_among_the_candidates_a_budget_8_tune_races(epilogue, norm, want):
    """A budget-B tune races the default and the first B - 1 seeds: the configs lfm2-350m's climbs ended on must be
    among them, legal on the H200, or a tune whose climb starts elsewhere may never reach them."""
    t = tpl("nf4", epilogue, norm)
    first = t.seed_configs(H200)[:8]
    hits = [c for c in first if all(c[k] == v for k, v in want.items())]
    assert hits, [str(c) for c in first]
    assert all(t.space().is_legal(c, H200) for c in hits), [t.space().why_illegal(c, H200) for c in hits]
