"""The CUDA device and the warp-tiling SGEMM on a real NVIDIA GPU (skips cleanly without CuPy or a GPU)."""

from __future__ import annotations

import numpy as np
import pytest

from tilewise.errors import LaunchError, ShaderCompileError
from tilewise.kernels.gemm.cuda import KERNEL7, PARAMS, SEED_WINNER, CudaGemm, name_expression
from tilewise.tune.verify import compare

pytestmark = pytest.mark.cuda

#: admitted but awkward: M odd or tiny, N and K multiples of 4 that no tile divides, K < BK
SHAPES = [(1, 4, 4), (37, 68, 20), (130, 132, 36), (517, 1036, 388), (346, 2560, 1024)]


@pytest.fixture(scope="module")
def tpl():
    return CudaGemm()


def config(tpl, values):
    return tpl.space("full").config(dict(zip(PARAMS, values)))


def run_once(dev, tpl, cfg, shape, rng):
    host = tpl.make_inputs(shape, rng)
    bufs = tpl.upload(dev, host, shape)
    tpl.poison(dev, bufs, shape)
    prog = tpl.compile(dev, cfg, shape)
    dev.run(tpl.launches(prog, bufs, cfg, shape))
    return tpl.read_output(dev, bufs, shape), tpl.reference(host, shape)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("values", [SEED_WINNER, KERNEL7, (256, 128, 16, 64, 32, 2, 4, 4, 512),
                                    (128, 128, 8, 64, 64, 4, 8, 4, 128)])
def test_matches_float64_at_admitted_odd_shapes(dev, tpl, values, shape, rng):
    cfg = config(tpl, values)
    assert tpl.shape_problems(cfg, shape) == []
    out, ref = run_once(dev, tpl, cfg, shape, rng)
    chk = compare(out, ref, "f32")
    assert chk.ok, chk.message


def test_every_legal_seed_point_is_correct(dev, tpl, rng):
    space = tpl.space("seed")
    legal, _ = space.split(dev.info.limits)
    assert len(legal) == 14
    for cfg in legal:
        out, ref = run_once(dev, tpl, cfg, (517, 1036, 388), rng)
        chk = compare(out, ref, "f32")
        assert chk.ok, (tpl.describe(cfg), chk.message)


def test_alpha_beta(dev, rng):
    tpl = CudaGemm(alpha=-0.75, beta=1.5)
    cfg = config(tpl, SEED_WINNER)
    out, ref = run_once(dev, tpl, cfg, (130, 132, 36), rng)
    assert compare(out, ref, "f32").ok


def test_timing_is_positive_and_flushes(dev, tpl, rng):
    shape = (1024, 1024, 1024)
    cfg = config(tpl, SEED_WINNER)
    bufs = tpl.upload(dev, tpl.make_inputs(shape, rng), shape)
    launches = tpl.launches(tpl.compile(dev, cfg, shape), bufs, cfg, shape) * 5
    for flush in (True, False):
        ms = dev.time(launches, flush_l2=flush)
        assert ms.shape == (5,) and np.all(np.isfinite(ms)) and np.all(ms > 0)
        assert np.median(ms) < 50.0  # 2 GFLOP: far under 50 ms on any GPU tilewise targets
    peer = tpl.peer_program(dev)
    ms = dev.time(tpl.peer_launches(peer, bufs, shape) * 3)
    assert np.all(ms > 0)


def test_limits_are_sane(dev):
    lim = dev.info.limits
    assert lim.warp_size == 32
    major, minor = (int(x) for x in lim.compute_capability.split("."))
    assert major >= 5
    assert lim.max_workgroup_storage_bytes >= 48 * 1024
    assert lim.shared_bytes_per_block_optin >= lim.max_workgroup_storage_bytes
    assert lim.shared_bytes_per_multiprocessor >= lim.shared_bytes_per_block_optin
    assert lim.registers_per_block >= 32 * 1024 and lim.registers_per_multiprocessor >= lim.registers_per_block
    assert lim.max_invocations_per_workgroup == 1024
    assert lim.max_threads_per_multiprocessor >= 1024
    assert lim.multiprocessors >= 1
    assert dev.info.fingerprint.startswith("cuda:CUDA:")
    assert dev.info.fingerprint == dev.info.fingerprint  # stable within a process
    assert dev.options[1] == f"-arch=sm_{major}{minor}" + ("a" if (major, minor) == (9, 0) else "")


def test_illegal_config_cannot_compile_and_says_which_rule(dev, tpl):
    from tilewise.kernels.gemm.cuda import _source

    bad = config(tpl, (128, 128, 16, 64, 64, 4, 8, 4, 256))
    with pytest.raises(ShaderCompileError) as info:
        dev.compile(_source(), entry=name_expression(bad))
    assert "warps_count" in str(info.value)


def test_launch_errors_are_launch_errors(dev, tpl, rng):
    shape = (64, 64, 64)
    cfg = config(tpl, SEED_WINNER)
    prog = tpl.compile(dev, cfg, shape)
    assert prog.meta["registers"] > 0 and prog.meta["block"] == (128, 1, 1)
    bufs = tpl.upload(dev, tpl.make_inputs(shape, rng), shape)
    prog.meta["block"] = (2048, 1, 1)  # more threads than any CUDA block may have
    try:
        with pytest.raises(LaunchError):
            dev.run(tpl.launches(prog, bufs, cfg, shape))
    finally:
        prog.meta["block"] = (128, 1, 1)

