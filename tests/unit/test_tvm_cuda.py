"""conv1d scheduled with TVM for CUDA, without a GPU: the emitted source per staging scope, the parsed argument
order, rules refusing illegal configs before TVM runs, and the emitted kernels run on the host (each CUDA thread
an OS thread, `__syncthreads` a barrier) against the float64 reference through the template's own launches."""

from __future__ import annotations

import re
import shutil
import sys
import types
from dataclasses import replace

import numpy as np
import pytest
from host_cuda import HostCuda

from tilewise.devices.profiles import get_profile
from tilewise.errors import ConfigError, DeviceUnavailable
from tilewise.kernels.conv1d import tvm_cuda
from tilewise.kernels.conv1d.tvm_cuda import TvmCudaConv1d, emit_cuda, fmt
from tilewise.kernels.gemm import tvm_cuda as gemm_tvm_cuda
from tilewise.kernels.gemm.tvm_cuda import TvmCudaGemm, gemm_fmt
from tilewise.kernels.registry import get_template
from tilewise.kernels.tvm.cuda import device_source, parse_kernel
from tilewise.tune.verify import compare

pytest.importorskip("tvm")

SM90 = get_profile("sm_90")
TPL = TvmCudaConv1d()


def cfg(NT=64, TPT=4, RK=8, STAGE="local"):
    return TPL.space("full").config(NT=NT, TPT=TPT, RK=RK, STAGE=STAGE)


def kernel_body(src: str) -> str:
    return src[src.rindex('extern "C"'):]


def test_registered_as_conv1d_on_cuda():
    tpl = get_template("conv1d", "cuda")
    assert isinstance(tpl, TvmCudaConv1d) and tpl.backend == "cuda"


@pytest.mark.parametrize("c", [cfg(TPT=4, RK=8), cfg(TPT=1, RK=1), cfg(NT=128, TPT=8, RK=16)], ids=fmt)
def test_staging_scope_decides_shared_arrays_and_barriers(c):
    shared = TPL.source(c.replace(STAGE="shared"), (1000, 16))
    local = TPL.source(c.replace(STAGE="local"), (1000, 16))
    glob = TPL.source(c.replace(STAGE="global"), (1000, 16))
    tile_halo = c.NT * c.TPT + c.RK - 1
    assert re.search(rf"__shared__ alignas\(\d+\) float Apad_shared_ptr\[{tile_halo}\];", shared)
    assert "__syncthreads()" in shared
    for src in (local, glob):
        assert "__shared__" not in src and "__syncthreads" not in src
    window = c.TPT + c.RK - 1
    if window > 1:  # a one-element window is a scalar, not an array
        assert re.search(rf"float Apad_local_ptr\[{window}\];", local)
    assert "Apad_local" not in glob and "Apad_shared" not in glob


def test_parsed_argument_order_matches_the_emitted_signature():
    src = emit_cuda(cfg(), 1000, 16)
    sig = parse_kernel(src)
    assert sig.name == f"{tvm_cuda.kernel_symbol(cfg())}_kernel"
    assert sig.launch_bounds == 64
    params = re.search(rf"void __launch_bounds__\(64\) {sig.name}\(([^)]*)\) \{{", src).group(1)
    assert tuple(re.findall(r"float\* __restrict__ (\w+)_ptr", params)) == sig.arg_order
    assert sig.arg_order == ("A", "B", "W")  # TVM orders by name: not the function's (A, W, B)


def test_parse_refuses_scalar_parameters_and_several_kernels():
    one = 'extern "C" __global__ void k(float* __restrict__ A_ptr, int n) {'
    with pytest.raises(Exception, match="parameter this template cannot pass: 'int n'"):
        parse_kernel(one)
    two = 'extern "C" __global__ void a(float* __restrict__ A_ptr) {\n}\nextern "C" __global__ void b(float* x) {'
    with pytest.raises(Exception, match="found 2"):
        parse_kernel(two)


def test_device_source_drops_only_the_include_preamble():
    src = emit_cuda(cfg(STAGE="shared"), 1000, 16)
    dev = device_source(src)
    assert "#include" in src and "#include" not in dev
    assert kernel_body(dev) == kernel_body(src)


def _forbid_tvm(monkeypatch):
    monkeypatch.setattr(tvm_cuda, "schedule", lambda *a: pytest.fail("TVM ran for an illegal config"))


def test_without_tvm_the_error_names_the_install_command(monkeypatch):
    for name in [m for m in sys.modules if m == "tvm" or m.startswith("tvm.")]:
        monkeypatch.setitem(sys.modules, name, None)  # `import tvm` now raises ImportError
    with pytest.raises(DeviceUnavailable, match="TVM-scheduled CUDA templates") as err:
        TPL.source(cfg(), (1000, 16))
    assert "pip install 'tilewise[tvm]'" in err.value.fix
    with pytest.raises(DeviceUnavailable):
        GEMM.source(gcfg(), (128, 128, 64))


