"""The model's CUDA kernels on a real NVIDIA GPU against their problems' float64 references, at edge shapes, every
output checked (skips cleanly without CuPy or a GPU)."""

from __future__ import annotations

import numpy as np
import pytest

from tilewise.kernels.attention.cuda import CudaAttention, CudaQKNormRope
from tilewise.kernels.matmul import cuda as mm
from tilewise.kernels.rowops.cuda import (
    CudaEmbed,
    CudaHead,
    CudaRMSNorm,
    copy_launch,
    copy_pairs_launches,
    copy_pairs_program,
    copy_program,
)
from tilewise.kernels.shortconv.cuda import CudaShortConv
from tilewise.tune.verify import compare

pytestmark = pytest.mark.cuda


def run(dev, tpl, cfg, shape, rng):
    assert tpl.why_illegal(cfg, dev.info.limits, shape) == [], (tpl.name, cfg, shape)
    host = tpl.make_inputs(shape, rng)
    bufs = tpl.upload(dev, host, shape)
    tpl.poison(dev, bufs, shape)
    dev.run(tpl.launches(tpl.compile(dev, cfg, shape), bufs, cfg, shape))
    dev.synchronize()
    return tpl.read_output(dev, bufs, shape), tpl.reference(host, shape)


def check(out, ref, dtype):
    assert out.shape == ref.shape
    chk = compare(out, ref, dtype)
    assert chk.ok, chk.message


#: rows 1 (a decision's last block), 31/33 around the mma default cutoff, 97 (partial 64-row tiles), 346 (the
#: benchmark's prompt); N = 64 * k + 32 and 3 * 1024 (partial and whole column tiles); K 64 (one NF4 block), 1024
MM_SHAPES = [(1, 96, 64), (3, 160, 128), (31, 64, 192), (33, 96, 64), (97, 224, 256), (346, 1056, 1024)]


@pytest.mark.parametrize("shape", MM_SHAPES)
@pytest.mark.parametrize("tpl", mm.all_variants(), ids=lambda t: t.name)
def test_matmul_default_config_matches_float64(dev, rng, tpl, shape):
    out, ref = run(dev, tpl, tpl.default_config(), shape, rng)
    check(out, ref, tpl.dtype)


@pytest.mark.parametrize("epilogue", mm.EPILOGUES)
def test_every_legal_config_of_the_nf4_spaces_is_correct(dev, rng, epilogue):
    for kind in ("mma", "rows"):  # split-K: its own test below (its K slices need a longer K)
        tpl = mm.CudaMatmul(kind, "nf4", epilogue, True)
        legal, _ = tpl.space("seed" if kind == "mma" else "full").split(dev.info.limits)
        for cfg in legal:
            out, ref = run(dev, tpl, cfg, (45, 160, 192), rng)
            check(out, ref, tpl.dtype)


@pytest.mark.parametrize("fmt", ["nf4", "f16", "f32"])
@pytest.mark.parametrize("epilogue", mm.EPILOGUES)
def test_short_rows_with_a_columns_k_split_over_warps_match_float64(dev, rng, fmt, epilogue):
    """WK warps a column, each adding its share of K, merged in warp order: one row (a decision's last block) at
    K = 4608 (every warp of 8 has words) and 3 rows at K = 1088 (a partial last run of words), 160 columns (a partial
    block of columns): every seed of the short-row space with nf4 weights, one-row WK 1 and 8 with the others."""
    tpl = mm.CudaMatmul("rows", fmt, epilogue, True)
    cfgs = tpl.space("seed").split(dev.info.limits)[0]
    assert {c["WK"] for c in cfgs} == {1, 2, 4, 8}
    if fmt != "nf4":  # each config is a compile of the whole family: the other formats take one row, WK 1 and 8
        cfgs = [c for c in cfgs if c["RM"] == 1 and c["WK"] in (1, 8)]
    for shape in [(1, 160, 4608), (3, 160, 1088)]:
        for cfg in cfgs:
            check(*run(dev, tpl, cfg, shape, rng), tpl.dtype)


