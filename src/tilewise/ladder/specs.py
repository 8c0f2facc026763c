"""Seed 000's optimization ladders as data: each primitive's rungs (named configs of one kernel template, one
distinct optimization per rung), its host references (numpy, torch), and its staging pairs; `VARIANTS` holds the
same ladders on CUDA (TVM-scheduled, TVM-emitted kernels). `run.py` measures them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tilewise.devices import Choice
from tilewise.devices.base import Device
from tilewise.errors import ConfigError
from tilewise.kernels.base import KernelTemplate, Shape
from tilewise.kernels.space import Config

DEFAULT_MEASURE = {"warmup": 3, "min_rounds": 20, "max_rounds": 100, "budget_s": 8.0}
TUNE_MEASURE = {"warmup": 1, "min_rounds": 5, "max_rounds": 20, "budget_s": 2.0}


@dataclass(frozen=True)
class RungSpec:
    """One named schedule of a ladder: `what` says what it changes over the rung before it."""

    name: str
    what: str
    config: dict[str, Any]


@dataclass(frozen=True)
class LadderSpec:
    """A primitive's ladder: its template, default device and shapes, rungs, and staging pairs."""

    primitive: str
    title: str
    device: str
    shape: tuple[int, ...]
    small_shape: tuple[int, ...]
    template: Callable[[], KernelTemplate]
    rungs: tuple[RungSpec, ...]
    references: Callable[[dict[str, np.ndarray], Shape], list[tuple[str, Callable[[], Any]]]]
    #: (workgroup rung, private rung) pairs that differ only in staging scope
    staging_pairs: tuple[tuple[str, str], ...] = ()
    #: config -> the same config with staging `scope`, or None when the template has no staging parameter
    restage: Callable[[Config, str], Config] | None = None
    #: config -> its staging scope ("workgroup", "private", "global", "mixed")
    stage_of: Callable[[Config], str] | None = None
    #: the space and strategy of the "tuned best" search (gemm's full grid takes ~30 s just to enumerate)
    tune_space: str = "full"
    tune_strategy: str = "random"
    #: values for parameters a rung leaves out (a template may grow parameters after its ladder was written)
    defaults: Callable[[], dict[str, Any]] | None = None
    #: the template's kernels are emitted by TVM: without TVM they come from the source store, and the tuned best
    #: chooses only among the configs stored for the shape and arch
    emitted_by_tvm: bool = False

    def rung_config(self, space: Any, rung: RungSpec) -> Config:
        """The rung's config in `space`: its own values, then `defaults`, then each parameter's first value."""
        values = {k: v[0] for k, v in space.params.items()}
        values.update({k: v for k, v in (self.defaults() if self.defaults else {}).items() if k in values})
        values.update(rung.config)
        return space.config(values)


# ---- the four primitives ---------------------------------------------------------------------------------------
def _lazy_template(module: str, cls: str) -> Callable[[], KernelTemplate]:
    """A factory of `module.cls()`, imported on first use (TVM, CuPy and wgpu load only for the ladder that runs)."""

    def make() -> KernelTemplate:
        return getattr(importlib.import_module(module), cls)()

    return make


_conv1d_gpu_template = _lazy_template("tilewise.kernels.conv1d.webgpu", "WgslConv1d")
_dwsep_template = _lazy_template("tilewise.kernels.dwsep_conv2d.webgpu", "WgslDwsepConv2d")
_gemm_template = _lazy_template("tilewise.kernels.gemm.webgpu", "WgslGemm")
_conv1d_tvm_template = _lazy_template("tilewise.kernels.conv1d.tvm_llvm", "TvmConv1d")
_tvm_cuda_conv1d_template = _lazy_template("tilewise.kernels.conv1d.tvm_cuda", "TvmCudaConv1d")
_tvm_cuda_gemm_template = _lazy_template("tilewise.kernels.gemm.tvm_cuda", "TvmCudaGemm")
_tvm_cuda_dwsep_template = _lazy_template("tilewise.kernels.dwsep_conv2d.tvm_cuda", "TvmCudaDwsepConv2d")


