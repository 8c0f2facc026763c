"""TVM-emitted conv1d and GEMM kernels on a real NVIDIA GPU through tilewise's CUDA device: every output value
against the float64 reference on random inputs, and timing.

The sources come from TVM when it imports, else from the pre-emitted store named by TILEWISE_TVM_CUDA_SOURCES
(`python tools/tvm_cuda_emit.py --arch sm_90 --out DIR` on a machine with TVM). A test skips cleanly without CuPy
or a GPU, and when neither TVM nor a store holding every source it needs is available.
"""

from __future__ import annotations

import numpy as np
import pytest
from tvm_support import need_sources, tvm_cuda_device

from tilewise.kernels.conv1d.tvm_cuda import TvmCudaConv1d, fmt
from tilewise.kernels.gemm.tvm_cuda import TvmCudaGemm, gemm_fmt
from tilewise.tune.verify import compare

pytestmark = pytest.mark.cuda

# What these tests compile (tools/tvm_cuda_emit.py pre-emits the same; a unit test checks it covers them):
#: conv1d seed configs: a tiny input, partial last tiles of every seed tile, a kernel as long as the input, a long input
SHAPES = [(16, 16), (700, 16), (1023, 64), (64, 64), (100_003, 64)]
#: conv1d (NT, TPT, RK, STAGE) of large blocks and long windows, at LARGE_SHAPE
LARGE = [(1024, 16, 16, "local"), (1024, 2, 64, "shared"), (32, 16, 32, "global"), (512, 8, 4, "shared")]
LARGE_SHAPE = (50_001, 64)
#: the conv1d config and shape that are timed
TIMED = ({"NT": 128, "TPT": 4, "RK": 8, "STAGE": "local"}, (1 << 20, 64))
#: GEMM seed configs
GEMM_SHAPES = [(64, 64, 16), (256, 192, 48), (1024, 1024, 1024)]


@pytest.fixture(scope="module")
def dev():
    return tvm_cuda_device()


@pytest.fixture(scope="module")
def tpl():
    return TvmCudaConv1d()


def run_once(dev, tpl, cfg, shape, rng):
    host = tpl.make_inputs(shape, rng)
    bufs = tpl.upload(dev, host, shape)
    tpl.poison(dev, bufs, shape)
    prog = tpl.compile(dev, cfg, shape)
    dev.run(tpl.launches(prog, bufs, cfg, shape))
    return tpl.read_output(dev, bufs, shape), tpl.reference(host, shape)


@pytest.mark.parametrize("shape", SHAPES)
def test_every_seed_config_matches_float64(dev, tpl, shape, rng):
    legal, _ = tpl.space("seed").split(dev.info.limits)
    assert len(legal) == 15
    configs = [c for c in legal if not tpl.shape_problems(c, shape)]  # RK must divide N
    need_sources(dev, tpl, configs, shape)
    for cfg in configs:
        out, ref = run_once(dev, tpl, cfg, shape, rng)
        check = compare(out, ref, "f32")
        assert check.ok, (fmt(cfg), shape, check.message)


@pytest.mark.parametrize("values", LARGE)
def test_large_blocks_and_windows_match_float64(dev, tpl, values, rng):
    cfg = tpl.space("full").config(dict(zip(("NT", "TPT", "RK", "STAGE"), values)))
    assert tpl.space("full").why_illegal(cfg, dev.info.limits) == []
    need_sources(dev, tpl, [cfg], LARGE_SHAPE)
    out, ref = run_once(dev, tpl, cfg, LARGE_SHAPE, rng)
    check = compare(out, ref, "f32")
    assert check.ok, (fmt(cfg), check.message)


def test_program_meta_and_timing(dev, tpl, rng):
    values, shape = TIMED
    cfg = tpl.space("full").config(values)
    need_sources(dev, tpl, [cfg], shape)
    prog = tpl.compile(dev, cfg, shape)
    assert prog.meta["block"] == (128, 1, 1) and prog.meta["arg_order"] == ("A", "B", "W")
    assert prog.meta["local_bytes"] == 0  # the window stayed in registers
    bufs = tpl.upload(dev, tpl.make_inputs(shape, rng), shape)
    times_ms = dev.time(tpl.launches(prog, bufs, cfg, shape) * 5)
    assert times_ms.shape == (5,) and np.all(times_ms > 0)


@pytest.mark.parametrize("shape", GEMM_SHAPES)
def test_every_gemm_seed_config_matches_float64(dev, shape, rng):
    gemm = TvmCudaGemm()
    legal, _ = gemm.space("seed").split(dev.info.limits)
    assert len(legal) == 12
    configs = [c for c in legal if not gemm.shape_problems(c, shape)]
    need_sources(dev, gemm, configs, shape)
    for cfg in configs:
        out, ref = run_once(dev, gemm, cfg, shape, rng)
        check = compare(out, ref, "f32")
        assert check.ok, (gemm_fmt(cfg), shape, check.message)
