"""gemm-f16's space and rules without a device: legality comes from the device's limits and subgroup-matrix
configs (a fragment the adapter lacks is illegal with that reason; no subgroup matrices at all -> every config
illegal with the fix `use --device dawn`); the problem's reference multiplies the f16-rounded inputs."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import re

import numpy as np
import pytest

from tilewise.devices.profiles import get_profile
from tilewise.kernels.gemm.sgmat_wgsl import LEGACY, invocations, storage_bytes, tile
from tilewise.kernels.registry import backends, get_template

H200 = get_profile("h200-dawn")


def legacy_grid(tpl):
    """The grid of the parameters before PIPE, PAD and SPLITK, at their legacy values."""
    space = tpl.space("full")
    old = {k: v for k, v in space.params.items() if k not in LEGACY}
    return [space.config({**dict(zip(old, combo)), **LEGACY}) for combo in itertools.product(*old.values())]


@pytest.fixture(scope="module")
def tpl():
    return get_template("gemm-f16", "webgpu")


def test_gemm_f16_is_registered_on_webgpu(tpl):
    assert backends("gemm-f16") == ["webgpu"]
    assert tpl.name == "gemm-f16" and tpl.backend == "webgpu"


def test_without_subgroup_matrices_every_config_is_illegal_with_the_fix(tpl):
    space = tpl.space("full")
    for name in ("webgpu-default", "h200-vulkan", "lavapipe"):
        limits = get_profile(name)
        sample = space.sample(50, seed=3)
        assert sample and not space.legal(limits, sample)
        for cfg in sample:
            assert any(w.startswith("fragment_offered: this device has no subgroup matrices") and
                       w.endswith("so use --device dawn (wgpudawn on a GPU with subgroup matrices)")
                       for w in space.why_illegal(cfg, limits))


def test_a_fragment_the_adapter_does_not_offer_is_illegal_with_what_it_offers(tpl):
    cfg = tpl.default_config().replace(FRAG="8x8x8")
    why = tpl.space("full").why_illegal(cfg, H200)
    assert why[0] == ("fragment_offered: fragment 8x8x8 f16->f32 is not offered by this adapter (it offers: "
                      "16x16x16 f16->f32, 16x8x16 f16->f32, 16x8x8 f16->f32)")


def test_only_offered_fragments_and_the_devices_subgroup_size_are_legal(tpl):
    legal = tpl.space("full").legal(H200, legacy_grid(tpl))
    assert {c["FRAG"] for c in legal} == {"16x16x16", "16x8x16", "16x8x8"}
    assert {c["SG"] for c in legal} == {32}  # the H200's fragments say subgroups of 32
    # Dawn: the workgroup's x size must be a multiple of the adapter's max subgroup size (128 on the H200)
    assert all(invocations(c) % 128 == 0 for c in legal)
    narrow = dataclasses.replace(H200, subgroup_size_max=32)
    assert any(invocations(c) == 64 for c in tpl.space("full").legal(narrow, legacy_grid(tpl)))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_device_limit_rules_hold_for_every_legal_config_and_name_the_numbers(tpl, seed):
    small = dataclasses.replace(H200, max_workgroup_storage_bytes=12288, max_invocations_per_workgroup=128)
    space = tpl.space("full")
    for cfg in space.sample(300, seed=seed, limits=H200):
        why = space.why_illegal(cfg, small)
        assert (storage_bytes(cfg) > 12288) == any(w.startswith("workgroup_storage:") for w in why)
        assert (invocations(cfg) > 128) == any(w.startswith(f"invocations: SM*SN*SG = {cfg['SM']}*{cfg['SN']}*32 = "
                                                            f"{invocations(cfg)} > ") for w in why)


def test_tile_and_storage_follow_the_parameters(tpl):
    cfg = tpl.default_config()  # 2x2 subgroups of 4x4 16x16 fragments, 2 fragments per K step
    assert tile(cfg) == (128, 128, 32)
    assert storage_bytes(cfg) == 2 * (128 * 32 + 32 * 128) + 4 * 4 * 16 * 16
    assert invocations(cfg) == 128


def test_seed_space_is_legal_on_the_h200(tpl):
    seed = list(tpl.space("seed"))
    assert len(tpl.space("seed").legal(H200)) == len(seed) >= 10


def test_reference_multiplies_the_f16_rounded_inputs(tpl, rng):
    shape = (7, 5, 33)
    host = tpl.problem.make_inputs(shape, rng)
    assert host["a"].dtype == np.float16 and host["b"].dtype == np.float16
    assert np.all(host["a"] != 0) and np.all(host["b"] != 0)
    ref = tpl.problem.reference(host, shape)
    expect = host["a"].astype(np.float64) @ host["b"].astype(np.float64)
    assert ref.shape == (7, 5) and np.array_equal(ref, expect)


def test_generated_offsets_never_use_the_invocation_index_in_a_fragment_op(tpl):
    """Subgroup-matrix builtins need uniform offsets: they derive from workgroup and subgroup ids only."""
    for cfg in tpl.space("seed"):
        for line in tpl.source(cfg).splitlines():
            if "subgroupMatrix" in line:
                assert "tid" not in line and "lane" not in line, line


def test_verify_shape_keeps_edge_structure_and_is_cheaper(tpl):
    cfg = tpl.default_config()
    assert tpl.verify_shape(cfg, (4096, 4096, 4096)) == (517, 1032, 384)
    assert tpl.verify_shape(cfg, (4096, 4100, 4095)) == (517, 1030, 389)  # unaligned stays unaligned
    assert tpl.verify_shape(cfg, (17, 33, 65)) == (17, 33, 65)


# ---- PIPE, PAD, SPLITK -------------------------------------------------------------------------------------------

# sha256 over every legacy config legal on the H200 (old key, then its WGSL's digest), taken before the three
# parameters existed: stored results keep their source hashes
LEGACY_DIGEST = "2c26e0497d6a8364"
LEGACY_SEED_WGSL = {  # the 14 seed configs of the first H200 measurement
    "FRAG=16x16x16,SG=32,SM=2,SN=2,FM=4,FN=4,KF=2,SA=direct,SB=direct": "b253afe18ea4c46b",
    "FRAG=16x16x16,SG=32,SM=2,SN=2,FM=4,FN=4,KF=2,SA=workgroup,SB=workgroup": "18880041708148af",
    "FRAG=16x16x16,SG=32,SM=2,SN=2,FM=4,FN=4,KF=2,SA=workgroup,SB=direct": "37a4138a65a86650",
    "FRAG=16x16x16,SG=32,SM=2,SN=2,FM=4,FN=4,KF=2,SA=direct,SB=workgroup": "78a8cdc1f67ef639",
    "FRAG=16x16x16,SG=32,SM=2,SN=2,FM=4,FN=4,KF=1,SA=direct,SB=direct": "c5d45d277879a5fa",
    "FRAG=16x16x16,SG=32,SM=2,SN=2,FM=4,FN=4,KF=4,SA=direct,SB=direct": "23e21d58b4fbe69f",
    "FRAG=16x16x16,SG=32,SM=4,SN=2,FM=2,FN=4,KF=2,SA=direct,SB=direct": "025ae9a57480d7df",
    "FRAG=16x16x16,SG=32,SM=2,SN=4,FM=4,FN=2,KF=2,SA=direct,SB=direct": "41c77508d297db07",
    "FRAG=16x16x16,SG=32,SM=4,SN=4,FM=2,FN=2,KF=2,SA=direct,SB=direct": "afda84479e94092f",
    "FRAG=16x16x16,SG=32,SM=2,SN=2,FM=2,FN=2,KF=2,SA=direct,SB=direct": "21e8c58a266036fb",
    "FRAG=16x8x16,SG=32,SM=2,SN=2,FM=4,FN=8,KF=2,SA=direct,SB=direct": "be9053c91cbfa026",
    "FRAG=16x8x16,SG=32,SM=2,SN=2,FM=4,FN=8,KF=2,SA=workgroup,SB=workgroup": "03301b9e70b83670",
    "FRAG=16x8x8,SG=32,SM=2,SN=2,FM=4,FN=8,KF=4,SA=direct,SB=direct": "d17738c25d9b900a",
    "FRAG=16x16x16,SG=32,SM=1,SN=4,FM=8,FN=2,KF=2,SA=direct,SB=direct": "a5c822c39a5e6f5b",
}


def _old_key(c) -> str:
    return ",".join(f"{k}={v}" for k, v in c.items() if k not in LEGACY)


def _wgsl_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def test_legacy_configs_generate_the_wgsl_they_generated_before(tpl):
    legal = tpl.space("full").legal(H200, legacy_grid(tpl))
    h = hashlib.sha256()
    for c in sorted(legal, key=_old_key):
        h.update(_old_key(c).encode())
        h.update(hashlib.sha256(tpl.source(c).encode()).digest())
    assert len(legal) == 2936 and h.hexdigest()[:16] == LEGACY_DIGEST


def test_old_seed_configs_written_without_the_new_parameters_keep_their_wgsl(tpl):
    for key, digest in LEGACY_SEED_WGSL.items():
        old = dict(part.split("=") for part in key.split(","))
        cfg = tpl.config_of({k: (int(v) if v.isdigit() else v) for k, v in old.items()})
        assert (cfg["PIPE"], cfg["PAD"], cfg["SPLITK"]) == (1, 0, 1)
        assert _wgsl_digest(tpl.source(cfg)) == digest, key
        assert "pipe" not in str(cfg) and "splitk" not in str(cfg)
    seeds = {_old_key(c) for c in tpl.space("seed") if all(c[k] == v for k, v in LEGACY.items())}
    assert set(LEGACY_SEED_WGSL) <= seeds


def _cfg(tpl, **kw):
    return tpl.default_config().replace(**kw)


def test_pipe_and_pad_need_a_staged_operand(tpl):
    space = tpl.space("full")
    for kw in ({"PIPE": 2}, {"PAD": 8}, {"PIPE": 2, "PAD": 8}):
        why = space.why_illegal(_cfg(tpl, **kw), H200)
        assert [w for w in why if w.startswith("pipe_staged:")] == [
            f"pipe_staged: PIPE={kw.get('PIPE', 1)} PAD={kw.get('PAD', 0)} shape workgroup-staged tiles, but SA and "
            "SB are both direct (use PIPE=1 PAD=0, or stage an operand)"]
        assert space.is_legal(_cfg(tpl, SB="workgroup", **kw), H200)


def test_double_buffered_padded_storage_and_the_limit(tpl):
    cfg = _cfg(tpl, SA="workgroup", SB="workgroup", PIPE=2, PAD=8)  # 128x128x32
    assert storage_bytes(cfg) == 2 * (2 * 128 * 40 + 2 * 32 * 136) + 4 * 4 * 16 * 16
    assert tpl.space("full").is_legal(cfg, H200)
    big = cfg.replace(KF=4)  # 2 * (2*128*72 + 2*64*136) + 4096 = 75776 bytes
    why = tpl.space("full").why_illegal(big, H200)
    assert any(w.startswith("workgroup_storage: workgroup storage = 2*(As + Bs) + 4*SM*SN*m*n = 2*(18432 + 17408) "
                            "+ 4096 = 75776 bytes > max_workgroup_storage_bytes 49152") for w in why)
    # padding only where staged: A direct keeps the (BM, BK) edge tile, B gets two padded halves
    half = _cfg(tpl, SB="workgroup", PIPE=2, PAD=8)
    assert storage_bytes(half) == 2 * (128 * 32 + 2 * 32 * 136) + 4096


def test_prefetch_registers_rule_names_the_count(tpl):
    # over 128 invocations: a 512x64 A tile is 32 vec4<u32> each, the 64x32 B tile 2: 4 * 34 words
    cfg = tpl.space("full").config({**dict(tpl.default_config()), "SM": 4, "SN": 1, "FM": 8, "FN": 2, "KF": 4,
                                    "SA": "workgroup", "SB": "workgroup", "PIPE": 2})
    why = tpl.space("full").why_illegal(cfg)
    assert "prefetch_registers: PIPE=2 holds the next K step in 4*(ceil(BM*BK/8/WG) + ceil(BK*BN/8/WG)) = 136 " \
           "registers per invocation > 64 (BMxBNxBK = 512x32x64, WG = 128)" in why
    assert not any(w.startswith("prefetch_registers") for w in tpl.space("full").why_illegal(cfg.replace(PIPE=1)))
    # PIPE 3 holds two steps: the 128x128x32 tile of 256 invocations takes 4*(2 + 2) words a step, 32 for two
    both = tpl.space("full").config({**dict(tpl.default_config()), "SM": 4, "FM": 2, "SA": "workgroup",
                                     "SB": "workgroup", "PIPE": 3})
    assert not any(w.startswith("prefetch_registers") for w in tpl.space("full").why_illegal(both))
    src = tpl.source(both)
    assert "if (more2) { na2 = load_A8(tid, bm0, k0 + 64u); }" in src and "na = na2; nb = nb2;" in src
    assert "load_A8" not in tpl.source(both.replace(PIPE=1))
    why = tpl.space("full").why_illegal(cfg.replace(PIPE=3))
    assert "prefetch_registers: PIPE=3 holds the next two K steps in 2*4*(ceil(BM*BK/8/WG) + ceil(BK*BN/8/WG)) = " \
           "272 registers per invocation > 64 (BMxBNxBK = 512x32x64, WG = 128)" in why


def _main_loop(src: str) -> str:
    """The interior tiles' K loop (from `if (fast)` to the store of the results)."""
    return src.split("  if (fast) {", 1)[1].split("    if (owner) {\n      subgroupMatrixStore", 1)[0]