def test_illegal_configs_are_refused_with_rule_and_numbers_before_tvm(monkeypatch):
    _forbid_tvm(monkeypatch)
    # 1024 threads share 65536 registers: 64 each, and the window of 16 outputs x 32 taps needs 95
    with pytest.raises(ConfigError, match=r"registers: registers = TPT \+ \(TPT \+ RK - 1\) \+ RK = "
                                          r"16 \+ 47 \+ 32 = 95 > 64 per thread"):
        TPL.source(cfg(NT=1024, TPT=16, RK=32), (1000, 64))
    tight = replace(SM90, max_invocations_per_workgroup=256, max_workgroup_storage_bytes=4096)
    fake = types.SimpleNamespace(info=types.SimpleNamespace(limits=tight))
    with pytest.raises(ConfigError, match=r"threads_per_block: NT = 512 threads per block > the device's limit 256"):
        TPL.compile(fake, cfg(NT=512, TPT=1, RK=1, STAGE="global"), (1000, 16))
    # 4*(256*8 + 2*8 - 1) = 8252 bytes of tile, halo and taps
    with pytest.raises(ConfigError, match=r"shared_memory: .* = 8252 bytes > 4096 per block"):
        TPL.compile(fake, cfg(NT=256, TPT=8, RK=8, STAGE="shared"), (1000, 16))
    with pytest.raises(ConfigError, match=r"reduction_split: N % RK = 20 % 8 = 4 != 0"):
        TPL.source(cfg(RK=8), (1000, 20))


def test_seed_space_is_legal_on_sm_90_and_full_grid_refusals_name_rules():
    legal, illegal = TPL.space("seed").split(SM90)
    assert len(legal) == 15 and not illegal
    _, bad = TPL.space("full").split(SM90)
    rules = {r.split(":")[0] for _, why in bad for r in why}
    assert rules == {"registers", "shared_memory"}  # 1024 threads x 16 outputs staged: 65788 bytes > 48 KiB
    huge = TPL.space("full").config(NT=1024, TPT=16, RK=4, STAGE="shared")
    assert TPL.space("full").why_illegal(huge, SM90) == [
        "shared_memory: __shared__ = 4*(NT*TPT + 2*RK - 1) = 4*(1024*16 + 2*4 - 1) = 65564 bytes > 49152 per block"]


def test_flops_bytes_and_padding():
    assert TPL.flops((1000, 16)) == 2 * 1000 * 16
    assert TPL.bytes_moved((1000, 16)) == 4 * (1000 + 16 + 1015)
    c = cfg(NT=64, TPT=8)  # tile 512: 1015 outputs padded to 1024
    assert TPL.tile_waste(c, (1000, 16)) == pytest.approx(1024 / 1015)
    assert tvm_cuda.alloc_length(1000, 16) % (c.NT * c.TPT) == 0


# ---- the emitted kernels, run on the host -------------------------------------------------------------------
@pytest.mark.skipif(shutil.which("g++") is None or sys.platform != "linux", reason="needs g++ on Linux")
def test_emitted_kernels_match_float64_when_run_on_the_host(tmp_path, rng):
    dev = HostCuda(tmp_path)
    shape = (700, 16)  # 715 outputs: partial last tile for every seed config, both pad edges inside a block
    legal, _ = TPL.space("seed").split(SM90)
    programs = [(c, TPL.compile(dev, c, shape)) for c in legal]
    dev.build()
    for c, prog in programs:
        assert prog.meta["arg_order"] == ("A", "B", "W")
        host = TPL.make_inputs(shape, rng)
        bufs = TPL.upload(dev, host, shape)
        TPL.poison(dev, bufs, shape)
        dev.run(TPL.launches(prog, bufs, c, shape))
        check = compare(TPL.read_output(dev, bufs, shape), TPL.reference(host, shape), "f32")
        assert check.ok, (fmt(c), check.message)


def test_launch_refuses_a_program_compiled_for_another_shape(tmp_path):
    dev = HostCuda(tmp_path)
    prog = TPL.compile(dev, cfg(), (1000, 16))
    bufs = TPL.upload(dev, TPL.make_inputs((900, 16), np.random.default_rng(1)), (900, 16))
    with pytest.raises(ConfigError, match=r"compiled for shape \(1000, 16\), launched at \(900, 16\)"):
        TPL.launches(prog, bufs, cfg(), (900, 16))


