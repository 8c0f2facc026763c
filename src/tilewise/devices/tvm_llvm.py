"""The `tvm-llvm` device: Apache TVM compiles scheduled TIR to host code through LLVM; tilewise runs and times it.

Buffers are 64-byte aligned numpy byte arrays (TVM's DLPack import refuses less); a launch hands TVM zero-copy
views shaped and typed as the compiled function's parameters. Programs are TVM functions built from an
`IRModule` or `PrimFunc` (the output of a `tvm.s_tir.Schedule`). `time` is the host clock around each call:
the call is synchronous, and the function runs on the calling thread unless its schedule has parallel loops.

TVM is an optional extra: `pip install 'tilewise[tvm]'` (apache-tvm 0.27 with apache-tvm-ffi 0.1.14 pinned).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from tilewise.devices.base import Buffer, DeviceInfo, HostDevice, Launch, Limits, Program, source_hash
from tilewise.devices.cpu import _cpu_name
from tilewise.errors import DeviceUnavailable, LaunchError, ShaderCompileError

TVM_INSTALL = "pip install 'tilewise[tvm]'  (or: pip install apache-tvm==0.27.0.post1 apache-tvm-ffi==0.1.14.post1)"
ALIGN_BYTES = 64


def import_tvm() -> Any:
    """The `tvm` module, or a DeviceUnavailable that names the install command."""
    try:
        import tvm
        import tvm.s_tir
        from tvm import te  # noqa: F401
    except ImportError as exc:
        raise DeviceUnavailable(f"Apache TVM is not installed ({exc}); the tvm-llvm device and the CPU conv1d "
                                "ladder need it", TVM_INSTALL) from exc
    return tvm


def host_mcpu(tvm: Any) -> str:
    """LLVM's name for this CPU (e.g. `znver4`): `-mcpu=native` is refused by TVM's LLVM, so ask for the name."""
    try:
        name = str(tvm.target.codegen.llvm_get_system_cpu())
    except Exception:
        return "generic"
    return name or "generic"


def aligned_empty(nbytes: int) -> np.ndarray:
    """A writable uint8 array of `nbytes` whose data pointer is 64-byte aligned."""
    raw = np.empty(int(nbytes) + ALIGN_BYTES, dtype=np.uint8)
    off = (-raw.ctypes.data) % ALIGN_BYTES
    return raw[off : off + int(nbytes)]


class TVMLLVMDevice(HostDevice):
    """Host CPU through TVM + LLVM. `compile` takes a scheduled `IRModule`/`PrimFunc`; buffers are aligned arrays."""

    timer = "wall-clock"

    def __init__(self, mcpu: str | None = None) -> None:
        self._tvm = tvm = import_tvm()
        self.mcpu = mcpu or host_mcpu(tvm)
        self.target = tvm.target.Target({"kind": "llvm", "mcpu": self.mcpu})
        threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        big = 2**62
        try:
            llvm = str(tvm.support.libinfo().get("LLVM_VERSION", ""))
        except Exception:
            llvm = ""
        self.info = DeviceInfo(
            backend="tvm-llvm",
            name=_cpu_name(),
            adapter_type="cpu",
            api="TVM-LLVM",
            driver=f"tvm {tvm.__version__} llvm {llvm} mcpu={self.mcpu}".strip(),
            vendor=os.uname().machine,
            limits=Limits(max_workgroup_storage_bytes=big, max_invocations_per_workgroup=1,
                          max_workgroup_size=(1, 1, 1), max_workgroups_per_dimension=big, max_buffer_bytes=big,
                          max_storage_binding_bytes=big),
            features=("float64",),
            extra={"threads": threads, "target": str(self.target)},
        )
        self._views: dict[tuple[int, tuple[int, ...], str], Any] = {}
        self._keep: list[np.ndarray] = []

    # ---- memory ------------------------------------------------------------------------------
    def allocate(self, nbytes: int, *, uniform: bool = False) -> Buffer:
        return Buffer(self, aligned_empty(max(int(nbytes), 4)), max(int(nbytes), 4), uniform)

    # ---- programs ----------------------------------------------------------------------------
    def compile(self, source: Any, entry: str = "main", constants: dict[str, Any] | None = None,
                name: str | None = None) -> Program:
        """Build a scheduled TIR module with LLVM for this CPU.

        Args:
            source: an `IRModule` (e.g. `Schedule.mod`) or a `PrimFunc`.
            entry: the function to call.
            constants: unused (TIR carries its constants); kept for the interface.
            name: label for reports.

        Returns:
            A Program whose meta holds the parameters' (shape, dtype), in call order.
        """
        tvm = self._tvm
        name = name or entry
        mod = source if isinstance(source, tvm.IRModule) else tvm.IRModule({entry: source})
        try:
            func = mod[entry]
            # TVM 0.27: a PrimFunc's params are its buffers (older TVM kept them in buffer_map)
            bmap = getattr(func, "buffer_map", None)
            bufs = [bmap[p] for p in func.params] if bmap is not None else list(func.params)
            params = [(tuple(int(d) for d in b.shape), str(b.dtype)) for b in bufs]
            script = mod.script()
            lib = tvm.compile(mod, target=self.target)
            handle = lib[entry]
        except Exception as exc:
            lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
            raise ShaderCompileError(f"TVM could not build {name}: {lines[-1] if lines else type(exc).__name__}",
                                     "check the schedule; `--show-source` prints the TVMScript") from exc
        return Program(name, handle, source_hash(script, str(self.target)), dict(constants or {}),
                       meta={"params": params, "source": script, "lib": lib})

    def _view(self, buffer: Buffer, shape: tuple[int, ...], dtype: str) -> Any:
        key = (id(buffer.handle), shape, dtype)
        t = self._views.get(key)
        if t is None:
            count = int(np.prod(shape)) * np.dtype(dtype).itemsize
            if count > buffer.nbytes:
                raise LaunchError(f"a {dtype}{list(shape)} parameter needs {count} bytes but its buffer has "
                                  f"{buffer.nbytes}", "allocate the buffer at the shape the program was built for")
            arr = buffer.handle[:count].view(dtype).reshape(shape)
            t = self._tvm.runtime.from_dlpack(arr)
            if len(self._views) > 4096:
                self._views.clear()
                self._keep.clear()
            self._views[key] = t
            self._keep.append(buffer.handle)  # a cached view must not outlive its array (ids get reused)
        return t

    def _call(self, launch: Launch) -> None:
        params = launch.program.meta["params"]
        if len(params) != len(launch.buffers):
            raise LaunchError(f"{launch.program.name} takes {len(params)} buffers, got {len(launch.buffers)}",
                              "pass one buffer per parameter, in order")
        args = [self._view(b, shape, dtype) for b, (shape, dtype) in zip(launch.buffers, params)]
        try:
            launch.program.handle(*args)
        except Exception as exc:
            raise LaunchError(f"{launch.program.name} failed: {str(exc).strip().splitlines()[-1:]}",
                              "rerun with --debug for TVM's message") from exc
