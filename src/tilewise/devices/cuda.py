"""CUDA backend on CuPy: NVRTC-compiled CUDA C++ templates, CUDA-event timing, limits read from the device.

CuPy is imported when a `CUDADevice` is created (or `cuda_info.list_cuda_devices()` runs), never at module import,
so `import tilewise` works on machines without it. Install with `pip install 'tilewise[cuda]'`.

Kernels are C++ templates instantiated by NVRTC name expressions (`sgemm_warptile<128, 64, ...>`), compiled
with `-std=c++17 -arch=sm_XX` for the device's compute capability (`sm_90a` on Hopper, for wgmma). Compiled
modules are cached on disk (CuPy's kernel cache, pointed at tilewise's user cache directory unless
`CUPY_CACHE_DIR` is set) and in memory per device. `load_compiled` takes a kernel compiled elsewhere as a cubin
(`cuda_nvrtc.compile_cubin`, which needs no GPU: a Ray run compiles on CPU workers and ships the cubins here).

Launch arguments: a CUDA kernel takes scalars as well as pointers, so on this backend `Launch.buffers`
is the kernel's argument list in order, where an element is either a `Buffer` (passed as its device
pointer), a NumPy scalar (`np.int32(M)`, `np.float32(alpha)`, passed by value) or a `cuda_tma.TensorMap` (128
bytes by value, for a `const __grid_constant__` parameter). The block size is a
property of the compiled program: `Program.meta["block"]` (the kernel template sets it when it compiles).
A Program with `meta["callable"]` wraps a library call (cuBLAS via CuPy): its handle is called with the
arguments (Buffers as CuPy byte arrays) and timed by the same events as a kernel.

Streams and graphs: a device's writes, launches, events and reads go to one stream it owns (blocking, so CuPy work
on the default stream stays ordered with it). `capture(steps)` records launches and `HostCopy`s (pinned host <->
buffer) into a `CudaGraph`, replayed as one submission by `launch()`; library calls are refused there (`mapped`
makes a pinned array a buffer kernels address directly, which needs no copy steps). With
`pdl=True`, `run` and `capture` launch a kernel that follows another with programmatic dependent launch
(`cuda_pdl.py`) when it waits for its predecessor (`meta["pdl"]`: the model's kernels, `kernels/pdl.cuh`); `time`
never does, so every timed kernel runs alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tilewise.devices.base import Buffer, Device, Launch, Once, Program, compile_workers_default, grid3, source_hash
from tilewise.devices.cuda_hold import Hold, batches
from tilewise.devices.cuda_info import MAX_GRID, cache_dir, device_count, first_line, import_cupy, info_from
from tilewise.devices.cuda_nvrtc import CompiledCuda, compile_error, device_options
from tilewise.devices.cuda_nvrtc import first_error_line as first_error_line  # re-exported: callers import them here
from tilewise.devices.cuda_nvrtc import nvrtc_options as nvrtc_options
from tilewise.devices.cuda_pdl import launch_pdl, supports_pdl
from tilewise.devices.cuda_tma import TensorMap
from tilewise.errors import DeviceUnavailable, LaunchError

MEMORY_TYPE_HOST = 1  # cudaMemoryTypeHost: page-locked host memory


@dataclass(frozen=True, eq=False)
class HostCopy:
    """Pinned host array (`CUDADevice.pinned`) <-> buffer; in a graph it moves what the host holds at replay time."""

    host: np.ndarray
    buffer: Buffer
    nbytes: int
    to_device: bool = True


class CudaGraph:
    """A captured launch list (`CUDADevice.capture`); `launch()` replays it on the device's stream."""

    def __init__(self, device: CUDADevice, graph: Any, steps: Sequence[Launch | HostCopy]) -> None:
        # the steps keep the buffers and host arrays whose addresses the graph holds alive with it
        self.device, self._graph, self._steps, self.replays = device, graph, list(steps), 0

    def launch(self, wait: bool = True) -> None:
        """Replay the graph; with `wait`, return when the GPU has finished it."""
        dev = self.device
        try:
            with dev._dev:
                self._graph.launch(stream=dev._stream)
                if wait:
                    dev._stream.synchronize()
        except dev._cp.cuda.runtime.CUDARuntimeError as exc:
            raise dev._wrap(exc, f"replaying a CUDA graph of {len(self._steps)} steps") from exc
        self.replays += 1


