"""The WGSL GEMM on a real adapter (lavapipe in CI): every legal seed config is right at awkward shapes, and
several rules are load-bearing (bypass them and the kernel computes garbage or fails validation)."""

import pytest

from tilewise.errors import LaunchError
from tilewise.kernels.gemm.webgpu import WgslGemm, gemm_space
from tilewise.tune.verify import verify

pytestmark = pytest.mark.webgpu


@pytest.fixture(scope="module")
def tpl():
    return WgslGemm()


def run_check(tpl, dev, cfg, shape, rng):
    prog = tpl.compile(dev, cfg, shape)
    return verify(tpl, dev, prog, cfg, shape, rng)


def test_seed_configs_correct_at_ragged_shape(webgpu_device, tpl, rng):
    shape = (67, 72, 44)  # no tile divides M; K is not a multiple of any BK
    legal = gemm_space("seed").legal(webgpu_device.info.limits)
    assert len(legal) >= 12
    for cfg in legal:
        chk = run_check(tpl, webgpu_device, cfg, shape, rng)
        assert chk.ok, f"{cfg}: {chk.message}"
        assert chk.rel_err < 1e-5


@pytest.mark.parametrize("shape", [(1, 1, 1), (5, 3, 7), (130, 9, 33)])
def test_vec1_handles_any_shape(webgpu_device, tpl, rng, shape):
    base = tpl.default_config()
    for cfg in (base.replace(VEC=1), base.replace(VEC=1, SA="private", SB="private"), base.replace(VEC=1, PF=1)):
        assert not tpl.shape_problems(cfg, shape)
        chk = run_check(tpl, webgpu_device, cfg, shape, rng)
        assert chk.ok, f"{cfg} at {shape}: {chk.message}"


def test_random_legal_configs_correct(webgpu_device, tpl, rng):
    from tilewise.tune.search import Budget, random_search

    limits = webgpu_device.info.limits
    picked = [c for c in random_search(gemm_space("full"), limits, Budget(count=60), seed=11) if c["NT"] <= 256][:10]
    for cfg in picked:
        shape = (int(rng.integers(1, 100)), 4 * int(rng.integers(1, 20)), 4 * int(rng.integers(1, 20)))
        chk = run_check(tpl, webgpu_device, cfg, shape, rng)
        assert chk.ok, f"{cfg} at {shape}: {chk.message}"


# ---- rules are load-bearing: bypass one and the result is wrong or the pipeline is refused ----------------
def test_threads_rule_is_load_bearing(webgpu_device, tpl, rng):
    cfg = tpl.default_config().replace(NT=64)  # 2 warps for 4 warp tiles
    assert [w.split(":")[0] for w in gemm_space("full").why_illegal(cfg, webgpu_device.info.limits)] == ["threads"]
    chk = run_check(tpl, webgpu_device, cfg, (128, 64, 32), rng)
    assert not chk.ok and chk.nan_count == 64 * 64  # rows 64..127 of the tile are never written


def test_load_a_rule_is_load_bearing(webgpu_device, tpl, rng):
    cfg = tpl.default_config().replace(BM=48, WM=24, TM=1)  # A tile copy covers 1 of 1.5 loads per invocation
    assert [w.split(":")[0] for w in gemm_space("full").why_illegal(cfg, webgpu_device.info.limits)] == ["load_a"]
    chk = run_check(tpl, webgpu_device, cfg, (48, 64, 32), rng)
    assert not chk.ok and chk.rel_err > 1e-2


def test_vec4_tn_rule_is_load_bearing(webgpu_device, tpl, rng):
    cfg = tpl.default_config().replace(TN=1)
    assert [w.split(":")[0] for w in gemm_space("full").why_illegal(cfg, webgpu_device.info.limits)] == ["vec4_tn"]
    # TN // 4 = 0 vec4 columns per invocation: nothing is ever stored, the output binding is unused and the
    # pipeline's bind group is refused
    with pytest.raises(LaunchError, match="binding"):
        run_check(tpl, webgpu_device, cfg, (64, 64, 32), rng)


def test_tile_waste(tpl):
    cfg = tpl.default_config()  # 128 x 64 tiles
    assert tpl.tile_waste(cfg, (128, 64, 8)) == 1.0
    assert tpl.tile_waste(cfg, (346, 64, 8)) == pytest.approx(384 / 346)
    assert tpl.tile_waste(cfg, (129, 65, 8)) == pytest.approx(256 * 128 / (129 * 65))


def test_generated_source_has_no_indexed_local_arrays(tpl):
    for cfg in gemm_space("seed"):
        if gemm_space("seed").is_legal(cfg):
            src = tpl.source(cfg)
            assert "var<function>" not in src and "array<f32, " not in src.split("fn main")[1]
            assert src.count("fma(") >= cfg["TM"] * cfg["TN"] // cfg["VEC"]


class BrokenBK32(WgslGemm):
    """The WGSL GEMM whose BK = 32 configs do not compile (a syntax error planted in their source)."""

    def source(self, config):
        src = super().source(config)
        return src.replace("workgroupBarrier();", "workgroupBarrier(;", 1) if config["BK"] == 32 else src


def test_a_batch_compile_keeps_each_configs_error_and_its_programs_run(webgpu_device, rng):
    """wgpu-native compiles a batch on threads, Dawn inside `compile_together`: either way each config gets its own
    program or its own error, and the programs compute what a one-by-one compile's do."""
    from tilewise.errors import ShaderCompileError

    dev, tpl, shape = webgpu_device, BrokenBK32(), (67, 72, 44)
    assert dev.compiles_in_parallel()
    legal = gemm_space("seed").legal(dev.info.limits)
    got = tpl.precompile(dev, legal, shape)
    assert set(got) == set(legal)
    broken = [c for c in legal if c["BK"] == 32]
    assert broken and len(broken) < len(legal)
    for cfg, prog in got.items():
        if cfg["BK"] == 32:
            assert isinstance(prog, ShaderCompileError) and "workgroupBarrier(;" in str(prog), (cfg, prog)
            continue
        assert not isinstance(prog, Exception), str(prog)
        assert prog.handle is not None and prog.source_hash == tpl.compile(dev, cfg, shape).source_hash
        chk = verify(tpl, dev, prog, cfg, shape, rng)
        assert chk.ok and chk.rel_err < 1e-5, f"{cfg}: {chk.message}"