@pytest.mark.parametrize("fmt", ["nf4", "f16"])
@pytest.mark.parametrize("epilogue", mm.EPILOGUES)
def test_short_rows_with_several_columns_a_warp_give_the_bits_of_one_column_a_warp(dev, rng, fmt, epilogue):
    """CW columns a warp load together and add each column in the order CW 1 does: on the same random inputs every
    output matches float64 and has the bits of CW 1 with the same NT, RM and WK. 1 and 3 rows; K = 1088 (a partial
    last run of words); N = 161 (the last group of columns partly past N: a store there would land in the next row
    and fail float64)."""
    tpl = mm.CudaMatmul("rows", fmt, epilogue, True)
    for shape in [(1, 161, 1088), (3, 161, 1088)]:
        host = tpl.make_inputs(shape, rng)
        ref = tpl.reference(host, shape)
        for nt, rm, wk in [(128, 1, 1), (128, 4, 1), (256, 1, 2), (64, 2, 2)]:
            outs = {}
            for cw in (1, 2, 4):
                cfg = tpl.config_of({"NT": nt, "RM": rm, "WK": wk, "CW": cw})
                assert tpl.why_illegal(cfg, dev.info.limits, shape) == [], cfg
                bufs = tpl.upload(dev, host, shape)
                tpl.poison(dev, bufs, shape)
                dev.run(tpl.launches(tpl.compile(dev, cfg, shape), bufs, cfg, shape))
                dev.synchronize()
                outs[cw] = tpl.read_output(dev, bufs, shape)
                check(outs[cw], ref, tpl.dtype)
            assert np.array_equal(outs[2], outs[1]) and np.array_equal(outs[4], outs[1]), (shape, nt, rm, wk)


@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("epilogue", mm.EPILOGUES)
def test_every_legal_splitk_seed_config_of_the_nf4_variants_is_correct(dev, rng, epilogue, norm):
    """K = 512: every seed's KS slices are whole BK steps; 45 rows and 160 columns leave partial tiles."""
    tpl = mm.CudaMatmul("splitk", "nf4", epilogue, norm)
    legal, _ = tpl.space("seed").split(dev.info.limits)
    assert {c["KS"] for c in legal} == {2, 4, 8}
    for cfg in legal:
        out, ref = run(dev, tpl, cfg, (45, 160, 512), rng)
        check(out, ref, tpl.dtype)


@pytest.mark.parametrize("kind", ["pipe", "ring", "wg", "wgt", "ws", "wgr"])
@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("epilogue", mm.EPILOGUES)
def test_every_legal_cp_async_seed_config_of_the_nf4_variants_is_correct(dev, rng, epilogue, norm, kind):
    """The cp.async kinds, K = 512 (8-16 steps: more than any ST in flight, every KS whole), 45 rows and 160 columns
    leaving partial tiles that cp.async zero-fills."""
    tpl = mm.CudaMatmul(kind, "nf4", epilogue, norm)
    legal, _ = tpl.space("seed").split(dev.info.limits)
    assert {c["KS"] for c in legal} >= {1, 2, 4} and {c["ST"] for c in legal} >= {3, 4, 6}
    for cfg in legal:
        out, ref = run(dev, tpl, cfg, (45, 160, 512), rng)
        check(out, ref, tpl.dtype)


@pytest.mark.parametrize("kind", ["pipe", "ring", "wg", "wgt", "ws", "wgr"])
@pytest.mark.parametrize("fmt", ["f16", "f32"])
def test_every_cp_async_seed_config_of_the_other_weight_formats_is_correct(dev, rng, fmt, kind):
    tpl = mm.CudaMatmul(kind, fmt, "swiglu", True)
    legal, _ = tpl.space("seed").split(dev.info.limits)
    assert legal
    for cfg in legal:
        out, ref = run(dev, tpl, cfg, (70, 96, 256), rng)
        check(out, ref, tpl.dtype)


@pytest.mark.parametrize("kind", ["mma", "pipe", "splitk", "ring", "wg", "wgt", "ws", "wgr"])
def test_the_fused_norm_scales_each_row_by_its_own_rms(dev, rng, kind):
    """Rows of x a thousand times apart in scale: a 1/rms applied to the wrong row (the late norm's accumulator rows,
    the prologue's rows) shows as an error far above the f16 tolerance."""
    tpl = mm.CudaMatmul(kind, "nf4", "swiglu", True)
    cfg, shape = tpl.default_config(), (97, 224, 256)
    host = tpl.make_inputs(shape, rng)
    scale = 10.0 ** rng.uniform(-1.5, 1.5, (shape[0], 1))  # (M, 1)
    host = {**host, "x": (host["x"] * scale).astype(np.float32)}
    bufs = tpl.upload(dev, host, shape)
    tpl.poison(dev, bufs, shape)
    dev.run(tpl.launches(tpl.compile(dev, cfg, shape), bufs, cfg, shape))
    check(tpl.read_output(dev, bufs, shape), tpl.reference(host, shape), tpl.dtype)