def torch_or_none() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch


def _conv1d_refs(host: dict[str, np.ndarray], shape: Shape) -> list[tuple[str, Callable[[], Any]]]:
    a, w = host["a"], host["w"]
    refs: list[tuple[str, Callable[[], Any]]] = [("numpy.convolve", lambda: np.convolve(a, w))]
    torch = torch_or_none()
    if torch is not None:
        N = w.shape[0]
        ta = torch.from_numpy(a).reshape(1, 1, -1)  # (1, 1, M)
        tw = torch.from_numpy(w[::-1].copy()).reshape(1, 1, -1)  # (1, 1, N): conv1d correlates, so flip
        refs.append(("torch.conv1d", lambda: torch.nn.functional.conv1d(ta, tw, padding=N - 1)))
    return refs


def _gemm_refs(host: dict[str, np.ndarray], shape: Shape) -> list[tuple[str, Callable[[], Any]]]:
    a, b = host["a"], host["b"]
    refs: list[tuple[str, Callable[[], Any]]] = [("numpy.matmul", lambda: a @ b)]
    torch = torch_or_none()
    if torch is not None:
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        refs.append(("torch.mm", lambda: torch.mm(ta, tb)))
    return refs


def _dwsep_refs(host: dict[str, np.ndarray], shape: Shape) -> list[tuple[str, Callable[[], Any]]]:
    x, dw, pw = host["x"], host["dw"], host["pw"]
    B, C, _, _, O, K, P = shape

    def numpy_dwsep() -> np.ndarray:
        xp = np.pad(x, ((0, 0), (0, 0), (P, P), (P, P)))  # (B, C, H+2P, W+2P)
        Ho, Wo = xp.shape[2] - K + 1, xp.shape[3] - K + 1
        d = np.zeros((B, C, Ho, Wo), np.float32)
        for ky in range(K):
            for kx in range(K):
                d += xp[:, :, ky:ky + Ho, kx:kx + Wo] * dw[None, :, ky, kx, None, None]
        return np.matmul(pw, d.reshape(B, C, Ho * Wo))  # (B, O, Ho*Wo)

    refs: list[tuple[str, Callable[[], Any]]] = [("numpy (shifted sums + matmul)", numpy_dwsep)]
    torch = torch_or_none()
    if torch is not None:
        tx, tdw = torch.from_numpy(x), torch.from_numpy(dw).reshape(C, 1, K, K)
        tpw = torch.from_numpy(pw).reshape(O, C, 1, 1)
        F = torch.nn.functional
        refs.append(("torch.conv2d (groups=C) + 1x1", lambda: F.conv2d(F.conv2d(tx, tdw, padding=P, groups=C), tpw)))
    return refs


def _restage_key(key: str) -> Callable[[Config, str], Config]:
    return lambda c, scope: c.replace(**{key: scope})


def _gemm_restage(c: Config, scope: str) -> Config:
    if scope == "private" and c.get("PF"):
        return c.replace(SA=scope, SB=scope, PF=0)  # prefetch exists only for workgroup-staged tiles
    return c.replace(SA=scope, SB=scope)


def _gemm_defaults() -> dict[str, Any]:
    from tilewise.kernels.gemm.webgpu import BASE

    return dict(BASE)


def _gemm_stage(c: Config) -> str:
    return c["SA"] if c["SA"] == c["SB"] else "mixed"


_GEMM_BASE = {"BM": 16, "BN": 16, "BK": 16, "WM": 8, "WN": 8, "WNITER": 2, "TM": 1, "TN": 1, "NT": 128,
              "SA": "private", "SB": "private", "VEC": 1}
