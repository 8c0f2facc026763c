"""Programmatic dependent launch (PDL, compute capability 9.0+): a kernel launched with the driver's launch attribute
`CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION` may start while the kernel before it on the stream still
runs, and its blocks wait in `griddepcontrol.wait` (the sources' PDL_WAIT, `kernels/pdl.cuh`) for that kernel's
results. In a captured graph the stream order becomes a programmatic edge, so each kernel's launch and prologue
overlap the tail of the one before it. CuPy launches through `cuLaunchKernel`, which takes no attributes, so this
module calls `cuLaunchKernelEx` on libcuda through ctypes (as `cuda_tma` calls `cuTensorMapEncodeTiled`).
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tilewise.devices.base import capability, env_switch
from tilewise.devices.cuda_tma import libcuda
from tilewise.errors import LaunchError

#: CUlaunchAttributeID (cuda.h)
PROGRAMMATIC_STREAM_SERIALIZATION = 6
PDL_ENV = "TILEWISE_CUDA_PDL"
#: PDL needs Hopper's griddepcontrol (sm_90)
MIN_COMPUTE_CAPABILITY = (9, 0)


class LaunchAttribute(ctypes.Structure):
    """CUlaunchAttribute: the id, 4 bytes of padding, then a 64-byte union (8-byte aligned)."""

    _fields_ = [("id", ctypes.c_uint32), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint64 * 8)]


class LaunchConfig(ctypes.Structure):
    """CUlaunchConfig."""

    _fields_ = [("gridDimX", ctypes.c_uint32), ("gridDimY", ctypes.c_uint32), ("gridDimZ", ctypes.c_uint32),
                ("blockDimX", ctypes.c_uint32), ("blockDimY", ctypes.c_uint32), ("blockDimZ", ctypes.c_uint32),
                ("sharedMemBytes", ctypes.c_uint32), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(LaunchAttribute)), ("numAttrs", ctypes.c_uint32)]


def pdl_from_env(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the CUDA executor launches with PDL: `TILEWISE_CUDA_PDL` 1/on or 0/off; unset, off, and the executor
    then follows what `tilewise tune model` raced for its model (`model/tune_settings.py`), since PDL speeds some
    models up and slows others down on the same GPU."""
    return env_switch(PDL_ENV, False, f"set {PDL_ENV}=0 to launch every kernel after the one before it "
                      "has finished, or 1 to let each start while its predecessor finishes (programmatic dependent "
                      "launch)", environ)


def supports_pdl(compute_capability: Any) -> bool:
    """The GPU has griddepcontrol (compute capability 9.0 or newer); unknown counts as no."""
    return capability(compute_capability) >= MIN_COMPUTE_CAPABILITY


@functools.cache
def _launch_fn() -> Any:
    fn = libcuda(f"no kernel can be launched with PDL; set {PDL_ENV}=0").cuLaunchKernelEx
    fn.argtypes = [ctypes.POINTER(LaunchConfig), ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


def kernel_params(args: Sequence[Any]) -> tuple[Any, list[Any]]:
    """The `void **kernelParams` array of a launch (entry i points at argument i's bytes) and the objects that hold
    those bytes, which must outlive the call. An argument is a device pointer (`ctypes.c_void_p`), a NumPy scalar,
    or a NumPy array passed by value (a TMA tensor map's 128 bytes)."""
    held: list[Any] = []
    for a in args:
        if isinstance(a, ctypes.c_void_p):
            held.append(a)
        elif isinstance(a, np.generic):
            held.append(np.array(a))  # a 0-d array of its own: the scalar's bytes at a stable address
        elif isinstance(a, np.ndarray):
            held.append(np.ascontiguousarray(a))
        else:
            raise LaunchError(f"kernel argument {a!r} cannot be passed to cuLaunchKernelEx",
                              "pass device pointers as ctypes.c_void_p, scalars as NumPy scalars, by-value structs "
                              "as NumPy arrays")
    ptrs = (ctypes.c_void_p * max(1, len(held)))()
    for i, h in enumerate(held):
        ptrs[i] = ctypes.addressof(h) if isinstance(h, ctypes.c_void_p) else h.ctypes.data
    return ptrs, held


def launch_pdl(function_ptr: int, grid: Sequence[int], block: Sequence[int], shared_bytes: int, stream_ptr: int,
               args: Sequence[Any]) -> None:
    """Launch `function_ptr` (a CUfunction) on the stream with the programmatic-serialization attribute.

    Raises:
        LaunchError: the driver refused the launch (its error code in the message).
    """
    attr = LaunchAttribute()
    attr.id = PROGRAMMATIC_STREAM_SERIALIZATION
    attr.value[0] = 1  # programmaticStreamSerializationAllowed, the union's first int
    cfg = LaunchConfig(*(int(g) for g in grid), *(int(b) for b in block), int(shared_bytes),
                       ctypes.c_void_p(int(stream_ptr)), ctypes.pointer(attr), 1)
    ptrs, held = kernel_params(args)
    got = _launch_fn()(ctypes.byref(cfg), ctypes.c_void_p(int(function_ptr)), ptrs, None)
    del held
    if got != 0:
        raise LaunchError(f"cuLaunchKernelEx with programmatic dependent launch failed: {_error_name(got)}",
                          f"set {PDL_ENV}=0 to launch without it")


def _error_name(code: int) -> str:
    """CUresult `code` by its name (cuGetErrorName), e.g. CUDA_ERROR_INVALID_VALUE."""
    name = ctypes.c_char_p()
    if libcuda("").cuGetErrorName(ctypes.c_int(code), ctypes.byref(name)) == 0 and name.value:
        return f"{name.value.decode()} ({code})"
    return f"CUresult {code}"
