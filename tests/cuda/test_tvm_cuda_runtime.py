"""TVM-emitted conv1d kernels on a real NVIDIA GPU through tilewise's CUDA device (skips cleanly without CuPy,
TVM or a GPU): every output value against the float64 reference on random inputs, and timing."""

from __future__ import annotations

import numpy as np
import pytest

from tilewise.errors import DeviceUnavailable
from tilewise.kernels.tvm_cuda import TvmCudaConv1d, fmt
from tilewise.tune.verify import compare

pytestmark = pytest.mark.cuda

#: a tiny input, partial last tiles of every seed tile, a kernel as long as the input, a long input
SHAPES = [(16, 16), (700, 16), (1023, 64), (64, 64), (100_003, 64)]


@pytest.fixture(scope="module")
def dev():
    pytest.importorskip("cupy")
    pytest.importorskip("tvm")
    from tilewise.devices import get_device

    try:
        return get_device("cuda")
    except DeviceUnavailable as exc:
        pytest.skip(f"no CUDA device: {exc}")


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
    for cfg in legal:
        if tpl.shape_problems(cfg, shape):
            continue  # RK does not divide N
        out, ref = run_once(dev, tpl, cfg, shape, rng)
        check = compare(out, ref, "f32")
        assert check.ok, (fmt(cfg), shape, check.message)


@pytest.mark.parametrize("values", [(1024, 16, 16, "local"), (1024, 2, 64, "shared"), (32, 16, 32, "global"),
                                    (512, 8, 4, "shared")])
def test_large_blocks_and_windows_match_float64(dev, tpl, values, rng):
    cfg = tpl.space("full").config(dict(zip(("NT", "TPT", "RK", "STAGE"), values)))
    assert tpl.space("full").why_illegal(cfg, dev.info.limits) == []
    out, ref = run_once(dev, tpl, cfg, (50_001, 64), rng)
    check = compare(out, ref, "f32")
    assert check.ok, (fmt(cfg), check.message)


def test_program_meta_and_timing(dev, tpl, rng):
    shape = (1 << 20, 64)
    cfg = tpl.space("full").config(NT=128, TPT=4, RK=8, STAGE="local")
    prog = tpl.compile(dev, cfg, shape)
    assert prog.meta["block"] == (128, 1, 1) and prog.meta["arg_order"] == ("A", "B", "W")
    assert prog.meta["local_bytes"] == 0  # the window stayed in registers
    bufs = tpl.upload(dev, tpl.make_inputs(shape, rng), shape)
    times_ms = dev.time(tpl.launches(prog, bufs, cfg, shape) * 5)
    assert times_ms.shape == (5,) and np.all(times_ms > 0)


@pytest.mark.parametrize("shape", [(64, 64, 16), (256, 192, 48), (1024, 1024, 1024)])
def test_every_gemm_seed_config_matches_float64(dev, shape, rng):
    from tilewise.kernels.tvm_cuda import TvmCudaGemm, gemm_fmt

    gemm = TvmCudaGemm()
    legal, _ = gemm.space("seed").split(dev.info.limits)
    assert len(legal) == 12
    for cfg in legal:
        if gemm.shape_problems(cfg, shape):
            continue
        out, ref = run_once(dev, gemm, cfg, shape, rng)
        check = compare(out, ref, "f32")
        assert check.ok, (gemm_fmt(cfg), shape, check.message)
