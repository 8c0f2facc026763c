"""tilewise: tune tiled kernels honestly and run a small NF4 LFM2 classifier on them.

Importing tilewise never imports wgpu or cupy; a device library loads only when a device is asked for.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["__version__", "get_device", "load"]


def get_device(name: str = "auto") -> Any:
    """Return a device by name (`cpu`, `webgpu`, `webgpu:1`, `cuda`, `cuda:0`, `auto`: the fastest found)."""
    from tilewise.devices import get_device as _get

    return _get(name)


def load(path_or_preset: str = "default", device: str = "auto", weights: str = "nf4", seed: int = 0,
         quiet: bool = False) -> Any:
    """Load a classifier model (`default`, a preset name, an HF LFM2 folder or a tilewise checkpoint) onto a device
    (`auto`: the fastest with a classifier executor; `model.device_choice.line()` says which and why). Steps that
    take over a second print a short line to stderr unless `quiet`."""
    from tilewise.model.runtime import load as _load

    return _load(path_or_preset, device=device, weights=weights, seed=seed, quiet=quiet)
