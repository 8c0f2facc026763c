"""The CUDA matmuls' peer: cuBLAS f16 (CuPy matmul, f16 x f16 with f32 accumulation) on the same shape, timed by
the device like any kernel."""

from __future__ import annotations

from typing import Any

import numpy as np

from tilewise.devices.base import Device, Launch, Program
from tilewise.kernels.base import Shape


def cublas_f16(device: Device) -> Program:
    """A callable program running cuBLAS on its own random f16 copies of x (M, K) and W (N, K), made at its first,
    untimed warm-up call per shape: the dense tensor-core bound an NF4 kernel is measured against."""
    cp = device._cp  # type: ignore[attr-defined]
    held: dict[tuple[int, int, int], tuple[Any, Any, Any]] = {}

    def cublas_hgemm(M: Any, N: Any, K: Any) -> None:
        m, n, k = int(M), int(N), int(K)
        if (m, n, k) not in held:
            rng = cp.random.default_rng(0)
            held[(m, n, k)] = (rng.standard_normal((m, k), dtype=cp.float32).astype(cp.float16),
                               rng.standard_normal((n, k), dtype=cp.float32).astype(cp.float16),
                               cp.empty((m, n), dtype=cp.float16))
        x, w, out = held[(m, n, k)]
        cp.matmul(x, w.T, out=out)

    return Program("cublas_hgemm", cublas_hgemm, "cublas-f16", meta={"callable": True})


def cublas_f16_launches(program: Program, shape: Shape, sets: int) -> list[Launch]:
    """One call at the matmul's shape; with two weight sets (SwiGLU) one GEMM of both."""
    m, n, k = shape
    return [Launch(program, (1, 1, 1), [np.int32(m), np.int32(n * sets), np.int32(k)])]
