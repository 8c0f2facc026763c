"""CUDA compiles without a GPU (devices/cuda_nvrtc.py): a real template's source becomes a cubin for the device's
architecture with the kernel's lowered name, a refused source gives the device's compile error text, and the probe
and the prebuilt wrapper route compiles as a Ray run needs. Skips unless libnvrtc is found."""

from __future__ import annotations

import random

import pytest

from tilewise.devices.base import DeviceInfo, Program, source_hash
from tilewise.devices.cuda_nvrtc import (
    CompileFailure,
    CompileProbe,
    Prebuilt,
    compile_cubin,
    compile_error,
    compile_key,
    find_nvrtc,
    first_error_line,
    nvrtc_options,
    nvrtc_version,
    try_compile,
)
from tilewise.devices.profiles import PROFILES
from tilewise.errors import ShaderCompileError
from tilewise.kernels.gemm import cuda as cuda_gemm

pytestmark = pytest.mark.skipif(find_nvrtc() is None, reason="libnvrtc not found")
OPTIONS = nvrtc_options("9.0")


def _config(seed: int) -> object:
    legal = cuda_gemm.CudaGemm().space("seed").legal(PROFILES["sm_90"])
    return random.Random(seed).choice(legal)


def test_a_gemm_config_compiles_to_an_sm90_cubin_with_its_lowered_name():
    cfg = _config(11)
    entry = cuda_gemm.name_expression(cfg)
    got = compile_cubin(cuda_gemm._source(), entry, OPTIONS)
    assert got.cubin[:4] == b"\x7fELF" and len(got.cubin) > 1000
    assert got.lowered_name.startswith("_Z") and "sgemm_warptile" in got.lowered_name
    assert str(cfg.BM) in got.lowered_name and got.options == OPTIONS
    assert got.key == source_hash(cuda_gemm._source(), entry, *OPTIONS)  # the key CUDADevice.compile gives


def test_a_refused_source_gives_the_first_error_line_the_device_gives():
    src = cuda_gemm._source() + '\nstatic_assert(sizeof(float) == 0, "refused_here");\n'
    entry = cuda_gemm.name_expression(_config(5))
    with pytest.raises(ShaderCompileError) as err:
        compile_cubin(src, entry, OPTIONS, label="gemm_cuda[x]")
    msg = str(err.value.problem)
    assert msg.startswith("NVRTC failed on gemm_cuda[x]: kernel.cu(") and "refused_here" in msg
    failure = try_compile(src, entry, OPTIONS)
    assert isinstance(failure, CompileFailure) and "refused_here" in failure.log
    # CuPy names its program after a temporary file: the same error there gives the same message
    line = msg.split(": ", 1)[1].split("kernel.cu", 1)[1]
    cupy_log = f"/tmp/tmpq8x/9f3e_2.cubin.cu{line}\n1 error detected"
    assert compile_error("gemm_cuda[x]", cupy_log).problem == msg
    assert first_error_line("gemm.cu(3): error: x") == "gemm.cu(3): error: x"  # a plain name stays


class _Recorder:
    """What Prebuilt wraps: records which path each kernel took."""

    options = OPTIONS
    info = DeviceInfo("cuda", "recorder", "discrete", "CUDA", "0", "NVIDIA", PROFILES["sm_90"])

    def __init__(self) -> None:
        self.compiled: list[str] = []
        self.loaded: list[str] = []

    def compile(self, source, entry="main", constants=None, name=None):
        self.compiled.append(entry)
        return Program(name or entry, None, "k", {}, {})

    def load_compiled(self, compiled, name=None, constants=None):
        self.loaded.append(compiled.lowered_name)
        return Program(name or compiled.entry, None, compiled.key, dict(constants or {}), {})


def test_the_probe_names_what_a_template_compiles_and_prebuilt_loads_it():
    tpl, cfg = cuda_gemm.CudaGemm(), _config(3)
    probe = CompileProbe(_Recorder.info)
    tpl.compile(probe, cfg, (64, 64, 64))
    (req,) = probe.requests
    assert req.entry == cuda_gemm.name_expression(cfg) and req.options == OPTIONS
    bad = "sgemm_warptile<0>"  # a key of its own: what the CPU compile refused
    rec = _Recorder()
    dev = Prebuilt(rec)
    dev.shipped = {req.key: compile_cubin(req.source, req.entry, req.options),
                   compile_key(req.source, bad, OPTIONS): CompileFailure("/tmp/a/b.cu(7): error: no", bad)}
    prog = tpl.compile(dev, cfg, (64, 64, 64))
    assert rec.loaded and rec.loaded[0].startswith("_Z") and not rec.compiled
    assert prog.meta["block"] == (cfg.NT, 1, 1)
    with pytest.raises(ShaderCompileError, match=r"NVRTC failed on lbl: kernel\.cu\(7\): error: no"):
        dev.compile(req.source, bad, name="lbl")
    dev.compile("other source", "k<1>")  # nothing shipped for it: the device compiles
    assert rec.compiled == ["k<1>"] and (dev.loaded, dev.compiled) == (2, 1)


@pytest.mark.parametrize("kind", ["rows", "mma", "splitk", "pipe", "ring", "wg", "ws"])
def test_every_model_matmul_kind_names_its_kernels_to_the_probe(kind):
    """`tune model --device cuda --ray` compiles the classifier's kernels in CPU tasks only where the probe can run
    their templates' compile: the dynamic-shared-memory kinds (pipe, ring, wg, ws) used to fail on the probe and were
    compiled on the GPU worker instead. Each one's default config becomes a cubin here."""
    from tilewise.kernels.matmul.cuda import CudaMatmul

    probe = CompileProbe(_Recorder.info)
    tpl = CudaMatmul(kind, "nf4", "swiglu", True)
    tpl.compile(probe, tpl.default_config(), (40, 128, 64))
    assert probe.requests and all(r.options == OPTIONS for r in probe.requests)
    got = compile_cubin(probe.requests[-1].source, probe.requests[-1].entry, OPTIONS)
    assert got.cubin[:4] == b"\x7fELF" and got.lowered_name.startswith("_Z")


def test_the_loaded_nvrtc_names_its_version():
    major, minor = nvrtc_version().split(".")
    assert int(major) >= 12 and int(minor) >= 0
