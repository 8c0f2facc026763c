"""The depthwise-separable conv2d scheduled with TVM for CUDA, without a GPU: registration, the emitted source per
staging scope, rules refusing illegal configs (with their numbers) before TVM runs, every seed config run on the
host (each CUDA thread an OS thread, `__syncthreads` a barrier) against the float64 reference at shapes with partial
tiles, and an nvcc compile check of the seed configs when the CUDA toolkit is installed."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import types
from dataclasses import replace

import numpy as np
import pytest
from host_cuda import HostCuda

from tilewise.devices.base import Program
from tilewise.devices.profiles import get_profile
from tilewise.errors import ConfigError
from tilewise.kernels.dwsep_conv2d import tvm_cuda as tvm_cuda_dwsep
from tilewise.kernels.dwsep_conv2d.tiling import fmt
from tilewise.kernels.dwsep_conv2d.tvm_cuda import TvmCudaDwsepConv2d, kernel_symbol
from tilewise.kernels.dwsep_conv2d.webgpu import WgslDwsepConv2d
from tilewise.kernels.registry import get_template
from tilewise.kernels.tvm.cuda import device_source, parse_kernel
from tilewise.tune.verify import compare

SM90 = get_profile("sm_90")
TPL = TvmCudaDwsepConv2d()
#: partial pixel and channel tiles for every seed tile, two images, padding on both edges of each block row
SHAPE = (2, 8, 5, 13, 20, 3, 1)
HOST = shutil.which("g++") is not None and sys.platform == "linux"


def cfg(BW=32, TPX=4, BO=32, TO=4, RC=4, STAGE="local"):
    return TPL.space("full").config(BW=BW, TPX=TPX, BO=BO, TO=TO, RC=RC, STAGE=STAGE)


# ---- without TVM: registration, rules, semantics -----------------------------------------------------------------
def test_registered_as_dwsep_conv2d_on_cuda_with_the_webgpu_shape_and_reference():
    tpl = get_template("dwsep-conv2d", "cuda")
    wgsl = WgslDwsepConv2d()
    assert isinstance(tpl, TvmCudaDwsepConv2d) and tpl.backend == "cuda" and tpl.name == wgsl.name
    assert tpl.shape_names == wgsl.shape_names == ("B", "C", "H", "W", "O", "K", "P")
    rng = np.random.default_rng(0)
    host = tpl.make_inputs(SHAPE, rng)
    assert tpl.reference(host, SHAPE).shape == (2, 20, 5, 13)
    np.testing.assert_array_equal(tpl.reference(host, SHAPE), wgsl.reference(host, SHAPE))
    assert tpl.flops(SHAPE) == wgsl.flops(SHAPE) == 2 * 2 * 5 * 13 * 8 * (9 + 20)
    assert tpl.bytes_moved(SHAPE) == wgsl.bytes_moved(SHAPE)


def test_seed_space_covers_each_scope_and_is_legal_on_sm_90():
    legal, illegal = TPL.space("seed").split(SM90)
    assert len(legal) == 12 and not illegal
    assert {c.STAGE for c in legal} == {"global", "shared", "local"}
    assert all(not TPL.shape_problems(c, s) for c in legal for s in (SHAPE, (1, 64, 56, 56, 128, 3, 1)))
    _, bad = TPL.space("full").split(SM90)
    rules = {r.split(":")[0] for _, why in bad for r in why}
    assert rules == {"channel_split", "threads_per_block", "registers"}  # the grid never reaches 48 KiB shared
    big = TPL.space("full").config(BW=64, TPX=1, BO=64, TO=2, RC=8, STAGE="shared")  # 2048 threads
    assert TPL.space("full").why_illegal(big, SM90) == [
        "threads_per_block: (BO/TO)*(BW/TPX) = (64/2)*(64/1) = 2048 threads per block > the device's limit 1024 "
        "(x at most 1024, y at most 1024)"]


def _forbid_tvm(monkeypatch):
    monkeypatch.setattr(tvm_cuda_dwsep, "schedule", lambda *a: pytest.fail("TVM ran for an illegal config"))


def test_illegal_configs_are_refused_with_rule_and_numbers_before_tvm(monkeypatch):
    _forbid_tvm(monkeypatch)
    with pytest.raises(ConfigError, match=r"pixel_split: BW % TPX = 8 % 16 = 8 != 0"):
        TPL.source(TPL.space("full").config(dict(cfg(BW=8), TPX=16)), SHAPE)
    tight = replace(SM90, max_invocations_per_workgroup=128, max_workgroup_storage_bytes=1024, registers_per_block=4096)
    fake = types.SimpleNamespace(info=types.SimpleNamespace(limits=tight))
    with pytest.raises(ConfigError, match=r"threads_per_block: \(BO/TO\)\*\(BW/TPX\) = \(16/1\)\*\(16/1\) = 256 "
                                          r"threads per block > the device's limit 128"):
        TPL.compile(fake, cfg(BW=16, TPX=1, BO=16, TO=1, RC=1, STAGE="global"), SHAPE)
    # 4*(RC*BW + BO*RC) = 4*(8*32 + 32*8) = 2048 bytes of depthwise values and weights
    with pytest.raises(ConfigError, match=r"shared_memory: __shared__ = 4\*\(RC\*BW \+ BO\*RC\) = "
                                          r"4\*\(8\*32 \+ 32\*8\) = 2048 bytes > 1024 per block"):
        TPL.compile(fake, cfg(RC=8, STAGE="shared"), SHAPE)
    # 4096 registers / 64 threads = 64 each; 16 accumulators + 32 depthwise values + 32 weights = 80
    with pytest.raises(ConfigError, match=r"registers: registers = TO\*TPX \+ RC\*TPX \+ TO\*RC = 80 > 64 per thread"):
        TPL.compile(fake, cfg(RC=8, STAGE="local"), SHAPE)
    with pytest.raises(ConfigError, match=r"reduction_split: C % RC = 12 % 8 = 4 != 0"):
        TPL.source(cfg(RC=8), (1, 12, 8, 8, 16, 3, 1))
    # at K=9 the local window of one channel is 9*(4+8) = 108 values and the taps 81, on top of 80
    with pytest.raises(ConfigError, match=r"window_registers: .* = 269 > 255 at K=9"):
        TPL.source(cfg(RC=8), (1, 16, 16, 16, 16, 9, 4))
    with pytest.raises(ConfigError, match=r"grid_rows: B\*Ho = 2\*40000 = 80000 > 65535"):
        TPL.source(cfg(), (2, 8, 40000, 4, 8, 1, 0))
    assert TPL.shape_problems(cfg(), (1, 8, 2, 2, 8, 5, 1))[0].startswith("shape: dwsep-conv2d kernel 5x5")


def test_launch_geometry_and_shape_check(tmp_path):
    dev = HostCuda(tmp_path)
    c = cfg(BW=16, TPX=2, BO=8, TO=2, RC=4, STAGE="shared")
    prog = TPL.compile(dev, c, SHAPE)
    assert prog.meta["block"] == (8, 4, 1) and prog.meta["grid"] == (1, 10, 3)  # 13 px, 2*5 rows, 20 channels
    assert sorted(prog.meta["arg_order"]) == ["DW", "Out", "PW", "X"]
    bufs = TPL.upload(dev, TPL.make_inputs((1, 8, 5, 13, 20, 3, 1), np.random.default_rng(1)), (1, 8, 5, 13, 20, 3, 1))
    with pytest.raises(ConfigError, match=r"compiled for shape \(2, 8, 5, 13, 20, 3, 1\), launched at"):
        TPL.launches(prog, bufs, c, (1, 8, 5, 13, 20, 3, 1))


# ---- with TVM: the emitted source --------------------------------------------------------------------------------
def test_staging_scope_decides_shared_arrays_barriers_and_windows():
    pytest.importorskip("tvm")
    shape = (1, 8, 8, 32, 32, 3, 1)
    c = cfg(BW=32, TPX=4, BO=32, TO=4, RC=4)
    shared = TPL.source(c.replace(STAGE="shared"), shape)
    local = TPL.source(c.replace(STAGE="local"), shape)
    glob = TPL.source(c.replace(STAGE="global"), shape)
    assert re.search(r"__shared__ alignas\(\d+\) float D_shared_ptr\[128\];", shared)  # (RC, BW) = 4 x 32
    assert re.search(r"__shared__ alignas\(\d+\) float PW_shared_ptr\[128\];", shared)  # (BO, RC) = 32 x 4
    assert "__syncthreads()" in shared
    for src in (local, glob):
        assert "__shared__" not in src and "__syncthreads" not in src
        assert re.search(r"float D_local_ptr\[16\];", src)  # (RC, TPX) depthwise values per thread
    assert re.search(r"float Xpad_local_ptr\[18\];", local)  # one channel's window: K x (TPX + K - 1) = 3 x 6
    assert re.search(r"float DW_local_ptr\[9\];", local) and re.search(r"float PW_local_ptr\[16\];", local)
    assert "Xpad_local" not in glob and "PW_local" not in glob
    sig = parse_kernel(shared)
    assert sig.name == f"{kernel_symbol(c.replace(STAGE='shared'))}_kernel" and sig.launch_bounds == 64
    assert "#include" not in device_source(shared)


# ---- the emitted kernels, run on the host -------------------------------------------------------------------
def _run_on_host(tmp_path, rng, cases):
    dev = HostCuda(tmp_path)
    programs = [(c, s, TPL.compile(dev, c, s)) for c, s in cases]
    dev.build()
    for c, shape, prog in programs:
        host = TPL.make_inputs(shape, rng)
        bufs = TPL.upload(dev, host, shape)
        TPL.poison(dev, bufs, shape)
        dev.run(TPL.launches(prog, bufs, c, shape))
        check = compare(TPL.read_output(dev, bufs, shape), TPL.reference(host, shape), "f32")
        assert check.ok, (fmt(c), shape, check.message)


@pytest.mark.skipif(not HOST, reason="needs g++ on Linux")
def test_every_seed_config_matches_float64_when_run_on_the_host(tmp_path, rng):
    pytest.importorskip("tvm")
    legal, _ = TPL.space("seed").split(SM90)
    _run_on_host(tmp_path, rng, [(c, SHAPE) for c in legal])


@pytest.mark.skipif(not HOST, reason="needs g++ on Linux")
def test_odd_kernels_padding_and_tiles_match_float64_on_the_host(tmp_path, rng):
    pytest.importorskip("tvm")
    cases = [(cfg(BW=8, TPX=2, BO=4, TO=2, RC=2, STAGE="local"), (1, 4, 9, 11, 6, 5, 2)),  # 5x5, pad 2
             (cfg(BW=8, TPX=2, BO=4, TO=2, RC=2, STAGE="shared"), (1, 4, 9, 11, 6, 5, 2)),
             (cfg(BW=64, TPX=4, BO=8, TO=8, RC=1, STAGE="shared"), (1, 3, 4, 70, 9, 1, 0)),  # 1x1, more px than BW
             (cfg(BW=64, TPX=4, BO=8, TO=8, RC=1, STAGE="local"), (1, 3, 4, 70, 9, 1, 0)),
             (cfg(BW=16, TPX=4, BO=8, TO=1, RC=2, STAGE="global"), (1, 2, 6, 6, 3, 3, 0))]  # no padding, O < BO
    _run_on_host(tmp_path, rng, cases)


# ---- nvcc (no GPU needed) ----------------------------------------------------------------------------------------
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (CUDA toolkit) not found")
def test_every_seed_config_compiles_for_sm_90_with_nvcc(tmp_path):
    pytest.importorskip("tvm")
    legal, _ = TPL.space("seed").split(SM90)
    shape = (1, 64, 56, 56, 128, 3, 1)
    src = tmp_path / "dwsep_tvm.cu"
    src.write_text("".join(device_source(TPL.source(c, shape)) for c in legal))
    res = subprocess.run([shutil.which("nvcc"), "-std=c++17", "-arch=sm_90", "-c", "-Xptxas", "-v", str(src), "-o",
                          "d.o"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    report = {name: int(spill) for name, spill in re.findall(
        r"Compiling entry function '(\w+)'.*?(\d+) bytes spill stores", res.stderr, re.S)}
    assert sorted(report) == sorted(f"{kernel_symbol(c)}_kernel" for c in legal)
    for c in legal:
        # the staged variants keep everything in registers; the global baseline's largest tile (RC8, 4x4) spills
        # a few bytes under ptxas 12.x (its predicated unrolled loads), which the rules do not promise against
        spill = report[f"{kernel_symbol(c)}_kernel"]
        assert spill == 0 if c.STAGE != "global" else spill <= 64, (fmt(c), spill)


def test_precompile_returns_programs_and_the_errors_of_illegal_configs(tmp_path):
    pytest.importorskip("tvm")
    dev = HostCuda(tmp_path)
    ok = cfg(BW=16, TPX=2, BO=8, TO=2, RC=4, STAGE="local")
    bad = cfg(RC=8)  # C = 12 is not a multiple of 8
    shape = (1, 12, 4, 9, 10, 3, 1)
    out = TPL.precompile(dev, [ok, bad], shape, workers=2)
    assert isinstance(out[ok], Program) and out[ok].meta["grid"] == (1, 4, 2)
    assert isinstance(out[bad], ConfigError) and "reduction_split" in out[bad].problem
    assert list(dev.sources) == [f"{kernel_symbol(ok)}_kernel"]


def test_cuda_ladder_mirrors_the_webgpu_ladder():
    from tilewise.ladder import LADDERS, get_ladder

    cuda, wgsl = get_ladder("dwsep-conv2d-gpu", "cuda"), LADDERS["dwsep-conv2d-gpu"]
    assert cuda.template().backend == "cuda" and cuda.device == "cuda"
    assert [r.name for r in cuda.rungs] == [r.name for r in wgsl.rungs]
    assert (cuda.shape, cuda.small_shape, cuda.staging_pairs) == (wgsl.shape, wgsl.small_shape, wgsl.staging_pairs)
    tiles = {k: v for k, v in wgsl.rungs[2].config.items() if k != "STAGE"}
    assert {k: v for k, v in cuda.rungs[2].config.items() if k != "STAGE"} == tiles
    assert [r.config["STAGE"] for r in cuda.rungs] == ["global", "global", "global", "shared", "local"]
    assert cuda.emitted_by_tvm and cuda.references is wgsl.references