@pytest.mark.parametrize("kind", ["pipe", "ring", "wg", "wgt", "ws", "wgr"])
def test_cp_async_with_fewer_steps_than_stages_is_correct(dev, rng, kind):
    """K = 64 is two 32-wide steps (one 64-wide step for wg) under six stages: the prologue's surplus copies are
    empty groups."""
    tpl = mm.CudaMatmul(kind, "nf4", "residual", False)
    cfg = tpl.config_of({**{"pipe": mm.DEFAULT_PIPE, "ring": mm.DEFAULT_RING, "wg": mm.DEFAULT_WG,
                                 "wgt": mm.DEFAULT_WG, "ws": mm.DEFAULT_WS, "wgr": mm.DEFAULT_WGR}[kind],
                             "ST": 6})
    out, ref = run(dev, tpl, cfg, (97, 224, 64), rng)
    check(out, ref, tpl.dtype)


@pytest.mark.parametrize("kind", ["wg", "wgt", "ws", "wgr"])
@pytest.mark.parametrize("epilogue", mm.EPILOGUES)
def test_every_wg_seed_at_the_decision_shape_is_correct(dev, rng, epilogue, kind):
    """The wgmma kinds at 346 rows (partial row tiles for every BM, 384 covering all of them), N = 1056 (a partial
    column tile for every BN) and K = 1024 (16 steps: the ring wraps several times); every output against float64."""
    tpl = mm.CudaMatmul(kind, "nf4", epilogue, True)
    legal, _ = tpl.space("seed").split(dev.info.limits)
    assert len(legal) >= 8
    for cfg in legal:
        out, ref = run(dev, tpl, cfg, (346, 1056, 1024), rng)
        check(out, ref, tpl.dtype)


@pytest.mark.parametrize("epilogue", mm.EPILOGUES)
@pytest.mark.parametrize("ks", [1, 2])
def test_wgr_epilogue_writes_columns_that_are_not_whole_16_byte_chunks(dev, rng, epilogue, ks):
    """wgr's staged epilogue writes 16-byte chunks of a row where N is a multiple of 4 and single values otherwise:
    N = 150 (odd pairs, a partial feature tile) and 45 rows, directly (KS 1) and through the partial sums (KS 2);
    every output (poisoned before the launch) against float64."""
    if dev.info.limits.compute_capability != "9.0":
        pytest.skip("wgmma needs a Hopper GPU")
    tpl = mm.CudaMatmul("wgr", "nf4", epilogue, epilogue != "residual")
    cfg, shape = tpl.config_of({**mm.DEFAULT_WGR, "KS": ks}), (45, 150, 256)
    assert tpl.why_illegal(cfg, dev.info.limits, shape) == []
    out, ref = run(dev, tpl, cfg, shape, rng)
    check(out, ref, tpl.dtype)


@pytest.mark.parametrize("dec", [0, 1, 2, 3])
def test_both_wgr_decodes_hold_every_output_column_within_the_f16_tolerance(dev, rng, dec):
    """DEC 1-3 round the code, the absmax and their product to f16 (DEC 0 rounds once, from f32): rows of W whose
    scale spans 1e-3..1e2 keep each output column, not only the whole output, within the f16 tolerance of float64."""
    from tilewise.quant.nf4 import weight_arrays

    tpl = mm.CudaMatmul("wgr", "nf4", "none", False)
    cfg, shape = tpl.config_of({**mm.DEFAULT_WGR, "DEC": dec}), (97, 224, 512)
    assert tpl.why_illegal(cfg, dev.info.limits, shape) == []
    host = tpl.make_inputs(shape, rng)
    w = rng.standard_normal(shape[1:]) * 10.0 ** rng.uniform(-3, 2, (shape[1], 1))  # (N, K)
    host = {**host, **weight_arrays(w.astype(np.float32), "nf4")}
    bufs = tpl.upload(dev, host, shape)
    tpl.poison(dev, bufs, shape)
    dev.run(tpl.launches(tpl.compile(dev, cfg, shape), bufs, cfg, shape))
    dev.synchronize()
    out, ref = tpl.read_output(dev, bufs, shape), tpl.reference(host, shape)  # (M, N)
    bad = [j for j in range(shape[1]) if not compare(out[:, j], ref[:, j], tpl.dtype).ok]
    assert not bad, (bad[:8], compare(out[:, bad[0]], ref[:, bad[0]], tpl.dtype).message)


@pytest.mark.parametrize(("epilogue", "cfg"), [
    ("swiglu", {"BF": 128, "BT": 120, "ST": 4, "KS": 1, "MB": 1, "SR": 0}),
    ("residual", {"BF": 64, "BT": 88, "ST": 6, "KS": 4, "MB": 2, "SR": 0}),
    ("none", {"BF": 64, "BT": 176, "ST": 4, "KS": 1, "MB": 1, "SR": 0}),
    ("residual", {"BF": 64, "BT": 40, "ST": 3, "KS": 2, "MB": 1, "SR": 2})])
