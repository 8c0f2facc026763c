"""Optimization ladders (seed 000): each primitive from its unoptimized schedule through one distinct optimization
per rung, plus the tuned best and the numpy/torch reference, all measured with the tuner's `measure`.

A ladder is data: named configs of one kernel template, in order. Running it

1. checks every rung against the template's rules at the shape (a refused rung is reported with the rule's numbers,
   never compiled) and verifies every output value of every rung against the float64 reference;
2. tunes the template at the shape (`tune.tuner.tune`, random search under a count/time budget);
3. times all rungs, the tuned best and, for GPU ladders, each staging counterpart in ONE interleaved measurement,
   so neighbour verdicts (tie / win / loss from overlapping 95% intervals) come from the same rounds;
4. times the host references (numpy, torch when installed) with the same function on the CPU device;
5. answers seed 000's question per device and shape: for pairs of schedules that differ only in staging scope
   (`workgroup` vs `private`), which one won, by how much, with intervals.

Primitives: `conv1d-cpu` (TVM on the `tvm-llvm` device), `conv1d-gpu`, `gemm-gpu` (the tuner's GEMM template and
its staging parameters) and `dwsep-conv2d-gpu` (WebGPU). All three GPU ladders also run on `--device cuda`
(`VARIANTS`): the same ladder over the TVM-scheduled, TVM-emitted CUDA templates (`kernels/*/tvm_cuda.py`), whose
`shared`/`local` scopes answer the workgroup/private staging question. Without TVM those kernels come from the
pre-emitted source store (`kernels/tvm/sources.py`), and the tuned best chooses only among stored configs.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tilewise.devices.base import Device, Launch
from tilewise.errors import ConfigError, DeviceUnavailable
from tilewise.kernels.base import KernelTemplate, Shape
from tilewise.kernels.space import Config, Space
from tilewise.tune.measure import Stats, measure, ties

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


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch


def _conv1d_refs(host: dict[str, np.ndarray], shape: Shape) -> list[tuple[str, Callable[[], Any]]]:
    a, w = host["a"], host["w"]
    refs: list[tuple[str, Callable[[], Any]]] = [("numpy.convolve", lambda: np.convolve(a, w))]
    torch = _torch()
    if torch is not None:
        N = w.shape[0]
        ta = torch.from_numpy(a).reshape(1, 1, -1)  # (1, 1, M)
        tw = torch.from_numpy(w[::-1].copy()).reshape(1, 1, -1)  # (1, 1, N): conv1d correlates, so flip
        refs.append(("torch.conv1d", lambda: torch.nn.functional.conv1d(ta, tw, padding=N - 1)))
    return refs


def _gemm_refs(host: dict[str, np.ndarray], shape: Shape) -> list[tuple[str, Callable[[], Any]]]:
    a, b = host["a"], host["b"]
    refs: list[tuple[str, Callable[[], Any]]] = [("numpy.matmul", lambda: a @ b)]
    torch = _torch()
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
    torch = _torch()
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
    """The device for a ladder: `tvm-llvm` is constructed here; every other name goes through `get_device`."""
    name = name or spec.device
    if spec.device == "tvm-llvm" and name != "tvm-llvm":
        raise ConfigError(f"ladder {spec.primitive} runs on the tvm-llvm device, not {name!r}",
                          "leave out --device or pass --device tvm-llvm")
    if spec.device == "webgpu" and not name.startswith("webgpu"):
        variant = VARIANTS.get((spec.primitive, _backend_of(name)))
        also = (f", or take its {variant.device} variant: get_ladder({spec.primitive!r}, {name!r}) (the CLI picks "
                f"it for --device {name})" if variant is not None else "")
        raise ConfigError(f"ladder {spec.primitive} ({spec.title}) has WGSL templates only; device {name!r} cannot "
                          "run them", f"pass --device webgpu or webgpu:N{also}")
    if spec.device == "cuda" and _backend_of(name) != "cuda":
        raise ConfigError(f"ladder {spec.primitive} ({spec.title}) runs on CUDA; device {name!r} cannot run it",
                          f"pass --device cuda or cuda:N, or get_ladder({spec.primitive!r}) for the default ladder")
    if name == "tvm-llvm":
        from tilewise.devices.tvm_llvm import TVMLLVMDevice

        return TVMLLVMDevice()
    from tilewise.devices import get_device

    return get_device(name)


# ---- results ---------------------------------------------------------------------------------------------------
@dataclass
class Rung:
    """One measured (or refused) rung."""

    name: str
    what: str
    config: Config
    status: str = "ok"  # ok | illegal | wrong | compile_error
    reason: str = ""
    stats: Stats | None = None
    rel_err: float | None = None
    speedup_vs_baseline: float | None = None
    speedup_vs_reference: float | None = None
    verdict: str = ""  # baseline | win | tie | loss (against the previous measured rung) | "" when not measured
    gflops: float | None = None

    def as_json(self) -> dict[str, Any]:
        s = self.stats
        return {"name": self.name, "what": self.what, "config": self.config.key(), "status": self.status,
                "reason": self.reason, "median_ms": s.median_ms if s else None,
                "ci95_ms": list(s.ci95_ms) if s else None, "p20_ms": s.p20_ms if s else None,
                "p80_ms": s.p80_ms if s else None, "samples": s.n if s else 0,
                "speedup_vs_baseline": self.speedup_vs_baseline, "speedup_vs_reference": self.speedup_vs_reference,
                "verdict": self.verdict, "rel_err": self.rel_err, "gflops": self.gflops}


@dataclass
class StagingAnswer:
    """Workgroup vs private staging at one schedule: who won, by what factor, with both intervals."""

    at: str
    workgroup: Stats
    private: Stats
    winner: str  # workgroup | private | tie
    factor: float  # slower median / faster median

    def as_json(self) -> dict[str, Any]:
        return {"at": self.at, "winner": self.winner, "factor": self.factor,
                "workgroup": {"median_ms": self.workgroup.median_ms, "ci95_ms": list(self.workgroup.ci95_ms)},
                "private": {"median_ms": self.private.median_ms, "ci95_ms": list(self.private.ci95_ms)}}

    def sentence(self) -> str:
        w, p = self.workgroup, self.private
        nums = (f"workgroup {w.median_ms:.4g} ms [{w.ci95_ms[0]:.4g}, {w.ci95_ms[1]:.4g}] vs private "
                f"{p.median_ms:.4g} ms [{p.ci95_ms[0]:.4g}, {p.ci95_ms[1]:.4g}]")
        if self.winner == "tie":
            return f"at {self.at}: tie ({nums})"
        return f"at {self.at}: {self.winner} staging wins by {self.factor:.2f}x ({nums})"


@dataclass
class LadderResult:
    """A measured ladder: rungs (baseline first, tuned best last), references and staging answers."""

    primitive: str
    title: str
    device: dict[str, Any]
    timer: str
    shape: Shape
    shape_names: tuple[str, ...]
    rungs: list[Rung]
    references: list[tuple[str, Stats]]
    staging: list[StagingAnswer] = field(default_factory=list)
    tuned: dict[str, Any] = field(default_factory=dict)
    rounds: int = 0

    @property
    def reference_ms(self) -> float | None:
        """The fastest reference's median (the strongest peer)."""
        return min((s.median_ms for _, s in self.references), default=None)

    @property
    def reference_name(self) -> str | None:
        if not self.references:
            return None
        return min(self.references, key=lambda r: r[1].median_ms)[0]

    def as_json(self) -> dict[str, Any]:
        return {"primitive": self.primitive, "title": self.title,
                "device": self.device.get("name"), "device_info": self.device, "timer": self.timer,
                "shape": list(self.shape), "shape_names": list(self.shape_names),
                "reference_ms": self.reference_ms, "reference": self.reference_name,
                "references": [{"name": n, "median_ms": s.median_ms, "ci95_ms": list(s.ci95_ms)}
                               for n, s in self.references],
                "rungs": [r.as_json() for r in self.rungs],
                "staging": [s.as_json() for s in self.staging], "tuned": self.tuned, "rounds": self.rounds}

    def table(self) -> str:
        """The ladder as a plain-text table plus the staging answers."""
        shape = " ".join(f"{n}={v}" for n, v in zip(self.shape_names, self.shape))
        lines = [f"{self.primitive}: {self.title}",
                 f"device {self.device.get('name')} ({self.device.get('api')}, timer {self.timer}), shape {shape}, "
                 f"{self.rounds} interleaved rounds"]
        for name, s in self.references:
            lines.append(f"reference {name} (host CPU): {s.median_ms:.4g} ms [{s.ci95_ms[0]:.4g}, {s.ci95_ms[1]:.4g}]")
        head = (f"  {'rung':<22} {'config':<40} {'median ms':>10} {'95% interval':>22} {'x base':>7} {'x ref':>7}"
                "  vs prev")
        lines += [head, "  " + "-" * (len(head) - 2)]
        for r in self.rungs:
            if r.stats is None:
                lines.append(f"  {r.name:<22} {r.config!s:<40} {r.status}: {r.reason}")
                continue
            s = r.stats
            ci = f"[{s.ci95_ms[0]:.4g}, {s.ci95_ms[1]:.4g}]"
            xb = f"{r.speedup_vs_baseline:.2f}" if r.speedup_vs_baseline else "-"
            xr = f"{r.speedup_vs_reference:.2f}" if r.speedup_vs_reference else "-"
            lines.append(f"  {r.name:<22} {r.config!s:<40} {s.median_ms:>10.4g} {ci:>22} {xb:>7} {xr:>7}  "
                         f"{r.verdict}")
        for a in self.staging:
            lines.append("staging " + a.sentence())
        if self.tuned.get("note"):
            lines.append("tuned best: " + self.tuned["note"])
        return "\n".join(lines)


