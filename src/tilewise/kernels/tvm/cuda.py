"""What the TVM-scheduled CUDA templates share (`conv1d`, `gemm-tvm` and `dwsep-conv2d` on `cuda`): TVM lowers each
family's schedule for a `{"kind": "cuda", "arch": "sm_XX"}` target and emits CUDA C++ that tilewise's CUDA device
compiles with NVRTC.

TVM (imported lazily; `pip install 'tilewise[tvm]'`) emits an `extern "C" __global__` kernel whose pointer parameters
come in name order (e.g. A, B, W), not in the order of the function's arguments; `parse_kernel` reads the order, the
kernel name and `__launch_bounds__` from the emitted signature. The device compiles the emitted source without TVM's
include preamble (`device_source`: the kernels use only int and float, and the preamble's NVRTC branch includes
CCCL headers that NVRTC finds only with extra include paths); a template's `source` shows the source exactly as TVM
emitted it.

A machine without TVM runs these templates from a store of pre-emitted sources (`tilewise.kernels.tvm.sources`,
`TILEWISE_TVM_CUDA_SOURCES=DIR`, filled by `tools/tvm_cuda_emit.py` where TVM is installed): `TvmCudaTemplate`'s
`compile` and `source` emit with TVM when it imports (and write the store when the variable is set), else read the
store.
"""

from __future__ import annotations

import math
import re
from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tilewise.devices.base import Device, Launch, Limits, Program
from tilewise.errors import ConfigError, DeviceUnavailable, ShaderCompileError
from tilewise.kernels.base import DeviceBuffers, KernelTemplate, Shape
from tilewise.kernels.space import Config

MAX_REGISTERS = 255  # CUDA's per-thread register maximum
MAX_INDEX = 2**31 - 1  # TVM indexes with int32 at these shapes, and CUDA caps grid.x at the same number
DEFAULT_ARCH = "sm_90"
#: where a schedule stages its operands: read from global memory at every use, copied by the block into
#: __shared__ arrays (`cache_read(..., "shared")`, between barriers) or by each thread into registers ("local")
STAGES = ("global", "shared", "local")


def arch_of(compute_capability: str | None) -> str:
    """`9.0` -> `sm_90` (the default when the device does not say)."""
    if not compute_capability:
        return DEFAULT_ARCH
    major, _, minor = compute_capability.partition(".")
    return f"sm_{major}{minor or '0'}"


def registers_per_thread(threads: int, L: Limits | None) -> int:
    """Registers one thread may hold: the block's register file shared by its `threads`, at most 255."""
    per_block = getattr(L, "registers_per_block", None) if L is not None else None
    return MAX_REGISTERS if per_block is None else min(MAX_REGISTERS, per_block // max(1, threads))


def import_tvm() -> Any:
    """The `tvm` module, or a DeviceUnavailable naming these templates and the install command."""
    from tilewise.devices.tvm_llvm import TVM_INSTALL
    from tilewise.devices.tvm_llvm import import_tvm as _import

    try:
        return _import()
    except DeviceUnavailable as exc:
        raise DeviceUnavailable(f"Apache TVM is not installed; the TVM-scheduled CUDA templates (conv1d, gemm-tvm "
                                f"and dwsep-conv2d on cuda) need it to emit their kernels ({exc.problem})",
                                TVM_INSTALL) from exc


def region_name(region: Any) -> str:
    """The buffer name of a block's read region (TVM 0.27: `region.source`; older releases: `region.buffer`)."""
    source = getattr(region, "source", None)
    return str(source.name if source is not None else region.buffer.name)


def loops_below(sch: Any, block: Any, depth: int) -> list[Any]:
    """The loops of `block` nested deeper than `depth` (a loop of extent 1 may not exist, so never index [-1])."""
    return list(sch.get_loops(block))[depth:]


def lower_to_cuda(mod: Any, arch: str, label: str) -> str:
    """The CUDA C++ source of a scheduled TIR module, as TVM emits it for `{"kind": "cuda", "arch": arch}`.

    Raises:
        ShaderCompileError: TVM could not lower the schedule.
    """
    tvm = import_tvm()
    try:
        lib = tvm.compile(mod, target=tvm.target.Target({"kind": "cuda", "arch": arch}))
    except Exception as exc:  # TVM reports lowering failures as TVMError/ValueError/RuntimeError
        raise ShaderCompileError(f"TVM could not lower {label} for {arch}: {str(exc).splitlines()[-1]}",
                                 "report the config; its schedule is outside what this TVM version lowers") from exc
    device_modules = [m for m in lib.mod.imports if getattr(m, "kind", "") == "cuda"] or list(lib.mod.imports)
    return str(device_modules[0].inspect_source())


_SIGNATURE = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\((\d+)\)\s+)?'
                        r"(\w+)\s*\(([^)]*)\)\s*\{")
