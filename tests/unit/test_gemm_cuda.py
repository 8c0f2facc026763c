"""The CUDA warp-tiling GEMM template without a GPU: seed 003's rules, spaces, shapes, and the no-CuPy path."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tilewise.devices.profiles import get_profile
from tilewise.errors import DeviceUnavailable
from tilewise.kernels.gemm.cuda import (
    DEVICE_RULES,
    KERNEL7,
    PARAMS,
    SEED_POINTS,
    SEED_RULES,
    SEED_WINNER,
    CudaGemm,
    min_registers_per_thread,
)

WARPSIZE = 32


def seed_cfg_valid(BM, BN, BK, WM, WN, WNITER, TM, TN, NT):
    """Seed 003's cfg_valid, transcribed line by line (C int semantics = Python's on positive ints)."""
    # block must be a whole number of warps, tiled evenly by warp tiles
    if NT % WARPSIZE != 0:
        return False
    if BM % WM != 0 or BN % WN != 0:
        return False
    if (BM // WM) * (BN // WN) != NT // WARPSIZE:
        return False

    # a warp's WM x WN rectangle must decompose into whole WMITER x WNITER steps
    denom = WARPSIZE * TM * TN * WNITER
    if denom <= 0 or (WM * WN) % denom != 0:
        return False
    WMITER = (WM * WN) // denom
    if WMITER < 1 or WM % WMITER != 0 or WN % WNITER != 0:
        return False

    # each sub-tile must be covered by exactly 32 threads
    WSUBM, WSUBN = WM // WMITER, WN // WNITER
    if WSUBM % TM != 0 or WSUBN % TN != 0:
        return False
    if (WSUBM // TM) * (WSUBN // TN) != WARPSIZE:
        return False

    # float4 vectorization requires 4-element alignment everywhere
    if BK % 4 != 0 or BN % 4 != 0 or TN % 4 != 0:
        return False

    # the SMEM load loops must tile each cache exactly
    if (NT * 4) % BK != 0:
        return False
    rowStrideA = (NT * 4) // BK
    if rowStrideA < 1 or BM % rowStrideA != 0:
        return False
    if NT % (BN // 4) != 0:
        return False
    rowStrideB = NT // (BN // 4)
    if rowStrideB < 1 or BK % rowStrideB != 0:
        return False

    # every output element must be owned by exactly one thread
    if NT * WMITER * TM * WNITER * TN != BM * BN:
        return False

    # static __shared__ is capped at 48KB without an opt-in
    if (BM * BK + BK * BN) * 4 > 48 * 1024:
        return False
    # accumulators alone above ~128 registers guarantees spilling
    return WMITER * TM * WNITER * TN <= 128


VALUES = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 512, 1024]
POW2 = [2, 4, 8, 16, 32, 64, 128, 256, 512]
TEMPLATE = CudaGemm()
FULL = TEMPLATE.space("full")
SM90 = get_profile("sm_90")


def cfg(values) -> object:
    return FULL.config(dict(zip(PARAMS, values)))


@settings(max_examples=3000, deadline=None)
@given(st.tuples(*[st.sampled_from(VALUES)] * 9))
def test_rules_agree_with_seed_cfg_valid_on_random_tuples(values):
    """Without device limits, the Space's verdict is exactly seed 003's cfg_valid."""
    assert FULL.is_legal(cfg(values)) == seed_cfg_valid(*values)


@settings(max_examples=3000, deadline=None)
@given(st.tuples(*[st.sampled_from(POW2)] * 9))
def test_rules_agree_with_seed_cfg_valid_on_power_of_two_tuples(values):
    """Powers of two hit the legal region far more often than arbitrary values do."""
    legal = FULL.is_legal(cfg(values))
    assert legal == seed_cfg_valid(*values)
    if FULL.is_legal(cfg(values), SM90):  # device limits only ever remove configs
        assert legal


def test_rules_are_the_seeds_checks_in_its_order_then_device_limits():
    assert [r.name for r in SEED_RULES] == [
        "whole_warps", "warp_tiles_divide", "warps_count", "wmiter_integral", "subtile_32_threads",
        "float4_alignment", "load_strides", "output_owned_once", "static_smem_48k", "accumulators_128"]
    assert all(r.needs_limits for r in DEVICE_RULES)
    assert [r.name for r in FULL.rules] == [r.name for r in SEED_RULES + DEVICE_RULES]


def test_every_full_grid_config_agrees_with_seed_cfg_valid():
    legal = 0
    for c in FULL:
        ok = FULL.is_legal(c)
        assert ok == seed_cfg_valid(*c.values())
        legal += ok
    assert 500 < legal < FULL.size / 4  # most of the grid is illegal, but a real sweep remains


def test_seed_space_is_the_sixteen_points_with_two_illegal():
    space = TEMPLATE.space("seed")
    configs = list(space)
    assert len(configs) == 16 == space.size
    assert [tuple(c.values()) for c in configs] == list(SEED_POINTS)
    legal, illegal = space.split(SM90)
    assert len(legal) == 14
    first_rules = sorted(why[0].split(":")[0] for _, why in illegal)
    assert first_rules == ["warps_count", "wmiter_integral"]
    named = {tuple(c.values()) for c in legal}
    assert KERNEL7 in named and SEED_WINNER in named
    for bk in (8, 16, 32):  # 128x128 at BK 8/16/32 (seed: 5.00/4.66/4.91 ms)
        assert (128, 128, bk, 64, 64, 4, 8, 4, 128) in named
    assert any(p[:3] == (256, 128, 16) and p[8] == 512 for p in named)  # the one that finished last


def test_illegal_reasons_carry_the_numbers():
    why = FULL.why_illegal(cfg((128, 128, 16, 64, 64, 4, 8, 4, 256)))
    assert why[0] == "warps_count: (128/64)*(128/64) = 4 warp tiles != NT/32 = 8 warps"
    why = FULL.why_illegal(cfg((256, 256, 32, 64, 64, 4, 8, 4, 512)))
    assert why == ["static_smem_48k: (BM*BK + BK*BN)*4 = 65536 bytes > 49152 (static __shared__ cap)"]
    why = FULL.why_illegal(cfg((128, 128, 16, 64, 64, 4, 8, 4, 100)))
    assert why[0].startswith("whole_warps: NT = 100")


def test_device_limits_reject_what_the_seed_rules_allow():
    c = cfg((256, 256, 16, 32, 64, 1, 4, 4, 1024))  # legal for the seed, but 1024 threads x >= 92 registers
    assert seed_cfg_valid(*c.values())
    why = FULL.why_illegal(c, SM90)
    assert why and why[0].startswith("registers_per_block:")
    assert str(1024 * min_registers_per_thread(c)) in why[0]
    small = get_profile("webgpu-default")  # 256 threads, 16 KiB: the same rules read any limits
    why = FULL.why_illegal(cfg((128, 128, 32, 64, 64, 4, 8, 4, 128)), small)  # 32 KiB of shared memory
    assert [w.split(":")[0] for w in why] == ["shared_per_block"]


def test_dry_run_lists_legal_and_illegal_without_a_gpu():
    legal, illegal = FULL.split(SM90)
    assert legal and illegal
    assert all(FULL.why_illegal(c, SM90) == [] for c in legal[:50])
    assert all(why and ":" in why[0] for _, why in illegal[:50])


def test_shapes_the_template_refuses_name_the_rule():
    c = cfg(SEED_WINNER)
    assert TEMPLATE.shape_problems(c, (346, 2560, 1024)) == []
    assert TEMPLATE.shape_problems(c, (1, 4, 4)) == []
    probs = TEMPLATE.shape_problems(c, (64, 66, 30))
    assert any("N = 66" in p for p in probs) and any("K = 30" in p for p in probs)
    assert any(p.startswith("grid_y") for p in TEMPLATE.shape_problems(c, (128 * 65536, 4, 4)))
    bad = TEMPLATE.shape_problems(c, (0, 4, 4))  # a shape the problem refuses is a reason, as for every template
    assert len(bad) == 1 and bad[0].startswith("shape: gemm takes a shape M,N,K of positive sizes")


def test_reference_counts_and_tile_waste(rng):
    shape = (37, 68, 20)
    host = TEMPLATE.make_inputs(shape, rng)
    assert host["a"].shape == (37, 20) and host["b"].shape == (20, 68)
    assert np.all(host["a"] != 0)
    ref = TEMPLATE.reference(host, shape)
    np.testing.assert_allclose(ref, host["a"].astype(np.float64) @ host["b"].astype(np.float64))
    assert TEMPLATE.flops(shape) == 2 * 37 * 68 * 20
    assert TEMPLATE.bytes_moved(shape) == 4 * (37 * 20 + 20 * 68 + 37 * 68)
    assert TEMPLATE.tile_waste(cfg(SEED_WINNER), (346, 2560, 1024)) == pytest.approx(384 / 346)
    scaled = CudaGemm(alpha=0.5, beta=2.0)
    host = scaled.make_inputs(shape, rng)
    np.testing.assert_allclose(scaled.reference(host, shape), 0.5 * host["a"].astype(np.float64) @ host["b"]
                               + 2.0 * host["c"])


def test_source_and_name_expression():
    c = cfg(SEED_WINNER)
    src = TEMPLATE.source(c)
    assert "constexpr bool cfg_valid(" in src and "static_assert(FAIL != 10" in src
    assert src.rstrip().endswith("sgemm_warptile<128, 64, 16, 64, 32, 2, 4, 4, 128>")
    assert TEMPLATE.describe(c) == "128x64x16 W64x32 WNITER2 T4x4 128t"


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is installed here")
def test_without_cupy_the_cuda_device_says_how_to_install():
    from tilewise.devices import get_device
    from tilewise.devices.cuda_info import list_cuda_devices

    with pytest.raises(DeviceUnavailable) as info:
        get_device("cuda")
    assert "pip install 'tilewise[cuda]'" in str(info.value)
    with pytest.raises(DeviceUnavailable):
        list_cuda_devices()


def test_importing_the_cuda_modules_does_not_import_cupy():
    code = ("import sys, tilewise, tilewise.devices.cuda, tilewise.kernels.gemm.cuda; "
            "assert 'cupy' not in sys.modules, 'cupy imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_first_error_line_picks_the_error():
    from tilewise.devices.cuda import first_error_line, nvrtc_options

    log = ("gemm.cu(112): warning: something\ngemm.cu(110): error: static assertion failed with \"warps_count: x\"\n"
           "  detected during instantiation\n1 error detected")
    assert first_error_line(log) == 'gemm.cu(110): error: static assertion failed with "warps_count: x"'
    assert nvrtc_options("9.0") == ("-std=c++17", "-arch=sm_90a")  # Hopper's own target: wgmma
    assert nvrtc_options("8.9")[1] == "-arch=sm_89"
    assert nvrtc_options("12.0")[1] == "-arch=sm_120"