def verdict(prev: Stats, cur: Stats) -> str:
    """`tie` when the 95% intervals overlap, else `win` (cur faster) or `loss`."""
    if ties(prev, cur):
        return "tie"
    return "win" if cur.median_ms < prev.median_ms else "loss"


def staging_answer(at: str, wg: Stats, pv: Stats) -> StagingAnswer:
    """Compare one workgroup/private pair."""
    if ties(wg, pv):
        winner = "tie"
    else:
        winner = "private" if pv.median_ms < wg.median_ms else "workgroup"
    lo, hi = sorted((wg.median_ms, pv.median_ms))
    return StagingAnswer(at, wg, pv, winner, hi / lo if lo > 0 else float("inf"))


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


# ---- running -----------------------------------------------------------------------------------------------------
def time_references(spec: LadderSpec, host: dict[str, np.ndarray], shape: Shape,
                    measure_kw: dict[str, Any]) -> list[tuple[str, Stats]]:
    """Time each host reference (numpy, torch) on the CPU device with the tuner's `measure`.

    torch references are timed twice: with torch's default intra-op threads and with one thread. On a loaded
    machine the default threads can spin against other processes and run 1000x slower at small shapes; the
    report shows both rather than picking the flattering one.
    """
    from tilewise.devices import get_device

    cpu = get_device("cpu")
    torch = _torch()
    refs = spec.references(host, shape)
    passes: list[tuple[int | None, list[tuple[str, Callable[[], Any]]]]] = [(None, refs)]
    if torch is not None and torch.get_num_threads() > 1:
        passes.append((1, [(n, f) for n, f in refs if n.startswith("torch")]))
    out: list[tuple[str, Stats]] = []
    for threads, group in passes:
        if not group:
            continue
        launches: dict[str, list[Launch]] = {}
        for name, fn in group:
            def kernel(buffers: Sequence[Any], grid: Any, _fn: Callable[[], Any] = fn) -> None:
                _fn()

            label = name
            if name.startswith("torch") and torch is not None:
                label = f"{name} ({threads or torch.get_num_threads()} thread{'s' if (threads or 2) > 1 else ''})"
            launches[label] = [Launch(cpu.compile(kernel, name=label), (1, 1, 1), [])]
        saved = torch.get_num_threads() if torch is not None else None
        try:
            if threads is not None and torch is not None:
                torch.set_num_threads(threads)
            m = measure(cpu, launches, **measure_kw)
        finally:
            if threads is not None and torch is not None and saved is not None:
                torch.set_num_threads(saved)
        out += [(label, m.stats[label]) for label in launches]
    return out


