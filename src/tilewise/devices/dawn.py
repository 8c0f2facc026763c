"""WebGPU on Google's Dawn (wgpudawn, the wgpu-py API): the WebGPU device class with Dawn's setup.

Why a second WebGPU runtime: Dawn offers `chromium-experimental-subgroup-matrix` (tensor-core fragments from WGSL)
and `shader-f16` on NVIDIA, which wgpu-native does not. Every WGSL template runs on it unchanged
(`DeviceInfo.backend` is "webgpu"); `runtime` is "dawn" and the fingerprint starts `webgpu+dawn-<version>`, so
results measured through Dawn never mix with wgpu-native's for the same GPU.

Setup: the instance toggle `allow_unsafe_apis` (Dawn offers experimental features only with it) and the adapter
toggles `vulkan_enable_f16_on_nvidia` and `use_vulkan_memory_model` (`set_instance_extras` gives each toggle to its
stage); the device disables `timestamp_quantization` (Dawn rounds timestamps to 65.5 us otherwise) and requests
timestamps, shader-f16, subgroups and subgroup matrices where offered. Robustness (bounds-checked buffer access)
stays on unless `disable_robustness=True` is asked for (from the command line: `TILEWISE_DAWN_UNCHECKED=1`); the
fingerprint then says so, so an unchecked device's results and tables never mix with the checked one's.

Dawn's Null backend (no GPU, compiles shaders without running them) is listed only when the environment forces it
(`WGPU_BACKEND_TYPE=Null`); it counts as a virtual adapter, which `auto` never picks.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

from tilewise.devices.base import DeviceInfo, SubgroupMatrixConfig
from tilewise.devices.webgpu import WebGPUDevice
from tilewise.devices.webgpu_adapters import Runtime, info_from, limits_from, private_runtime_dir
from tilewise.errors import DeviceUnavailable

DAWN_FIX = "pip install 'tilewise[dawn]' (in a clone: bash scripts/run extras dawn)"
NO_ADAPTER_FIX = ("Dawn needs a Vulkan, Metal or D3D12 driver it accepts; it refuses Mesa 22's lavapipe (Debian 12), "
                  "which Mesa 25 (mesa-vulkan-drivers from bookworm-backports) replaces; or use --device webgpu")
_SAID = "Dawn said while listing adapters: "
INSTANCE_TOGGLES = ("allow_unsafe_apis", "vulkan_enable_f16_on_nvidia", "use_vulkan_memory_model")
DEVICE_DISABLED_TOGGLES = ("timestamp_quantization",)
SUBGROUP_MATRIX = "chromium-experimental-subgroup-matrix"
WANTED_FEATURES = ("timestamp-query", "chromium-experimental-timestamp-query-inside-passes", "shader-f16",
                   "subgroups", SUBGROUP_MATRIX)
# a subgroup-matrix kernel also needs f16 and subgroups: without them the configs are not reported
_MATRIX_NEEDS = ("shader-f16", "subgroups", SUBGROUP_MATRIX)
_state: dict[str, Any] = {}


def available() -> bool:
    """True when wgpudawn is installed (nothing is imported)."""
    return importlib.util.find_spec("wgpudawn") is not None


def _import_dawn() -> Any:
    """wgpudawn, its instance created once with `INSTANCE_TOGGLES`."""
    if "module" in _state:
        return _state["module"]
    private_runtime_dir()
    try:
        import wgpudawn
        from wgpudawn.backends.dawn import extras
    except ImportError as exc:
        raise DeviceUnavailable(f"the Dawn runtime needs wgpudawn, which is not installed ({exc})", DAWN_FIX) from exc
    try:
        extras.set_instance_extras(enable_toggles=list(INSTANCE_TOGGLES))
    except RuntimeError as exc:  # the instance exists already (made by other code): its toggles are what they are
        _state["instance_note"] = str(exc).splitlines()[0]
    _state["module"], _state["extras"] = wgpudawn, extras
    return wgpudawn


@contextlib.contextmanager
def _native_stderr_to_notes() -> Iterator[None]:
    """Dawn's C++ prints an adapter it refuses (e.g. Mesa 22's lavapipe) straight to the process's stderr while
    enumerating; catch those lines at the file-descriptor level and keep them as notes for `tilewise devices`."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            text = caught.read().decode(errors="replace")
    refused = [ln.strip() for ln in text.splitlines() if ln.startswith("Warning:")]
    notes = _state.setdefault("notes", [])
    for line in refused:
        note = _SAID + line.removeprefix("Warning:").strip()
        if note not in notes:
            notes.append(note)


def notes() -> list[str]:
    """What Dawn said while listing adapters (an adapter it refused and why, limits it lowered)."""
    return list(_state.get("notes", []))


