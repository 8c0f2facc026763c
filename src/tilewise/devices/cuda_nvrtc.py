"""CUDA compiles without a GPU: NVRTC through ctypes, producing the cubin a `CUDADevice` loads (`load_compiled`).

A Ray run compiles a batch's CUDA kernels in CPU tasks and ships the cubins to the GPU worker, which only loads
them. The compile here is the one `CUDADevice.compile` runs through CuPy: the same NVRTC, the device's options plus
the `-ftz=true` CuPy adds to every compile, a cubin for the device's real architecture, and the same error text.

libnvrtc is found from `TILEWISE_NVRTC` (a library file), the `nvidia-cuda-nvrtc` wheel's folder on `sys.path`
(installed next to CuPy), then the loader's path. Also here: `CompileProbe`, a device stand-in that records what a
template would compile, and `Prebuilt`, a device wrapper whose compile loads shipped cubins.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import re
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tilewise.devices.base import DeviceInfo, Program, source_hash
from tilewise.errors import DeviceUnavailable, ShaderCompileError

NVRTC_FIX = ("pip install nvidia-cuda-nvrtc (the CUDA 13 one, as cupy-cuda13x uses), or point TILEWISE_NVRTC at "
             "a libnvrtc.so")
#: what CuPy appends to the options of every NVRTC compile; a shipped cubin must be the same code as a local one
CUPY_ADDED_OPTIONS = ("-ftz=true",)
COMPILE_FIX = ("this config's instantiation is rejected by the compiler; check the template's rules (an illegal "
               "config must fail a static_assert)")


def nvrtc_options(compute_capability: str, extra: Sequence[str] = ()) -> tuple[str, ...]:
    """NVRTC options for a device of `compute_capability` ("8.9" -> `-arch=sm_89`). Hopper (9.0) compiles for
    `sm_90a`, the architecture-specific target where wgmma and setmaxnreg exist; its code runs on compute
    capability 9.0 only, which is the device's own."""
    major, minor = compute_capability.split(".")
    return ("-std=c++17", f"-arch=sm_{major}{minor}{'a' if (major, minor) == ('9', '0') else ''}", *extra)


def device_options(info: DeviceInfo) -> tuple[str, ...]:
    """The options a CUDA device of `info` compiles with."""
    return nvrtc_options(info.limits.compute_capability or "9.0")


_ERROR_RE = re.compile(r"error\s*:", re.IGNORECASE)
PROGRAM_NAME = "kernel.cu"
_TEMP_FILE_RE = re.compile(r"^\S*/[^/\s(]*\((\d+)\):")  # CuPy names the program after a temporary file


def first_error_line(log: str) -> str:
    """The first `error:` line of an NVRTC log (or its first non-empty line); a file path (CuPy's temporary file)
    becomes `kernel.cu`, the name compiles here use, so the message does not depend on where the compile ran."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    hit = next((ln for ln in lines if _ERROR_RE.search(ln)), lines[0] if lines else "(empty compiler log)")
    return _TEMP_FILE_RE.sub(PROGRAM_NAME + r"(\1):", hit)


def compile_error(label: str, log: str) -> ShaderCompileError:
    """The error a CUDA compile of `label` with this NVRTC `log` raises (the one text local and shipped use)."""
    return ShaderCompileError(f"NVRTC failed on {label}: {first_error_line(log)}", COMPILE_FIX)


def nvrtc_candidates() -> list[str]:
    """Library files to try, in order: TILEWISE_NVRTC, the wheel's folder on sys.path, the loader's name."""
    names = [os.environ.get("TILEWISE_NVRTC", "")]
    for base in map(Path, sys.path):
        names += [str(p) for p in sorted((base / "nvidia").glob("cu*/lib/libnvrtc.so.*")) if ".alt." not in p.name]
    names.append(ctypes.util.find_library("nvrtc") or "")
    return [n for n in names if n]


@functools.cache
def find_nvrtc() -> ctypes.CDLL | None:
    """The first loadable libnvrtc, or None."""
    for name in nvrtc_candidates():
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def nvrtc_version() -> str | None:
    """`major.minor` of the libnvrtc `find_nvrtc` loads, or None without one (two compilers of other versions
    compile at other speeds, and a driver and its Ray tasks may find different ones)."""
    lib = find_nvrtc()
    if lib is None:
        return None
    major, minor = ctypes.c_int(), ctypes.c_int()
    return f"{major.value}.{minor.value}" if lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)) == 0 else None


def nvrtc() -> ctypes.CDLL:
    lib = find_nvrtc()
    if lib is None:
        raise DeviceUnavailable("libnvrtc was not found (compiling CUDA without a GPU needs it)", NVRTC_FIX)
    return lib


@dataclass(frozen=True)
class CompiledCuda:
    """One kernel compiled for one device's options: the cubin and the name to look the kernel up by."""

    cubin: bytes
    lowered_name: str
    log: str
    source: str
    entry: str
    options: tuple[str, ...]  # the device's options (`CUPY_ADDED_OPTIONS` were added to the compile)

    @property
    def key(self) -> str:
        """The Program.source_hash `CUDADevice.compile` gives this kernel."""
        return source_hash(self.source, self.entry, *self.options)


@dataclass(frozen=True)
class CompileFailure:
    """NVRTC's refusal of one kernel (its log), to be raised as `compile_error` where the label is known."""

    log: str
    entry: str