def _search_points(spec: LadderSpec, tpl: KernelTemplate, space: Space, limits: Any, shape: Shape, count: int,
                   seed: int) -> list[Config]:
    """Up to `count` legal configs for the tuned rung: a named space's points, or a uniform sample of the grid."""
    if spec.tune_strategy == "exhaustive":
        cands = list(tpl.space(spec.tune_space))
    else:
        cands = tpl.space(spec.tune_space).sample(4 * count, seed=seed, limits=limits)
    ok = [c for c in cands if not space.why_illegal(c, limits) and not tpl.shape_problems(c, shape)]
    return ok[:count]


def _stored_search_points(tpl: KernelTemplate, space: Space, limits: Any, shape: Shape, count: int,
                          usual: list[Config]) -> tuple[list[Config], str]:
    """For a TVM-emitted template on a machine without TVM: up to `count` legal configs that have a stored source
    (those of the usual search first, then the other stored ones), and a sentence saying so. With TVM: `usual`.
    """
    from tilewise.kernels.tvm import sources as tvm_sources
    from tilewise.kernels.tvm.cuda import arch_of

    if tvm_sources.tvm_available():
        return usual, ""
    arch = arch_of(getattr(limits, "compute_capability", None))
    store = tvm_sources.store_dir()
    stored: list[Config] = []
    for values in tvm_sources.stored_configs(tpl.name, shape, arch, store) if store is not None else []:
        try:
            stored.append(space.config(values))
        except ConfigError:  # stored by an older version of the template: not a config of this space
            continue
    ok = [c for c in stored if not space.why_illegal(c, limits) and not tpl.shape_problems(c, shape)]
    in_store = set(ok)
    ordered = list(dict.fromkeys([*(c for c in usual if c in in_store), *ok]))
    picked = ordered[:count]
    where = f"store {store}" if store is not None else f"no store ({tvm_sources.ENV} is not set)"
    note = (f"TVM is not importable, so the tuned best chose only among configs with a pre-emitted source: "
            f"{len(picked)} of the {len(ok)} legal configs stored for {tpl.name} at shape "
            f"{','.join(map(str, shape))} for {arch} ({where})")
    return picked, note


