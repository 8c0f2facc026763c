"""WebGPU adapters before a device exists: the `Runtime` (which module with wgpu-py's API, and its hooks), what an
adapter reports (`DeviceInfo`, `Limits`), listing adapters and picking the best usable one. `webgpu.py` (the
device) and `dawn.py` (Dawn's runtime) build on it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tilewise.devices.base import DeviceInfo, Limits
from tilewise.errors import ConfigError, DeviceUnavailable

WANTED_FEATURES = ("timestamp-query", "timestamp-query-inside-passes", "shader-f16", "subgroup")
LAVAPIPE_FIX = "install a Vulkan driver; on Debian/Ubuntu: apt-get install -y mesa-vulkan-drivers libvulkan1"
_RANK = {"discrete": 0, "integrated": 1, "virtual": 2, "cpu": 3, "unknown": 4}


def private_runtime_dir() -> None:
    """Vulkan loaders warn on every call without a runtime dir; give the process a private one."""
    if not os.environ.get("XDG_RUNTIME_DIR") or not os.path.isdir(os.environ["XDG_RUNTIME_DIR"]):
        os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="tilewise-xdg-")


def import_wgpu() -> Any:
    private_runtime_dir()
    try:
        import wgpu
    except ImportError as exc:  # pragma: no cover - wgpu is a core dependency
        raise DeviceUnavailable(f"the WebGPU backend needs wgpu-py ({exc})", "pip install wgpu") from exc
    return wgpu


def adapter_type(info: Any) -> str:
    """discrete | integrated | virtual | cpu | unknown, from wgpu-py's adapter info."""
    t = str(info.get("adapter_type", "")).lower()
    for key in ("discrete", "integrated", "virtual", "cpu"):
        if key in t:
            return key
    return "unknown"


def limits_from(lim: Any, info: Any, **more: Any) -> Limits:
    """`Limits` from wgpu-py's adapter limits and info (`more`: fields only some runtimes report)."""
    sub_min = info.get("subgroup_min_size") or info.get("stackgroup_min_size")
    sub_max = info.get("subgroup_max_size") or info.get("stackgroup_max_size")
    return Limits(
        max_workgroup_storage_bytes=int(lim["max-compute-workgroup-storage-size"]),
        max_invocations_per_workgroup=int(lim["max-compute-invocations-per-workgroup"]),
        max_workgroup_size=(int(lim["max-compute-workgroup-size-x"]), int(lim["max-compute-workgroup-size-y"]),
                            int(lim["max-compute-workgroup-size-z"])),
        max_workgroups_per_dimension=int(lim["max-compute-workgroups-per-dimension"]),
        max_buffer_bytes=int(lim["max-buffer-size"]),
        max_storage_binding_bytes=int(lim["max-storage-buffer-binding-size"]),
        subgroup_size_min=int(sub_min) if sub_min else None,
        subgroup_size_max=int(sub_max) if sub_max else None,
        **more,
    )


def info_from(adapter: Any, index: int, **fields: Any) -> DeviceInfo:
    """The `DeviceInfo` of a wgpu-py adapter (`fields` override or add DeviceInfo fields)."""
    info = adapter.info
    values: dict[str, Any] = dict(
        backend="webgpu",
        name=str(info.get("device", "unknown")),
        adapter_type=adapter_type(info),
        api=str(info.get("backend_type", "unknown")),
        driver=str(info.get("description", "")),
        vendor=str(info.get("vendor", "")) or f"0x{int(info.get('vendor_id', 0)):04x}",
        limits=limits_from(adapter.limits, info),
        features=tuple(sorted(str(f) for f in adapter.features)),
        index=index,
        extra={"vendor_id": int(info.get("vendor_id", 0)), "device_id": int(info.get("device_id", 0))},
    )
    values.update(fields)
    return DeviceInfo(**values)


MAP_WAITS = ("block", "spin")


def map_wait_mode(runtime: Runtime) -> str:
    """`TILEWISE_MAP_WAIT` (block or spin; spin only where the runtime can process events), else block.

    Raises:
        ConfigError: the variable names another mode.
    """
    asked = os.environ.get("TILEWISE_MAP_WAIT", "").strip() or "block"
    if asked not in MAP_WAITS:
        raise ConfigError(f"TILEWISE_MAP_WAIT={asked!r} is not a map wait mode",
                          f"set it to one of {', '.join(MAP_WAITS)} (or unset it)")
    return asked if runtime.process_events is not None else "block"