def test_pipelined_interior_loop_has_one_barrier_per_step_and_wide_loads(tpl):
    single = _cfg(tpl, SA="workgroup", SB="workgroup")
    double = single.replace(PIPE=2, PAD=8)
    loop = _main_loop(tpl.source(single)).split("for (var k0", 1)[1]
    assert loop.count("workgroupBarrier()") == 2
    src = tpl.source(double)
    loop = _main_loop(src).split("for (var k0", 1)[1]
    assert loop.count("workgroupBarrier()") == 1
    assert "var<storage, read> A8: array<vec4<u32>>" in src and "var<storage, read> B8: array<vec4<u32>>" in src
    assert "A4" not in src and "B4" not in src
    # the multiplies read the half `ph` with the padded strides, the stores fill the other half
    assert "subgroupMatrixLoad<Left, row_major>(&As, ph * 5120u + (r0 + 0u) * 40u + 0u, 40u)" in loop
    assert "subgroupMatrixLoad<Right, row_major>(&Bs, ph * 4352u + 2176u + c0 + 0u, 136u)" in loop
    assert "store_As(tid, (1u - ph) * 5120u, na);" in loop
    assert loop.index("load_A8(tid, bm0, k0 + 32u)") < loop.index("subgroupMatrixMultiplyAccumulate") < \
        loop.index("store_As(tid, (1u - ph)")


