"""`CUDADevice.allow_dynamic_shared` without a GPU: the pipe kernel's dynamic shared memory is recorded for its
launches, a kernel above 48 KB is opted in on its handle first, and a request beyond what the GPU offers per block
is refused with the fix before anything launches."""

from __future__ import annotations

import contextlib
import dataclasses
import types

import pytest

from tilewise.devices.base import Program
from tilewise.devices.cuda import CUDADevice
from tilewise.devices.profiles import get_profile
from tilewise.errors import LaunchError
from tilewise.kernels.matmul import cuda as mm

SM90 = get_profile("sm_90")


class Handle:
    """A kernel handle that records the opt-in attribute the way CuPy's RawKernel takes it."""

    def __init__(self) -> None:
        self.set_to: list[int] = []

    @property
    def max_dynamic_shared_size_bytes(self) -> int:
        return self.set_to[-1] if self.set_to else 0

    @max_dynamic_shared_size_bytes.setter
    def max_dynamic_shared_size_bytes(self, value: int) -> None:
        self.set_to.append(value)


def stand_in(limits=SM90) -> types.SimpleNamespace:
    """What `allow_dynamic_shared` reads of a device: its limits and its CUDA context."""
    return types.SimpleNamespace(info=types.SimpleNamespace(limits=limits), _dev=contextlib.nullcontext())


def program(static_bytes: int = 0) -> Program:
    return Program("nf4_mm_pipe", Handle(), "h", meta={"static_shared_bytes": static_bytes})


@pytest.mark.parametrize("fmt", ["nf4", "f16", "f32"])
def test_every_legal_pipe_seed_is_recorded_and_opted_in_above_48k(fmt):
    tpl = mm.CudaMatmul("pipe", fmt, "swiglu", True)
    legal, _ = tpl.space("seed").split(SM90)
    sizes = [mm.pipe_smem_bytes(c, fmt, tpl.sets) for c in legal]
    assert any(n > 48 * 1024 for n in sizes) and all(n <= SM90.shared_bytes_per_block_optin for n in sizes)
    for n in sizes:
        prog = program()
        CUDADevice.allow_dynamic_shared(stand_in(), prog, n)  # type: ignore[arg-type]
        assert prog.meta["dynamic_shared_bytes"] == n  # what every launch asks for
        assert prog.handle.set_to == ([n] if n > 48 * 1024 else [])  # opted in only where the default is short


def test_more_shared_memory_than_the_gpu_offers_is_refused_with_the_fix():
    small = dataclasses.replace(SM90, shared_bytes_per_block_optin=100 * 1024)
    prog = program(static_bytes=4096)
    with pytest.raises(LaunchError, match=r"needs 106496 bytes of shared memory per block, this GPU offers 102400") \
            as err:
        CUDADevice.allow_dynamic_shared(stand_in(small), prog, 100 * 1024)  # type: ignore[arg-type]
    assert "fewer stages or smaller tiles" in err.value.fix
    assert prog.handle.set_to == [] and "dynamic_shared_bytes" not in prog.meta  # nothing half-done