@dataclass(frozen=True)
class Runtime:
    """A module with wgpu-py's API and what differs per module.

    Args:
        name: the device name's prefix (`webgpu`, `dawn`).
        import_module: imports the module (lazily, on first use) and prepares it (instance options).
        adapters: the module -> its adapters, in index order.
        describe: (adapter, index) -> its DeviceInfo.
        request_device: (adapter, features) -> a device with those features and the adapter's maximum limits.
        wanted_features: features requested where the adapter offers them.
        no_adapter_fix: the fix when the module finds no adapter.
        process_events: module -> None, one non-blocking round of the module's event processing (Dawn's
            `wgpuInstanceProcessEvents`), for the `spin` map wait; None where the module has none.
        many_pipelines: how a batch of pipelines is built at once: `threads` (the device may be called from several
            threads: wgpu-native's is), `async` (`create_compute_pipeline_async`, built on the runtime's own
            threads: Dawn, whose device takes calls from one thread at a time) or `serial`.
        refusals: () -> what the runtime said about adapters it refused while listing them (Dawn prints why it
            passes over a driver, e.g. Mesa 22's lavapipe), so that "no adapter" can say why; None where it says
            nothing.
    """

    name: str
    import_module: Callable[[], Any]
    adapters: Callable[[Any], list[Any]]
    describe: Callable[[Any, int], DeviceInfo]
    request_device: Callable[[Any, list[str]], Any]
    wanted_features: tuple[str, ...]
    no_adapter_fix: str
    process_events: Callable[[Any], None] | None = None
    many_pipelines: str = "serial"
    refusals: Callable[[], list[str]] | None = None


def _wgpu_request(adapter: Any, features: list[str]) -> Any:
    return adapter.request_device_sync(required_features=features, required_limits=dict(adapter.limits))


# wgpu-native; the import goes through the module-level name so that tests can stand in fake adapters
WGPU_NATIVE = Runtime("webgpu", lambda: import_wgpu(), lambda m: list(m.gpu.enumerate_adapters_sync()),
                      info_from, _wgpu_request, WANTED_FEATURES, LAVAPIPE_FIX, many_pipelines="threads")


def list_adapters(runtime: Runtime = WGPU_NATIVE) -> list[DeviceInfo]:
    """Every adapter the runtime can see, OpenGL ones included (the caller decides what is usable)."""
    module = runtime.import_module()
    return [runtime.describe(a, i) for i, a in enumerate(runtime.adapters(module))]


def runtime_kind(runtime: Runtime) -> str:
    return "WebGPU" if runtime.name == "webgpu" else f"{runtime.name.capitalize()} WebGPU"


def pick_adapter(index: int | None, runtime: Runtime = WGPU_NATIVE) -> tuple[Any, DeviceInfo]:
    module = runtime.import_module()
    adapters = runtime.adapters(module)
    infos = [runtime.describe(a, i) for i, a in enumerate(adapters)]
    refused = "; ".join(runtime.refusals()) if runtime.refusals is not None else ""
    who = runtime.name.capitalize()
    if not adapters:  # before the index check: with none found, why none matters more than which was asked for
        why = f"{who} refused what it found: {refused}" if refused else "no Vulkan, Metal or D3D12 driver"
        raise DeviceUnavailable(f"no {runtime_kind(runtime)} adapter found ({why})", runtime.no_adapter_fix)
    if index is not None:
        if not 0 <= index < len(adapters):
            also = f"; {who} refused others: {refused}" if refused else ""
            raise DeviceUnavailable(f"there is no {runtime_kind(runtime)} adapter {index} (found {len(adapters)}"
                                    f"{also})", "run `tilewise devices` to list adapters")
        chosen = [index]
    else:
        chosen = sorted((i for i, inf in enumerate(infos) if inf.api.lower() != "opengl"),
                        key=lambda i: (_RANK[infos[i].adapter_type], i))
    if not chosen or infos[chosen[0]].api.lower() == "opengl":
        names = ", ".join(f"{i.name} ({i.api})" for i in infos)
        raise DeviceUnavailable(f"only OpenGL WebGPU adapters were found: {names}; tilewise needs Vulkan, "
                                "Metal or D3D12 for compute", LAVAPIPE_FIX)
    return adapters[chosen[0]], infos[chosen[0]]