def test_the_pair_table_decodes_give_the_register_tables_bits(dev, rng, epilogue, cfg):
    """DEC 2 and 3 (one load of a stored byte's two f16 codes from a shared-memory table, 8 or 32 copies) scale and
    round as DEC 1 does: the same bits as DEC 1 in every output, on the lfm2-350m winners' tiles and a cluster config,
    at 346 and 45 rows and a width that leaves a partial feature tile, with weights that use all 256 byte values."""
    if dev.info.limits.compute_capability != "9.0":
        pytest.skip("wgmma needs a Hopper GPU")
    tpl = mm.CudaMatmul("wgr", "nf4", epilogue, epilogue != "residual")
    for shape in [(346, 1056, 1024), (45, 150, 512)]:
        host = tpl.make_inputs(shape, rng)
        assert len(np.unique(host["w"].view(np.uint8))) == 256
        outs = {}
        for dec in (1, 2, 3):
            c = tpl.config_of({**cfg, "DEC": dec})
            bufs = tpl.upload(dev, host, shape)
            tpl.poison(dev, bufs, shape)
            dev.run(tpl.launches(tpl.compile(dev, c, shape), bufs, c, shape))
            dev.synchronize()
            outs[dec] = tpl.read_output(dev, bufs, shape)
        check(outs[1], tpl.reference(host, shape), tpl.dtype)
        for dec in (2, 3):
            assert np.array_equal(outs[dec].view(np.uint32), outs[1].view(np.uint32)), (dec, shape)


#: per kind with SR: a split config (KS 4) and its launches without the reduction (wgr: the prologue and the matmul)
SR_CASES = {"wgr": ({**mm.DEFAULT_WGR, "BT": 32, "KS": 4}, 2),
            "splitk": ({**mm.DEFAULT_SPLITK, "BM": 32, "BN": 64, "BK": 64, "WM": 16, "WN": 32, "KS": 4}, 1)}


@pytest.mark.parametrize("kind", list(SR_CASES))
@pytest.mark.parametrize(("epilogue", "norm"), [("none", True), ("residual", False), ("swiglu", True)])
@pytest.mark.parametrize("shape", [(97, 224, 1024), (346, 1056, 1024), (7, 96, 512), (33, 94, 512)])
def test_slices_summed_by_the_last_block_equal_the_reduction_launch(dev, rng, kind, epilogue, norm, shape):
    """SR 1 (the last of a tile's blocks sums the KS slices, counted in `counters`) and SR 2 (Hopper: the tile's
    blocks one cluster, summing from each other's shared memory) add them in the reduction's order: the same bits as
    SR 0's separate launch, launch after launch (the counters go back to 0), every tile, widths not a multiple of 4
    included."""
    if kind == "wgr" and dev.info.limits.compute_capability != "9.0":
        pytest.skip("wgmma needs a Hopper GPU")
    tpl = mm.CudaMatmul(kind, "nf4", epilogue, norm)
    host = tpl.make_inputs(shape, rng)
    bufs = tpl.upload(dev, host, shape)
    base, serial_launches = SR_CASES[kind]
    runs = [(0, base), (1, base)]
    if dev.info.limits.compute_capability == "9.0":  # SR 2: clusters, Hopper
        cluster = tpl.config_of({**base, "SR": 2})
        if any(p.startswith("cluster_tile_48k") for p in tpl.why_illegal(cluster, dev.info.limits, shape)):
            # SwiGLU's two weight sets leave the pipelined tile no room for the cluster's static tile; PIPE 1 stages
            # the same steps unprefetched, adding in the same order (so SR 0 with PIPE 1 joins the comparison too)
            runs += [(0, {**base, "PIPE": 1}), (2, {**base, "PIPE": 1})]
        else:
            runs.append((2, base))
    got = {}
    for sr, over in runs:
        cfg = tpl.config_of({**over, "SR": sr})
        assert tpl.why_illegal(cfg, dev.info.limits, shape) == []
        launches = tpl.launches(tpl.compile(dev, cfg, shape), bufs, cfg, shape)
        assert len(launches) == serial_launches + (0 if sr else 1)
        for _ in range(3):
            tpl.poison(dev, bufs, shape)
            dev.run(launches)
            got.setdefault((sr, over.get("PIPE")), []).append(tpl.read_output(dev, bufs, shape))
    assert any(sr == 2 for sr, _ in got) or dev.info.limits.compute_capability != "9.0"
    first = got[(0, base.get("PIPE"))][0]
    check(first, tpl.reference(host, shape), tpl.dtype)
    for out in (out for outs in got.values() for out in outs):
        np.testing.assert_array_equal(out, first)
    assert not dev.download(bufs["counters"], np.uint32).any()


