"""The CPU device: numpy arrays as buffers, Python callables as programs, BLAS through numpy.

A CPU "kernel" is a callable `fn(buffers, grid, **constants)` that receives the buffers' raw byte
arrays (np.uint8, writable) and works on views of them. The CPU executor and the float64 references
build on this device; it is also what `auto` falls back to when no GPU adapter is usable.
"""

from __future__ import annotations

import inspect
import os
import platform
from typing import Any

import numpy as np

from tilewise.devices.base import Buffer, DeviceInfo, HostDevice, Launch, Limits, Program, source_hash


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _blas_name() -> str:
    try:
        cfg = np.show_config(mode="dicts")  # numpy >= 1.25
        blas = cfg.get("Build Dependencies", {}).get("blas", {})
        return f"numpy {np.__version__} {blas.get('name', 'blas')} {blas.get('version', '')}".strip()
    except Exception:
        return f"numpy {np.__version__}"


class CPUDevice(HostDevice):
    """numpy-backed device; `time` is the host clock around each call (the work is synchronous)."""

    def __init__(self) -> None:
        threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        big = 2**62
        self.info = DeviceInfo(
            backend="cpu",
            name=_cpu_name(),
            adapter_type="cpu",
            api="numpy",
            driver=_blas_name(),
            vendor=platform.machine(),
            limits=Limits(
                max_workgroup_storage_bytes=big,
                max_invocations_per_workgroup=1,
                max_workgroup_size=(1, 1, 1),
                max_workgroups_per_dimension=big,
                max_buffer_bytes=big,
                max_storage_binding_bytes=big,
            ),
            features=("float64",),
            extra={"threads": threads},
        )

    def allocate(self, nbytes: int, *, uniform: bool = False) -> Buffer:
        return Buffer(self, np.empty(int(nbytes), dtype=np.uint8), int(nbytes), uniform)

    def compile(self, source: Any, entry: str = "main", constants: dict[str, Any] | None = None,
                name: str | None = None) -> Program:
        if not callable(source):
            raise TypeError("the CPU device compiles Python callables fn(buffers, grid, **constants)")
        try:
            text = inspect.getsource(source)
        except (OSError, TypeError):
            text = repr(source)
        consts = dict(constants or {})
        return Program(name or getattr(source, "__name__", "cpu_kernel"), source,
                       source_hash(text, repr(sorted(consts.items()))), consts)

    def _call(self, launch: Launch) -> None:
        launch.program.handle([b.handle for b in launch.buffers], launch.grid, **launch.program.constants)