_GEMM_44 = {"BM": 64, "BN": 64, "BK": 16, "WM": 32, "WN": 16, "WNITER": 1, "TM": 4, "TN": 4, "NT": 256,
            "SA": "workgroup", "SB": "workgroup", "VEC": 1}

LADDERS: dict[str, LadderSpec] = {
    "conv1d-cpu": LadderSpec(
        "conv1d-cpu", "1D convolution on the CPU, scheduled with TVM (LLVM)", "tvm-llvm", (16384, 64), (1024, 16),
        _conv1d_tvm_template,
        (
            RungSpec("baseline", "TVM's default schedule: padded input computed whole, one dot product per output",
                     {"XO": 1, "KI": 1, "ORDER": "n_k", "VEC": False, "CACHE": False, "PAD": "root"}),
            RungSpec("split+reorder", "split n by 32 and k by 8; reorder so the innermost loop walks contiguous "
                     "outputs and inputs", {"XO": 32, "KI": 8, "ORDER": "k_n", "VEC": False, "CACHE": False,
                                            "PAD": "root"}),
            RungSpec("vectorize", "vectorize the contiguous inner loop",
                     {"XO": 32, "KI": 8, "ORDER": "k_n", "VEC": True, "CACHE": False, "PAD": "root"}),
            RungSpec("cache accumulator", "cache_write the output tile into a local accumulator",
                     {"XO": 32, "KI": 8, "ORDER": "k_n", "VEC": True, "CACHE": True, "PAD": "root"}),
            RungSpec("compute_at padding", "compute_at the padded intermediate inside the output-tile loop",
                     {"XO": 32, "KI": 8, "ORDER": "k_n", "VEC": True, "CACHE": True, "PAD": "compute_at"}),
        ),
        _conv1d_refs,
    ),
    "conv1d-gpu": LadderSpec(
        "conv1d-gpu", "1D convolution on the GPU (WGSL)", "webgpu", (16384, 64), (1024, 16), _conv1d_gpu_template,
        (
            RungSpec("baseline", "one invocation per output, every operand read from global memory at every multiply",
                     {"NT": 64, "TPT": 1, "RK": 1, "STAGE": "global"}),
            RungSpec("reduction split", "walk the taps 8 at a time, each step unrolled",
                     {"NT": 64, "TPT": 1, "RK": 8, "STAGE": "global"}),
            RungSpec("per-thread tile", "each invocation owns 4 consecutive outputs",
                     {"NT": 64, "TPT": 4, "RK": 8, "STAGE": "global"}),
            RungSpec("workgroup staging", "stage each step's inputs and taps in var<workgroup> memory (barriers)",
                     {"NT": 64, "TPT": 4, "RK": 8, "STAGE": "workgroup"}),
            RungSpec("private staging", "instead stage each invocation's window in registers (no barrier)",
                     {"NT": 64, "TPT": 4, "RK": 8, "STAGE": "private"}),
        ),
        _conv1d_refs,
        staging_pairs=(("workgroup staging", "private staging"),),
        restage=_restage_key("STAGE"),
        stage_of=lambda c: c["STAGE"],
    ),
    "gemm-gpu": LadderSpec(
        "gemm-gpu", "fp32 GEMM on the GPU (WGSL, the tuner's GEMM template)", "webgpu", (1024, 1024, 1024),
        (128, 128, 128), _gemm_template,
        (
            RungSpec("baseline", "16x16 block, 2 outputs per invocation, operands read from global memory",
                     dict(_GEMM_BASE)),
            RungSpec("shared-memory tiling", "the textbook fix: stage A and B tiles in var<workgroup> memory",
                     {**_GEMM_BASE, "SA": "workgroup", "SB": "workgroup"}),
            RungSpec("register tile 4x4", "64x64 block, each invocation owns a 4x4 patch (still workgroup staging)",
                     dict(_GEMM_44)),
            RungSpec("private staging", "seed 000's winner: operands in registers, no shared memory, no barrier",
                     {**_GEMM_44, "SA": "private", "SB": "private"}),
            RungSpec("vec4 loads", "vectorized global loads and stores",
                     {**_GEMM_44, "SA": "private", "SB": "private", "VEC": 4}),
        ),
        _gemm_refs,
        staging_pairs=(("shared-memory tiling", "baseline"), ("register tile 4x4", "private staging")),
        restage=_gemm_restage,
        stage_of=_gemm_stage,
        defaults=_gemm_defaults,
        tune_space="seed",
        tune_strategy="exhaustive",
    ),
    "dwsep-conv2d-gpu": LadderSpec(
        "dwsep-conv2d-gpu", "depthwise-separable conv2d on the GPU (WGSL, fused)", "webgpu",
        (1, 64, 56, 56, 128, 3, 1), (1, 8, 12, 12, 16, 3, 1), _dwsep_template,
        (
            RungSpec("baseline", "one invocation per output pixel and channel, operands from global memory",
                     {"BW": 16, "TPX": 1, "BO": 16, "TO": 1, "RC": 1, "STAGE": "global"}),
            RungSpec("reduction split", "walk input channels 4 at a time, unrolled",
                     {"BW": 16, "TPX": 1, "BO": 16, "TO": 1, "RC": 4, "STAGE": "global"}),
            RungSpec("per-thread tile", "32px x 32oc block, each invocation owns 4 pixels x 4 channels",
                     {"BW": 32, "TPX": 4, "BO": 32, "TO": 4, "RC": 4, "STAGE": "global"}),
            RungSpec("workgroup staging", "compute each step's depthwise values once per workgroup, share them",
                     {"BW": 32, "TPX": 4, "BO": 32, "TO": 4, "RC": 4, "STAGE": "workgroup"}),
            RungSpec("private staging", "instead keep input windows, taps and weights in registers (no barrier)",
                     {"BW": 32, "TPX": 4, "BO": 32, "TO": 4, "RC": 4, "STAGE": "private"}),
        ),
        _dwsep_refs,
        staging_pairs=(("workgroup staging", "private staging"),),
        restage=_restage_key("STAGE"),
        stage_of=lambda c: c["STAGE"],
    ),
}


