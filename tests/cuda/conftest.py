"""The CUDA test group's device: one fixture, skipping cleanly without CuPy or a GPU."""

from __future__ import annotations

import pytest

from tilewise.errors import DeviceUnavailable


@pytest.fixture(scope="module")
def dev():
    pytest.importorskip("cupy")
    from tilewise.devices import get_device

    try:
        return get_device("cuda")
    except DeviceUnavailable as exc:
        pytest.skip(f"no CUDA device: {exc}")
