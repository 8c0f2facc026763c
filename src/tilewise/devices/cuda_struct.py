"""A C struct passed to a CUDA kernel by value (`const __grid_constant__ S s`): its fields packed in declaration
order with C's natural alignment, each a device Buffer (its address, 8 bytes), None (a null pointer) or a NumPy
scalar (its own size). Like a `cuda_tma.TensorMap`, a `StructArg` is a kernel argument that `CUDADevice` passes as
bytes, and it keeps the buffers whose addresses it holds alive as long as the launch that carries it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tilewise.errors import LaunchError

POINTER_BYTES = 8


def _field_bytes(field: Any, what: str) -> bytes:
    if field is None:
        return bytes(POINTER_BYTES)
    if isinstance(field, np.generic):
        return field.tobytes()
    handle = getattr(field, "handle", None)
    data = getattr(handle, "data", None)
    if data is None or not hasattr(data, "ptr"):
        raise LaunchError(f"{what}: field {field!r} is neither a CUDA Buffer, None nor a NumPy scalar",
                          "pass device buffers, None for a null pointer, or np.int32(...) / np.float32(...)")
    return int(data.ptr).to_bytes(POINTER_BYTES, "little")


class StructArg:
    """One struct value: `fields` (which keeps its buffers alive) and, packed when first asked for (at launch: a
    device that only records launches never needs the addresses), `array`, its bytes as a size-one NumPy void array
    (what CuPy and `kernel_params` pass by value)."""

    def __init__(self, fields: Sequence[Any], what: str) -> None:
        self.fields = tuple(fields)
        self.what = what
        self._array: np.ndarray | None = None

    @property
    def array(self) -> np.ndarray:
        if self._array is None:
            raw, largest = bytearray(), 1
            for f in self.fields:
                b = _field_bytes(f, self.what)
                raw += bytes(-len(raw) % len(b)) + b  # each field at a multiple of its size
                largest = max(largest, len(b))
            raw += bytes(-len(raw) % largest)  # the struct's size: a multiple of its largest field
            self._array = np.frombuffer(bytes(raw), dtype=np.dtype((np.void, len(raw)))).copy()
        return self._array

    @property
    def nbytes(self) -> int:
        return int(self.array.nbytes)

    def __repr__(self) -> str:
        return f"StructArg({self.what}, {len(self.fields)} fields)"
