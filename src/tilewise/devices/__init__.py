"""Device registry: names -> backends, imported lazily so `import tilewise` needs no GPU library.

Names: `cpu`, `webgpu` (best adapter), `webgpu:N` (adapter N of `tilewise devices`), `cuda`,
`cuda:N`, `tvm-llvm` (TVM-compiled CPU code, optional extra), and `auto` (the best device the model
runtime can use: a GPU WebGPU adapter, else CPU).
"""

from __future__ import annotations

from typing import Any

from tilewise.devices.base import Buffer, Device, DeviceInfo, Launch, Limits, Program
from tilewise.errors import ConfigError, DeviceLost, DeviceUnavailable

__all__ = ["Buffer", "Device", "DeviceInfo", "Launch", "Limits", "Program", "get_device", "list_devices",
           "parse_device_name"]

BACKENDS = ("cpu", "webgpu", "cuda", "tvm-llvm")
_cache: dict[str, Device] = {}


def parse_device_name(name: str) -> tuple[str, int | None]:
    """Split `webgpu:1` into ("webgpu", 1); refuse unknown names with the list of valid ones."""
    base, _, idx = name.strip().lower().partition(":")
    if base not in (*BACKENDS, "auto"):
        raise ConfigError(f"unknown device {name!r}",
                          "use one of: auto, cpu, webgpu, webgpu:N, cuda, cuda:N, tvm-llvm (see `tilewise devices`)")
    if idx and not idx.isdigit():
        raise ConfigError(f"device index in {name!r} must be a number", "write e.g. webgpu:0 or cuda:1")
    return base, int(idx) if idx else None


def get_device(name: str = "auto") -> Device:
    """Return (and cache) the device called `name`."""
    base, index = parse_device_name(name)
    if base == "auto":
        return _get_auto()
    key = f"{base}:{index}" if index is not None else base
    dev = _cache.get(key)
    if dev is not None and not getattr(dev, "_lost", False):
        return dev
    if base == "cpu":
        from tilewise.devices.cpu import CPUDevice

        dev = CPUDevice()
    elif base == "webgpu":
        from tilewise.devices.webgpu import WebGPUDevice

        dev = WebGPUDevice(index)
    elif base == "tvm-llvm":
        from tilewise.devices.tvm_llvm import TVMLLVMDevice

        dev = TVMLLVMDevice()
    else:
        dev = _cuda(index)
    _cache[key] = dev
    return dev


def _cuda(index: int | None) -> Device:
    try:
        from tilewise.devices.cuda import CUDADevice
    except ImportError as exc:
        raise DeviceUnavailable(f"the CUDA backend is not available ({exc})",
                                "pip install 'tilewise[cuda]' on a machine with an NVIDIA GPU") from exc
    return CUDADevice(index or 0)


def _get_auto() -> Device:
    try:
        dev = get_device("webgpu")
        if dev.info.adapter_type in ("discrete", "integrated"):
            return dev
    except (DeviceUnavailable, DeviceLost):
        pass
    return get_device("cpu")


def list_devices() -> tuple[list[DeviceInfo], list[str]]:
    """Every usable device, and one note per backend that is not usable (with its fix)."""
    infos: list[DeviceInfo] = [get_device("cpu").info]
    notes: list[str] = []
    try:
        from tilewise.devices.webgpu import LAVAPIPE_FIX, list_adapters

        adapters = list_adapters()
        usable = [a for a in adapters if a.api.lower() != "opengl"]
        infos.extend(usable)
        if not usable:
            notes.append(f"webgpu: no Vulkan/Metal/D3D12 adapter ({len(adapters)} OpenGL-only); fix: {LAVAPIPE_FIX}")
    except DeviceUnavailable as exc:
        notes.append(f"webgpu: {exc}")
    try:
        from tilewise.devices.cuda import list_cuda_devices

        infos.extend(list_cuda_devices())
    except ImportError:
        notes.append("cuda: not available; fix: pip install 'tilewise[cuda]' on a machine with an NVIDIA GPU")
    except DeviceUnavailable as exc:
        notes.append(f"cuda: {exc}")
    return infos, notes


def describe(info: DeviceInfo) -> dict[str, Any]:
    return info.as_dict()
