"""A host stand-in for tilewise's CUDA device, for tests of the TVM-emitted CUDA templates without a GPU: the
kernels' sources are collected, built into one shared library by g++, and each launch runs its kernel over the 3D
grid with one OS thread per CUDA thread (`__syncthreads` a barrier, one block at a time)."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
import types

import numpy as np

from tilewise.devices.base import Buffer, Program
from tilewise.devices.profiles import get_profile
from tilewise.kernels.tvm.cuda import parse_kernel

SM90 = get_profile("sm_90")

HARNESS = r"""
#include <barrier>
#include <thread>
#include <vector>
struct tw_dim3 { unsigned x = 0, y = 0, z = 0; };
thread_local tw_dim3 threadIdx, blockIdx;
static std::barrier<>* tw_bar;
#define __global__
#define __launch_bounds__(n)
#define __syncthreads() tw_bar->arrive_and_wait()
// one block at a time, so a block's __shared__ arrays (made `static`) are private to it while it runs
template <class F> void tw_launch(F f, int gx, int gy, int gz, int bx, int by) {
  for (int b = 0; b < gx * gy * gz; ++b) {
    std::barrier<> bar(bx * by);
    tw_bar = &bar;
    std::vector<std::thread> pool;
    for (int t = 0; t < bx * by; ++t)
      pool.emplace_back([=] {
        blockIdx.x = b % gx; blockIdx.y = (b / gx) % gy; blockIdx.z = b / (gx * gy);
        threadIdx.x = t % bx; threadIdx.y = t / bx;
        f();
      });
    for (auto& th : pool) th.join();
  }
}
"""


class HostCuda:
    """Just enough of a CUDA device for a TVM-CUDA template's compile/upload/launches (see the module docstring)."""

    def __init__(self, tmp_path):
        self.info = types.SimpleNamespace(limits=SM90, name="host emulation")
        self.tmp_path = tmp_path
        self.sources: dict[str, str] = {}
        self.lib = None

    def compile(self, source, entry, constants=None, name=None):
        self.sources[entry] = source
        return Program(name or entry, entry, entry, dict(constants or {}), {})

    def build(self):
        # `__shared__ alignas(64) float x[n]` -> `alignas(64) static float x[n]`: one array for the block's threads
        runners = [HARNESS] + [re.sub(r"__shared__ (alignas\(\d+\) )?", r"\1static ", s) for s in self.sources.values()]
        for entry, source in self.sources.items():
            args = ", ".join(f"p[{i}]" for i in range(len(parse_kernel(source).arg_order)))
            runners.append(f'extern "C" void run_{entry}(float** p, int gx, int gy, int gz, int bx, int by) '
                           f"{{ tw_launch([=] {{ {entry}({args}); }}, gx, gy, gz, bx, by); }}\n")
        src = self.tmp_path / "kernels.cpp"
        src.write_text("\n".join(runners))
        lib = self.tmp_path / "kernels.so"
        res = subprocess.run([shutil.which("g++"), "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-w",
                              str(src), "-o", str(lib)], capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, res.stderr[-3000:]
        self.lib = ctypes.CDLL(str(lib))

    def allocate(self, nbytes, *, uniform=False):
        return Buffer(self, np.zeros(nbytes // 4, np.float32), nbytes)

    def upload(self, array, *, uniform=False):
        return Buffer(self, np.ascontiguousarray(array, np.float32).reshape(-1).copy(), array.nbytes)

    def write(self, buffer, array, offset_bytes=0):
        buffer.handle[:] = array

    def download(self, buffer, dtype=np.float32, shape=None, offset_bytes=0):
        return buffer.handle.reshape(-1)[: int(np.prod(shape))].reshape(shape).copy()

    def run(self, launches):
        for launch in launches:
            ptrs = (ctypes.POINTER(ctypes.c_float) * len(launch.buffers))(
                *(b.handle.ctypes.data_as(ctypes.POINTER(ctypes.c_float)) for b in launch.buffers))
            bx, by, _ = launch.program.meta["block"]
            gx, gy, gz = launch.grid
            getattr(self.lib, f"run_{launch.program.handle}")(ptrs, gx, gy, gz, bx, by)