@pytest.mark.skipif(shutil.which("g++") is None or sys.platform != "linux", reason="needs g++ on Linux")
def test_large_blocks_and_long_windows_match_float64_on_the_host(tmp_path, rng):
    dev = HostCuda(tmp_path)
    shape = (3001, 64)  # one partial block of 16384 or 2048 outputs, several of 512
    configs = [cfg(NT=1024, TPT=16, RK=16, STAGE="local"), cfg(NT=1024, TPT=2, RK=64, STAGE="shared"),
               cfg(NT=32, TPT=16, RK=32, STAGE="global"), cfg(NT=512, TPT=1, RK=4, STAGE="shared")]
    programs = [(c, TPL.compile(dev, c, shape)) for c in configs]
    dev.build()
    for c, prog in programs:
        host = TPL.make_inputs(shape, rng)
        bufs = TPL.upload(dev, host, shape)
        TPL.poison(dev, bufs, shape)
        dev.run(TPL.launches(prog, bufs, c, shape))
        check = compare(TPL.read_output(dev, bufs, shape), TPL.reference(host, shape), "f32")
        assert check.ok, (fmt(c), check.message)


# ---- GEMM ------------------------------------------------------------------------------------------------------
GEMM = TvmCudaGemm()


def gcfg(TY=16, TX=16, TM=4, TN=4, KB=8, STAGE="local"):
    return GEMM.space("full").config(TY=TY, TX=TX, TM=TM, TN=TN, KB=KB, STAGE=STAGE)


def test_gemm_registered_and_staging_scope_decides_shared_arrays():
    assert isinstance(get_template("gemm-tvm", "cuda"), TvmCudaGemm)
    shared = GEMM.source(gcfg(STAGE="shared"), (128, 128, 64))
    local = GEMM.source(gcfg(STAGE="local"), (128, 128, 64))
    assert re.search(r"__shared__ alignas\(\d+\) float A_shared_ptr\[512\];", shared)  # (TY*TM, KB) = 64 x 8
    assert "__syncthreads()" in shared and "__shared__" not in local and "__syncthreads" not in local
    assert re.search(r"float A_local_ptr\[32\];", local)  # (TM, KB) = 4 x 8
    sig = parse_kernel(shared)
    assert sig.arg_order == ("A", "B", "C") and sig.launch_bounds == 256


def test_gemm_illegal_configs_are_refused_before_tvm(monkeypatch):
    monkeypatch.setattr(gemm_tvm_cuda, "gemm_schedule", lambda *a: pytest.fail("TVM ran for an illegal config"))
    fake = types.SimpleNamespace(info=types.SimpleNamespace(limits=replace(SM90, max_invocations_per_workgroup=256)))
    with pytest.raises(ConfigError, match=r"threads_per_block: TY\*TX = 32\*16 = 512 threads per block \(TY = 32\) "
                                          r"> the device's limit 256"):
        GEMM.compile(fake, gcfg(TY=32, TX=16, TM=1, TN=1, KB=1, STAGE="global"), (1024, 1024, 1024))
    with pytest.raises(ConfigError, match=r"registers: registers = TM\*TN \+ KB\*\(TM \+ TN\) = 576 > 255"):
        GEMM.source(gcfg(TY=4, TX=4, TM=8, TN=8, KB=32), (1024, 1024, 1024))
    with pytest.raises(ConfigError, match=r"shared_memory: __shared__ = 4\*KB\*\(TY\*TM \+ TX\*TN\) = "
                                          r"4\*32\*\(32\*8 \+ 32\*8\) = 65536 bytes > 49152"):
        GEMM.source(gcfg(TY=32, TX=32, TM=8, TN=8, KB=32, STAGE="shared"), (1024, 1024, 1024))
    with pytest.raises(ConfigError, match=r"row_split: M % \(TY\*TM\) = 100 % 64 = 36 != 0"):
        GEMM.source(gcfg(), (100, 128, 64))


@pytest.mark.skipif(shutil.which("g++") is None or sys.platform != "linux", reason="needs g++ on Linux")
def test_gemm_emitted_kernels_match_float64_on_the_host(tmp_path, rng):
    dev = HostCuda(tmp_path)
    shape = (64, 128, 48)  # two block columns of the 64x64 tiles, eight of 16x16, K in 3 steps of 16
    legal, illegal = GEMM.space("seed").split(SM90)
    assert len(legal) == 12 and not illegal
    configs = [*legal, gcfg(TY=8, TX=4, TM=2, TN=8, KB=4, STAGE="shared")]  # a non-square block and tile
    programs = [(c, GEMM.compile(dev, c, shape)) for c in configs]
    dev.build()
    for c, prog in programs:
        host = GEMM.make_inputs(shape, rng)
        bufs = GEMM.upload(dev, host, shape)
        GEMM.poison(dev, bufs, shape)
        dev.run(GEMM.launches(prog, bufs, c, shape))
        check = compare(GEMM.read_output(dev, bufs, shape), GEMM.reference(host, shape), "f32")
        assert check.ok, (gemm_fmt(c), check.message)
