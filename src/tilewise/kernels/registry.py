"""Which class implements a kernel family on a backend, loaded lazily (no GPU library at import).

Adding a family or a backend is one line in `TEMPLATES`: `(family, backend): "module:Class"`.
"""

from __future__ import annotations

import importlib

from tilewise.errors import ConfigError, DeviceUnavailable
from tilewise.kernels.base import KernelTemplate

TEMPLATES: dict[tuple[str, str], str] = {
    ("gemm", "webgpu"): "tilewise.kernels.gemm.webgpu:WgslGemm",
    ("gemm", "cuda"): "tilewise.kernels.gemm.cuda:CudaGemm",
    ("gemm-f16", "webgpu"): "tilewise.kernels.gemm.sgmat:SgmatGemmF16",
    ("conv1d", "webgpu"): "tilewise.kernels.conv1d.webgpu:WgslConv1d",
    ("conv1d", "tvm-llvm"): "tilewise.kernels.conv1d.tvm_llvm:TvmConv1d",
    ("conv1d", "cuda"): "tilewise.kernels.conv1d.tvm_cuda:TvmCudaConv1d",
    ("gemm-tvm", "cuda"): "tilewise.kernels.gemm.tvm_cuda:TvmCudaGemm",
    ("dwsep-conv2d", "webgpu"): "tilewise.kernels.dwsep_conv2d.webgpu:WgslDwsepConv2d",
    ("dwsep-conv2d", "cuda"): "tilewise.kernels.dwsep_conv2d.tvm_cuda:TvmCudaDwsepConv2d",
    ("nf4-matmul", "webgpu"): "tilewise.kernels.matmul.webgpu:NF4MatmulTiled",
    ("nf4-matmul-rows", "webgpu"): "tilewise.kernels.matmul.webgpu:NF4MatmulRows",
    ("nf4-swiglu", "webgpu"): "tilewise.kernels.matmul.webgpu:NF4SwigluTiled",
    ("nf4-matmul-f16s", "webgpu"): "tilewise.kernels.matmul.webgpu:NF4MatmulTiledF16",
    ("nf4-matmul", "cuda"): "tilewise.kernels.matmul.cuda:CudaNF4MatmulMma",
    ("nf4-matmul-rows", "cuda"): "tilewise.kernels.matmul.cuda:CudaNF4MatmulRows",
    ("nf4-swiglu", "cuda"): "tilewise.kernels.matmul.cuda:CudaNF4SwigluMma",
}


def kernels() -> list[str]:
    """Kernel family names, sorted."""
    return sorted({k for k, _ in TEMPLATES})


# which backend `auto` prefers when a family runs on several devices of the same rank (one GPU through CUDA and
# through WebGPU): the CUDA SGEMM reaches 0.95x cuBLAS fp32 where the WGSL one reaches 0.62x (docs/journal)
PREFERENCE = ("cuda", "webgpu", "tvm-llvm", "cpu")


def backends(kernel: str) -> list[str]:
    """The backends a family has an implementation for, the preferred first (`PREFERENCE`)."""
    have = {b for k, b in TEMPLATES if k == kernel}
    return sorted(have, key=lambda b: (PREFERENCE.index(b) if b in PREFERENCE else len(PREFERENCE), b))


def get_template(kernel: str, backend: str) -> KernelTemplate:
    """An instance of the template for (kernel, backend).

    Raises:
        ConfigError: unknown kernel, or no template of it for this backend.
        DeviceUnavailable: the template's module is missing or fails to import.
    """
    if kernel not in kernels():
        raise ConfigError(f"unknown kernel {kernel!r}", f"tunable kernels: {', '.join(kernels())}")
    target = TEMPLATES.get((kernel, backend))
    if target is None:
        raise ConfigError(f"kernel {kernel!r} has no {backend} template",
                          f"use --device with one of: {', '.join(backends(kernel))}")
    module_name, _, cls_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise DeviceUnavailable(f"the {backend} template for {kernel} ({module_name}) is not part of this build "
                                f"({exc})", f"use another device ({', '.join(backends(kernel))}) or install "
                                "tilewise with that backend") from exc
    try:
        cls = getattr(module, cls_name)
    except AttributeError:
        raise DeviceUnavailable(f"{module_name} has no class {cls_name}",
                                "fix tilewise.kernels.registry.TEMPLATES") from None
    return cls()


def template_named(kernel: str, backend: str) -> KernelTemplate | None:
    """The template a stored result's kernel name stands for on `backend` (`nf4_matmul.ring.swiglu.norm` on
    cuda, `attention`, `gemm`), or None when the name is none this build can make there. The classifier's matmuls
    are named per variant, so they are parsed; its attention and short conv are made per backend; every other name
    is a family."""
    try:
        if kernel.split(".")[0].endswith("_matmul"):
            if backend == "cuda":
                from tilewise.kernels.matmul.cuda import CudaMatmul

                return CudaMatmul.from_name(kernel)
            if backend == "webgpu":
                from tilewise.kernels.matmul.webgpu import MatmulTemplate

                return MatmulTemplate.from_name(kernel, None)
            return None
        if kernel == "attention" and backend in ("cuda", "webgpu"):
            if backend == "cuda":
                from tilewise.kernels.attention.cuda import CudaAttention

                return CudaAttention()
            from tilewise.kernels.attention.webgpu import AttentionTemplate

            return AttentionTemplate()
        if kernel == "shortconv" and backend in ("cuda", "webgpu"):  # the classifier's conv (its table entry)
            if backend == "cuda":
                from tilewise.kernels.shortconv.cuda import CudaShortConv

                return CudaShortConv()
            from tilewise.kernels.shortconv.webgpu import ConvTemplate

            return ConvTemplate()
        if (kernel, backend) in TEMPLATES:
            tpl = get_template(kernel, backend)
            return tpl if tpl.name == kernel else None
    except (ConfigError, DeviceUnavailable, ValueError, IndexError):
        return None
    return None


def backend_of(fingerprint: str) -> str:
    """The backend whose kernels a device fingerprint's results ran (`webgpu` for wgpu-native and Dawn alike: the
    same WGSL)."""
    return fingerprint.split(":", 1)[0].split("+", 1)[0]