def run_ladder(primitive: str, device: Device | None = None, shape: Shape | None = None, *,
               tune_count: int = 24, tune_seconds: float | None = 60.0, measure_kw: dict[str, Any] | None = None,
               tune_measure_kw: dict[str, Any] | None = None, seed: int = 0,
               progress: Callable[[str], None] | None = None) -> LadderResult:
    """Verify and measure one primitive's ladder.

    Args:
        primitive: a key of `LADDERS` (conv1d-cpu, conv1d-gpu, gemm-gpu, dwsep-conv2d-gpu).
        device: where to run (default: the ladder's device).
        shape: problem shape (default: the ladder's seed-sized shape).
        tune_count: configs the search adds to the rungs for the "tuned best" rung (0: no tuned rung).
        tune_seconds: wall-clock budget of that search.
        measure_kw: arguments of the final interleaved `measure` (default `DEFAULT_MEASURE`).
        tune_measure_kw: arguments of the tuner's per-batch `measure` (default `TUNE_MEASURE`).
        seed: inputs, search order and bootstrap.
        progress: callback with one line per stage.

    Returns:
        A `LadderResult` (rungs baseline first, tuned best last).

    Raises:
        ConfigError: unknown primitive, bad shape, or a baseline the shape refuses.
    """
    from tilewise.tune.engine import Engine, Item
    from tilewise.tune.search import Budget
    from tilewise.tune.tuner import tune

    spec = get_ladder(primitive, device.info.backend if device is not None else None)
    say = progress or (lambda _msg: None)
    dev = device if device is not None else get_ladder_device(spec, None)
    tpl = spec.template()
    shape = validate_shape(spec, shape or spec.shape)
    space = tpl.space("full")
    limits = dev.info.limits
    eng = Engine(dev, None, seed=seed, measure_kw={**TUNE_MEASURE, **(tune_measure_kw or {})})
    rungs: list[Rung] = []
    extras: list[Rung] = []  # raced for the staging answer at the tuned tile, not a rung of the ladder

    def add(entries: list[tuple[str, str, Config]], to: list[Rung] = rungs) -> list[Rung]:
        """Verify rungs (the engine: rules first, never compiled when illegal; every output value checked)."""
        for name, _, cfg in entries:
            say(f"compile + verify {name}: {cfg}")
        outs = eng.evaluate([Item(tpl, cfg, shape) for _, _, cfg in entries], batch=None, timed=False)
        made = [Rung(name, what, cfg, oc.status, "" if oc.status == "ok" else oc.reason, rel_err=oc.rel_err)
                for (name, what, cfg), oc in zip(entries, outs)]
        to.extend(made)
        return made

    add([(r.name, r.what, spec.rung_config(space, r)) for r in spec.rungs])
    if rungs[0].status != "ok":
        prog = eng.program(Item(tpl, rungs[0].config, shape)) if rungs[0].status == "compile_error" else None
        if isinstance(prog, DeviceUnavailable):  # e.g. no TVM and no stored source: its fix says how to get one
            raise prog
        raise ConfigError(f"the {primitive} baseline cannot run at shape {shape}: {rungs[0].reason}",
                          f"use another shape, e.g. --shape {','.join(str(s) for s in spec.shape)}")

    tuned_info: dict[str, Any] = {}
    if tune_count > 0:
        search = _search_points(spec, tpl, space, limits, shape, tune_count, seed)
        note = ""
        if spec.emitted_by_tvm:
            search, note = _stored_search_points(tpl, space, limits, shape, tune_count, search)
            if note:
                say(note)
        # the rungs seed the search: by the tuner's own measurement the tuned best is never slower than the best rung
        points = list(dict.fromkeys([*(r.config for r in rungs), *search]))
        say(f"tuning {tpl.name}: the {len(rungs)} rungs + {len(search)} configs of a {spec.tune_strategy} search "
            f"of space {spec.tune_space!r} ({tune_seconds} s at most)")
        res = tune(tpl, dev, shape, space="full", configs=points, budget=Budget(None, tune_seconds), seed=seed,
                   final_race=4, engine=eng)
        best = res.best
        counts: dict[str, int] = {}
        for row in res.rows:
            counts[row.status] = counts.get(row.status, 0) + 1
        tuned_info = {"strategy": spec.tune_strategy, "space": spec.tune_space, "searched": len(search),
                      "with_rungs": True, "seconds": round(res.seconds, 2), "statuses": counts,
                      "best": best.config.key() if best else None}
        if spec.emitted_by_tvm:
            tuned_info.update(sources="store" if note else "tvm", note=note)
        if best is not None:
            what = (f"best of {counts.get('ok', 0)} verified configs (the rungs + {len(search)} from a "
                    f"{spec.tune_strategy} search of space {spec.tune_space!r})")
            if note:
                what = (f"best of {counts.get('ok', 0)} verified configs (the rungs + {len(search)} configs with a "
                        f"stored source; TVM is not importable, so nothing else was a candidate)")
            add([("tuned best", what, best.config)])
            # the tuned best with its staging flipped answers the staging question at the tuned tile too
            if spec.restage is not None and spec.stage_of is not None and spec.stage_of(best.config) in (
                    "workgroup", "private"):
                other = "private" if spec.stage_of(best.config) == "workgroup" else "workgroup"
                flipped = spec.restage(best.config, other)
                if not tpl.why_illegal(flipped, limits, shape):
                    add([("tuned best, staging flipped", "", flipped)], extras)

    measured = [r for r in rungs + extras if r.status == "ok"]
    say(f"timing {len(measured)} schedules interleaved")
    final_kw = {**DEFAULT_MEASURE, **(measure_kw or {})}
    race = eng.race([Item(tpl, r.config, shape) for r in measured], measure_kw=final_kw)
    stats = {r.name: st for r, st in zip(measured, race.stats)}
    say("timing the host references")
    host = tpl.make_inputs(shape, np.random.default_rng(seed))
    refs = time_references(spec, host, shape, final_kw)
    ref_ms = min((s.median_ms for _, s in refs), default=None)
    base = stats[rungs[0].name]
    prev: Stats | None = None
    for r in rungs:
        st = stats.get(r.name)
        if st is None:
            continue
        r.stats = st
        r.gflops = tpl.flops(shape) / (st.median_ms * 1e6)
        r.speedup_vs_baseline = base.median_ms / st.median_ms
        r.speedup_vs_reference = ref_ms / st.median_ms if ref_ms else None
        r.verdict = "baseline" if prev is None else verdict(prev, st)
        prev = st

    staging: list[StagingAnswer] = []
    for wg_name, pv_name in spec.staging_pairs:
        if wg_name in stats and pv_name in stats:
            cfg = next(r.config for r in rungs if r.name == pv_name)
            staging.append(staging_answer(f"{cfg} (rungs {wg_name!r} vs {pv_name!r})", stats[wg_name],
                                          stats[pv_name]))
    tuned = next((r for r in rungs if r.name == "tuned best"), None)
    flipped_st = stats.get("tuned best, staging flipped")
    if extras and tuned is not None and spec.stage_of is not None and tuned.stats is not None and flipped_st:
        pair = {spec.stage_of(tuned.config): tuned.stats, spec.stage_of(extras[0].config): flipped_st}
        staging.append(staging_answer(f"the tuned best tile ({tuned.config})", pair["workgroup"], pair["private"]))
    return LadderResult(spec.primitive, spec.title, dev.info.as_dict(), dev.timer, shape, tuple(tpl.shape_names),
                        rungs, refs, staging, tuned_info, race.rounds)


