"""Every model kernel against its float64 reference on random inputs, on the WebGPU adapter (lavapipe in CI).

Matmuls run at rows around the short-row / tiled cutoff (95, 96, 97) and at 1, in every weight format and
epilogue; a sample of legal configs checks the generator across geometries; the rules explain illegal ones.
"""

from __future__ import annotations

import numpy as np
import pytest

from tilewise.kernels.attention import problem as attention_problem
from tilewise.kernels.attention import webgpu as attention
from tilewise.kernels.matmul import webgpu as mm
from tilewise.kernels.rowops import webgpu as rowops
from tilewise.kernels.shortconv import webgpu as conv
from tilewise.kernels.space import Config
from tilewise.tune.verify import compare

pytestmark = pytest.mark.webgpu

_KEEP: list = []  # programs and buffers stay alive: the device caches bind groups by object identity


def _run(dev, template, config, shape, rng):
    host = template.make_inputs(shape, rng)
    bufs = template.upload(dev, host, shape)
    template.poison(dev, bufs, shape)
    prog = template.compile(dev, config, shape)
    _KEEP.append((prog, bufs))
    dev.run(template.launches(prog, bufs, config, shape))
    return template.read_output(dev, bufs, shape), template.reference(host, shape)


def _assert_close(out, ref, dtype):
    assert not np.isnan(out).any(), "unwritten (NaN-poisoned) outputs"
    check = compare(out, ref, dtype)
    assert check.ok, check.message


@pytest.mark.parametrize("fmt", mm.FORMATS)
@pytest.mark.parametrize("epilogue", mm.EPILOGUES)
@pytest.mark.parametrize("kind", mm.KINDS)
def test_matmul_default_configs_around_the_cutoff(webgpu_device, rng, kind, fmt, epilogue):
    t = mm.MatmulTemplate(kind, fmt, epilogue, webgpu_device.enabled_features)
    cfg = t.default_config()
    for rows in (1, 95, 96, 97):
        out, ref = _run(webgpu_device, t, cfg, (rows, 96, 128), rng)
        _assert_close(out, ref, t.dtype)


def test_matmul_nf4_matches_dequantized_weights_tightly(webgpu_device, rng):
    # NF4 decode must be exact: the only error left is float32 accumulation
    t = mm.MatmulTemplate("tiled", "nf4", "none")
    out, ref = _run(webgpu_device, t, t.default_config(), (33, 64, 256), rng)
    assert np.abs(out - ref).max() / np.abs(ref).max() < 1e-5


@pytest.mark.parametrize("kind", mm.KINDS)
def test_matmul_sampled_configs(webgpu_device, rng, kind):
    t = mm.MatmulTemplate(kind, "nf4", "swiglu", webgpu_device.enabled_features)
    configs = t.space().sample(5, seed=int(rng.integers(1 << 30)), limits=webgpu_device.info.limits)
    assert configs
    for cfg in configs:
        shape = (int(rng.integers(1, 140)), 72, 128)  # N=72 is no multiple of most tile widths: edge guards
        if t.shape_problems(cfg, shape):
            continue
        out, ref = _run(webgpu_device, t, cfg, shape, rng)
        _assert_close(out, ref, t.dtype)


def test_matmul_f16_staging_has_its_own_tolerance(webgpu_device, rng):
    if "shader-f16" not in webgpu_device.enabled_features:
        pytest.skip("adapter has no shader-f16")
    t = mm.MatmulTemplate("tiled", "nf4", "swiglu", webgpu_device.enabled_features, f16_staging=True)
    assert t.dtype == "f16"
    out, ref = _run(webgpu_device, t, t.default_config(), (97, 96, 128), rng)
    _assert_close(out, ref, "f16")
    err = np.abs(out - ref).max() / np.abs(ref).max()
    assert err > 1e-6, "f16 staging should round (else the f16 path did not run)"


