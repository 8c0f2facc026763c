"""What the CUDA tests of the TVM-emitted templates share: the device (skipping cleanly without CuPy, a GPU, or a
way to get the kernels' sources) and the check that every source a test compiles can be had."""

from __future__ import annotations

from typing import Any

import pytest

from tilewise.errors import DeviceUnavailable
from tilewise.kernels.tvm import sources as tvm_sources
from tilewise.kernels.tvm.cuda import arch_of


def tvm_cuda_device() -> Any:
    """The CUDA device, or a skip naming what is missing (CuPy, TVM and the source store, or the GPU)."""
    pytest.importorskip("cupy")
    from tilewise.devices import get_device

    if not tvm_sources.tvm_available() and tvm_sources.store_dir() is None:
        pytest.skip(f"neither TVM nor a pre-emitted source store ({tvm_sources.ENV}) is available")
    try:
        return get_device("cuda")
    except DeviceUnavailable as exc:
        pytest.skip(f"no CUDA device: {exc}")


def need_sources(dev: Any, template: Any, configs: Any, shape: Any) -> None:
    """Skip unless TVM imports or the store holds the source of every config at this shape for the device's arch."""
    if tvm_sources.tvm_available():
        return
    arch = arch_of(dev.info.limits.compute_capability)
    keys = [tvm_sources.SourceKey.make(template.name, c, shape, arch) for c in configs]
    gone = tvm_sources.missing(keys)
    if gone:
        pytest.skip(f"TVM is not installed and the store {tvm_sources.store_dir()} lacks {len(gone)} of "
                    f"{len(keys)} sources, e.g. {gone[0].describe()} (emit: {gone[0].emit_command()})")