def _wgsl_int(expr: str, env: dict[str, int]) -> int:
    """Evaluate a WGSL u32 expression of this generator (integers, + - * / %, min) in Python."""
    py = re.sub(r"\b(\d+)u\b", r"\1", expr).replace("/", "//")
    return int(eval(py, {"min": min, "__builtins__": {}}, dict(env)))


def _copy_lines(src: str, fn: str) -> list[tuple[str | None, str, str, str]]:
    """(guard bound or None, row expr, col expr, q expr) of each register of `fn` (`load_A8` ...)."""
    body = src.split(f"fn {fn}(", 1)[1].split("\n}", 1)[0]
    out = []
    for m in re.finditer(r"(?:if \(tid \+ (\d+)u < (\d+)u\) )?\{ let i = tid \+ (\d+)u; let r = i / (\d+)u; "
                         r"let c = \(i % (\d+)u\) \* 8u;", body):
        out.append((m.group(2), m.group(3), m.group(4), m.group(5)))
    return out


@pytest.mark.parametrize("kw", [
    {"SA": "workgroup", "SB": "workgroup", "PIPE": 2, "PAD": 8},
    {"FRAG": "16x8x8", "SM": 4, "SN": 4, "FM": 1, "FN": 1, "KF": 2, "SA": "workgroup", "SB": "workgroup", "PIPE": 2},
    {"SM": 2, "SN": 2, "FM": 1, "FN": 4, "SA": "workgroup", "SB": "workgroup", "PIPE": 2, "PAD": 8},
    {"SB": "workgroup", "PIPE": 2, "KF": 1},
])
def test_register_copies_cover_each_tile_element_once(tpl, kw):
    """The generated load/store index math, evaluated for every invocation: each 8-half group of the tile is
    loaded and stored by exactly one (invocation, register)."""
    cfg = _cfg(tpl, **kw)
    src = tpl.source(cfg)
    bm, bn, bk = tile(cfg)
    wg = invocations(cfg)
    for fn, rows, cols, staged in (("load_A8", bm, bk, cfg["SA"]), ("load_B8", bk, bn, cfg["SB"])):
        if staged != "workgroup":
            assert f"fn {fn}(" not in src
            continue
        regs = _copy_lines(src, fn)
        assert regs
        seen: list[tuple[int, int]] = []
        for tid in range(wg):
            for u, (bound, start, q, q2) in enumerate(regs):
                assert int(start) == u * wg and q == q2
                i = tid + u * wg
                if bound is not None and i >= int(bound):
                    continue
                seen.append((_wgsl_int(f"{i} / {q}u", {}), _wgsl_int(f"({i} % {q}u) * 8u", {})))
        assert sorted(seen) == [(r, c) for r in range(rows) for c in range(0, cols, 8)], fn