def test_matmul_rules_explain_illegal_configs(webgpu_device):
    lim = webgpu_device.info.limits
    sp = mm.MatmulTemplate("tiled", "nf4", "swiglu", (), f16_staging=True, f16_arith=True).space()
    text = " ".join(sp.why_illegal(sp.config(BM=128, BN=128, BK=32, TM=8, TN=8, F16S=True, PF=0, CL="block",
                                             DB=0, UK=0, F16A=True), lim))
    assert "accumulators" in text and "= 192 " in text and "f16_staging" in text  # 2*8*8*1.5
    sp = mm.tiled_space(paired=True, features=())
    if lim.max_workgroup_storage_bytes < 49216:  # (2*32*128 + 128*32) * 4 + 64 bytes
        text = " ".join(sp.why_illegal(sp.config(BM=128, BN=128, BK=32, TM=4, TN=4, F16S=False, PF=0, CL="block",
                                                 DB=0, UK=0), lim))
        assert "workgroup_storage" in text and "49216" in text
    plain = {"F16S": False, "PF": 0, "CL": "block", "DB": 0, "UK": 0}
    assert sp.why_illegal(sp.config(BM=64, BN=64, BK=16, TM=4, TN=4, **plain), lim) == []
    assert any(r.startswith("vec4_cols") for r in sp.why_illegal(sp.config(BM=64, BN=32, BK=16, TM=4, TN=2, **plain),
                                                                 lim))
    why = sp.why_illegal(sp.config(BM=64, BN=64, BK=16, TM=4, TN=4, F16S=False, PF=0, CL="block", DB=1, UK=0), lim)
    assert why == ["double_buffer: DB=1 (double-buffered tiles) stores the prefetch registers of the next step: it "
                   "needs PF=1"]
    rs = mm.rows_space()
    assert any(r.startswith("pow2_lanes") for r in rs.why_illegal(rs.config(WG=96 * 2, NC=2, RM=1, EL=8), lim))
    assert mm.shape_problems("tiled", mm.DEFAULT_TILED, 64, 100) != []


def test_dispatch_defaults_switch_kernels_at_96_rows():
    from tilewise.model.dispatch import default_matmul

    assert default_matmul(1) == ("rows", mm.DEFAULT_ONE_ROW) and default_matmul(2)[1]["RM"] == 1
    assert default_matmul(95) == ("rows", mm.DEFAULT_ROWS)
    assert default_matmul(96) == ("tiled", mm.DEFAULT_TILED) and default_matmul(5000)[0] == "tiled"


def test_rmsnorm_embed_head(webgpu_device, rng):
    cfg = Config({"WG": 64})
    for rows in (1, 95, 96, 97):
        out, ref = _run(webgpu_device, rowops.RMSNormTemplate(), cfg, (rows, 128), rng)
        _assert_close(out, ref, "f32")
    for fmt in mm.FORMATS:
        out, ref = _run(webgpu_device, rowops.EmbedTemplate(fmt), Config({"WG": 32}), (9, 128, 40), rng)
        np.testing.assert_array_equal(out, ref.astype(np.float32))  # a gather decodes exactly
    out, ref = _run(webgpu_device, rowops.HeadTemplate(), cfg, (7, 128, 8), rng)
    _assert_close(out, ref, "f32")


@pytest.mark.parametrize("shape", [(1, 64, 3), (2, 64, 3), (3, 64, 3), (50, 64, 3), (37, 96, 4), (5, 32, 2)])
def test_conv_with_state(webgpu_device, rng, shape):
    """Every run length RT (50 and 37 rows: a partial last run; 1 and 2 rows: the state's rows before them) at two
    widths, 2-4 taps: y and the new state against float64."""
    tpl = conv.ConvTemplate()
    cfgs = [c for c in tpl.space().legal(webgpu_device.info.limits) if c["WG"] in (32, 128)]
    assert {c["RT"] for c in cfgs} == {1, 2, 4, 8, 16}
    for cfg in cfgs:
        out, ref = _run(webgpu_device, tpl, cfg, shape, rng)
        _assert_close(out, ref, "f32")


@pytest.mark.parametrize("shape", [(1, 0, 4, 2, 16), (1, 40, 4, 2, 16), (37, 5, 4, 2, 16), (97, 0, 4, 4, 16),
                                   (12, 3, 8, 2, 64)])
