"""What CUDA reports of its GPUs, without creating a device: CuPy imported on demand, `DeviceInfo` and `Limits` read
from the device properties, and where compiled modules are cached. `cuda.py` (the device) builds on it; listing
devices (`tilewise devices`) needs only this.
"""

from __future__ import annotations

import os
from typing import Any

from tilewise.devices.base import DeviceInfo, Limits
from tilewise.errors import DeviceUnavailable

INSTALL_FIX = "pip install 'tilewise[cuda]' (CuPy for CUDA 13) on a machine with an NVIDIA GPU and driver"

#: CUDA caps grid y and z at 65535 blocks, x at 2**31 - 1
MAX_GRID = (2**31 - 1, 65535, 65535)


def import_cupy() -> Any:
    try:
        import cupy
    except ImportError as exc:
        raise DeviceUnavailable(f"CuPy is not installed ({exc})", INSTALL_FIX) from exc
    except Exception as exc:  # a broken CUDA install raises at import
        raise DeviceUnavailable(f"CuPy failed to import: {first_line(exc)}", INSTALL_FIX) from exc
    return cupy


def device_count(cupy: Any) -> int:
    try:
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:
        raise DeviceUnavailable(f"no usable NVIDIA GPU: {first_line(exc)}",
                                "check `nvidia-smi`; install the NVIDIA driver, then " + INSTALL_FIX) from exc


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.split(b"\0", 1)[0].decode(errors="replace")
    return str(value)


def info_from(cupy: Any, index: int) -> DeviceInfo:
    rt = cupy.cuda.runtime
    p = rt.getDeviceProperties(index)
    warp = int(p.get("warpSize", 32))
    max_dims = tuple(int(x) for x in p.get("maxThreadsDim", (1024, 1024, 64)))
    max_grid = tuple(int(x) for x in p.get("maxGridSize", MAX_GRID))
    total = int(p.get("totalGlobalMem", 0))
    limits = Limits(
        max_workgroup_storage_bytes=int(p["sharedMemPerBlock"]),
        max_invocations_per_workgroup=int(p["maxThreadsPerBlock"]),
        max_workgroup_size=max_dims,  # type: ignore[arg-type]
        max_workgroups_per_dimension=min(max_grid),
        max_buffer_bytes=total,
        max_storage_binding_bytes=total,
        subgroup_size_min=warp,
        subgroup_size_max=warp,
        warp_size=warp,
        shared_bytes_per_block_optin=_opt_int(p.get("sharedMemPerBlockOptin")),
        shared_bytes_per_multiprocessor=_opt_int(p.get("sharedMemPerMultiprocessor")),
        registers_per_block=_opt_int(p.get("regsPerBlock")),
        registers_per_multiprocessor=_opt_int(p.get("regsPerMultiprocessor")),
        max_threads_per_multiprocessor=_opt_int(p.get("maxThreadsPerMultiProcessor")),
        multiprocessors=_opt_int(p.get("multiProcessorCount")),
        compute_capability=f"{int(p['major'])}.{int(p['minor'])}",
    )
    driver = rt.driverGetVersion()
    runtime = rt.runtimeGetVersion()
    uuid = p.get("uuid")
    return DeviceInfo(
        backend="cuda",
        name=_text(p.get("name", f"CUDA device {index}")),
        adapter_type="discrete",
        api="CUDA",
        driver=f"{driver // 1000}.{driver % 1000 // 10}",
        vendor="NVIDIA",
        limits=limits,
        features=("fp32", "float4"),
        index=index,
        extra={
            "cuda_runtime": f"{runtime // 1000}.{runtime % 1000 // 10}",
            "cupy": getattr(cupy, "__version__", "?"),
            "l2_cache_bytes": int(p.get("l2CacheSize", 0)),
            "global_memory_bytes": total,
            "clock_khz": int(p.get("clockRate", 0)),
            **({"uuid": uuid.hex() if isinstance(uuid, bytes) else str(uuid)} if uuid is not None else {}),
        },
    )


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


def list_cuda_devices() -> list[DeviceInfo]:
    """DeviceInfo of every visible NVIDIA GPU.

    Returns:
        One DeviceInfo per CUDA device, in CUDA's order (`cuda:0`, `cuda:1`, ...).

    Raises:
        DeviceUnavailable: CuPy is missing or no GPU/driver is usable (the message carries the fix).
    """
    cupy = import_cupy()
    return [info_from(cupy, i) for i in range(device_count(cupy))]


def cache_dir() -> str:
    """Directory of compiled CUDA modules (CuPy's kernel cache; `CUPY_CACHE_DIR` overrides)."""
    env = os.environ.get("CUPY_CACHE_DIR")
    if env:
        return env
    try:
        from platformdirs import user_cache_dir

        base = user_cache_dir("tilewise", appauthor=False)
    except ImportError:  # platformdirs is a dependency; this keeps a bare checkout usable
        base = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tilewise")
    return os.path.join(base, "cuda")


def first_line(exc: Exception) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return " / ".join(lines[:2]) if lines else type(exc).__name__
