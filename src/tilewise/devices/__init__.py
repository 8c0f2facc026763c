"""The one device resolver: names -> backends, imported lazily so `import tilewise` needs no GPU library.

Names, the same in every command and in `tilewise.load`: `auto`, `cpu`, `webgpu` (the best adapter), `webgpu:N`
(adapter N of `tilewise devices`), `dawn`, `dawn:N` (WebGPU on Google's Dawn, an optional extra: the same WGSL, plus
subgroup matrices), `cuda`, `cuda:N`, `tvm-llvm` (TVM-compiled CPU code, an optional extra).

Dawn is a second runtime of the `webgpu` backend: a job that runs on `webgpu` runs on `dawn` too. `auto` considers
Dawn's adapters where wgpudawn is installed (never its Null adapter); on a tie with wgpu-native (the same kind of
GPU) it takes wgpu-native unless the caller says `prefer="dawn"`.

`resolve(name, backends, job)` is what commands call: `backends` are the backends that can run the job (the
model's executors, a kernel family's implementations), in the caller's order of preference. `auto` means the
fastest device among them: a discrete GPU over an integrated one, a GPU over the CPU, the CPU over a software
adapter (lavapipe is far slower than numpy). A named device the job cannot run on is refused with the reason and
the devices it can run on. The `Choice` says which device was picked and why, in one line.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tilewise.devices.base import Buffer, Device, DeviceInfo, Launch, Limits, Program
from tilewise.errors import ConfigError, DeviceLost, DeviceUnavailable

__all__ = ["BACKENDS", "Buffer", "Choice", "Device", "DeviceInfo", "Launch", "Limits", "Program", "get_device",
           "list_devices", "parse_device_name", "resolve"]

BACKENDS = ("cpu", "webgpu", "cuda", "tvm-llvm")
#: device-name prefixes that are a runtime of a backend rather than a backend of their own
RUNTIMES = {"dawn": "webgpu"}
#: what `auto` may pick when the caller names no job: every backend a model or kernel runs on, fastest first
ALL_BACKENDS = ("cuda", "webgpu", "cpu")
# rank of a device for `auto`: lower is faster
_RANK = {"discrete": 0, "integrated": 1, "host": 2, "virtual": 3, "cpu": 3, "unknown": 3}
_cache: dict[str, Device] = {}


@dataclass(frozen=True)
class Choice:
    """A resolved device: the device, its canonical name (`webgpu:0`, `cpu`) and why it was picked."""

    device: Device
    name: str
    reason: str

    def line(self) -> str:
        """One line for a command to print: `device: webgpu:0 (NVIDIA H200, Vulkan, discrete GPU): why`."""
        info = self.device.info
        kind = {"discrete": "discrete GPU", "integrated": "integrated GPU", "cpu": "software adapter",
                "virtual": "virtual adapter"}.get(info.adapter_type, info.adapter_type)
        what = (f"{info.name}, {info.api}" + (f" on {info.runtime.capitalize()}" if info.runtime else "")
                + (f", {kind}" if info.backend != "cpu" else "")
                + (", unchecked: no robustness" if getattr(self.device, "unchecked", False) else ""))
        return f"device: {self.name} ({what}): {self.reason}"


def parse_device_name(name: str) -> tuple[str, int | None]:
    """Split `webgpu:1` into ("webgpu", 1); refuse unknown names with the list of valid ones."""
    base, _, idx = str(name).strip().lower().partition(":")
    if base not in (*BACKENDS, *RUNTIMES, "auto"):
        raise ConfigError(f"unknown device {name!r}", "use one of: auto, cpu, webgpu, webgpu:N, dawn, dawn:N, cuda, "
                          "cuda:N, tvm-llvm (see `tilewise devices`)")
    if idx and not idx.isdigit():
        raise ConfigError(f"device index in {name!r} must be a number", "write e.g. webgpu:0 or cuda:1")
    if idx and base in ("cpu", "tvm-llvm", "auto"):
        raise ConfigError(f"device {name!r} takes no index", f"write {base}")
    return base, int(idx) if idx else None


def get_device(name: str = "auto") -> Device:
    """Return (and cache) the device called `name` (`auto`: `resolve("auto").device`)."""
    base, index = parse_device_name(name)
    if base == "auto":
        return resolve("auto").device
    key = f"{base}:{index}" if index is not None else base
    unchecked = False
    if base == "dawn":
        from tilewise.devices.dawn import unchecked_asked

        unchecked = unchecked_asked()
        key += "+unchecked" * unchecked  # never the checked device when the unchecked one is asked for
    dev = _cache.get(key)
    if dev is not None and not getattr(dev, "_lost", False):
        return dev
    if base == "cpu":
        from tilewise.devices.cpu import CPUDevice

        dev = CPUDevice()
    elif base == "webgpu":
        from tilewise.devices.webgpu import WebGPUDevice

        dev = WebGPUDevice(index)
    elif base == "dawn":
        from tilewise.devices.dawn import DawnDevice

        dev = DawnDevice(index, disable_robustness=unchecked)
    elif base == "tvm-llvm":
        from tilewise.devices.tvm_llvm import TVMLLVMDevice

        dev = TVMLLVMDevice()
    else:
        try:
            from tilewise.devices.cuda import CUDADevice
        except ImportError as exc:
            raise DeviceUnavailable(f"the CUDA backend is not available ({exc})",
                                    "pip install 'tilewise[cuda]' on a machine with an NVIDIA GPU") from exc
        dev = CUDADevice(index or 0)
    _cache[key] = dev
    return dev


def _names(backends: Sequence[str]) -> str:
    """The device names a job on `backends` takes, a runtime beside its backend (dawn after webgpu)."""
    names = (r for b in backends for r in (b, *(x for x, of in RUNTIMES.items() if of == b)))
    return ", ".join(n for r in names for n in ((r, f"{r}:N") if RUNTIMES.get(r, r) in ("webgpu", "cuda") else (r,)))


def _dawn_adapters() -> list[DeviceInfo]:
    """Dawn's real adapters where wgpudawn is installed (its Null adapter never counts for `auto`)."""
    from tilewise.devices import dawn

    if not dawn.available():
        return []
    return [i for i in dawn.list_adapters() if i.api != "Null"]


