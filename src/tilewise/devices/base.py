"""The one small interface every backend implements, and the facts a device reports about itself.

A backend file (cpu.py, webgpu.py, cuda.py) subclasses `Device` and fills in `DeviceInfo`. Kernel
templates and the tuner see only this interface: allocate, upload, write, download, compile, launch,
run (one submission of many launches), time (GPU time per launch) and synchronize.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Mapping, Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from tilewise.errors import ConfigError

ADAPTER_TYPES = ("discrete", "integrated", "virtual", "cpu", "unknown")


@dataclass(frozen=True)
class SubgroupMatrixConfig:
    """One fragment shape an adapter multiplies in hardware (Dawn's chromium-experimental-subgroup-matrix):
    left (m, k) of `component_type` times right (k, n) into a result (m, n) of `result_component_type`, for
    subgroups of `min_subgroup_size`..`max_subgroup_size` invocations."""

    component_type: str  # f16 | f32 | i8 | u8 | ...
    result_component_type: str
    m: int
    n: int
    k: int
    min_subgroup_size: int
    max_subgroup_size: int

    def label(self) -> str:
        """`16x8x16 f16->f32` (M x N x K)."""
        return f"{self.m}x{self.n}x{self.k} {self.component_type}->{self.result_component_type}"


@dataclass(frozen=True)
class Limits:
    """Hard limits that legality rules check before anything compiles.

    The WebGPU names follow the spec's limits; the CUDA-only fields are None elsewhere. Occupancy
    estimates must use the per-multiprocessor pools, never the per-workgroup limit (seed 001).
    """

    max_workgroup_storage_bytes: int
    max_invocations_per_workgroup: int
    max_workgroup_size: tuple[int, int, int]
    max_workgroups_per_dimension: int
    max_buffer_bytes: int
    max_storage_binding_bytes: int
    subgroup_size_min: int | None = None
    subgroup_size_max: int | None = None
    # CUDA (cudaDeviceProp); None on other backends
    warp_size: int | None = None
    shared_bytes_per_block_optin: int | None = None
    shared_bytes_per_multiprocessor: int | None = None
    registers_per_block: int | None = None
    registers_per_multiprocessor: int | None = None
    max_threads_per_multiprocessor: int | None = None
    multiprocessors: int | None = None
    compute_capability: str | None = None
    #: fragment shapes of subgroup-matrix multiplies (Dawn with the feature enabled); None where there are none
    subgroup_matrix_configs: tuple[SubgroupMatrixConfig, ...] | None = None

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["max_workgroup_size"] = list(self.max_workgroup_size)
        if self.subgroup_matrix_configs is not None:
            d["subgroup_matrix_configs"] = [dataclasses.asdict(c) for c in self.subgroup_matrix_configs]
        return {k: v for k, v in d.items() if v is not None}


@dataclass(frozen=True)
class DeviceInfo:
    """What a device is. `fingerprint` keys stored tuning results: same hardware + driver, same key."""

    backend: str  # cpu | webgpu | cuda
    name: str
    adapter_type: str  # one of ADAPTER_TYPES
    api: str  # numpy | Vulkan | Metal | D3D12 | OpenGL | CUDA
    driver: str
    vendor: str
    limits: Limits
    features: tuple[str, ...] = ()
    index: int = 0
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    #: the implementation of `backend` when it has several ("dawn" for WebGPU on Dawn; "" = the default one)
    runtime: str = ""
    #: that implementation's version (and any setting that changes timings), part of the fingerprint
    runtime_version: str = ""

    @property
    def device_name(self) -> str:
        """The name that opens this device again: `cpu`, `webgpu:0`, `dawn:1`, `cuda:0`."""
        if self.backend in ("cpu", "tvm-llvm"):
            return self.backend
        return f"{self.runtime or self.backend}:{self.index}"

    @property
    def fingerprint(self) -> str:
        """Stable, readable key: backend:api:name:driver:hash of everything that can change a timing (a second
        runtime of a backend writes `backend+runtime-version` first, so its results never mix with the default's)."""
        fields: list[Any] = [self.backend, self.api, self.vendor, self.name, self.driver, self.limits.as_dict(),
                             sorted(self.features)]
        if self.runtime:
            fields += [self.runtime, self.runtime_version]
        digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:10]
        head = f"{self.backend}+{self.runtime}-{_slug(self.runtime_version)}" if self.runtime else self.backend
        return f"{head}:{_slug(self.api)}:{_slug(self.name)}:{_slug(self.driver)}:{digest}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "name": self.name,
            "adapter_type": self.adapter_type,
            "api": self.api,
            "driver": self.driver,
            "vendor": self.vendor,
            "index": self.index,
            "fingerprint": self.fingerprint,
            "limits": self.limits.as_dict(),
            "features": sorted(self.features),
            **({"runtime": self.runtime, "runtime_version": self.runtime_version} if self.runtime else {}),
            **({"subgroup_matrix_configs": self.limits.as_dict()["subgroup_matrix_configs"]}
               if self.limits.subgroup_matrix_configs is not None else {}),
            **({"extra": self.extra} if self.extra else {}),
        }


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", str(text)).strip("-")[:40] or "none"


