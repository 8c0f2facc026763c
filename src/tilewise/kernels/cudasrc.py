"""Shared plumbing of the model kernels' CUDA C++ templates: the `.cu` text of a family and one compile step.

Each family keeps its source beside its Python template (`matmul/matmul.cu`, `rowops/rowops.cu`, ...); a config is
an NVRTC name expression (`nf4_mm_mma<0, 2, 1, 64, 64, 32, 32, 32>`), and every source mirrors its template's
rules with `static_assert`s, so an illegal config is refused in Python before compiling and cannot compile either.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

import numpy as np

from tilewise.devices.base import Buffer, Device, Program
from tilewise.kernels.base import DeviceBuffers, HostInputs

#: weight format -> the `FMT` template argument of the sources
FMT_CODE = {"nf4": 0, "f16": 1, "f32": 2}


@cache
def cu_source(family: str, filename: str) -> str:
    """The text of `tilewise/kernels/<family>/<filename>`."""
    return resources.files(f"tilewise.kernels.{family}").joinpath(filename).read_text()


#: what every model source starts with (`kernels/`): the PDL_WAIT / PDL_LAUNCH_DEPENDENTS macros every kernel calls,
#: and the f16 tensor-core pieces (pack2, mma_16816, ldmatrix) the matmul and attention kernels share
MODEL_HEADERS = ("pdl.cuh", "tensorcore.cuh")


@cache
def model_source(family: str, *filenames: str) -> str:
    """A model family's CUDA text: `MODEL_HEADERS`, then its files in order, compiled as one text."""
    heads = [resources.files("tilewise.kernels").joinpath(h).read_text() for h in MODEL_HEADERS]
    return "\n".join([*heads, *(cu_source(family, f) for f in filenames)])


def name_expression(kernel: str, *args: int) -> str:
    """`kernel<a, b, ...>`: the instantiation NVRTC compiles."""
    return f"{kernel}<{', '.join(str(int(a)) for a in args)}>"


def compile_cuda(device: Device, source: str, entry: str, block: int, label: str,
                 dynamic_shared_bytes: int = 0) -> Program:
    """Compile one instantiation of a model kernel (`model_source`) and record its block size (the CUDA device
    launches with `meta['block']`), the dynamic shared memory each launch asks for (above 48 KB the device opts the
    kernel in first) and `meta['pdl']`: the kernel waits for its predecessor (PDL_WAIT), so the device may launch it
    with programmatic dependent launch."""
    prog = device.compile(source, entry=entry, name=label)
    prog.meta["block"] = (int(block), 1, 1)
    prog.meta["pdl"] = True
    if dynamic_shared_bytes:
        device.allow_dynamic_shared(prog, int(dynamic_shared_bytes))  # type: ignore[attr-defined]
    return prog


#: a null device pointer argument (an optional output left unused)
NULL = np.uint64(0)


def offers_f16_out(prog: Program, out: int, out_h: int, rows: int, cols: int, cols_scale: int = 1) -> Program:
    """Mark a program whose launch can store its (rows, cols) f32 output, argument `out`, as f16 rows instead:
    argument `out_h` (NULL by default) set to an f16 buffer, rounded as `nf4_mm_prep<0>` would round it, and `out`
    is then not written. `rows` and `cols` are the indices of the int arguments with the output's shape (the
    columns are that argument times `cols_scale`). `matmul.cuda_fuse.fuse_prep` uses it to drop a matmul's prologue."""
    prog.meta["f16_out"] = (out, out_h, rows, cols, cols_scale)
    return prog


def upload_all(device: Device, host: HostInputs) -> DeviceBuffers:
    """Every host input as a device buffer of the same name."""
    return {k: device.upload(np.ascontiguousarray(v)) for k, v in host.items()}


def zeroed(device: Device, nbytes: int) -> Buffer:
    """A buffer of `nbytes` zero bytes (counters a kernel expects at 0 and leaves at 0)."""
    buf = device.allocate(nbytes)
    device.write(buf, np.zeros(buf.nbytes, np.uint8))
    return buf


def arg_or(bufs: dict[str, Buffer], name: str, fallback: str) -> Buffer:
    """A buffer argument the variant does not read (absmax of f16 weights): any valid pointer will do."""
    return bufs[name] if name in bufs else bufs[fallback]