def _candidates(backends: Sequence[str], prefer: str | None = None) -> list[tuple[int, int, str, DeviceInfo]]:
    """(rank, preference, name, info) of every device of `backends` this machine has, best first (a tie between
    wgpu-native and Dawn goes to wgpu-native unless `prefer` is "dawn")."""
    out: list[tuple[int, int, str, DeviceInfo]] = []
    for pref, b in enumerate(backends):
        if b == "webgpu":
            for lister in (_wgpu_native_adapters, _dawn_adapters):
                try:
                    out += [(_RANK.get(i.adapter_type, 3), pref, i.device_name, i) for i in lister()]
                except (ImportError, DeviceUnavailable, DeviceLost):
                    continue  # that runtime is not usable here; the other may be
            continue
        try:
            if b == "cuda":
                from tilewise.devices.cuda_info import list_cuda_devices

                out += [(_RANK["discrete"], pref, f"cuda:{i.index}", i) for i in list_cuda_devices()]
            elif b in ("cpu", "tvm-llvm"):
                out.append((_RANK["host"], pref, b, get_device(b).info))
        except (ImportError, DeviceUnavailable, DeviceLost):
            continue  # that backend is not usable here; the others may be
    late = "webgpu" if prefer == "dawn" else "dawn"
    return sorted(out, key=lambda c: (c[0], c[1], (c[3].runtime or c[3].backend) == late))


def _wgpu_native_adapters() -> list[DeviceInfo]:
    from tilewise.devices.webgpu_adapters import list_adapters

    return [i for i in list_adapters() if i.api.lower() != "opengl"]


