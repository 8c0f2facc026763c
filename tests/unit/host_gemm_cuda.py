"""A host stand-in for tilewise's CUDA device that runs the warp-tiled `gemm.cu` itself, for running
bench/gemm_cuda.py without a GPU.

Sources go to g++ with host_cuda's harness (one OS thread per CUDA thread, `__syncthreads` a barrier, one block at
a time, so a block's `__shared__` arrays, made `static`, are private to it while it runs) plus the few CUDA types
and qualifiers gemm.cu uses. `compile` only collects a kernel; the first launch of a collected kernel builds every
one collected so far into one shared library (a batch's parallel compiles become one g++ run). The cuBLAS peer's
matmul runs on numpy, the device's `_cp`. Times are the host clock's.

`broken` makes chosen kernels (by name expression) fail to compile or write one wrong value, so a test sees those
outcomes travel from the engine to a report. `install` puts the stand-in in place of
`tilewise.devices.cuda.CUDADevice`, for a `sitecustomize` of the process that runs the script.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from host_cuda import HARNESS, SM90

from tilewise.devices.base import Buffer, Launch, Program, source_hash
from tilewise.devices.cpu import CPUDevice
from tilewise.errors import LaunchError, ShaderCompileError

SHIMS = r"""
#include <cstddef>
struct float4 { float x, y, z, w; };
static inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
#define __host__
#define __device__
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static
"""
# one C entry point per kernel of gemm.cu's signature: (M, N, K, alpha, A, B, beta, C) and the launch geometry
RUNNER = ('extern "C" void run_{i}(int M, int N, int K, float alpha, const float* A, const float* B, float beta, '
          'float* C, int gx, int gy, int gz, int bx, int by) {{ tw_launch([=] {{ {entry}(M, N, K, alpha, A, B, beta, '
          'C); }}, gx, gy, gz, bx, by); }}\n')
FLOAT_P = ctypes.POINTER(ctypes.c_float)
ARGTYPES = [ctypes.c_int] * 3 + [ctypes.c_float, FLOAT_P, FLOAT_P, ctypes.c_float, FLOAT_P] + [ctypes.c_int] * 5


class HostGemmCuda(CPUDevice):
    """A `cuda` device with sm_90 limits whose kernels are gemm.cu instantiations run on the host."""

    def __init__(self, workdir: str | Path, *, flush_l2: bool = True, broken: dict[str, str] | None = None) -> None:
        super().__init__()
        self.info = replace(self.info, backend="cuda", name="host gemm.cu (g++)", api="CUDA", driver="host",
                            vendor="host", limits=SM90, features=(), extra={"l2_cache_bytes": 0})
        self._cp = np  # the cuBLAS peer calls `_cp.matmul` on views of the buffers
        self.flush_l2 = flush_l2
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.broken = dict(broken or {})
        self.builds = 0
        self._lock = threading.Lock()  # precompile calls `compile` from a thread pool
        self._pending: dict[str, str] = {}  # entry -> source, collected but not built yet
        self._runners: dict[str, Any] = {}  # entry -> its C entry point

    def compile(self, source: Any, entry: str = "main", constants: dict[str, Any] | None = None,
                name: str | None = None) -> Program:
        if self.broken.get(entry) == "compile":
            raise ShaderCompileError(f"g++ failed on {name or entry}: error: refused by the test",
                                     "the test broke this config on purpose")
        with self._lock:
            if entry not in self._runners:
                self._pending[entry] = source
        return Program(name or entry, entry, source_hash(source, entry), dict(constants or {}),
                       {"source": source, "entry": entry})

    def _runner(self, entry: str) -> Any:
        with self._lock:
            if entry not in self._runners:
                self._build()
            return self._runners[entry]

    def _build(self) -> None:
        entries = list(self._pending)
        parts = [HARNESS, SHIMS, *dict.fromkeys(self._pending.values())]
        parts += [RUNNER.format(i=i, entry=e) for i, e in enumerate(entries)]
        self.builds += 1
        src, lib = self.workdir / f"kernels{self.builds}.cpp", self.workdir / f"kernels{self.builds}.so"
        src.write_text("\n".join(parts))
        res = subprocess.run([shutil.which("g++") or "g++", "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-w",
                              str(src), "-o", str(lib)], capture_output=True, text=True, timeout=600)
        if res.returncode:
            raise LaunchError(f"g++ failed on {len(entries)} kernels: {res.stderr[-2000:]}", "see the source")
        dll = ctypes.CDLL(str(lib))
        for i, entry in enumerate(entries):
            fn = getattr(dll, f"run_{i}")
            fn.argtypes, fn.restype = ARGTYPES, None
            self._runners[entry] = fn
        self._pending.clear()

    def _call(self, launch: Launch) -> None:
        prog = launch.program
        args = [a.handle if isinstance(a, Buffer) else a for a in launch.buffers]
        if prog.meta.get("callable"):  # the cuBLAS peer: a library call on the buffers
            prog.handle(*args)
            return
        M, N, K, alpha, a, b, beta, c = args
        bx, by, _ = prog.meta["block"]
        self._runner(prog.handle)(int(M), int(N), int(K), float(alpha), a.ctypes.data_as(FLOAT_P),
                                  b.ctypes.data_as(FLOAT_P), float(beta), c.ctypes.data_as(FLOAT_P),
                                  *launch.grid, bx, by)
        if self.broken.get(prog.handle) == "wrong":
            c.view(np.float32)[0] += 1.0  # one output value off: verification must catch it


def install(workdir: str | Path, broken: dict[str, str] | None = None) -> None:
    """Make `tilewise.devices.cuda.CUDADevice(index, flush_l2=...)` return a `HostGemmCuda` in this process."""
    import tilewise.devices.cuda as cuda

    def host_device(index: int = 0, *, flush_l2: bool = True) -> HostGemmCuda:
        return HostGemmCuda(workdir, flush_l2=flush_l2, broken=broken)

    cuda.CUDADevice = host_device  # type: ignore[assignment,misc]