@pytest.mark.parametrize("over", [{"BF": 128, "BT": 120, "KS": 4}, {"BF": 64, "BT": 104, "KS": 2},
                                  {"BF": 64, "BT": 16, "KS": 4}], ids=["15-groups-4", "13-groups-2", "2-groups-4"])
@pytest.mark.parametrize(("epilogue", "norm"), [("none", True), ("residual", False), ("swiglu", True)])
@pytest.mark.parametrize("shape", [(346, 1024, 1024), (45, 200, 512)])
def test_cluster_sums_of_uneven_token_groups_equal_the_reduction_launch(dev, rng, over, epilogue, norm, shape):
    """wgr SR 2: a block owns every KS-th group of 8 tokens and its peers send it their sums of those; where the
    groups do not divide among the KS blocks (some own more, some none), every output still has the bits of SR 0's
    reduction launch, launch after launch."""
    if dev.info.limits.compute_capability != "9.0":
        pytest.skip("wgmma needs a Hopper GPU")
    tpl = mm.CudaMatmul("wgr", "nf4", epilogue, norm)
    host = tpl.make_inputs(shape, rng)
    bufs = tpl.upload(dev, host, shape)
    got = {}
    for sr in (0, 2):
        cfg = tpl.config_of({**mm.DEFAULT_WGR, **over, "SR": sr})
        assert tpl.why_illegal(cfg, dev.info.limits, shape) == []
        launches = tpl.launches(tpl.compile(dev, cfg, shape), bufs, cfg, shape)
        for _ in range(2):
            tpl.poison(dev, bufs, shape)
            dev.run(launches)
            got.setdefault(sr, []).append(tpl.read_output(dev, bufs, shape))
    check(got[0][0], tpl.reference(host, shape), tpl.dtype)
    for out in got[0][1:] + got[2]:
        np.testing.assert_array_equal(out, got[0][0])


SPLITK_CLUSTER = {**mm.DEFAULT_SPLITK, "BM": 32, "BN": 64, "BK": 64, "WM": 16, "WN": 32, "KS": 4, "SR": 2}


@pytest.mark.parametrize("consumer", [{"BT": 32}, {"BT": 32, "KS": 2, "SR": 2}], ids=["into-ks1", "into-cluster"])
@pytest.mark.parametrize("producer", [("wgr", {"BT": 32}), ("wgr", {"BT": 32, "KS": 4, "SR": 2}),
                                      ("splitk", SPLITK_CLUSTER)], ids=["ks1", "cluster", "splitk-cluster"])