def resolve(name: str = "auto", backends: Sequence[str] | None = None, job: str = "this job",
            noun: str = "implementation", prefer: str | None = None,
            measured: Callable[[DeviceInfo, DeviceInfo], str | None] | None = None) -> Choice:
    """The device called `name` for a job that runs on `backends` (preference order; None: any).

    Args:
        name: a device name (see the module docstring).
        backends: the backends the job has an implementation for, fastest first.
        job: the job in words, for messages ("the classifier", "tuning gemm").
        noun: what the job has per backend, for messages ("executor", "implementation").
        prefer: "dawn" makes `auto` take Dawn over wgpu-native on a tie (the default takes wgpu-native).
        measured: on such a tie, `measured(picked, rival)` may say why the rival (the other WebGPU runtime on the
            same kind of GPU) measured faster for this job; `auto` then takes the rival and says so.

    Raises:
        ConfigError: an unknown name.
        DeviceUnavailable: a device of a backend the job has no `noun` for (the message says which devices it can
            run on), or the device (for `auto`: every device of the job's backends) is not usable here.
    """
    base, _ = parse_device_name(name)
    allowed = tuple(backends) if backends is not None else ALL_BACKENDS
    if base != "auto":
        if backends is not None and RUNTIMES.get(base, base) not in allowed:
            raise DeviceUnavailable(f"{job} has no {noun} for {base!r}, so it cannot run on device {name!r}",
                                    f"use --device {_names(allowed)} or auto")
        dev = get_device(name)
        canonical = base if base in ("cpu", "tvm-llvm") else f"{base}:{dev.info.index}"
        return Choice(dev, canonical, f"asked for {name}")
    found = _candidates(allowed, prefer)
    if not found:
        raise DeviceUnavailable(f"no device for {job}: none of {', '.join(allowed)} is usable here",
                                "see `tilewise devices` for each backend's state and fix")
    rank, _, picked, _ = found[0]
    if measured is not None:
        for rival in _runtime_rivals(found):
            faster = measured(found[0][3], rival[3])
            if faster:
                return Choice(get_device(rival[2]), rival[2], f"auto: {faster}")
    software = [n for r, _, n, i in found if r == _RANK["cpu"] and i.backend != "cpu"]
    if rank == _RANK["discrete"]:
        why = f"auto: a discrete GPU, the fastest kind of device {job} runs on"
    elif rank == _RANK["integrated"]:
        why = f"auto: an integrated GPU (no discrete one), the fastest device {job} runs on here"
    elif rank == _RANK["host"]:
        why = "auto: no GPU" + (f"; {', '.join(software)} is a software adapter, slower than the CPU"
                                if software else " found")
    else:
        why = f"auto: no GPU, and {job} has no CPU implementation; {picked} is a software adapter (slow)"
    why += _runtime_note(found)
    return Choice(get_device(picked), picked, why)


def _runtime_rivals(found: list[tuple[int, int, str, DeviceInfo]]) -> list[tuple[int, int, str, DeviceInfo]]:
    """The candidates tied with the first that run the other WebGPU runtime (Dawn vs wgpu-native) on the same GPU."""
    rank, pref, _, info = found[0]
    return [c for c in found[1:] if (c[0], c[1]) == (rank, pref) and info.backend == c[3].backend == "webgpu"
            and (c[3].runtime == "dawn") != (info.runtime == "dawn") and c[3].name == info.name]


def _runtime_note(found: list[tuple[int, int, str, DeviceInfo]]) -> str:
    """Why wgpu-native or Dawn was taken when the other had the same kind of adapter ("" when only one had)."""
    rank, pref, _, info = found[0]
    rivals = [n for r, p, n, i in found[1:] if (r, p) == (rank, pref) and i.backend == "webgpu"
              and (i.runtime == "dawn") != (info.runtime == "dawn")]
    if info.backend != "webgpu" or not rivals:
        return ""
    if info.runtime == "dawn":
        return f"; Dawn preferred over wgpu-native ({rivals[0]}) as asked"
    return f"; wgpu-native preferred over Dawn ({rivals[0]}) for the same kind of GPU (--device dawn takes Dawn)"


def list_devices() -> tuple[list[DeviceInfo], list[str]]:
    """Every usable device, and one note per backend that is not usable (with its fix)."""
    infos: list[DeviceInfo] = [get_device("cpu").info]
    notes: list[str] = []
    try:
        from tilewise.devices.webgpu_adapters import LAVAPIPE_FIX, list_adapters

        adapters = list_adapters()
        usable = [a for a in adapters if a.api.lower() != "opengl"]
        infos.extend(usable)
        if not usable:
            notes.append(f"webgpu: no Vulkan/Metal/D3D12 adapter ({len(adapters)} OpenGL-only); fix: {LAVAPIPE_FIX}")
    except DeviceUnavailable as exc:
        notes.append(f"webgpu: {exc}")
    from tilewise.devices import dawn

    if dawn.available():
        try:
            infos.extend(dawn.list_adapters())
        except DeviceUnavailable as exc:
            notes.append(f"dawn: {exc}")
        notes.extend(f"dawn: {note}" for note in dawn.notes())
    else:
        notes.append(f"dawn: wgpudawn is not installed (WebGPU with subgroup matrices); fix: {dawn.DAWN_FIX}")
    try:
        from tilewise.devices.cuda_info import list_cuda_devices

        infos.extend(list_cuda_devices())
    except ImportError:
        notes.append("cuda: not available; fix: pip install 'tilewise[cuda]' on a machine with an NVIDIA GPU")
    except DeviceUnavailable as exc:
        notes.append(f"cuda: {exc}")
    return infos, notes


def describe(info: DeviceInfo) -> dict[str, Any]:
    return info.as_dict()