_PARAM = re.compile(r"^float\s*\*\s*(?:__restrict__\s+)?(\w+?)(?:_ptr)?$")


@dataclass(frozen=True)
class KernelSignature:
    """What the launch needs from an emitted kernel: its name, block size bound and argument order."""

    name: str
    launch_bounds: int | None
    arg_order: tuple[str, ...]  # tensor names (e.g. A, B, W) in parameter order


def parse_kernel(source: str) -> KernelSignature:
    """The one kernel definition of an emitted source: name, `__launch_bounds__` and tensor names in order.

    Raises:
        ShaderCompileError: not exactly one kernel, or a parameter that is not a float pointer (a scalar
            would need a value these templates do not pass).
    """
    defs = _SIGNATURE.findall(source)
    if len(defs) != 1:
        raise ShaderCompileError(f"expected one __global__ kernel definition in TVM's output, found {len(defs)}",
                                 "the schedule must lower to a single kernel (inline every intermediate stage)")
    bounds, name, params = defs[0]
    order = []
    for p in (p.strip() for p in params.split(",")):
        m = _PARAM.match(p)
        if m is None:
            raise ShaderCompileError(f"kernel {name} has a parameter this template cannot pass: {p!r}",
                                     "keep the shape static in the schedule (no scalar kernel arguments)")
        order.append(m.group(1))
    return KernelSignature(name, int(bounds) if bounds else None, tuple(order))


_RTC_PREAMBLE = re.compile(r"#ifdef __CUDACC_RTC__\n.*?\n#else\n.*?\n#endif\n", re.DOTALL)


def device_source(emitted: str) -> str:
    """The emitted source without TVM's include preamble, when the kernel needs nothing from those headers.

    The preamble includes `<cuda/std/cstdint>` under NVRTC (found only with CCCL's include path) and `<cuda.h>`
    under nvcc; the kernels use int and float only, so dropping it lets NVRTC and nvcc compile the same text with
    no include path. A kernel that does use std:: or fixed-width types keeps the preamble.
    """
    stripped = _RTC_PREAMBLE.sub("", emitted, count=1)
    kernels = stripped[stripped.find('extern "C"'):]
    if stripped == emitted or re.search(r"\bstd::|\b(?:u?int(?:8|16|32|64)_t)\b", kernels):
        return emitted
    return stripped


def _listed(names: Sequence[str]) -> str:
    """`A, W and B`."""
    return f"{', '.join(names[:-1])} and {names[-1]}" if len(names) > 1 else "".join(names)