def test_attention_causal_gqa(webgpu_device, rng, shape):
    t = attention.AttentionTemplate()
    # KT > 1: each query's keys split over KT threads and merged; BKV = 8 with KT = 8 gives every slot one key
    # per tile, so the merge of slots that saw no key at all (the first rows) is covered too
    # LZ = 1: lazy rescale, with and without the key split
    for cfg in (Config({"BQ": 16, "BKV": 8}), Config({"BQ": 32, "BKV": 16}), Config({"BQ": 16, "BKV": 8, "KT": 8}),
                Config({"BQ": 32, "BKV": 16, "KT": 2}), Config({"BQ": 16, "BKV": 32, "KT": 4}),
                Config({"BQ": 16, "BKV": 8, "LZ": 1}), Config({"BQ": 32, "BKV": 16, "KT": 4, "LZ": 1}),
                Config({"BQ": 16, "BKV": 8, "KT": 8, "LZ": 1})):
        out, ref = _run(webgpu_device, t, cfg, shape, rng)
        _assert_close(out, ref, "f32")


@pytest.mark.parametrize(("m", "d"), [(6, 16), (37, 64), (5, 24)])  # 2, 4 and 1 invocations per head; a partial
def test_qknorm_rope_writes_q_and_cache_rows(webgpu_device, rng, m, d):  # last workgroup at 37 rows
    from tilewise.devices.base import Launch

    dev = webgpu_device
    p, hq, hkv = 9, 4, 2
    cap = p + m + 7
    qkv = rng.standard_normal((m, (hq + 2 * hkv) * d)).astype(np.float32)
    qn, kn = (1 + 0.3 * rng.standard_normal((2, d))).astype(np.float32)
    cos, sin = attention_problem.rope_table(cap, d, 1e6)
    bufs = {"dims": dev.upload(np.array([m, p, 0, 0], np.uint32), uniform=True), "qkv": dev.upload(qkv),
            "q_norm": dev.upload(qn), "k_norm": dev.upload(kn), "cos": dev.upload(cos), "sin": dev.upload(sin),
            "q": dev.allocate(4 * m * hq * d), "k_cache": dev.upload(np.full((cap, hkv * d), np.nan, np.float32)),
            "v_cache": dev.upload(np.full((cap, hkv * d), np.nan, np.float32))}
    prog = dev.compile(attention.qknorm_rope_source(hq, hkv, d, 1e-5))
    _KEEP.append((prog, bufs))
    dev.run([Launch(prog, attention.qknorm_rope_grid(m, hq, hkv, d), [bufs[k] for k in attention.ROPE_BINDINGS])])
    q, k, v = attention_problem.qknorm_rope_ref(qkv, qn, kn, p, hq, hkv, d, 1e6, 1e-5)
    kc = dev.download(bufs["k_cache"], np.float32, (cap, hkv, d))
    np.testing.assert_allclose(dev.download(bufs["q"], np.float32, (m, hq, d)), q, atol=2e-6)
    np.testing.assert_allclose(kc[p:p + m], k, atol=2e-6)
    np.testing.assert_array_equal(dev.download(bufs["v_cache"], np.float32, (cap, hkv, d))[p:p + m], v)
    assert np.isnan(kc[:p]).all() and np.isnan(kc[p + m:]).all(), "rows outside p..p+m-1 must stay untouched"


def test_flop_and_byte_counts():
    t = mm.MatmulTemplate("tiled", "nf4", "swiglu")
    assert t.flops((346, 2560, 1024)) == 2 * 2 * 346 * 2560 * 1024
    assert t.bytes_moved((1, 2560, 1024)) == int(4 * 1024 + 2 * 2560 * 1024 * (0.5 + 4 / 64) + 4 * 2560)
    assert t.tile_waste(t.default_config(), (346, 2560, 1024)) == pytest.approx(384 / 346)