class CUDADevice(Device):
    """One NVIDIA GPU through CuPy. `time()` uses CUDA events; `flush_l2` evicts L2 between samples."""

    timer = "gpu-timestamp"
    time_runs = True  # `time` takes `runs` (it flushes L2 only where a candidate's run starts)

    def __init__(self, index: int = 0, *, flush_l2: bool = True) -> None:
        cupy = import_cupy()
        count = device_count(cupy)
        if count == 0:
            raise DeviceUnavailable("CuPy sees no NVIDIA GPU", "check `nvidia-smi` and CUDA_VISIBLE_DEVICES")
        if not 0 <= index < count:
            raise DeviceUnavailable(f"cuda:{index} does not exist ({count} CUDA device(s))",
                                    f"use cuda:0 .. cuda:{count - 1}")
        self._cp = cupy
        self._dev = cupy.cuda.Device(index)
        self.info = info_from(cupy, index)
        self.flush_l2 = flush_l2
        self.options = device_options(self.info)
        os.environ.setdefault("CUPY_CACHE_DIR", cache_dir())
        self._modules = Once()  # (source hash, entry, options) -> CuPy module
        self._cubins: dict[tuple[str, str, tuple[str, ...]], Any] = {}  # modules loaded from shipped cubins
        self._lock = threading.Lock()
        self.compile_workers = compile_workers_default()  # NVRTC releases the GIL; `_modules` builds each once
        self._flush_buf: Any = None
        self._hold: Hold | None = None  # made on the first `time`
        self._lost = False
        with self._dev:
            # not the legacy default stream, where capture is impossible; blocking, so default-stream work orders
            self._stream = cupy.cuda.Stream(non_blocking=False)
        self.captures = 0  # graphs captured on this device (tests count them)
        self.pdl = supports_pdl(self.info.limits.compute_capability)  # griddepcontrol exists (sm_90+)
        self.pdl_launches = 0  # kernels launched (or captured) with programmatic dependent launch

    @property
    def timing_tag(self) -> str:
        """What a stored timing is keyed by besides the fingerprint: a timing with L2 kept is not a cold one."""
        return "" if self.flush_l2 else "+l2kept"

    # ---- memory ------------------------------------------------------------------------------
    def allocate(self, nbytes: int, *, uniform: bool = False) -> Buffer:
        size = max(4, (int(nbytes) + 3) // 4 * 4)
        try:
            with self._dev:
                handle = self._cp.empty(size, dtype=self._cp.uint8)
        except self._cp.cuda.memory.OutOfMemoryError as exc:
            raise LaunchError(f"out of GPU memory allocating {size} bytes on {self.info.name}",
                              "use smaller shapes or free GPU memory") from exc
        return Buffer(self, handle, size, uniform)

    def address(self, buffer: Buffer) -> int:
        """The buffer's device address, for a struct of pointers a kernel reads (`cuda_fuse.fuse_rope`)."""
        if buffer.device is not self:
            raise LaunchError("the address of a buffer of another device was asked for",
                              "allocate the buffer on the device whose kernels read it")
        return int(buffer.handle.data.ptr)

    def write(self, buffer: Buffer, array: np.ndarray, offset_bytes: int = 0) -> None:
        raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        if offset_bytes + raw.nbytes > buffer.nbytes:
            raise ValueError(f"write of {raw.nbytes} bytes at {offset_bytes} overflows a {buffer.nbytes}-byte buffer")
        with self._dev, self._stream:
            buffer.handle[offset_bytes:offset_bytes + raw.nbytes].set(raw)

    def download(self, buffer: Buffer, dtype: Any = np.float32, shape: Sequence[int] | None = None,
                 offset_bytes: int = 0) -> np.ndarray:
        nbytes = buffer.nbytes - offset_bytes
        if shape is not None:
            nbytes = min(nbytes, int(np.prod(shape)) * np.dtype(dtype).itemsize)
        try:
            with self._dev, self._stream:
                raw = self._cp.asnumpy(buffer.handle[offset_bytes:offset_bytes + nbytes])
                self._stream.synchronize()
        except self._cp.cuda.runtime.CUDARuntimeError as exc:
            raise self._wrap(exc, "reading a buffer back") from exc
        out = raw.view(dtype)
        return out.reshape(shape) if shape is not None else out

    def array(self, buffer: Buffer, dtype: Any = np.float32, shape: Sequence[int] | None = None) -> Any:
        """A CuPy view of a buffer (no copy), e.g. to compare with cuBLAS on the device."""
        view = buffer.handle.view(dtype)
        return view[: int(np.prod(shape))].reshape(shape) if shape is not None else view

    # ---- programs ----------------------------------------------------------------------------
    def compile(self, source: Any, entry: str = "main", constants: dict[str, Any] | None = None,
                name: str | None = None) -> Program:
        """Compile CUDA C++ `source` and return the kernel named by the name expression `entry`.

        Args:
            source: CUDA C++ text.
            entry: a kernel name or a template name expression (`sgemm_warptile<128, 64, ...>`).
            constants: recorded with the program (for the store); CUDA templates take values in `entry`.
            name: label for messages (default: `entry`).

        Returns:
            A Program whose handle is a CuPy RawKernel-like function; `meta` holds registers, spills and
            static shared memory reported by the compiled kernel.

        Raises:
            ShaderCompileError: NVRTC rejected the source; the message has its first error line.
        """
        if not isinstance(source, str):
            raise TypeError("the CUDA device compiles CUDA C++ source text")
        cp = self._cp
        label = name or entry
        key = (source_hash(source), entry, self.options)

        def build() -> Any:
            try:
                with self._dev:
                    module = cp.RawModule(code=source, options=self.options, name_expressions=[entry],
                                          backend="nvrtc")
                    module.get_function(entry)
            except cp.cuda.compiler.CompileException as exc:
                raise compile_error(label, str(exc)) from exc
            return module

        module = self._modules.get(key, build)  # threads asking for one kernel at once wait for one compile
        with self._dev:
            func = module.get_function(entry)
        return self._program(label, func, source, entry, constants)

    def load_compiled(self, compiled: CompiledCuda, name: str | None = None,
                      constants: dict[str, Any] | None = None) -> Program:
        """The Program of a kernel compiled elsewhere (`cuda_nvrtc.compile_cubin` with this device's options):
        the same handle type, meta and key as `compile` gives, the module cached per cubin."""
        if tuple(compiled.options) != self.options:
            raise ValueError(f"{compiled.entry} was compiled with {list(compiled.options)}, this device compiles "
                             f"with {list(self.options)}")
        key = (source_hash(compiled.source), compiled.entry, self.options)
        with self._lock:
            module = self._cubins.get(key)
        if module is None:
            with self._dev:
                module = self._cp.RawModule(path=str(_cubin_file(compiled.cubin)))
            with self._lock:
                self._cubins[key] = module
        with self._dev:
            func = module.get_function(compiled.lowered_name)
        return self._program(name or compiled.entry, func, compiled.source, compiled.entry, constants)

    def allow_dynamic_shared(self, program: Program, nbytes: int) -> None:
        """Launch `program` with `nbytes` of dynamic shared memory; above the 48 KB every kernel may use, the
        kernel is opted in first (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES).

        Raises:
            LaunchError: the GPU offers less shared memory per block than asked for.
        """
        optin = self.info.limits.shared_bytes_per_block_optin or self.info.limits.max_workgroup_storage_bytes
        static = int(program.meta.get("static_shared_bytes", 0))
        if nbytes + static > optin:
            raise LaunchError(f"{program.name} needs {nbytes + static} bytes of shared memory per block, this GPU "
                              f"offers {optin}", "pick a config with fewer stages or smaller tiles")
        if nbytes > 48 * 1024:
            try:
                with self._dev:
                    program.handle.max_dynamic_shared_size_bytes = int(nbytes)
            except self._cp.cuda.driver.CUDADriverError as exc:
                raise self._wrap(exc, f"opting {program.name} into {nbytes} bytes of shared memory") from exc
        program.meta["dynamic_shared_bytes"] = int(nbytes)

    def _program(self, label: str, func: Any, source: str, entry: str, constants: dict[str, Any] | None) -> Program:
        meta = {
            "source": source,
            "entry": entry,
            "options": list(self.options),
            "registers": int(func.num_regs),
            "local_bytes": int(func.local_size_bytes),  # > 0: registers spilled to local memory
            "static_shared_bytes": int(func.shared_size_bytes),
            "max_threads_per_block": int(func.max_threads_per_block),
        }
        return Program(label, func, source_hash(source, entry, *self.options), dict(constants or {}), meta)

    # ---- launches ----------------------------------------------------------------------------
    def _args(self, launch: Launch) -> tuple[Any, ...]:
        args: list[Any] = []
        for a in launch.buffers:
            if isinstance(a, Buffer):
                if a.device is not self:
                    raise LaunchError(f"{launch.program.name}: a buffer of another device was passed",
                                      "allocate every buffer on the device that launches the kernel")
                args.append(a.handle)
            elif isinstance(a, np.generic):
                args.append(a)
            elif isinstance(a, TensorMap):  # 128 bytes by value (a size-one NumPy array)
                args.append(a.array)
            else:
                raise LaunchError(f"{launch.program.name}: kernel argument {a!r} is neither a Buffer nor a NumPy "
                                  "scalar (nor a TMA TensorMap)", "pass scalars as np.int32(...) / np.float32(...)")
        return tuple(args)

    def _launch(self, launch: Launch, pdl: bool = False) -> bool:
        """Launch on the current stream (with programmatic dependent launch if `pdl`); False if nothing was
        launched (an empty grid)."""
        prog = launch.program
        if prog.meta.get("callable"):
            # a library call (cuBLAS through CuPy) timed like a kernel: handle(*args) on the current stream
            args = [a.handle if isinstance(a, Buffer) else a for a in launch.buffers]
            prog.handle(*args)
            return True
        block = prog.meta.get("block")
        if block is None:
            raise LaunchError(f"{prog.name} has no block size", "set Program.meta['block'] = (x, y, z) after compile")
        grid = grid3(launch.grid)
        if any(g > cap for g, cap in zip(grid, MAX_GRID)):
            raise LaunchError(f"{prog.name}: grid {grid} exceeds CUDA's limits {MAX_GRID}",
                              "use a larger tile or split the launch")
        if not all(g > 0 for g in grid):
            return False
        threads = int(np.prod(grid3(block)))
        if threads > prog.meta.get("max_threads_per_block", threads):
            raise LaunchError(f"{prog.name}: {threads} threads per block, but the compiled kernel can run at most "
                              f"{prog.meta['max_threads_per_block']} ({prog.meta.get('registers')} registers per "
                              "thread)", "pick a config with fewer threads or fewer registers")
        shared = int(prog.meta.get("dynamic_shared_bytes", 0))
        if pdl:
            args = [ctypes.c_void_p(int(a.data.ptr)) if isinstance(a, self._cp.ndarray) else a
                    for a in self._args(launch)]
            func = getattr(prog.handle, "kernel", prog.handle)  # a RawKernel's CUfunction (cupy.cuda.Function)
            launch_pdl(func.ptr, grid, grid3(block), shared, self._stream.ptr, args)
            self.pdl_launches += 1
            return True
        try:
            prog.handle(grid, grid3(block), self._args(launch), shared_mem=shared)
        except self._cp.cuda.driver.CUDADriverError as exc:
            raise self._wrap(exc, f"launching {prog.name} with grid {grid} block {block}") from exc
        return True

    def run(self, launches: Sequence[Launch | HostCopy], pdl: bool = False) -> None:
        """Run `launches` on the device's stream. pdl: launch each kernel that waits for its predecessor
        (`meta['pdl']`, `kernels/pdl.cuh`) and follows another kernel with programmatic dependent launch (on GPUs
        that have it: `self.pdl`)."""
        with self._dev, self._stream:
            self._steps(launches, pdl)

    def _steps(self, steps: Sequence[Launch | HostCopy], pdl: bool) -> None:
        after_kernel = False  # the stream's last operation was a kernel (not a copy, nor a library call)
        for step in steps:
            kernel = isinstance(step, Launch) and not step.program.meta.get("callable")
            use = pdl and self.pdl and after_kernel and kernel and bool(step.program.meta.get("pdl"))
            launched = self._step(step, use)
            if launched or not kernel:
                after_kernel = kernel

    def _step(self, step: Launch | HostCopy, pdl: bool = False) -> bool:
        if isinstance(step, Launch):
            return self._launch(step, pdl)
        if step.nbytes > min(step.host.nbytes, step.buffer.nbytes):
            raise LaunchError(f"a host copy of {step.nbytes} bytes overflows its host array or buffer",
                              "copy at most the smaller of the two")
        rt = self._cp.cuda.runtime
        ends = (int(step.buffer.handle.data.ptr), int(step.host.ctypes.data))
        (dst, src), kind = (ends, rt.memcpyHostToDevice) if step.to_device else (ends[::-1], rt.memcpyDeviceToHost)
        try:
            rt.memcpyAsync(dst, src, step.nbytes, kind, self._stream.ptr)
        except rt.CUDARuntimeError as exc:
            raise self._wrap(exc, f"copying {step.nbytes} bytes between host and GPU") from exc
        return True

    def pinned(self, shape: int | Sequence[int], dtype: Any = np.float32) -> np.ndarray:
        """A page-locked host array: what a `HostCopy` (and so a graph) reads or fills."""
        import cupyx

        with self._dev:
            return cupyx.empty_pinned(shape, dtype)

    def mapped(self, host: np.ndarray) -> Buffer:
        """The pinned host array `host` (`pinned`) as a buffer kernels read and write over the bus at its host
        address (unified addressing), so that a graph moves it without copy steps. LaunchError where the array is
        not page-locked memory this GPU addresses at the same address."""
        cp = self._cp
        ptr, nbytes = int(host.ctypes.data), int(host.nbytes)
        try:
            attrs = cp.cuda.runtime.pointerGetAttributes(ptr)
        except cp.cuda.runtime.CUDARuntimeError as exc:
            raise self._wrap(exc, "reading a host array's CUDA pointer attributes") from exc
        kind = getattr(attrs, "type", getattr(attrs, "memoryType", -1))  # CuPy's name for it varies by version
        if int(kind) != MEMORY_TYPE_HOST or int(attrs.devicePointer) != ptr:
            raise LaunchError(f"a host array of {nbytes} bytes is not page-locked memory {self.info.name} addresses "
                              "at its host address", "allocate it with pinned()")
        mem = cp.cuda.UnownedMemory(ptr, nbytes, host, self.info.index)
        return Buffer(self, cp.ndarray((nbytes,), cp.uint8, cp.cuda.MemoryPointer(mem, 0)), nbytes)

    def capture(self, steps: Sequence[Launch | HostCopy], pdl: bool = False) -> CudaGraph:
        """Record `steps` on the device's stream into a graph (nothing runs yet); with `pdl` as `run` launches them,
        so consecutive kernels are joined by programmatic edges. LaunchError: a step is a library call (it may
        allocate or use its own stream), `run` would refuse a launch, or CUDA rejects the capture."""
        for step in steps:
            if isinstance(step, Launch) and step.program.meta.get("callable"):
                raise LaunchError(f"{step.program.name} is a library call, which is not captured in a CUDA graph",
                                  "run this launch list with run() (TILEWISE_CUDA_GRAPHS=0 for the classifier)")
        s, err = self._stream, self._cp.cuda.runtime.CUDARuntimeError
        with self._dev, s:
            try:
                s.begin_capture()  # relaxed mode: CuPy's first-use context calls stay legal while capturing
            except err as exc:
                raise self._wrap(exc, "starting a CUDA graph capture") from exc
            try:
                self._steps(steps, pdl)
            except BaseException:
                with contextlib.suppress(Exception):  # a stream left capturing fails every later call on it
                    s.end_capture()
                raise
            try:
                graph = s.end_capture()
            except err as exc:
                raise self._wrap(exc, f"capturing a CUDA graph of {len(steps)} steps") from exc
        self.captures += 1
        return CudaGraph(self, graph, steps)

    def time(self, launches: Sequence[Launch], *, flush_l2: bool | None = None,
             runs: Sequence[int] | None = None) -> np.ndarray:
        """Each launch's GPU time in ms (CUDA events around it), launched back to back on one stream behind a hold
        (`cuda_hold.py`), so that no sample contains the host's time to launch.

        Args:
            launches: the launches, in order.
            flush_l2: overwrite a buffer larger than L2 before each run (outside its events) so every run starts
                with cold caches, as a real layer in a model does; default `self.flush_l2`.
            runs: the indices where a run (one candidate's launches) starts; None: every launch is a run. A run's
                later launches find what its earlier ones left in L2, as they do in the model (a split-K
                reduction reads its partial sums there).
        """
        n = len(launches)
        if n == 0:
            return np.empty(0)
        cp = self._cp
        flush = self.flush_l2 if flush_l2 is None else flush_l2
        starts = None if runs is None else {int(i) for i in runs}
        with self._dev, self._stream:
            if self._hold is None:
                self._hold = Hold(cp)
            events = [(cp.cuda.Event(), cp.cuda.Event()) for _ in range(n)]
            try:
                # what may allocate GPU memory runs before the hold: an allocation may wait for the GPU to be idle,
                # which would hold the host until the hold gave up
                if flush:
                    self._flush_buffer()
                for launch in {id(x.program): x for x in launches if x.program.meta.get("callable")}.values():
                    if not launch.program.meta.get("warm"):  # a library call's first call makes its buffers
                        self._launch(launch)
                        launch.program.meta["warm"] = True
                for a, b in batches(n, starts):
                    self._hold.hold()
                    try:
                        for i in range(a, b):
                            if flush and (starts is None or i in starts):
                                self._flush()
                            events[i][0].record()
                            self._launch(launches[i])
                            events[i][1].record()
                    finally:
                        self._hold.release()
                events[-1][1].synchronize()
            except cp.cuda.runtime.CUDARuntimeError as exc:
                raise self._wrap(exc, "timing launches") from exc
            self._hold.check()
            return np.array([cp.cuda.get_elapsed_time(s, e) for s, e in events], dtype=np.float64)

    def _flush_buffer(self) -> Any:
        if self._flush_buf is None:
            l2 = int(self.info.extra.get("l2_cache_bytes") or 0) or 64 << 20
            self._flush_buf = self._cp.empty(2 * l2 // 4, dtype=self._cp.float32)
        return self._flush_buf

    def _flush(self) -> None:
        self._flush_buffer().fill(0.0)  # a write of 2x L2 evicts every line the previous launch left

    def synchronize(self) -> None:
        try:
            self._dev.synchronize()
        except self._cp.cuda.runtime.CUDARuntimeError as exc:
            raise self._wrap(exc, "waiting for the GPU") from exc

    def _wrap(self, exc: Exception, doing: str) -> LaunchError:
        text = first_line(exc)
        if any(s in text for s in ("ILLEGAL_ADDRESS", "LAUNCH_FAILED", "illegal memory", "unspecified launch")):
            # a kernel fault poisons the CUDA context: every later call on it fails too
            self._lost = True
            from tilewise.errors import DeviceLost

            return DeviceLost(f"CUDA error while {doing}: {text}",
                              "the context is unusable after a kernel fault; restart the process")
        return LaunchError(f"CUDA error while {doing}: {text}",
                           "the config may exceed a resource (threads, registers, shared memory); it is stored as "
                           "launch_error and the sweep continues")

    def close(self) -> None:
        self._modules.clear()
        self._cubins.clear()
        self._flush_buf = None


def _cubin_file(cubin: bytes) -> Path:
    """`cubin` in a file named by its hash (CuPy loads a module from a path and caches it by that path)."""
    path = Path(cache_dir()) / "cubin" / f"{hashlib.sha256(cubin).hexdigest()}.cubin"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(cubin)
        os.replace(tmp, path)
    return path