def write_json(result: LadderResult, path: str) -> None:
    """Write the ladder's JSON ({primitive, device, shape, reference_ms, rungs: [...], staging: [...]})."""
    with open(path, "w") as f:
        json.dump(result.as_json(), f, indent=2)
        f.write("\n")


def plot(result: LadderResult, path: str) -> None:
    """A PNG: one bar per rung (median, 95% interval whiskers, log scale) and a line per reference."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ConfigError(f"--plot needs matplotlib ({exc})", "pip install 'tilewise[plot]'") from exc
    measured = [r for r in result.rungs if r.stats is not None]
    names = [r.name for r in measured]
    med = np.array([r.stats.median_ms for r in measured])  # type: ignore[union-attr]
    lo = med - np.array([r.stats.ci95_ms[0] for r in measured])  # type: ignore[union-attr]
    hi = np.array([r.stats.ci95_ms[1] for r in measured]) - med  # type: ignore[union-attr]
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(names) + 1.8))
    y = np.arange(len(names))[::-1]
    ax.barh(y, med, xerr=[lo, hi], color="#4c78a8", capsize=3)
    for yi, r in zip(y, measured):
        ax.text(r.stats.ci95_ms[1] * 1.08, yi, f"{r.stats.median_ms:.3g} ms  {r.verdict}", va="center", fontsize=8)
    for name, s in result.references:
        ax.axvline(s.median_ms, linestyle="--", color="#e45756")
        ax.text(s.median_ms, len(names) - 0.4, name, rotation=90, fontsize=7, color="#e45756", va="top")
    ax.set_yticks(y, names)
    ax.set_xscale("log")
    ax.set_xlabel("median time per run, ms (95% interval)")
    shape = ",".join(str(s) for s in result.shape)
    ax.set_title(f"{result.primitive} [{shape}] on {result.device.get('name')}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