@pytest.mark.parametrize("epilogue", ["none", "swiglu"])
@pytest.mark.parametrize("shape", [(97, 256, 512), (346, 1024, 1024), (7, 128, 256)])
def test_the_norm_fold_hands_the_next_matmul_its_rows_and_their_scale(dev, rng, producer, epilogue, shape, consumer):
    """A residual launch with the norm fold (fold_g, ss_out; wgr with KS 1 or a cluster's sum, splitk with a
    cluster's sum) writes the same f32 rows h as without it, f16 (h * g) rows with the bits of numpy's rounding, and
    each row's sums of squares per 64 columns; a wgr launch reading those rows with ss_in (KS 1, or a cluster that
    scales its summed slices) matches the float64 normed matmul of h in every output (rows 1000x apart in scale, so
    a scale applied to the wrong row shows)."""
    from tilewise.devices.base import Launch

    if dev.info.limits.compute_capability != "9.0":
        pytest.skip("wgmma and clusters need a Hopper GPU")
    m, n, _ = shape
    kind, over = producer
    prod = mm.CudaMatmul(kind, "nf4", "residual")
    cfg = prod.config_of({**(mm.DEFAULT_WGR if kind == "wgr" else {}), **over})
    assert prod.why_illegal(cfg, dev.info.limits, shape) == []
    host = prod.make_inputs(shape, rng)
    host["residual"] = (host["residual"] * 10.0 ** rng.uniform(-1.5, 1.5, (m, 1))).astype(np.float32)  # (M, N)
    bufs = prod.upload(dev, host, shape)
    program = prod.compile(dev, cfg, shape)
    *before, main = prod.launches(program, bufs, cfg, shape)  # wgr: its f16 prologue, then the matmul
    prod.poison(dev, bufs, shape)
    dev.run([*before, main])
    want = prod.read_output(dev, bufs, shape)
    g = rng.uniform(0.5, 1.5, n).astype(np.float32)  # (N,) the next norm's weight
    g_buf, xh, ss = dev.upload(g), dev.allocate(2 * m * n), dev.allocate(4 * m * (n // 64))
    at, args = program.meta["fold_from"], list(main.buffers)
    args[at["out_h"]], args[at["fold_g"]], args[at["ss_out"]] = xh, g_buf, ss
    prod.poison(dev, bufs, shape)
    dev.run([*before, Launch(main.program, main.grid, args)])
    h = prod.read_output(dev, bufs, shape)  # (M, N)
    np.testing.assert_array_equal(h, want)
    rows = dev.download(xh, np.float16, (m, n))
    np.testing.assert_array_equal(rows, (h * g).astype(np.float16))
    sums = (h.astype(np.float64) ** 2).reshape(m, n // 64, 64).sum(-1)  # (M, N / 64)
    np.testing.assert_allclose(dev.download(ss, np.float32, (m, n // 64)), sums, rtol=1e-5)

    cons = mm.CudaMatmul("wgr", "nf4", epilogue, True)
    cshape = (m, 192, n)
    chost = {**cons.make_inputs(cshape, rng), "x": h, "norm_w": g}
    cbufs = cons.upload(dev, chost, cshape)
    ccfg = cons.config_of({**mm.DEFAULT_WGR, **consumer})
    assert cons.why_illegal(ccfg, dev.info.limits, cshape) == []
    _, cmain = cons.launches(cons.compile(dev, ccfg, cshape), cbufs, ccfg, cshape)
    cargs = list(cmain.buffers)
    cargs[13], cargs[14] = ss, np.float32(cons.eps)
    cons.poison(dev, cbufs, cshape)  # xh is a scratch buffer it poisons: the rows go in after
    dev.write(cbufs["xh"], rows)
    dev.run([Launch(cmain.program, cmain.grid, cargs)])
    check(cons.read_output(dev, cbufs, cshape), cons.reference(chost, cshape), cons.dtype)


def test_splitk_replays_are_bit_identical(dev, rng):
    """The reduction adds the slices in a fixed order: two runs of one input give the same bits."""
    tpl = mm.CudaMatmul("splitk", "nf4", "none", True)
    cfg, shape = tpl.config_of({**mm.DEFAULT_SPLITK, "KS": 8}), (97, 224, 1024)
    host = tpl.make_inputs(shape, rng)
    bufs = tpl.upload(dev, host, shape)
    prog = tpl.compile(dev, cfg, shape)
    outs = []
    for _ in range(2):
        tpl.poison(dev, bufs, shape)
        dev.run(tpl.launches(prog, bufs, cfg, shape))
        outs.append(tpl.read_output(dev, bufs, shape))
    np.testing.assert_array_equal(outs[0], outs[1])
    check(outs[0], tpl.reference(host, shape), tpl.dtype)


@pytest.mark.parametrize("fmt", ["f16", "f32"])
def test_every_mma_seed_config_of_the_other_weight_formats_is_correct(dev, rng, fmt):
    tpl = mm.CudaMatmul("mma", fmt, "none", False)
    legal, _ = tpl.space("seed").split(dev.info.limits)
    for cfg in legal:
        out, ref = run(dev, tpl, cfg, (70, 96, 128), rng)
        check(out, ref, tpl.dtype)


@pytest.mark.parametrize("kind", mm.KINDS)
def test_matmul_reads_x_from_row_x_row0(dev, rng, kind):
    tpl = mm.CudaMatmul(kind, "nf4", "residual", True)
    shape = (5, 96, 128)
    host = tpl.make_inputs(shape, rng)
    pad = rng.standard_normal((7, 128)).astype(np.float32)
    bufs = tpl.upload(dev, {**host, "x": np.concatenate([pad, host["x"]])}, shape)
    cfg = tpl.default_config()
    dev.run(tpl.launches_at(tpl.compile(dev, cfg, shape), bufs, cfg, shape, 7))
    check(dev.download(bufs["out"], np.float32, (5, 96)), tpl.reference(host, shape), tpl.dtype)


@pytest.mark.parametrize("shape", [(1, 64), (7, 256), (346, 1024), (3, 1000)])
def test_rmsnorm(dev, rng, shape):
    tpl = CudaRMSNorm(1e-5)
    for cfg in tpl.space().split(dev.info.limits)[0]:
        check(*run(dev, tpl, cfg, shape, rng), "f32")


@pytest.mark.parametrize("fmt", ["nf4", "f16", "f32"])
@pytest.mark.parametrize("shape", [(1, 64, 390), (346, 1024, 4096), (5, 320, 17)])
def test_embed(dev, rng, fmt, shape):
    tpl = CudaEmbed(fmt)
    out, ref = run(dev, tpl, tpl.config_of({"NT": 128}), shape, rng)
    np.testing.assert_array_equal(out, ref.astype(np.float32))  # a gather of exact stored values


@pytest.mark.parametrize("shape", [(1, 64, 8), (346, 1024, 8), (3, 256, 1), (2, 96, 11)])  # 11: a partial 2nd pass
def test_head(dev, rng, shape):
    tpl = CudaHead(1e-5)
    for cfg in tpl.space().split(dev.info.limits)[0]:
        check(*run(dev, tpl, cfg, shape, rng), "f32")


#: one row (the state alone before it), rows fewer than any RT but 1, 37 (a partial last run of every RT > 1), the
#: bundled model's and lfm2-350m's widths, 4 and 2 taps
CONV_SHAPES = [(1, 64, 3), (2, 64, 3), (3, 256, 3), (37, 96, 3), (346, 1024, 3), (5, 96, 4), (1, 32, 2)]


@pytest.mark.parametrize("shape", CONV_SHAPES)
def test_shortconv_output_and_new_state(dev, rng, shape):
    tpl = CudaShortConv()
    cfgs = tpl.space().split(dev.info.limits)[0]
    assert {c["RT"] for c in cfgs} == {1, 2, 4, 8, 16}
    for cfg in cfgs:
        check(*run(dev, tpl, cfg, shape, rng), "f32")


@pytest.mark.parametrize("shape", CONV_SHAPES)
def test_shortconv_gives_the_same_bits_whatever_rows_a_thread_takes(dev, shape):
    """A thread's run of RT rows slides its window in registers, and every output sums its taps in the same order,
    so the outputs and the new state are the same bits at every RT (and NT)."""
    tpl = CudaShortConv()
    cfgs = tpl.space().split(dev.info.limits)[0]
    outs = {cfg: run(dev, tpl, cfg, shape, np.random.default_rng(7))[0] for cfg in cfgs}  # the same inputs
    first = outs[tpl.default_config()]
    assert np.isfinite(first).all() and np.abs(first).max() > 0
    for cfg, out in outs.items():
        np.testing.assert_array_equal(out, first, err_msg=str(cfg))


#: (M, P, HQ, HKV, D): a single query, a long prefix, GQA groups of 1, 2 and 4, head dims 16 (tiny), 48 (a partial
#: lane group), 64 (the bundled model and lfm2-350m)
ATTN_SHAPES = [(1, 0, 4, 2, 16), (1, 700, 16, 8, 64), (37, 5, 4, 4, 48), (346, 0, 16, 8, 64), (9, 130, 8, 2, 32)]


@pytest.mark.parametrize("shape", ATTN_SHAPES)
def test_attention(dev, rng, shape):
    """Every legal config of the three kernels (one query a block, QT queries sharing staged key tiles, 16 queries a
    warp on tensor cores) whose shared memory fits the head size; the tensor-core ones at the f16 tolerance."""
    tpl = CudaAttention()
    cfgs = [c for c in tpl.space().split(dev.info.limits)[0] if not tpl.config_problems(c, shape)]
    assert {c["QT"] for c in cfgs} == {1, 8, 16, 32, 64}
    assert {(c["QT"], c["NW"], c["KW"]) for c in cfgs if c["TC"]} >= {(16, 1, 1), (32, 2, 1), (64, 4, 1), (16, 4, 4),
                                                                    (32, 4, 2), (16, 2, 2)}
    assert any(c["PF"] for c in cfgs)  # every head size here lets some tile prefetch
    for cfg in cfgs:
        check(*run(dev, tpl, cfg, shape, rng), tpl.dtype_of(cfg))


@pytest.mark.parametrize("shape", ATTN_SHAPES)
def test_attention_prefetch_gives_the_same_bits(dev, rng, shape):
    """PF 1 only moves the next key tile's loads earlier: each tensor-core tile gives the same bits with and without
    it (a long prefix, partial key tiles, GQA groups), on one set of random inputs."""
    tpl = CudaAttention()
    pairs = [(tpl.config_of({**dict(c), "PF": 0}), c) for c in tpl.space().split(dev.info.limits)[0]
             if c["PF"] and not tpl.config_problems(c, shape)]
    assert pairs
    host = tpl.make_inputs(shape, rng)
    bufs = tpl.upload(dev, host, shape)
    for off, on in pairs:
        got = []
        for cfg in (off, on):
            tpl.poison(dev, bufs, shape)
            dev.run(tpl.launches(tpl.compile(dev, cfg, shape), bufs, cfg, shape))
            got.append(tpl.read_output(dev, bufs, shape))
        np.testing.assert_array_equal(got[1], got[0], err_msg=str(on))
        check(got[1], tpl.reference(host, shape), tpl.dtype_of(on))


@pytest.mark.parametrize("cfg", [{"QT": 16, "NW": 1, "TC": 1, "KW": 1}, {"QT": 64, "NW": 4, "TC": 1, "KW": 1},
                                 {"QT": 16, "NW": 4, "TC": 1, "KW": 4}, {"QT": 32, "NW": 4, "TC": 1, "KW": 2},
                                 {"QT": 32, "NW": 8, "TC": 1, "KW": 4, "PF": 1},
                                 {"QT": 64, "NW": 4, "TC": 1, "KW": 1, "PF": 1},
                                 {"QT": 32, "NW": 8, "TC": 0, "KW": 1}, {"QT": 1, "NW": 4, "TC": 0, "KW": 1}])
@pytest.mark.parametrize("nq", [1, 3, 17])
def test_attention_reads_its_queries_from_row_first(dev, rng, cfg, nq):
    """A decision's last block asks for its last rows only (queries first.. of the chunk, at their own positions):
    they equal those rows of the whole chunk's attention."""
    tpl = CudaAttention()
    full = (21, 5, 4, 2, 64)  # 21 rows after 5 cached positions
    host = tpl.make_inputs(full, rng)
    want = tpl.reference(host, full)[full[0] - nq:]
    shape, c = (nq, *full[1:]), tpl.config_of(cfg)
    bufs = tpl.upload(dev, host, full)
    tpl.poison(dev, bufs, full)
    dev.run(tpl.launches_at(tpl.compile(dev, c, shape), bufs, shape, full[0] - nq))
    got = dev.download(bufs["out"], np.float32, (nq, want.shape[1]))
    check(got, want, tpl.dtype_of(c))


@pytest.mark.parametrize("shape", ATTN_SHAPES)
def test_qknorm_rope_into_the_cache_rows(dev, rng, shape):
    tpl = CudaQKNormRope(1e6, 1e-5)
    check(*run(dev, tpl, tpl.config_of({"NT": 0}), shape, rng), "f32")


def test_copy_words_moves_exactly_the_window(dev, rng):
    src = rng.standard_normal(1000).astype(np.float32)
    dst0 = rng.standard_normal(1200).astype(np.float32)
    s, d = dev.upload(src), dev.upload(dst0)
    dev.run([copy_launch(copy_program(dev), s, 13, d, 100, 777)])
    want = dst0.copy()
    want[100:877] = src[13:790]
    np.testing.assert_array_equal(dev.download(d, np.float32, (1200,)), want)


@pytest.mark.parametrize("pairs", [1, 8, 11])  # 11: two launches, the second with three pairs and five null slots
def test_copy_pairs_moves_each_buffers_first_words_and_nothing_else(dev, rng, pairs):
    words = 777
    srcs = [rng.standard_normal(900).astype(np.float32) for _ in range(pairs)]
    dsts = [rng.standard_normal(900).astype(np.float32) for _ in range(pairs)]
    bufs = [(dev.upload(s), dev.upload(d)) for s, d in zip(srcs, dsts)]
    launches = copy_pairs_launches(copy_pairs_program(dev), bufs, words)
    assert len(launches) == -(-pairs // 8)
    dev.run(launches)
    for (s, d), (_, db) in zip(zip(srcs, dsts), bufs):
        want = d.copy()
        want[:words] = s[:words]
        np.testing.assert_array_equal(dev.download(db, np.float32, (900,)), want)


def test_the_cublas_f16_peer_races_with_the_kernel(dev):
    """bench/matmul_cuda.py's peer: one interleaved race gives the kernel's and cuBLAS's stats."""
    from tilewise.tune.engine import Engine, Item

    eng = Engine(dev, None, seed=1, measure_kw={"warmup": 2, "min_rounds": 6, "max_rounds": 6, "budget_s": 5.0})
    tpl = mm.CudaMatmul("mma", "nf4", "swiglu", True)
    item = Item(tpl, tpl.default_config(), (64, 128, 128))
    outs = eng.evaluate([item], batch=None)
    assert outs[0].status == "ok", outs[0].reason
    got = eng.race([item], peer=True, outcomes=outs)
    assert got.peer is not None and got.peer_name == "cuBLAS f16", got.peer_error
    assert got.peer.median_ms > 0 and got.stats[0].median_ms > 0