class TvmCudaTemplate(KernelTemplate):
    """The emit, compile and launch path of a TVM-scheduled CUDA template; a family adds its problem, space, rules,
    shape problems, TVM schedule (`emit`), launch geometry and buffers.

    Every path refuses an illegal config (rules and shape problems, with their numbers) before TVM is imported, so
    an illegal config costs no scheduling. The kernel is specialised on the shape (static loop bounds): a program
    runs only at the shape it was compiled for.
    """

    backend = "cuda"
    #: (tensor, buffer): the emitted kernel's tensor parameters in the schedule's argument order, each with the buffer
    #: of `upload` that it binds (TVM's parameter order is read from the emitted signature, never assumed)
    tensors: tuple[tuple[str, str], ...] = ()
    #: the shape `source(config)` shows when no shape is given
    default_shape: Shape = ()
    #: how messages name the template, e.g. "conv1d (cuda, TVM)"
    label: str = ""
    #: the threads-per-block formula, as a refused `__launch_bounds__` names it ("NT", "TY*TX"), and its fix
    threads_formula: str = ""
    threads_fix: str = ""

    # ---- what a family supplies ----------------------------------------------------------------------------
    @abstractmethod
    def config_problems(self, config: Config, shape: Shape) -> list[str]:
        """Why `config` cannot run at a checked shape (the splits the kernel assumes, grid and index limits)."""

    @abstractmethod
    def emit(self, config: Config, shape: Shape, arch: str) -> str:
        """TVM's CUDA C++ for one legal config at a checked shape (schedules and lowers; imports TVM)."""

    @abstractmethod
    def block(self, config: Config) -> tuple[int, int, int]:
        """The block dimensions (x, y, z)."""

    @abstractmethod
    def grid(self, config: Config, shape: Shape) -> tuple[int, int, int]:
        """The grid of one launch at a checked shape."""

    spaces = ("seed", "full", "small")

    # ---- refusing, emitting, compiling ----------------------------------------------------------------------
    def refuse_illegal(self, config: Config, shape: Shape, limits: Limits | None) -> Shape:
        """The checked shape when the config is legal at it; otherwise a ConfigError naming every broken rule."""
        shp = self.problem.check_shape(shape)
        reasons = self.why_illegal(config, limits, shp)
        if reasons:
            raise ConfigError(f"{self.label} config {self.describe(config)} is illegal at shape "
                              f"{','.join(map(str, shp))}: " + "; ".join(reasons),
                              f"pick a legal config (tilewise tune {self.name} --device cuda --dry-run lists the "
                              "rules)")
        return shp

    def source(self, config: Config, shape: Shape | None = None, arch: str = DEFAULT_ARCH) -> str:
        """TVM's CUDA C++ for one config at `shape` (default `default_shape`) for `arch`, as emitted (stored, without
        TVM).

        Raises:
            ConfigError: the config breaks a rule (checked against the `arch` profile when tilewise has one).
        """
        from tilewise.devices.profiles import PROFILES

        shp = self.refuse_illegal(config, shape or self.default_shape, PROFILES.get(arch))
        return self.emitted(config, shp, arch)

    def emit_tvm(self, config: Config, shape: Shape, arch: str = DEFAULT_ARCH) -> str:
        """TVM's CUDA C++ for one legal config (refused against the `arch` profile first); never the store."""
        from tilewise.devices.profiles import PROFILES

        return self.emit(config, self.refuse_illegal(config, shape, PROFILES.get(arch)), arch)

    def emitted(self, config: Config, shape: Shape, arch: str) -> str:
        """TVM's emission, or the stored one without TVM (`sources.emitted_source`)."""
        from tilewise.kernels.tvm import sources

        key = sources.SourceKey.make(self.name, config, shape, arch)
        return sources.emitted_source(key, lambda: self.emit(config, shape, arch))

    def compile(self, device: Device, config: Config, shape: Shape) -> Program:
        limits = device.info.limits
        shp = self.refuse_illegal(config, shape, limits)
        return self.build(device, config, shp, self.emitted(config, shp, arch_of(limits.compute_capability)))

    def build(self, device: Device, config: Config, shape: Shape, emitted: str) -> Program:
        """The device program of one emitted source at a checked shape, with its launch geometry in `meta`."""
        sig = parse_kernel(emitted)
        names = [t for t, _ in self.tensors]
        if sorted(sig.arg_order) != sorted(names):
            raise ShaderCompileError(f"kernel {sig.name} takes {sig.arg_order}, expected the tensors "
                                     f"{_listed(sorted(names))}",
                                     f"the schedule must keep {_listed(names)} as the only kernel parameters")
        threads = math.prod(self.block(config))
        if sig.launch_bounds is not None and sig.launch_bounds != threads:
            raise ShaderCompileError(f"kernel {sig.name} is bounded to {sig.launch_bounds} threads, config has "
                                     f"{self.threads_formula} = {threads}", self.threads_fix)
        prog = device.compile(device_source(emitted), entry=sig.name, constants=dict(config),
                              name=f"{self.problem.name}-tvm-cuda[{self.describe(config)}]")
        prog.meta.update(block=self.block(config), arg_order=sig.arg_order, shape=tuple(shape),
                         grid=self.grid(config, shape))
        return prog

    def launches(self, program: Program, bufs: DeviceBuffers, config: Config, shape: Shape) -> list[Launch]:
        if tuple(program.meta["shape"]) != tuple(int(s) for s in shape):
            raise ConfigError(f"{program.name} was compiled for shape {program.meta['shape']}, launched at {shape}",
                              "compile the config at the shape it runs (the kernel's loop bounds are static)")
        by_name = {t: bufs[b] for t, b in self.tensors}
        return [Launch(program, program.meta["grid"], [by_name[t] for t in program.meta["arg_order"]])]
