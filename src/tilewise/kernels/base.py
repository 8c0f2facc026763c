"""What a kernel template is, for the tuner: one class per kernel family and backend.

A template owns its source (text or a generator), its `Space` (parameters + rules), the launch geometry,
a float64 reference, and flop/byte counts. The tuner (`tune/`) only talks to this interface, so the
measurement, verification, store and search code exists once for every backend.

Life of one candidate, as the tuner drives it:

    space = tpl.space("full")                                   # or "seed", ...
    reasons = space.why_illegal(cfg, device.info.limits) + tpl.shape_problems(cfg, shape)
    prog = tpl.compile(device, cfg, shape)                      # raises ShaderCompileError
    host = tpl.make_inputs(shape, rng)                          # fresh random arrays, never zeros
    bufs = tpl.upload(device, host, shape)                      # device buffers incl. the output
    tpl.poison(device, bufs, shape)                             # NaN into the output
    device.run(tpl.launches(prog, bufs, cfg, shape))
    out = tpl.read_output(device, bufs, shape)
    ref = tpl.reference(host, shape)                            # float64

Optional hooks (defaults keep the plain behaviour above):

    tpl.precompile(device, configs, shape)   # a batch's compiles at once (CUDA: NVRTC on a thread pool)
    tpl.verify_shape(config, shape)          # verify at a cheaper shape with the same edge structure
    tpl.peer_program(device)                 # a reference implementation to race (CUDA: cuBLAS fp32)
    tpl.peer_launches(peer, bufs, shape)     # its launches on the template's own buffers
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tilewise.devices.base import Buffer, Device, Launch, Program
from tilewise.tune.space import Config, Space

Shape = tuple[int, ...]
HostInputs = dict[str, np.ndarray]
DeviceBuffers = dict[str, Buffer]


class KernelTemplate(ABC):
    """One kernel family on one backend (e.g. `gemm` on `webgpu`)."""

    #: family name used on the command line (`tilewise tune gemm`)
    name: str = ""
    #: backend this template's source targets: "webgpu" | "cuda" | "cpu"
    backend: str = ""
    #: names of the shape dimensions, e.g. ("M", "N", "K")
    shape_names: tuple[str, ...] = ()
    #: dtype label used to pick a verification tolerance ("f32", "f16", "nf4", ...)
    dtype: str = "f32"
    #: short name of the peer `peer_program` returns (the tuner prints "% of <peer_name>"); "" = no peer
    peer_name: str = ""

    @abstractmethod
    def space(self, which: str = "full") -> Space:
        """A named space of configs ("full" = the whole grid; templates may add "seed", "small", ...)."""

    def space_names(self) -> tuple[str, ...]:
        return ("full",)

    def shape_problems(self, config: Config, shape: Shape) -> list[str]:
        """Reasons this config cannot handle this shape (e.g. alignment the template requires); empty if fine."""
        return []

    @abstractmethod
    def source(self, config: Config) -> str:
        """The generated source of one config (what `--show-source` prints)."""

    @abstractmethod
    def compile(self, device: Device, config: Config, shape: Shape) -> Program:
        """Compile one config; may specialise on the shape (then the store key includes the shape anyway)."""

    @abstractmethod
    def make_inputs(self, shape: Shape, rng: np.random.Generator) -> HostInputs:
        """Fresh random host inputs for one check or timing (never zeros)."""

    @abstractmethod
    def upload(self, device: Device, host: HostInputs, shape: Shape) -> DeviceBuffers:
        """Device buffers for the inputs plus an allocated output buffer named "out"."""

    def poison(self, device: Device, bufs: DeviceBuffers, shape: Shape) -> None:
        """Fill the output with NaN so that unwritten elements fail verification."""
        out = bufs["out"]
        device.write(out, np.full(out.nbytes // 4, np.nan, dtype=np.float32))

    @abstractmethod
    def launches(self, program: Program, bufs: DeviceBuffers, config: Config, shape: Shape) -> list[Launch]:
        """The launch(es) that compute one output (usually one)."""

    @abstractmethod
    def read_output(self, device: Device, bufs: DeviceBuffers, shape: Shape) -> np.ndarray:
        """Download the output as an array of the reference's shape."""

    @abstractmethod
    def reference(self, host: HostInputs, shape: Shape) -> np.ndarray:
        """The float64 answer for these inputs."""

    @abstractmethod
    def flops(self, shape: Shape) -> int:
        """Useful floating-point operations of one launch (not counting padding)."""

    @abstractmethod
    def bytes_moved(self, shape: Shape) -> int:
        """Fewest bytes one launch must move through device memory (each input read once, output written once)."""

    # ---- optional hooks -------------------------------------------------------------------------------
    def precompile(self, device: Device, configs: Sequence[Config], shape: Shape,
                   ) -> Mapping[Config, Program | Exception]:
        """Compile a batch of configs at once, before the tuner verifies them one by one.

        A template whose compiler can work in parallel overrides this; the tuner calls it once per batch and
        uses the returned programs instead of calling `compile`. A config missing from the answer is compiled
        with `compile` as usual; an exception stands for what `compile` would have raised for that config.

        Args:
            device: where the programs will run.
            configs: the batch's legal configs.
            shape: the problem shape (as for `compile`).

        Returns:
            config -> Program or the exception compiling it raised; the default compiles nothing ({}).
        """
        return {}

    def verify_shape(self, config: Config, shape: Shape) -> Shape:
        """The shape at which to verify a config that will be timed at `shape`.

        Verifying a large shape costs a float64 reference on the host (137 GFLOP at 4096^3); a template may
        name a smaller shape that exercises the same code paths (the same partial tiles, or more), so every
        candidate is checked on fresh inputs at a fraction of the cost. The program compiled for `shape` is
        run at the returned shape, so a template whose programs specialise on the shape must keep the default.

        Args:
            config: the config to verify.
            shape: the shape it is compiled for and timed at.

        Returns:
            The shape to verify at; the default is `shape` itself.
        """
        return shape

    def peer_program(self, device: Device) -> Program | None:
        """A reference implementation (a vendor library) that `tune` races against the best configs.

        Returns:
            A program the device can launch through `peer_launches`, or None when the template has no peer.
        """
        return None

    def peer_launches(self, program: Program, bufs: DeviceBuffers, shape: Shape) -> list[Launch]:
        """The launches of one run of the peer on this template's buffers (only called when `peer_program`
        returned a program)."""
        from tilewise.errors import ConfigError

        raise ConfigError(f"kernel template {self.name} on {self.backend} has no peer to race",
                          "tune without a peer (tilewise tune ... --no-peer)")

    def tile_waste(self, config: Config, shape: Shape) -> float:
        """Launched tile area over useful area (1.0 = no padding)."""
        return 1.0

    def describe(self, config: Config) -> str:
        return str(config)

    def meta(self) -> dict[str, Any]:
        return {"name": self.name, "backend": self.backend, "shape_names": list(self.shape_names)}


def parse_shape(text: str, names: Sequence[str]) -> Shape:
    """Parse `M,N,K` into ints, refusing malformed input with the expected form."""
    from tilewise.errors import ConfigError

    parts = [p.strip() for p in str(text).replace("x", ",").split(",") if p.strip()]
    if len(parts) != len(names) or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ConfigError(f"malformed shape {text!r}: expected {len(names)} positive integers "
                          f"{','.join(names)}", f"write e.g. --shape {','.join(['256'] * len(names))}")
    return tuple(int(p) for p in parts)