@pytest.mark.parametrize("splitk", [2, 4, 8])
def test_split_k_slices_cover_k_once_in_whole_steps(tpl, splitk, rng):
    cfg = _cfg(tpl, SPLITK=splitk, KF=int(rng.choice([1, 2, 4])))
    src = tpl.source(cfg)
    kch = re.search(r"let kch = (.*);  //", src).group(1)
    kb, ke = re.search(r"let kb = (.*); let ke = (.*);  //", src).groups()
    bk = tile(cfg)[2]
    for K in [1, 7, bk - 1, bk, bk + 1, *rng.integers(1, 5000, 40)]:
        covered = []
        for z in range(splitk):
            env = {"K": int(K), "wg.z": z}
            env["kch"] = _wgsl_int(kch, {"K": int(K)})
            lo = _wgsl_int(kb.replace("wg.z", "z"), {"z": z, "kch": env["kch"]})
            hi = _wgsl_int(ke.replace("kb", str(lo)), {"K": int(K), "kch": env["kch"]})
            assert lo % bk == 0
            covered += list(range(lo, hi))
        assert covered == list(range(int(K))), (K, splitk)


def test_split_k_writes_only_slices_and_reduces_them_in_order(tpl):
    from tilewise.devices.base import Launch, Program

    cfg = _cfg(tpl, FM=2, FN=2, SPLITK=4, SA="workgroup")
    src = tpl.source(cfg)
    main, reduce = src.split("\n// ---- second module: the split-K reduction ----\n")
    stores = [ln for ln in main.splitlines() if "subgroupMatrixStore<row_major>(&C," in ln or "C[" in ln]
    assert stores and all("cz + " in ln for ln in stores)
    assert "C[i] = P[i] + P[1u * mn + i] + P[2u * mn + i] + P[3u * mn + i];" in reduce
    assert tpl.sources(cfg) == [main, reduce] and tpl.sources(cfg.replace(SPLITK=1)) == [tpl.source(cfg.replace(
        SPLITK=1))]
    prog = Program("main", None, "x", meta={"reduce": Program("reduce", None, "y")})
    bufs = {k: object() for k in ("a", "b", "out", "partial", "dims")}
    shape = (346, 1000, 4608)
    first, second = tpl.launches(prog, bufs, cfg, shape)
    assert isinstance(first, Launch) and first.grid == (-(-1000 // 64), -(-346 // 64), 4)
    assert list(first.buffers) == [bufs["a"], bufs["b"], bufs["partial"], bufs["dims"], bufs["a"]]
    assert second.program is prog.meta["reduce"] and second.grid == (-(-346 * 1000 // 256), 1, 1)
    assert list(second.buffers) == [bufs["dims"], bufs["partial"], bufs["out"]]
    (only,) = tpl.launches(prog, bufs, cfg.replace(SPLITK=1), shape)
    assert only.grid[2] == 1 and only.buffers[2] is bufs["out"]
    assert tpl.scratch_buffers == ("partial",)


def test_split_k_is_refused_where_the_partial_buffer_is_too_large(tpl):
    cfg = _cfg(tpl, SPLITK=2)
    assert tpl.why_illegal(cfg, H200, (346, 4608, 1024)) == []
    assert tpl.why_illegal(cfg, H200, (4096, 1024, 4096)) == []  # 8*4096*1024*4 = 128 MiB exactly
    why = tpl.why_illegal(cfg, H200, (4096, 4096, 4096))
    assert why == ["splitk_partial: the partial buffer 8*M*N*4 = 536870912 bytes at M=4096, N=4096 > 134217728 "
                   "(split K only for small M*N; use SPLITK=1)"]
    assert tpl.why_illegal(cfg.replace(SPLITK=1), H200, (4096, 4096, 4096)) == []


def test_new_seed_points_use_each_idea(tpl):
    seeds = list(tpl.space("seed"))
    assert len(seeds) == len(set(seeds))
    assert sum(c["PIPE"] == 2 for c in seeds) >= 3 and sum(c["PAD"] == 8 for c in seeds) >= 3
    assert {c["SPLITK"] for c in seeds} >= {2, 4, 8}
    assert any(tile(c)[0] <= 32 for c in seeds) and any(tile(c)[0] == 64 and c["SPLITK"] > 1 for c in seeds)