# ---- the same primitives on CUDA: TVM schedules and emits, the CUDA device runs ----------------------------------
#: TVM's scope names -> the staging names of the ladder's answer (shared memory is the workgroup's, local is private)
_TVM_STAGE = {"global": "global", "shared": "workgroup", "local": "private"}
_TVM_SCOPE = {"workgroup": "shared", "private": "local"}


def _tvm_restage(c: Config, scope: str) -> Config:
    return c.replace(STAGE=_TVM_SCOPE.get(scope, scope))


def _tvm_stage(c: Config) -> str:
    return _TVM_STAGE.get(c["STAGE"], c["STAGE"])


_TVM_GEMM_BASE = {"TY": 16, "TX": 16, "TM": 1, "TN": 1, "KB": 1, "STAGE": "global"}
_TVM_DWSEP_44 = {"BW": 32, "TPX": 4, "BO": 32, "TO": 4, "RC": 4}

#: (primitive, device backend) -> the ladder of that primitive on that backend; `get_ladder(primitive, device)`
#: picks it, `LADDERS` holds each primitive's default (the rung names match, so the JSON of both compares)
VARIANTS: dict[tuple[str, str], LadderSpec] = {
    ("conv1d-gpu", "cuda"): LadderSpec(
        "conv1d-gpu", "1D convolution on the GPU (CUDA, scheduled and emitted by TVM)", "cuda", (16384, 64),
        (1024, 16), _tvm_cuda_conv1d_template,
        (
            RungSpec("baseline", "one thread per output, every operand read from global memory at every multiply",
                     {"NT": 64, "TPT": 1, "RK": 1, "STAGE": "global"}),
            RungSpec("reduction split", "split k by 8, the inner step unrolled",
                     {"NT": 64, "TPT": 1, "RK": 8, "STAGE": "global"}),
            RungSpec("per-thread tile", "each thread owns 4 consecutive outputs (a local cache_write, unrolled)",
                     {"NT": 64, "TPT": 4, "RK": 8, "STAGE": "global"}),
            RungSpec("workgroup staging", "cache_read(..., 'shared'): the block copies each step's inputs and taps "
                     "into __shared__ arrays between __syncthreads",
                     {"NT": 64, "TPT": 4, "RK": 8, "STAGE": "shared"}),
            RungSpec("private staging", "instead cache_read(..., 'local'): each thread loads its own window into "
                     "registers (no barrier)", {"NT": 64, "TPT": 4, "RK": 8, "STAGE": "local"}),
        ),
        _conv1d_refs,
        staging_pairs=(("workgroup staging", "private staging"),),
        restage=_tvm_restage,
        stage_of=_tvm_stage,
        emitted_by_tvm=True,
    ),
    ("gemm-gpu", "cuda"): LadderSpec(
        "gemm-gpu", "fp32 GEMM on the GPU (CUDA, scheduled and emitted by TVM)", "cuda", (1024, 1024, 1024),
        (128, 128, 128), _tvm_cuda_gemm_template,
        (
            RungSpec("baseline", "16x16 thread block, one output per thread, operands read from global memory",
                     dict(_TVM_GEMM_BASE)),
            RungSpec("reduction split", "split k by 8, the inner step unrolled", {**_TVM_GEMM_BASE, "KB": 8}),
            RungSpec("shared-memory tiling", "the textbook fix: the block stages its (16, 8) slab of A and (8, 16) "
                     "slab of B in __shared__ memory", {**_TVM_GEMM_BASE, "KB": 8, "STAGE": "shared"}),
            RungSpec("register tile 4x4", "each thread owns a 4x4 patch of C (64x64 per block, still shared "
                     "staging)", {**_TVM_GEMM_BASE, "TM": 4, "TN": 4, "KB": 8, "STAGE": "shared"}),
            RungSpec("private staging", "seed 000's cache_read(A, 'local'): each thread's operands in registers, no "
                     "shared memory, no barrier", {**_TVM_GEMM_BASE, "TM": 4, "TN": 4, "KB": 8, "STAGE": "local"}),
        ),
        _gemm_refs,
        staging_pairs=(("register tile 4x4", "private staging"),),
        restage=_tvm_restage,
        stage_of=_tvm_stage,
        emitted_by_tvm=True,
    ),
    ("dwsep-conv2d-gpu", "cuda"): LadderSpec(
        "dwsep-conv2d-gpu", "depthwise-separable conv2d on the GPU (CUDA, fused, scheduled and emitted by TVM)", "cuda",
        (1, 64, 56, 56, 128, 3, 1), (1, 8, 12, 12, 16, 3, 1), _tvm_cuda_dwsep_template,
        (
            RungSpec("baseline", "one thread per output pixel and channel, its depthwise values in registers, every "
                     "operand read from global memory at every multiply",
                     {"BW": 16, "TPX": 1, "BO": 16, "TO": 1, "RC": 1, "STAGE": "global"}),
            RungSpec("reduction split", "split the input channels by 4, the inner step unrolled",
                     {"BW": 16, "TPX": 1, "BO": 16, "TO": 1, "RC": 4, "STAGE": "global"}),
            RungSpec("per-thread tile", "32px x 32oc block, each thread owns 4 pixels x 4 channels (a local "
                     "cache_write, unrolled)", {**_TVM_DWSEP_44, "STAGE": "global"}),
            RungSpec("workgroup staging", "set_scope(D, 'shared'): the block computes each step's depthwise values "
                     "once and shares them (with the pointwise weights) through __shared__ arrays between "
                     "__syncthreads", {**_TVM_DWSEP_44, "STAGE": "shared"}),
            RungSpec("private staging", "instead cache_read(..., 'local'): each thread keeps its input windows, taps "
                     "and weights in registers (no barrier)", {**_TVM_DWSEP_44, "STAGE": "local"}),
        ),
        _dwsep_refs,
        staging_pairs=(("workgroup staging", "private staging"),),
        restage=_tvm_restage,
        stage_of=_tvm_stage,
        emitted_by_tvm=True,
    ),
}


