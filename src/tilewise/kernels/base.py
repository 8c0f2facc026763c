"""The two halves of a kernel family: its `Problem` (the math, written once) and one `KernelTemplate` per backend.

A **problem** owns what every backend shares: the shape's names and checks, fresh random inputs (never zeros),
the float64 reference, flop and byte counts, and the output's initial value when a kernel accumulates into it.
An **implementation** (`KernelTemplate`) owns what differs per backend: its `Space` (parameters and `Rule`s), the
generated source, compilation, the device buffers and the launches. No implementation inherits from another
backend's; two backends of one family share their problem object, nothing else.

Life of one candidate, as the evaluation engine (`tilewise.tune.engine`) drives it:

    reasons = tpl.why_illegal(cfg, device.info.limits, shape)   # rules + shape_problems, before compiling
    prog = tpl.compile(device, cfg, shape)                      # raises ShaderCompileError
    host = tpl.problem.make_inputs(shape, rng)                  # fresh random arrays
    bufs = tpl.upload(device, host, shape)                      # device buffers incl. the output "out"
    tpl.poison(device, bufs, shape)                             # NaN (or the initial output) into "out"
    device.run(tpl.launches(prog, bufs, cfg, shape))
    out = tpl.read_output(device, bufs, shape)
    ref = tpl.problem.reference(host, shape)                    # float64, compared value by value

Optional hooks (the defaults keep the plain behaviour above):

    tpl.precompile(device, configs, shape)   # a batch's compiles at once (threads, or the device's own)
    tpl.verify_shape(config, shape)          # verify at a cheaper shape with the same edge structure
    tpl.program_key(config, shape)           # what a compiled program depends on (one compile serves many shapes)
    tpl.rebind(device, bufs, have, shape)    # buffers uploaded for shape `have` serving a smaller shape
    tpl.peer_program(device)                 # a reference implementation to race (CUDA: cuBLAS fp32)
    tpl.peer_launches(peer, bufs, shape)     # its launches on the template's own buffers
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from tilewise.devices.base import Buffer, Device, Launch, Limits, Program
from tilewise.errors import ConfigError
from tilewise.kernels.space import Config, Space, split_pairs

Shape = tuple[int, ...]
HostInputs = dict[str, np.ndarray]
DeviceBuffers = dict[str, Buffer]


def nonzero_uniform(rng: np.random.Generator, shape: Any) -> np.ndarray:
    """Uniform magnitudes in [0.5, 1.5) with random signs: random, never zero (float64)."""
    return rng.uniform(0.5, 1.5, shape) * rng.choice([-1.0, 1.0], shape)


MAX_DIM = 2**31 - 1  # kernels index with 32-bit integers
MAX_PROBLEM_BYTES = 4 * 2**30


class Problem(ABC):
    """A kernel family's math, shared by every backend's implementation."""

    #: the family's problem name; with the shape's trailing sizes it keys a dispatch-table entry
    name: str = ""
    #: names of the shape dimensions, e.g. ("M", "N", "K"); a dispatch table picks per value of the first
    shape_names: tuple[str, ...] = ()
    #: dtype label that picks the verification tolerance ("f32", "f16", "nf4", ...)
    dtype: str = "f32"
    #: an example shape for messages and `--show-source`
    example_shape: tuple[int, ...] = ()

    def check_shape(self, shape: Sequence[int]) -> Shape:
        """The shape as ints; ConfigError when it has the wrong length, a size below 1, or is too large to check:
        every run is verified against a float64 host reference, so its data must fit in host memory."""
        shp = tuple(int(s) for s in shape)
        if len(shp) != len(self.shape_names) or any(s < 1 for s in shp):
            example = ",".join(str(s) for s in (self.example_shape or (256,) * len(self.shape_names)))
            raise ConfigError(f"{self.name} takes a shape {','.join(self.shape_names)} of positive sizes, got "
                              f"{','.join(map(str, shape)) or 'nothing'}", f"write e.g. --shape {example}")
        return self.check_size(shp)

    def check_size(self, shp: Shape) -> Shape:
        """`shp` unchanged, or ConfigError when it is too large to verify (families that override `check_shape`
        end with this)."""
        example = ",".join(str(s) for s in (self.example_shape or (256,) * len(self.shape_names)))
        if max(shp) > MAX_DIM or self.bytes_moved(shp) > MAX_PROBLEM_BYTES:
            raise ConfigError(f"{self.name} shape {','.join(map(str, shp))} is too large: it moves "
                              f"{self.bytes_moved(shp) / 2**30:.1f} GiB and sizes stop at {MAX_DIM} (every run is "
                              f"checked against a float64 reference on the host, limit "
                              f"{MAX_PROBLEM_BYTES / 2**30:.0f} GiB)", f"write a smaller shape, e.g. --shape {example}")
        return shp

    @abstractmethod
    def make_inputs(self, shape: Shape, rng: np.random.Generator) -> HostInputs:
        """Fresh random host inputs for one check or timing (never zeros: a kernel that skips work looks right
        on zeros)."""

    @abstractmethod
    def reference(self, host: HostInputs, shape: Shape) -> np.ndarray:
        """The float64 answer for these inputs, in the shape `read_output` returns."""

    @abstractmethod
    def flops(self, shape: Shape) -> int:
        """Useful floating-point operations of one run (padding not counted)."""

    @abstractmethod
    def bytes_moved(self, shape: Shape) -> int:
        """Fewest bytes one run must move through device memory (each input read once, the output written once)."""

    def output_shape(self, shape: Shape) -> tuple[int, ...]:
        """The shape of the reference (and of what `read_output` returns); the default is the shape's first two
        sizes, the (rows, columns) of a matrix product."""
        return tuple(shape[:2])

    def initial_output(self, host: HostInputs, shape: Shape) -> np.ndarray | None:
        """What the output holds before a run when the kernel accumulates into it (a residual, beta * C); None
        when the output is written only, and is then poisoned with NaN so that unwritten elements fail."""
        return None

    def dispatch_key(self, shape: Shape) -> str:
        """The dispatch-table entry for this shape: the name and every size but the first (`gemm:2560x1024`)."""
        rest = "x".join(str(int(s)) for s in shape[1:])
        return f"{self.name}:{rest}" if rest else self.name


class KernelTemplate(ABC):
    """One kernel family on one backend (e.g. `gemm` on `webgpu`): space, rules, source, compile, launches."""

    #: the family's math (shared with the other backends' implementations)
    problem: Problem
    #: the implementation's name: the store's kernel key and the command-line family (`tilewise tune gemm`);
    #: defaults to the problem's
    name: str = ""
    #: backend this template's source targets: "webgpu" | "cuda" | "cpu" | "tvm-llvm"
    backend: str = ""
    #: names of the shape dimensions (the problem's)
    shape_names: tuple[str, ...] = ()
    #: tolerance label (the problem's); an implementation that rounds more (f16 staging) says so here
    dtype: str = "f32"
    #: short name of the peer `peer_program` returns (the tuner prints "% of <peer_name>"); "" = no peer
    peer_name: str = ""
    #: buffers besides "out" the kernel writes (a second output, split-K partials): the default `poison` fills them
    #: with NaN too, and guarded verification binds them between canary words like "out"
    scratch_buffers: tuple[str, ...] = ()
    #: the WebGPU runtime `auto` should take on a tie ("dawn" for kernels that need Dawn-only features)
    prefer_runtime: str | None = None
    #: the named spaces (`space_names`) and the function that makes one (`space`), for templates whose spaces are
    #: data; a template that builds its space itself overrides `space`
    spaces: tuple[str, ...] = ("full",)
    make_space: Callable[[str], Space] | None = None
    #: consecutive verifications that may share one input set (outputs re-poisoned each time); >1 where making
    #: inputs costs more than a candidate (quantizing NF4 weights)
    verify_reuse: int = 1

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A class that names its problem takes the problem's name, shape names and dtype unless it says otherwise."""
        super().__init_subclass__(**kwargs)
        problem = cls.__dict__.get("problem")
        if isinstance(problem, Problem):
            for attr in ("name", "shape_names", "dtype"):
                if attr not in cls.__dict__:
                    setattr(cls, attr, getattr(problem, attr))

    def dtype_of(self, config: Config) -> str:
        """The tolerance label of one config: `dtype`, unless some configs round more than others (a tensor-core
        config of an otherwise f32 kernel)."""
        return self.dtype

    # ---- the space -------------------------------------------------------------------------------------------
    def space(self, which: str = "full") -> Space:
        """A named space of configs ("full" = the whole grid; templates may add "seed", "small", ...)."""
        if self.make_space is None:
            raise NotImplementedError(f"{type(self).__name__} names no make_space and does not override space()")
        return type(self).make_space(which)  # type: ignore[misc]  # a plain function stored on the class

    def space_names(self) -> tuple[str, ...]:
        return self.spaces

    def default_space(self) -> str:
        """The space a command uses when none is named: the hand-picked "seed" points where there are some."""
        return "seed" if "seed" in self.space_names() else "full"

    def named_space(self, name: str | None) -> Space:
        """The space called `name` (None: `default_space`); an unknown name lists the known ones."""
        name = name or self.default_space()
        if name not in self.space_names():
            raise ConfigError(f"unknown space {name!r} for {self.name}",
                              f"use --space with one of: {', '.join(self.space_names())}")
        return self.space(name)

    def parse_config(self, text: str) -> Config:
        """A config from `NAME=V,...`; names left out take the template's default config (where it has one)."""
        given = split_pairs(text)
        base = getattr(self, "default_config", None)
        if base is not None:
            full = {k: str(v) for k, v in base().items()}
            unknown = set(given) - set(full)
            if unknown:
                raise ConfigError(f"unknown parameters {sorted(unknown)} for {self.name}",
                                  f"parameters: {', '.join(full)}")
            given = {**full, **given}
        return self.space("full").parse(",".join(f"{k}={v}" for k, v in given.items()))

    def shape_problems(self, config: Config, shape: Shape) -> list[str]:
        """Reasons this config cannot handle this shape; empty if fine. A shape the problem refuses is one reason
        (`shape: why`); otherwise the implementation's own `config_problems` at the checked shape."""
        try:
            checked = self.problem.check_shape(shape)
        except ConfigError as exc:
            return [f"shape: {exc.problem}"]
        return self.config_problems(config, checked)

    def config_problems(self, config: Config, shape: Shape) -> list[str]:
        """What this config assumes of a valid shape that it breaks (alignment, grid limits, index ranges)."""
        return []

    def config_of(self, values: Mapping[str, Any]) -> Config:
        """A config from plain values (a dispatch table's, a command line's); refuses unknown or missing names."""
        return self.space("full").config(dict(values))

    def why_illegal(self, config: Config, limits: Limits | None, shape: Shape) -> list[str]:
        """Every broken rule and shape assumption as `rule: numbers`; empty when the config may be compiled."""
        return self.space("full").why_illegal(config, limits) + self.shape_problems(config, shape)

    # ---- code ------------------------------------------------------------------------------------------------
    @abstractmethod
    def source(self, config: Config, shape: Shape | None = None) -> str:
        """The generated source of one config (what `--show-source` prints); `shape` where the code depends on it."""

    @abstractmethod
    def compile(self, device: Device, config: Config, shape: Shape) -> Program:
        """Compile one config for a shape (the store key includes the shape, so specialising on it is fine)."""

    def program_key(self, config: Config, shape: Shape) -> Hashable:
        """What a compiled program depends on: programs with equal keys are interchangeable. The default, the
        config and the whole shape, is always safe; a template whose sizes come in a uniform returns less."""
        return (config, tuple(shape))

    # ---- data --------------------------------------------------------------------------------------------------
    @abstractmethod
    def upload(self, device: Device, host: HostInputs, shape: Shape) -> DeviceBuffers:
        """Device buffers for the inputs plus an allocated output buffer named "out" (see `attach_initial`)."""

    def attach_initial(self, device: Device, host: HostInputs, shape: Shape, bufs: DeviceBuffers) -> DeviceBuffers:
        """Keep the problem's initial output (if any) beside the buffers, so `poison` can restore it."""
        init = self.problem.initial_output(host, shape)
        if init is not None:
            bufs["_init"] = device.upload(np.ascontiguousarray(init))
        return bufs

    def poison(self, device: Device, bufs: DeviceBuffers, shape: Shape) -> None:
        """Fill the output with NaN so that unwritten elements fail verification; an output the kernel accumulates
        into gets its initial value instead (unwritten elements then keep it and still differ from the answer)."""
        out = bufs["out"]
        init = bufs.get("_init")
        if init is not None:
            device.write(out, device.download(init, np.uint8))
        else:
            device.write(out, np.full(out.nbytes // 4, np.nan, dtype=np.float32))
        for key in self.scratch_buffers:
            device.write(bufs[key], np.full(bufs[key].nbytes // 4, np.nan, dtype=np.float32))

    def rebind(self, device: Device, bufs: DeviceBuffers, have: Shape, shape: Shape) -> DeviceBuffers | None:
        """Buffers for `shape` made from `bufs` (uploaded for shape `have`), or None when they cannot serve it."""
        return bufs if tuple(have) == tuple(shape) else None

    @abstractmethod
    def launches(self, program: Program, bufs: DeviceBuffers, config: Config, shape: Shape) -> list[Launch]:
        """The launch(es) that compute one output (usually one)."""

    def read_output(self, device: Device, bufs: DeviceBuffers, shape: Shape) -> np.ndarray:
        """Download the output ("out", float32) as an array of the reference's shape."""
        return device.download(bufs["out"], np.float32, self.problem.output_shape(shape))

    # ---- the problem's math, as the engine and the reports ask for it -----------------------------------------
    def make_inputs(self, shape: Shape, rng: np.random.Generator) -> HostInputs:
        return self.problem.make_inputs(shape, rng)

    def reference(self, host: HostInputs, shape: Shape) -> np.ndarray:
        return self.problem.reference(host, shape)

    def flops(self, shape: Shape) -> int:
        return self.problem.flops(shape)

    def bytes_moved(self, shape: Shape) -> int:
        return self.problem.bytes_moved(shape)

    # ---- optional hooks -------------------------------------------------------------------------------------
    def precompile(self, device: Device, configs: Sequence[Config], shape: Shape, workers: int | None = None,
                   ) -> Mapping[Config, Program | Exception]:
        """Compile a batch of configs at once, before the engine verifies them one by one.

        Where the device's compiler can work on several kernels at once: `compile` on `workers` threads (default
        `device.compile_workers`: NVRTC and wgpu-native release the GIL), or each config's `compile` inside
        `device.compile_together()`, where the device builds the pipelines on its own threads (Dawn). Elsewhere it
        compiles nothing. The engine uses the returned programs instead of calling `compile`; a config missing from
        the answer is compiled with `compile` as usual.

        Returns:
            config -> Program, or the TilewiseError compiling it raised (a sweep stores it as that config's result).
        """
        from tilewise.errors import DeviceLost, TilewiseError

        workers = workers or device.compile_workers
        if len(configs) < 2:
            return {}

        def one(cfg: Config) -> Program | Exception:
            try:
                return self.compile(device, cfg, shape)
            except DeviceLost:
                raise  # not this config's fault: the engine stops and keeps what is stored
            except TilewiseError as exc:
                return exc

        if workers > 1:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(max_workers=min(workers, len(configs))) as pool:
                return dict(zip(configs, pool.map(one, configs)))
        out: dict[Config, Program | Exception] = {}
        started: dict[Config, list[Program]] = {}
        with device.compile_together() as batch:
            if batch is None:
                return {}
            for cfg in configs:
                mark = len(batch.programs)
                out[cfg] = one(cfg)
                started[cfg] = batch.programs[mark:]
        for cfg, programs in started.items():
            failed = [batch.errors[id(p)] for p in programs if id(p) in batch.errors]
            if failed:  # the config's main program or one beside it (a split-K reduction) did not build
                out[cfg] = failed[0]
        return out

    def verify_shape(self, config: Config, shape: Shape) -> Shape:
        """The shape at which to verify a config that will be timed at `shape`.

        Verifying a large shape costs a float64 reference on the host (137 GFLOP at 4096^3); a template may
        name a smaller shape that exercises the same code paths (the same partial tiles, or more). The program
        compiled for `shape` runs at the returned shape, so the two must have equal `program_key`s.
        """
        return shape

    def peer_program(self, device: Device) -> Program | None:
        """A reference implementation (a vendor library) that the tuner races against the best configs, or None."""
        return None

    def peer_launches(self, program: Program, bufs: DeviceBuffers, shape: Shape) -> list[Launch]:
        """The launches of one run of the peer on this template's buffers (only called when `peer_program`
        returned a program)."""
        raise ConfigError(f"kernel template {self.name} on {self.backend} has no peer to race",
                          "tune without a peer (tilewise tune ... --no-peer)")

    def tile_waste(self, config: Config, shape: Shape) -> float:
        """Launched tile area over useful area (1.0 = no padding)."""
        return 1.0

    def describe(self, config: Config) -> str:
        return str(config)

    def meta(self) -> dict[str, Any]:
        return {"name": self.name, "backend": self.backend, "shape_names": list(self.shape_names),
                "problem": self.problem.name}


def parse_shape(text: str, names: Sequence[str]) -> Shape:
    """Parse `M,N,K` into ints, refusing malformed input with the expected form."""
    parts = [p.strip() for p in str(text).replace("x", ",").split(",") if p.strip()]
    if len(parts) != len(names) or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ConfigError(f"malformed shape {text!r}: expected {len(names)} positive integers "
                          f"{','.join(names)}", f"write e.g. --shape {','.join(['256'] * len(names))}")
    return tuple(int(p) for p in parts)
