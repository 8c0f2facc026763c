"""WGSL that several families' kernels share: the row ops' dims uniform and their storage bindings.

A binding's index is its position: the dims uniform is binding 0, then the read-only arrays, then the written
ones, in the order given, which is also the order the kernel's launches pass their buffers in.
"""

from __future__ import annotations

from collections.abc import Sequence

#: the uniform of the row-wise kernels: m rows, and up to three offsets (first row, positions, ...)
ROW_DIMS = "struct Dims { m: u32, r0: u32, r1: u32, r2: u32 }\n@group(0) @binding(0) var<uniform> dims: Dims;\n"


def storage(read: Sequence[tuple[str, str]], write: Sequence[tuple[str, str]] = (), first: int = 1) -> str:
    """`@group(0) @binding(i) var<storage, ...> name: array<type>;` for (name, element type) pairs, read-only
    ones first, numbered from `first`."""
    lines = [f"@group(0) @binding({first + i}) var<storage, {'read' if i < len(read) else 'read_write'}> {name}: "
             f"array<{elem}>;" for i, (name, elem) in enumerate([*read, *write])]
    return "\n".join(lines) + "\n"


def row_header(read: Sequence[tuple[str, str]], write: Sequence[tuple[str, str]]) -> str:
    """The dims uniform and the storage bindings of a row-wise kernel."""
    return ROW_DIMS + storage(read, write)
