"""Tensor maps for the wgt kind's TMA copies: what `f16_rows_map` refuses before it reaches the driver (no GPU needed),
and how a launch carries a map (128 bytes by value, the way CuPy passes a size-one NumPy array)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from tilewise.devices.cuda_tma import TENSOR_MAP_BYTES, TensorMap, f16_rows_map
from tilewise.errors import LaunchError


def _buffer(nbytes: int) -> SimpleNamespace:
    return SimpleNamespace(nbytes=nbytes, handle=SimpleNamespace(data=SimpleNamespace(ptr=0x10000)))


@pytest.mark.parametrize(("rows", "cols", "box_rows", "box_cols", "nbytes", "says"), [
    (346, 1024, 64, 32, 346 * 1024 * 2, "needs 128 (64 f16)"),
    (346, 1024, 300, 64, 346 * 1024 * 2, "300 box rows is outside 1..256"),
    (346, 1020, 64, 64, 346 * 1020 * 2, "not a multiple of 16 bytes"),
    (346, 1024, 64, 64, 345 * 1024 * 2, "does not fit the buffer"),
    (0, 1024, 64, 64, 1024, "does not fit the buffer"),
])
def test_a_matrix_the_tma_cannot_copy_is_refused_by_name_before_the_driver(rows, cols, box_rows, box_cols, nbytes,
                                                                           says):
    with pytest.raises(LaunchError, match="no TMA tensor map") as err:
        f16_rows_map(_buffer(nbytes), rows, cols, box_rows, box_cols)
    assert says in str(err.value)
    assert "pick a config" in err.value.fix


def test_a_map_is_one_128_byte_value_that_keeps_its_buffer():
    """The launch argument is a size-one array of exactly the map's bytes (CuPy passes those by value), and the map
    keeps the buffer whose address it holds alive."""
    rng = np.random.default_rng(3)
    raw = rng.integers(0, 256, TENSOR_MAP_BYTES, dtype=np.uint8).tobytes()
    buf = _buffer(4096)
    tm = TensorMap(raw, "f16 (32, 64)", buf)
    assert tm.array.shape == (1,) and tm.array.size == 1 and tm.array.itemsize == TENSOR_MAP_BYTES
    assert tm.array.tobytes() == raw
    assert tm.buffer is buf


def test_the_cuda_device_passes_a_map_as_its_array():
    from tilewise.devices.base import Launch, Program
    from tilewise.devices.cuda import CUDADevice

    dev = object.__new__(CUDADevice)  # no GPU: only the argument list is built
    tm = TensorMap(bytes(range(128)), "f16 (8, 64)", None)
    prog = Program("k", None, "key", {}, {})
    args = dev._args(Launch(prog, (1, 1, 1), [np.int32(5), tm]))
    assert args[0] == 5 and args[1] is tm.array