def test_matmul_f16_arithmetic_has_its_own_tolerance(webgpu_device, rng):
    if "shader-f16" not in webgpu_device.enabled_features:
        pytest.skip("adapter has no shader-f16")
    for kind, epilogue in [("tiled", e) for e in mm.EPILOGUES] + [("splitk", "residual"), ("splitk", "swiglu")]:
        t = mm.MatmulTemplate(kind, "nf4", epilogue, webgpu_device.enabled_features, f16_staging=True,
                              f16_arith=True)
        assert t.dtype == "f16" and "F16A" in t.space().params
        for cfg in (t.default_config(), t.default_config().replace(TM=2, TN=8)):
            out, ref = _run(webgpu_device, t, cfg, (97, 96, 256), rng)
            _assert_close(out, ref, "f16")
            assert np.abs(out - ref).max() / np.abs(ref).max() > 1e-6, "f16 FMAs should round"
    sp = mm.tiled_space(features=webgpu_device.enabled_features)
    cfg = Config({**mm.DEFAULT_TILED, "F16A": True})  # f16 arithmetic without f16 tiles
    assert any(r.startswith("f16_arith") for r in sp.why_illegal(cfg))


def test_registry_classes_run_under_the_tuner(webgpu_device):
    from tilewise.tune.search import Budget
    from tilewise.tune.tuner import tune

    res = tune(mm.NF4SwigluTiled(), webgpu_device, (97, 64, 128), strategy="random", budget=Budget(count=2),
               measure_kw={"budget_s": 0.1, "min_rounds": 2, "max_rounds": 3})
    assert [r.status for r in res.rows] == ["ok", "ok"]


@pytest.mark.parametrize("kind", ["tiled", "rows", "splitk"])
@pytest.mark.parametrize("epilogue", ["none", "swiglu"])
def test_matmul_with_fused_rmsnorm(webgpu_device, rng, kind, epilogue):
    t = mm.MatmulTemplate(kind, "nf4", epilogue, webgpu_device.enabled_features, norm=True, eps=1e-5)
    assert mm.binding_names("nf4", epilogue, norm=True)[:3] == ["dims", "x", "norm_w"]
    for rows in (1, 95, 96, 97):
        out, ref = _run(webgpu_device, t, t.default_config(), (rows, 96, 128), rng)
        _assert_close(out, ref, t.dtype)
    if kind == "tiled":  # 64 threads for 128 rows: each thread keeps two rows' sums of squares
        cfg = t.default_config().replace(BM=128, BN=16, TM=8, TN=4)
        assert t.space().is_legal(cfg, webgpu_device.info.limits)
        out, ref = _run(webgpu_device, t, cfg, (130, 96, 128), rng)
        _assert_close(out, ref, t.dtype)
    if kind == "splitk":  # each K slice's sums of squares reach the reduce: a wrong split changes every row
        assert "inverseSqrt" not in t.source(t.default_config(), (97, 96, 128))
        with pytest.raises(ValueError, match="needs K"):
            mm.splitk_reduce_source(epilogue, 96, 4, 1e-5)


def test_copy_kernels_move_exactly_the_asked_words(webgpu_device, rng):
    from tilewise.devices.base import Launch

    dev = webgpu_device
    src = [rng.integers(0, 2**32, 3000, dtype=np.uint32) for _ in range(2)]
    dst = [np.full(3000, 7, np.uint32) for _ in range(2)]
    bufs = [dev.upload(a) for a in src + dst]
    dims = dev.upload(np.array([1234, 10, 100, 0], np.uint32), uniform=True)  # 1234 words, src at 10, dst at 100
    progs = [dev.compile(rowops.copy_source()), dev.compile(rowops.copy2_source())]
    _KEEP.append((progs, bufs, dims))
    dev.run([Launch(progs[1], rowops.copy_grid(1234), [dims, *bufs])])
    for a, b in zip(src, bufs[2:]):
        got = dev.download(b, np.uint32, (3000,))
        np.testing.assert_array_equal(got[100:1334], a[10:1244])
        assert (got[:100] == 7).all() and (got[1334:] == 7).all()
    dev.run([Launch(progs[0], (1, 1, 1), [dims, bufs[1], bufs[2]])])  # one workgroup: the grid-stride loop
    np.testing.assert_array_equal(dev.download(bufs[2], np.uint32, (3000,))[100:1334], src[1][10:1244])