class Buffer:
    """A device allocation of `nbytes` bytes. `handle` is the backend's object.

    A buffer may also be a window into a larger allocation (`offset` bytes in, bound as `bind_nbytes` bytes): the
    verifier's guarded outputs, with canary words before and after them (`tune/verify.py`). Reads and writes address
    the window; only backends with `Device.supports_windows` make them.
    """

    __slots__ = ("bind_nbytes", "device", "handle", "nbytes", "offset", "uniform")

    def __init__(self, device: Device, handle: Any, nbytes: int, uniform: bool = False, offset: int = 0,
                 bind_nbytes: int | None = None) -> None:
        self.device = device
        self.handle = handle
        self.nbytes = nbytes
        self.uniform = uniform
        self.offset = offset
        self.bind_nbytes = nbytes if bind_nbytes is None else bind_nbytes

    def __repr__(self) -> str:
        return f"Buffer({self.nbytes} bytes{' uniform' if self.uniform else ''} on {self.device.info.backend})"


@dataclass(eq=False)
class Program:
    """A compiled kernel: backend handle plus what produced it (for the results store)."""

    name: str
    handle: Any
    source_hash: str
    constants: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)


class Launch(NamedTuple):
    """One kernel launch: a program over a grid of workgroups (blocks), bound to buffers in order."""

    program: Program
    grid: tuple[int, int, int]
    buffers: Sequence[Buffer]


@dataclass
class CompileBatch:
    """What `compile` started inside `Device.compile_together`: its programs, in order, and, once the block has
    ended, the error of each one that failed (keyed by `id(program)`; such a program has no handle)."""

    programs: list[Program] = field(default_factory=list)
    errors: dict[int, Exception] = field(default_factory=dict)


COMPILE_WORKERS_ENV = "TILEWISE_COMPILE_WORKERS"


def compile_workers_default(environ: Mapping[str, str] | None = None) -> int:
    """Threads a batch compile may use: `TILEWISE_COMPILE_WORKERS` where set (a Ray worker gets its share of the
    host's CPUs), else the CPUs this process may run on."""
    env = os.environ if environ is None else environ
    text = env.get(COMPILE_WORKERS_ENV, "").strip()
    if text:
        try:
            n = int(text)
        except ValueError:
            n = 0
        if n < 1:
            raise ConfigError(f"{COMPILE_WORKERS_ENV}={text!r} is not a positive number of threads",
                              f"set {COMPILE_WORKERS_ENV} to 1 or more, or unset it (one thread per CPU)")
        return n
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class Once:
    """Values made at most once per key, by whichever thread asks first, while the others asking for that key wait
    for it: a batch compiled on threads builds a kernel every config shares (a split-K reduction) once, not once per
    thread. A make that fails is not kept: its error reaches the callers that waited, and the next call tries again."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done: dict[Hashable, Any] = {}
        self._making: dict[Hashable, Future[Any]] = {}

    def get(self, key: Hashable, make: Callable[[], Any]) -> Any:
        with self._lock:
            if key in self._done:
                return self._done[key]
            pending = self._making.get(key)
            mine = pending is None
            if pending is None:
                pending = self._making[key] = Future()
        if not mine:
            return pending.result()  # the maker's value, or its exception raised here
        try:
            value = make()
        except BaseException as exc:
            with self._lock:
                del self._making[key]
            pending.set_exception(exc)
            raise
        with self._lock:
            self._done[key] = value
            del self._making[key]
        pending.set_result(value)
        return value

    def clear(self) -> None:
        with self._lock:
            self._done.clear()


def source_hash(*parts: str | bytes) -> str:
    """Hash of a kernel's source and constants; changes whenever the code that runs changes."""
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()[:16]