def refusals() -> list[str]:
    """Dawn's own words for each adapter it refused while listing them (the notes without their prefix)."""
    return [n.removeprefix(_SAID).rstrip(".") for n in notes() if n.startswith(_SAID)]


def _adapters(module: Any) -> list[Any]:
    with _native_stderr_to_notes():
        found = list(module.gpu.enumerate_adapters_sync())
    if os.environ.get("WGPU_BACKEND_TYPE", "").strip().lower() == "null":
        try:
            with _native_stderr_to_notes():
                null = module.gpu.request_adapter_sync()
        except Exception:  # a build without the Null backend simply has no such adapter
            null = None
        if null is not None and null.info.get("backend_type") == "Null":
            found.append(null)
    return found


def dawn_version() -> str:
    """Dawn's release (wgpudawn's native library), e.g. `20261009.190412`."""
    _import_dawn()
    from wgpudawn.backends import dawn

    return str(dawn.__version__)


def _matrix_configs(adapter: Any) -> tuple[SubgroupMatrixConfig, ...] | None:
    if not all(f in adapter.features for f in _MATRIX_NEEDS):
        return None
    props = _state["extras"].get_adapter_properties(adapter)
    return tuple(SubgroupMatrixConfig(str(c["component_type"]), str(c["result_component_type"]), int(c["m"]),
                                      int(c["n"]), int(c["k"]), int(c["min_subgroup_size"]),
                                      int(c["max_subgroup_size"]))
                 for c in props.get("subgroup_matrix_configs", []))


def _describe(adapter: Any, index: int, disable_robustness: bool = False) -> DeviceInfo:
    info = adapter.info
    null = info.get("backend_type") == "Null"
    base = info_from(adapter, index)
    version = dawn_version() + ("+no-robustness" if disable_robustness else "")
    return info_from(adapter, index, adapter_type="virtual" if null else base.adapter_type,
                     limits=limits_from(adapter.limits, info, subgroup_matrix_configs=_matrix_configs(adapter)),
                     runtime="dawn", runtime_version=version,
                     extra={**base.extra, "instance_toggles": list(INSTANCE_TOGGLES),
                            "disabled_device_toggles": list(DEVICE_DISABLED_TOGGLES),
                            "robustness": not disable_robustness})


def runtime(disable_robustness: bool = False) -> Runtime:
    """The Dawn runtime hooks (`disable_robustness`: the device toggle of that name, off by default)."""
    enabled = ["disable_robustness"] if disable_robustness else []

    def request(adapter: Any, features: list[str]) -> Any:
        return _state["extras"].request_device_sync(adapter, required_features=features,
                                                    required_limits=dict(adapter.limits), enable_toggles=enabled,
                                                    disable_toggles=list(DEVICE_DISABLED_TOGGLES))

    return Runtime("dawn", _import_dawn, _adapters, lambda a, i: _describe(a, i, disable_robustness), request,
                   WANTED_FEATURES, NO_ADAPTER_FIX, _process_events, many_pipelines="async", refusals=refusals)


def _process_events(module: Any) -> None:
    """One round of Dawn's event processing (`wgpuInstanceProcessEvents`, non-blocking), for the spin map wait."""
    from wgpudawn.backends.dawn import process_events

    process_events()


UNCHECKED_ENV = "TILEWISE_DAWN_UNCHECKED"


def unchecked_asked() -> bool:
    """`TILEWISE_DAWN_UNCHECKED`: 1 runs `dawn` devices without robustness (every verification then guards each
    output and scratch buffer with canary words), 0 or unset keeps it.

    Raises:
        ConfigError: another value.
    """
    from tilewise.errors import ConfigError

    asked = os.environ.get(UNCHECKED_ENV, "").strip()
    if asked not in ("", "0", "1"):
        raise ConfigError(f"{UNCHECKED_ENV}={asked!r} is not 0 or 1",
                          f"set {UNCHECKED_ENV}=1 for Dawn without robustness, 0 or unset for the default")
    return asked == "1"


def list_adapters() -> list[DeviceInfo]:
    """Every adapter Dawn sees (the Null one only where the environment forces it)."""
    from tilewise.devices.webgpu_adapters import list_adapters as listed

    return listed(runtime())


class DawnDevice(WebGPUDevice):
    """The WebGPU device on Dawn (see the module docstring); `toggles` are the device's enabled Dawn toggles."""

    def __init__(self, index: int | None = None, *, disable_robustness: bool = False) -> None:
        super().__init__(index, runtime(disable_robustness))
        self.disable_robustness = disable_robustness
        self.unchecked = disable_robustness  # verification then guards every output with canaries
        self.toggles: tuple[str, ...] = tuple(_state["extras"].get_toggles(self._dev))
        # what was asked for and what Dawn did, for `tilewise devices --json` and bug reports
        self.info.extra["device_toggles"] = list(self.toggles)
        self.info.extra["enabled_features"] = sorted(self.enabled_features)
