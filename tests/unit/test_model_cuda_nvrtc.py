"""The model's CUDA sources under NVRTC itself (the compiler the CUDA device uses, with its options), no GPU needed:
every instantiation the executor launches compiles with no include path. nvcc is not enough: it includes the CUDA
runtime headers implicitly, so a kernel using a header-only name (INFINITY) compiles there and fails under NVRTC.
Skips unless libnvrtc is found (TILEWISE_NVRTC names the library file; else the loader's path and the
nvidia-cuda-nvrtc wheel's folder)."""

from __future__ import annotations

import ctypes
import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from tilewise.devices.cuda_nvrtc import find_nvrtc, nvrtc_options
from tilewise.kernels.attention.cuda import SOURCE_FILES as ATTENTION_FILES
from tilewise.kernels.cudasrc import model_source
from tilewise.kernels.matmul import cuda as mm

NVRTC = find_nvrtc()
pytestmark = pytest.mark.skipif(NVRTC is None, reason="libnvrtc not found")


def nvrtc_compile(source: str, entries: list[str]) -> tuple[int, str]:
    assert NVRTC is not None
    prog = ctypes.c_void_p()
    assert NVRTC.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"model.cu", 0, None, None) == 0
    try:
        for e in entries:
            assert NVRTC.nvrtcAddNameExpression(prog, e.encode()) == 0
        opts = [o.encode() for o in nvrtc_options("9.0")]
        rc = NVRTC.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
        size = ctypes.c_size_t()
        NVRTC.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        NVRTC.nvrtcGetProgramLog(prog, log)
        return rc, log.value.decode(errors="replace")
    finally:
        NVRTC.nvrtcDestroyProgram(ctypes.byref(prog))


def nvrtc_compile_split(source: str, entries: list[str]) -> tuple[int, str]:
    """`nvrtc_compile` with the entries split over one program per CPU (at most 4), compiled in threads (NVRTC's
    calls are thread-safe and ctypes lets go of the GIL): the first failing program's return code and log."""
    n = max(1, min(4, os.cpu_count() or 1, len(entries)))
    with ThreadPoolExecutor(n) as pool:
        results = list(pool.map(lambda part: nvrtc_compile(source, part), [entries[i::n] for i in range(n)]))
    return next((r for r in results if r[0] != 0), results[0])


def test_every_matmul_the_executor_launches_compiles_under_nvrtc():
    variants = mm.all_variants()
    entries = sorted({t.entry(t.default_config()) for t in variants} |
                     {t.reduce_entry() for t in variants if t.kind == "splitk"} |
                     {t.prep_entry() for t in variants if t.preps()})
    # 4 kinds x 3 formats x 3 epilogues x norm on/off; ring's, wg's, wgt's, ws's and wgr's 9 each (their norm is
    # the prologue's); 3 reductions, 2 preps
    assert len(entries) == 72 + 9 + 9 + 9 + 9 + 9 + 3 + 2
    rc, log = nvrtc_compile_split(mm.matmul_source(), entries)
    assert rc == 0, log[-3000:]


def test_the_short_row_and_split_seeds_compile_under_nvrtc():
    """What the defaults do not exercise: the short-row kernel's columns split over warps (WK) and columns a warp
    (CW), split-K's last block summing the slices (SR 1: split-K's shared flag declared in the kernel, wgr's in its
    code table) and the cluster kernels (SR 2: `__cluster_dims__` on a template parameter, distributed shared
    memory)."""
    rows = mm.CudaMatmul("rows", "nf4", "swiglu", True)
    split = mm.CudaMatmul("splitk", "nf4", "residual", False)
    wgr = mm.CudaMatmul("wgr", "nf4", "swiglu", False)
    entries = sorted({rows.entry(rows.config_of(v)) for v in mm.ROWS_SEED} |
                     {split.entry(split.config_of(v)) for v in mm.SPLITK_SEED if v["SR"]} |
                     {wgr.entry(wgr.config_of({**mm.DEFAULT_WGR, "KS": 4, "SR": sr})) for sr in (1, 2)})
    assert any(e.startswith("nf4_mm_rows") and e.endswith(", 8, 1>") for e in entries)
    assert any(e.startswith("nf4_mm_rows") and e.endswith(", 4>") for e in entries)
    assert any(e.startswith("nf4_mm_splitk<") for e in entries)
    assert {e.split("<")[0] for e in entries} >= {"nf4_mm_splitk_cluster", "nf4_mm_wgr_cluster"}
    rc, log = nvrtc_compile(mm.matmul_source(), entries)
    assert rc == 0, log[-3000:]


@pytest.mark.parametrize(("family", "filenames", "entries"), [
    ("rowops", ("rowops.cu",), ["rmsnorm<128>", "embed<0, 128>", "embed<1, 128>", "embed<2, 128>", "head<256>",
                             "copy_words<256>", "copy_pairs<256>"]),
    ("shortconv", ("shortconv.cu",), ["shortconv<128, 3, 1>", "shortconv<32, 4, 16>"]),
    ("attention", ATTENTION_FILES, ["qknorm_rope<16>", "qknorm_rope<64>", "attention<16, 4>", "attention<64, 4>",
                                   "attention<48, 2>", "attention_tiled<64, 32, 16>", "attention_tiled<48, 16, 8>",
                                   "attention_mma<64, 4, 1, 0>", "attention_mma<64, 8, 4, 1>",
                                   "attention_mma<128, 2, 2, 0>", "attention_mma<16, 1, 1, 1>"]),
])
def test_row_ops_conv_and_attention_compile_under_nvrtc(family, filenames, entries):
    rc, log = nvrtc_compile(model_source(family, *filenames), entries)
    assert rc == 0, log[-3000:]


def test_an_illegal_config_fails_under_nvrtc_with_the_rule_name():
    rc, log = nvrtc_compile(mm.matmul_source(), ["nf4_mm_rows<0, 2, 1, 128, 32, 1, 1>"])
    assert rc != 0 and "rows_1_16" in log