def capability(compute_capability: str | None) -> tuple[int, ...]:
    """A compute capability ("9.0") as (major, minor), comparable with a tuple; (0,) for none (not a CUDA device)."""
    return tuple(int(v) for v in str(compute_capability).split(".")[:2]) if compute_capability else (0,)


def env_switch(name: str, default: bool, fix: str, environ: Mapping[str, str] | None = None) -> bool:
    """An on/off switch from the environment: 1/on/true/yes or 0/off/false/no, the default when unset or empty;
    anything else is one ConfigError naming the variable, with `fix`."""
    raw = (os.environ if environ is None else environ).get(name, "").strip().lower()
    if raw == "":
        return default
    if raw in ("1", "on", "true", "yes"):
        return True
    if raw in ("0", "off", "false", "no"):
        return False
    raise ConfigError(f"{name}={raw!r} is neither 0 nor 1", fix)


def grid3(grid: int | Sequence[int]) -> tuple[int, int, int]:
    """Normalise a grid to three positive dimensions."""
    g = (grid,) if isinstance(grid, int) else tuple(int(x) for x in grid)
    if not 1 <= len(g) <= 3 or any(x < 0 for x in g):
        raise ValueError(f"grid must be 1-3 non-negative sizes, got {grid!r}")
    return (*g, *(1,) * (3 - len(g)))  # type: ignore[return-value]