def _backend_of(device: str) -> str:
    """`cuda:1` -> `cuda`."""
    return device.split(":", 1)[0]


def get_ladder(primitive: str, device: str | None = None) -> LadderSpec:
    """The ladder called `primitive` for a device name (`cuda`, `cuda:1`, `webgpu`, ...), or a ConfigError listing
    the known ones. A device whose backend has a variant of the primitive (`VARIANTS`) gets that variant; every
    other device (and None) gets the default in `LADDERS`."""
    try:
        spec = LADDERS[primitive]
    except KeyError:
        raise ConfigError(f"unknown ladder {primitive!r}", f"use one of: {', '.join(LADDERS)}") from None
    if device:
        return VARIANTS.get((primitive, _backend_of(device)), spec)
    return spec


def get_ladder_device(spec: LadderSpec, name: str | None) -> Device:
    """The device for a ladder (see `resolve_ladder_device`)."""
    return resolve_ladder_device(spec, name).device


def resolve_ladder_device(spec: LadderSpec, name: str | None) -> Choice:
    """The device for a ladder, through the one device resolver: `auto` or no name is the ladder's own backend;
    a device of another backend is refused, naming the ladder's variant for that backend when one exists."""
    name = name or spec.device
    if spec.device == "tvm-llvm" and name not in ("tvm-llvm", "auto"):
        raise ConfigError(f"ladder {spec.primitive} runs on the tvm-llvm device, not {name!r}",
                          "leave out --device or pass --device tvm-llvm")
    backend = _backend_of(name)
    if spec.device == "webgpu" and backend not in ("webgpu", "auto"):
        variant = VARIANTS.get((spec.primitive, backend))
        also = (f", or take its {variant.device} variant: get_ladder({spec.primitive!r}, {name!r}) (the CLI picks "
                f"it for --device {name})" if variant is not None else "")
        raise ConfigError(f"ladder {spec.primitive} ({spec.title}) has WGSL templates only; device {name!r} cannot "
                          "run them", f"pass --device webgpu or webgpu:N{also}")
    if spec.device == "cuda" and backend not in ("cuda", "auto"):
        raise ConfigError(f"ladder {spec.primitive} ({spec.title}) runs on CUDA; device {name!r} cannot run it",
                          f"pass --device cuda or cuda:N, or get_ladder({spec.primitive!r}) for the default ladder")
    from tilewise.devices import resolve

    return resolve(name, (spec.device,), job=f"the {spec.primitive} ladder")


def validate_shape(spec: LadderSpec, shape: Sequence[int]) -> Shape:
    """The shape as ints, refused (before any device is touched) when the ladder's baseline cannot run it.

    Raises:
        ConfigError: wrong number of dimensions, or the baseline's shape rule fails (e.g. a kernel longer than
            the input), with the numbers.
    """
    tpl = spec.template()
    shp = tuple(int(s) for s in shape)
    if len(shp) != len(tpl.shape_names):
        raise ConfigError(f"{spec.primitive} takes a shape {','.join(tpl.shape_names)}, got {shp}",
                          f"write e.g. --shape {','.join(str(s) for s in spec.shape)}")
    problems = tpl.shape_problems(spec.rung_config(tpl.space("full"), spec.rungs[0]), shp)
    if problems:
        raise ConfigError(f"{spec.primitive} cannot run at shape {','.join(map(str, shp))}: {'; '.join(problems)}",
                          f"use another shape, e.g. --shape {','.join(str(s) for s in spec.shape)}")
    return shp