# prefetch (PF) and column layout (CL) of the tiled / split-K kernels: every value, in every weight format,
# epilogue, with and without the fused norm, split-K, f16 staging / arithmetic; M=37 and 97 and N=72 leave
# partial tiles (N=72 is no multiple of 32, 64 or 256), and some configs leave a thread's last prefetch slot
# partly outside the tile (weight chunks or activation vec4s not a multiple of the threads)
_VARIANTS = [  # (kind, fmt, epilogue, norm, f16: 0 f32 / 1 F16S / 2 F16S+F16A, overrides of the default, M)
    ("tiled", "nf4", "none", False, 0, {"PF": 1}, 37),
    ("tiled", "nf4", "residual", False, 0, {"TN": 8, "CL": "strided"}, 37),
    ("tiled", "nf4", "swiglu", True, 0, {"TN": 8, "PF": 1, "CL": "strided"}, 37),
    ("tiled", "nf4", "swiglu", False, 0, {"TM": 8, "TN": 8, "PF": 1, "CL": "strided"}, 97),  # 128 accumulators
    ("tiled", "nf4", "none", True, 0, {"BM": 16, "BN": 32, "BK": 64, "TM": 1, "TN": 8, "PF": 1, "CL": "strided"}, 37),
    ("tiled", "nf4", "swiglu", False, 0, {"BN": 32, "BK": 8, "TM": 2, "PF": 1}, 37),  # 256 threads, 32 chunks
    ("tiled", "nf4", "residual", False, 0, {"BM": 16, "BN": 256, "BK": 8, "TM": 2, "TN": 8, "PF": 1,
                                            "CL": "strided"}, 37),
    ("tiled", "f16", "none", True, 0, {"TN": 8, "PF": 1, "CL": "strided"}, 37),
    ("tiled", "f16", "swiglu", False, 0, {"PF": 1}, 37),
    ("tiled", "f16", "residual", False, 0, {"BM": 32, "TM": 2, "TN": 8, "CL": "strided"}, 97),
    ("tiled", "f32", "swiglu", True, 0, {"BK": 8, "TN": 8, "PF": 1, "CL": "strided"}, 37),
    ("tiled", "f32", "residual", False, 0, {"PF": 1}, 37),
    ("splitk", "nf4", "residual", False, 0, {"KS": 2, "TN": 8, "PF": 1, "CL": "strided"}, 37),
    ("splitk", "f16", "swiglu", False, 0, {"KS": 4, "PF": 1}, 37),
    ("splitk", "f32", "none", False, 0, {"KS": 2, "TN": 8, "CL": "strided"}, 37),
    ("tiled", "nf4", "swiglu", True, 1, {"TN": 8, "PF": 1, "CL": "strided"}, 37),
    ("tiled", "nf4", "swiglu", True, 2, {"TN": 8, "PF": 1, "CL": "strided"}, 37),
    ("splitk", "nf4", "residual", False, 2, {"KS": 2, "TN": 8, "PF": 1, "CL": "strided"}, 37),
    ("tiled", "f16", "none", False, 2, {"TN": 8, "CL": "strided"}, 37),
    # split-K with the fused norm: the slices' sums of squares are added in the reduce
    ("splitk", "nf4", "swiglu", True, 0, {"KS": 2, "TN": 8, "PF": 1, "CL": "strided"}, 97),
    ("splitk", "nf4", "none", True, 2, {"KS": 4, "BM": 32, "TN": 8, "PF": 1, "CL": "strided"}, 37),
    ("splitk", "f16", "none", True, 0, {"KS": 2}, 37),
    # double-buffered tiles (DB): the halves alternate over 8, 16, 4 and 1 K steps, partial prefetch slots too
    ("tiled", "nf4", "swiglu", True, 2, {"TN": 8, "PF": 1, "CL": "strided", "DB": 1}, 37),
    ("tiled", "nf4", "residual", False, 0, {"BN": 32, "BK": 8, "TM": 2, "PF": 1, "DB": 1}, 97),
    ("tiled", "f16", "none", True, 0, {"BM": 32, "BK": 32, "PF": 1, "DB": 1}, 37),
    ("splitk", "nf4", "swiglu", True, 2, {"KS": 2, "BM": 32, "TN": 8, "PF": 1, "CL": "strided", "DB": 1}, 97),
    ("splitk", "f32", "residual", False, 0, {"KS": 4, "BN": 32, "BK": 32, "PF": 1, "DB": 1}, 37),
    # the K step's loop unrolled in the source (UK): with and without prefetch, double buffering, the fused norm
    ("tiled", "nf4", "swiglu", True, 2, {"TN": 8, "PF": 1, "CL": "strided", "UK": 1}, 37),
    ("tiled", "f32", "none", True, 0, {"BK": 8, "UK": 1}, 97),
    ("splitk", "nf4", "residual", False, 2, {"KS": 4, "BK": 32, "TN": 8, "PF": 1, "CL": "strided", "UK": 1}, 97),
    ("splitk", "f16", "none", True, 1, {"KS": 2, "BM": 32, "PF": 1, "DB": 1, "UK": 1}, 37),
]