class Device(ABC):
    """A backend. Subclasses import their device library lazily, in `__init__`, never at module import."""

    info: DeviceInfo
    #: how `time` measures: "gpu-timestamp" (device clock per launch) or "wall-clock" (host clock
    #: around a blocking completion of each launch)
    timer: str = "wall-clock"
    #: buffers may be windows into larger allocations (`Buffer.offset`), which guarded verification needs
    supports_windows: bool = False
    #: timed rounds shorter than this (ms) repeat each candidate back to back (`tune.measure`): a GPU whose clock
    #: falls in the host's gaps between short rounds; 0: never
    min_round_ms: float = 0.0
    #: memory accesses are not bounds-checked (Dawn with `disable_robustness`): every verification then runs with
    #: canary words around each output, so a write out of bounds fails the config instead of corrupting others
    unchecked: bool = False
    #: threads that may call `compile` at once: a template's batch compile (`KernelTemplate.precompile`) uses that
    #: many where the compiler releases the GIL and is thread-safe (NVRTC, wgpu-native); 1: one at a time
    compile_workers: int = 1
    #: `time` takes `runs=` (the indices where a candidate's launches start): a device that prepares state before
    #: each run (CUDA's L2 flush) does it there only, so a run's later launches see what its first ones left
    time_runs: bool = False

    def compile_together(self) -> AbstractContextManager[CompileBatch | None]:
        """A block inside which `compile` starts each pipeline and returns at once, the device's own threads building
        them (Dawn); leaving it waits for all. Yields the batch, or None where the device has no such mode."""
        return nullcontext(None)

    def compiles_in_parallel(self) -> bool:
        """Whether a batch of kernels compiles faster together than one by one here (threads or the device's own)."""
        return self.compile_workers > 1 or type(self).compile_together is not Device.compile_together

    @abstractmethod
    def allocate(self, nbytes: int, *, uniform: bool = False) -> Buffer:
        """A buffer of `nbytes` bytes. Contents are undefined: write or poison before reading."""

    @abstractmethod
    def write(self, buffer: Buffer, array: np.ndarray, offset_bytes: int = 0) -> None:
        """Copy `array`'s bytes into `buffer` at `offset_bytes`."""

    @abstractmethod
    def download(self, buffer: Buffer, dtype: Any = np.float32, shape: Sequence[int] | None = None,
                 offset_bytes: int = 0) -> np.ndarray:
        """Wait for pending work, then return the buffer's contents as a new array."""

    @abstractmethod
    def compile(self, source: Any, entry: str = "main", constants: dict[str, Any] | None = None,
                name: str | None = None) -> Program:
        """Compile `source` (WGSL text, CUDA C++ text, or a Python callable on the CPU)."""

    @abstractmethod
    def run(self, launches: Sequence[Launch]) -> None:
        """Enqueue launches in order as one submission; returns without waiting."""

    @abstractmethod
    def time(self, launches: Sequence[Launch]) -> np.ndarray:
        """Run launches in order, one submission, and return each one's duration in ms (float64)."""

    @abstractmethod
    def synchronize(self) -> None:
        """Block until all submitted work has finished (never by sleeping)."""

    def run_and_download(self, launches: Sequence[Launch], buffer: Buffer, dtype: Any = np.float32,
                         shape: Sequence[int] | None = None, reuse: Any = None) -> np.ndarray:
        """Run launches, then return `buffer`'s contents (a device may fold the read-back into the same submission).

        `reuse` is a hint: a key for a launch list that will run again unchanged (a device may prepare the next
        run ahead); devices without such preparation ignore it.
        """
        self.run(launches)
        return self.download(buffer, dtype, shape)

    def upload(self, array: np.ndarray, *, uniform: bool = False) -> Buffer:
        """A new buffer holding `array`'s bytes."""
        data = np.ascontiguousarray(array)
        buf = self.allocate(max(data.nbytes, 4), uniform=uniform)
        self.write(buf, data)
        return buf

    def launch(self, program: Program, grid: int | Sequence[int], buffers: Sequence[Buffer]) -> None:
        """Enqueue one launch (shorthand for `run([Launch(...)])`)."""
        self.run([Launch(program, grid3(grid), list(buffers))])

    def close(self) -> None:
        """Release the device (optional for backends)."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.info.name} ({self.info.api}, {self.info.adapter_type})>"


class HostDevice(Device):
    """A device whose buffers are host byte arrays (np.uint8) and whose launches run synchronously on the host.

    `time` is the host clock around each call.
    """

    timer = "wall-clock"

    def write(self, buffer: Buffer, array: np.ndarray, offset_bytes: int = 0) -> None:
        raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        if offset_bytes + raw.nbytes > buffer.nbytes:
            raise ValueError(f"write of {raw.nbytes} bytes at {offset_bytes} overflows a {buffer.nbytes}-byte buffer")
        buffer.handle[offset_bytes : offset_bytes + raw.nbytes] = raw

    def download(self, buffer: Buffer, dtype: Any = np.float32, shape: Sequence[int] | None = None,
                 offset_bytes: int = 0) -> np.ndarray:
        out = buffer.handle[offset_bytes:].view(dtype).copy()
        if shape is not None:
            out = out[: int(np.prod(shape))].reshape(shape)
        return out

    @abstractmethod
    def _call(self, launch: Launch) -> None:
        """Run one launch to completion."""

    def run(self, launches: Sequence[Launch]) -> None:
        for launch in launches:
            self._call(launch)

    def time(self, launches: Sequence[Launch]) -> np.ndarray:
        out = np.empty(len(launches))
        for i, launch in enumerate(launches):
            t0 = time.perf_counter_ns()
            self._call(launch)
            out[i] = (time.perf_counter_ns() - t0) / 1e6
        return out

    def synchronize(self) -> None:
        return None
