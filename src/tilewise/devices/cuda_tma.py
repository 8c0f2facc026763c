"""Tensor maps for Hopper's tensor memory accelerator (TMA): a 128-byte descriptor of a 2-D tile of global memory,
encoded by the driver (`cuTensorMapEncodeTiled`, reached through ctypes on libcuda, as CuPy does not wrap it) and
passed to a kernel by value as a `const __grid_constant__` parameter.

A `TensorMap` is a kernel argument like a Buffer or a NumPy scalar (`CUDADevice` passes its 128 bytes by value). It
holds the address it was encoded for, so it belongs to one buffer: a launch list that uses one keeps that buffer.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import numpy as np

from tilewise.errors import LaunchError

#: CUtensorMapDataType, CUtensorMapSwizzle and CUtensorMapL2promotion values used here (cuda.h)
DTYPE_FLOAT16 = 6
SWIZZLE_128B = 3
L2_PROMOTION_128B = 2
TENSOR_MAP_BYTES = 128
#: a box is at most 256 elements along each dimension; with the 128-byte swizzle its inner extent is 128 bytes
MAX_BOX = 256


class TensorMap:
    """One encoded CUtensorMap (`array`: 128 bytes in a size-one NumPy array, what CuPy passes by value)."""

    def __init__(self, raw: bytes, what: str, buffer: Any) -> None:
        self.array = np.frombuffer(bytearray(raw), dtype=np.dtype((np.void, TENSOR_MAP_BYTES))).copy()
        self.what = what
        self.buffer = buffer  # keeps the encoded address alive as long as the map

    def __repr__(self) -> str:
        return f"TensorMap({self.what})"


@functools.cache
def _libcuda() -> Any:
    return ctypes.CDLL("libcuda.so.1")


def libcuda(without: str) -> Any:
    """The NVIDIA driver library, for the calls CuPy does not wrap. LaunchError when it cannot be loaded: `without`
    says what then cannot be done and how to do without it."""
    try:
        return _libcuda()
    except OSError as exc:
        raise LaunchError(f"libcuda.so.1 cannot be loaded ({exc}), so {without}",
                          "run on a machine with the NVIDIA driver") from exc


@functools.cache
def _encode_fn() -> Any:
    lib = libcuda("no TMA tensor map can be made; pick a config that copies without TMA")
    fn = lib.cuTensorMapEncodeTiled
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p,
                   ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64),
                   ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32),
                   ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def f16_rows_map(buffer: Any, rows: int, cols: int, box_rows: int, box_cols: int = 64) -> TensorMap:
    """The map of a row-major f16 matrix (rows, cols) in `buffer`, read in boxes of (box_rows, box_cols) with the
    128-byte swizzle (chunk c of box row r lands at chunk c ^ (r % 8)); boxes past the matrix are zero-filled."""
    problems = []
    if box_cols * 2 != 128:
        problems.append(f"a box row is {box_cols * 2} bytes; the 128-byte swizzle needs 128 (64 f16)")
    if not 1 <= box_rows <= MAX_BOX:
        problems.append(f"{box_rows} box rows is outside 1..{MAX_BOX}")
    if cols % 8:
        problems.append(f"a row of {cols} f16 is not a multiple of 16 bytes (TMA's stride alignment)")
    if rows < 1 or rows * cols * 2 > buffer.nbytes:
        problems.append(f"({rows}, {cols}) f16 does not fit the buffer's {buffer.nbytes} bytes")
    if problems:
        raise LaunchError("no TMA tensor map for this matrix: " + "; ".join(problems),
                          "pick a config whose tile the TMA can copy (or one that copies by cp.async)")
    out = (ctypes.c_ubyte * TENSOR_MAP_BYTES)()
    dims = (ctypes.c_uint64 * 2)(cols, rows)  # innermost first
    strides = (ctypes.c_uint64 * 1)(cols * 2)
    box = (ctypes.c_uint32 * 2)(box_cols, box_rows)
    ones = (ctypes.c_uint32 * 2)(1, 1)
    ptr = int(buffer.handle.data.ptr)
    got = _encode_fn()(ctypes.addressof(out), DTYPE_FLOAT16, 2, ctypes.c_void_p(ptr), dims, strides, box, ones,
                       0, SWIZZLE_128B, L2_PROMOTION_128B, 0)
    if got != 0:
        raise LaunchError(f"cuTensorMapEncodeTiled refused f16 ({rows}, {cols}) in boxes of ({box_rows}, "
                          f"{box_cols}) at 0x{ptr:x}: CUresult {got}",
                          "check the buffer's alignment (16 bytes) and the box against TMA's limits")
    return TensorMap(bytes(out), f"f16 ({rows}, {cols}) boxes ({box_rows}, {box_cols})", buffer)