@pytest.mark.parametrize("variant", _VARIANTS, ids=lambda v: "-".join(
    [v[0], v[1], v[2]] + (["norm"] if v[3] else []) + [("", "f16s", "f16a")[v[4]]] * bool(v[4])
    + [f"{a}{b}" for a, b in v[5].items()] + [f"m{v[6]}"]))
def test_matmul_prefetch_and_column_layout(webgpu_device, rng, variant):
    kind, fmt, epilogue, norm, f16, overrides, m = variant
    if f16 and "shader-f16" not in webgpu_device.enabled_features:
        pytest.skip("adapter has no shader-f16: the F16S / F16A variants cannot compile")
    t = mm.MatmulTemplate(kind, fmt, epilogue, webgpu_device.enabled_features, f16 > 0, f16 == 2, norm=norm)
    cfg = t.default_config().replace(**overrides)
    assert t.space().why_illegal(cfg, webgpu_device.info.limits) == []
    shape = (m, 72, 128)
    assert not t.shape_problems(cfg, shape)
    src = t.source(cfg, shape)
    assert ("pw0_0" in src) == (cfg["PF"] == 1) and ("cs0" in src) == (cfg["CL"] == "strided")
    assert src.count("let kk = ") == (cfg["BK"] if cfg["UK"] else 0)  # UK=1: one constant kk per copy
    out, ref = _run(webgpu_device, t, cfg, shape, rng)
    _assert_close(out, ref, t.dtype)


# tiles of 88 / 176 / 120 rows and 72 / 48 / 192 columns (fitted to a decision's rows, `tune_seeds.fitted_seeds`):
# row counts that leave a partial last row tile (97 = 88 + 9, 130 = 120 + 10) and a column count that is not a
# multiple of the tile (150 = 2 x 72 + 6), so the guards of both partial tiles run
_FITTED = [
    ("tiled", "swiglu", True, {"BM": 88, "BN": 72, "BK": 32, "TM": 4, "TN": 8, "PF": 1, "CL": "strided"}, 97),
    ("tiled", "swiglu", True, {"BM": 176, "BN": 72, "BK": 32, "TM": 8, "TN": 4, "PF": 1}, 130),
    ("tiled", "none", True, {"BM": 120, "BN": 48, "BK": 16, "TM": 4, "TN": 8, "PF": 1, "CL": "strided"}, 130),
    ("splitk", "residual", False, {"BM": 88, "BN": 128, "BK": 16, "TM": 4, "TN": 8, "PF": 1, "CL": "strided",
                                   "KS": 8}, 97),
    ("splitk", "none", True, {"BM": 48, "BN": 192, "BK": 16, "TM": 8, "TN": 8, "PF": 1, "CL": "strided",
                              "KS": 4}, 49),
]


@pytest.mark.parametrize("variant", _FITTED, ids=lambda v: f"{v[0]}-{v[1]}-{v[3]['BM']}x{v[3]['BN']}-m{v[4]}")
def test_matmul_tiles_that_are_not_powers_of_two(webgpu_device, rng, variant):
    kind, epilogue, norm, overrides, m = variant
    f16 = "shader-f16" in webgpu_device.enabled_features
    t = mm.MatmulTemplate(kind, "nf4", epilogue, webgpu_device.enabled_features, f16, f16, norm=norm)
    cfg = t.default_config().replace(**overrides)
    assert t.space().why_illegal(cfg, webgpu_device.info.limits) == []
    shape = (m, 150, 128 if kind == "tiled" else 256)
    assert not t.shape_problems(cfg, shape)
    out, ref = _run(webgpu_device, t, cfg, shape, rng)
    _assert_close(out, ref, t.dtype)