def _log(lib: ctypes.CDLL, prog: ctypes.c_void_p) -> str:
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    buf = ctypes.create_string_buffer(max(1, size.value))
    lib.nvrtcGetProgramLog(prog, buf)
    return buf.value.decode(errors="replace")


def _check(rc: int, doing: str) -> None:
    if rc != 0:
        raise DeviceUnavailable(f"NVRTC failed while {doing} (error {rc})", NVRTC_FIX)


def try_compile(source: str, entry: str, options: Sequence[str]) -> CompiledCuda | CompileFailure:
    """Compile the name expression `entry` of `source` to a cubin (a refusal is returned, not raised)."""
    lib = nvrtc()
    prog = ctypes.c_void_p()
    _check(lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), PROGRAM_NAME.encode(), 0, None, None),
           "creating a program")
    try:
        _check(lib.nvrtcAddNameExpression(prog, entry.encode()), f"adding the name expression {entry}")
        opts = [o.encode() for o in (*options, *CUPY_ADDED_OPTIONS)]
        rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
        log = _log(lib, prog)
        if rc != 0:
            return CompileFailure(log, entry)
        lowered = ctypes.c_char_p()
        _check(lib.nvrtcGetLoweredName(prog, entry.encode(), ctypes.byref(lowered)), f"naming {entry}")
        size = ctypes.c_size_t()
        _check(lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "sizing the cubin (is -arch a real sm_XX?)")
        cubin = ctypes.create_string_buffer(size.value)
        _check(lib.nvrtcGetCUBIN(prog, cubin), "reading the cubin")
        return CompiledCuda(cubin.raw, (lowered.value or b"").decode(), log, source, entry, tuple(options))
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def compile_cubin(source: str, entry: str, options: Sequence[str], label: str | None = None) -> CompiledCuda:
    """A cubin of `entry`, or the `ShaderCompileError` the device's compile would raise for `label`."""
    got = try_compile(source, entry, options)
    if isinstance(got, CompileFailure):
        raise compile_error(label or entry, got.log)
    return got


def compile_key(source: str, entry: str, options: Sequence[str]) -> tuple[str, str, tuple[str, ...]]:
    return source_hash(source), entry, tuple(options)


@dataclass(frozen=True)
class CompileRequest:
    """What one `device.compile` call of a template asked for."""

    source: str
    entry: str
    options: tuple[str, ...]

    @property
    def key(self) -> tuple[str, str, tuple[str, ...]]:
        return compile_key(self.source, self.entry, self.options)


@dataclass
class CompileProbe:
    """A CUDA device stand-in whose `compile` records the request and returns an empty program: a template's
    compile run on it names the kernels it needs without a GPU. Anything else a template asks of it fails."""

    info: DeviceInfo
    enabled_features: set[str] = field(default_factory=set)
    requests: list[CompileRequest] = field(default_factory=list)

    @property
    def options(self) -> tuple[str, ...]:
        return device_options(self.info)

    def compile(self, source: Any, entry: str = "main", constants: dict[str, Any] | None = None,
                name: str | None = None) -> Program:
        if not isinstance(source, str):
            raise TypeError("the CUDA device compiles CUDA C++ source text")
        self.requests.append(CompileRequest(source, entry, self.options))
        return Program(name or entry, None, source_hash(source, entry, *self.options), dict(constants or {}), {})

    def allow_dynamic_shared(self, program: Program, nbytes: int) -> None:
        """Nothing to do: the worker's device opts the loaded kernel in (and refuses what its GPU cannot hold)."""

    @classmethod
    def requests_of(cls, kernel: Any, config: Any, shape: Any, info: DeviceInfo,
                    features: set[str] | None = None) -> list[CompileRequest]:
        """The compiles `kernel.compile(device, config, shape)` asks of a device described by `info`, in order (a
        template's own errors propagate)."""
        probe = cls(info, set(features or ()))
        kernel.compile(probe, config, shape)
        return probe.requests


class Prebuilt:
    """A CUDA device whose `compile` loads the cubin shipped for that (source, entry, options) when there is one,
    and raises the shipped compile error as the device would; everything else is the device's own."""

    def __init__(self, device: Any) -> None:
        self.device = device
        self.shipped: Mapping[tuple[str, str, tuple[str, ...]], CompiledCuda | CompileFailure] = {}
        self.loaded = 0  # kernels loaded from shipped cubins (or refused as shipped)
        self.compiled = 0  # kernels the device compiled itself
        self._lock = threading.Lock()  # templates compile from several threads (`precompile`)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.device, name)

    def compile(self, source: Any, entry: str = "main", constants: dict[str, Any] | None = None,
                name: str | None = None) -> Program:
        got = self.shipped.get(compile_key(source, entry, self.device.options)) if isinstance(source, str) else None
        with self._lock:
            self.compiled += got is None
            self.loaded += got is not None
        if got is None:
            return self.device.compile(source, entry, constants, name)
        if isinstance(got, CompileFailure):
            raise compile_error(name or entry, got.log)
        return self.device.load_compiled(got, name or entry, constants)


__all__ = ["COMPILE_FIX", "CUPY_ADDED_OPTIONS", "CompileFailure", "CompileProbe", "CompileRequest", "CompiledCuda",
           "Prebuilt", "compile_cubin", "compile_error", "compile_key", "device_options", "find_nvrtc",
           "first_error_line", "nvrtc_candidates", "nvrtc_options", "try_compile"]
