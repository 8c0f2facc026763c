"""TVM-emitted conv1d kernels under nvcc (no GPU needed): every seed config compiles for sm_90 in one translation
unit, exactly as the CUDA device receives the source, and the registers rule's budget matches what ptxas does;
the same for the GEMM seed configs."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tilewise.devices.profiles import get_profile
from tilewise.kernels.conv1d.tvm_cuda import TvmCudaConv1d, emit_cuda, kernel_symbol, registers
from tilewise.kernels.gemm.tvm_cuda import TvmCudaGemm, gemm_symbol
from tilewise.kernels.tvm.cuda import device_source

pytest.importorskip("tvm")
NVCC = shutil.which("nvcc")
pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc (CUDA toolkit) not found")

TPL = TvmCudaConv1d()
SM90 = get_profile("sm_90")
SHAPE = (4096, 64)


def ptxas_report(tmp_path, configs) -> dict[str, tuple[int, int]]:
    """kernel name -> (registers, spill store bytes) from one `nvcc -c -arch=sm_90 -Xptxas -v` over all configs."""
    src = tmp_path / "conv1d_tvm.cu"
    src.write_text("".join(device_source(emit_cuda(c, *SHAPE)) for c in configs))
    res = subprocess.run([NVCC, "-std=c++17", "-arch=sm_90", "-c", "-Xptxas", "-v", str(src), "-o", "k.o"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    report = {}
    for name, body in re.findall(r"Compiling entry function '(\w+)'(.*?Used \d+ registers)", res.stderr, re.S):
        spill = re.search(r"(\d+) bytes spill stores", body)
        report[name] = (int(re.search(r"Used (\d+) registers", body).group(1)), int(spill.group(1)) if spill else 0)
    return report


def test_every_seed_config_compiles_for_sm_90_without_spills(tmp_path):
    legal, _ = TPL.space("seed").split(SM90)
    fits = TPL.space("full").config(NT=1024, TPT=16, RK=16, STAGE="local")  # registers(c) = 63 <= 64
    spills = fits.replace(RK=32)  # registers(c) = 95 > 64: refused by the rule
    assert TPL.space("full").is_legal(fits, SM90) and not TPL.space("full").is_legal(spills, SM90)
    report = ptxas_report(tmp_path, [*legal, fits, spills])
    assert set(report) == {f"{kernel_symbol(c)}_kernel" for c in [*legal, fits, spills]}
    for c in [*legal, fits]:
        regs, spill = report[f"{kernel_symbol(c)}_kernel"]
        assert spill == 0 and regs <= SM90.registers_per_block // c.NT, (c, regs, spill)
    assert registers(spills) == 95 and report[f"{kernel_symbol(spills)}_kernel"][1] > 0


def test_every_gemm_seed_config_compiles_for_sm_90_without_spills(tmp_path):
    gemm = TvmCudaGemm()
    legal, _ = gemm.space("seed").split(SM90)
    src = tmp_path / "gemm_tvm.cu"
    src.write_text("".join(device_source(gemm.source(c, (256, 256, 64))) for c in legal))
    res = subprocess.run([NVCC, "-std=c++17", "-arch=sm_90", "-c", "-Xptxas", "-v", str(src), "-o", "g.o"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    entries = re.findall(r"Compiling entry function '(\w+)'", res.stderr)
    assert sorted(entries) == sorted(f"{gemm_symbol(c)}_kernel" for c in legal)
    assert re.findall(r"(\d+) bytes spill stores", res.stderr) == ["0"] * len(legal)
