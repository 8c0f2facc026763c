"""The full 1D convolution, shared by every backend's implementation:

    out (M+N-1) = a (M) full-convolved with w (N), as `np.convolve(a, w)`
    out[i] = sum_k a[i - k] * w[k],  a[j] = 0 outside [0, M)   (seed 000's zero padding of N-1 on both sides)

A kernel no longer than its input (N <= M); both are fp32. `conv1d_te` states the same sum as TVM tensor
expressions for the TVM schedules (on the CPU and on CUDA), with the padding as a stage of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tilewise.errors import ConfigError
from tilewise.kernels.base import HostInputs, Problem, Shape, nonzero_uniform


class Conv1dProblem(Problem):
    """Full 1D convolution on a shape (M, N): input length M, kernel length N <= M."""

    name = "conv1d"
    shape_names = ("M", "N")
    dtype = "f32"
    example_shape = (4096, 64)

    def check_shape(self, shape: Sequence[int]) -> tuple[int, int]:
        """(M, N) of a conv1d shape; refuses a kernel longer than its input."""
        if len(shape) != 2 or any(int(s) < 1 for s in shape):
            raise ConfigError(f"conv1d shape {shape!r} must be two positive integers M,N",
                              "write e.g. --shape 4096,64 (input length, kernel length)")
        M, N = (int(s) for s in shape)
        if N > M:
            raise ConfigError(f"conv1d kernel length N={N} is longer than the input length M={M}",
                              "swap the operands (convolution is commutative) or pass a kernel no longer than the "
                              "input")
        return self.check_size((M, N))

    def make_inputs(self, shape: Shape, rng: np.random.Generator) -> HostInputs:
        M, N = self.check_shape(shape)
        return {"a": nonzero_uniform(rng, M).astype(np.float32),  # (M,)
                "w": nonzero_uniform(rng, N).astype(np.float32)}  # (N,)

    def reference(self, host: HostInputs, shape: Shape) -> np.ndarray:
        return np.convolve(host["a"].astype(np.float64), host["w"].astype(np.float64))  # (M+N-1,)

    def output_shape(self, shape: Shape) -> tuple[int, ...]:
        """(M + N - 1,): what `reference` and every template's `read_output` return."""
        M, N = self.check_shape(shape)
        return (M + N - 1,)

    def flops(self, shape: Shape) -> int:
        M, N = self.check_shape(shape)
        return 2 * M * N

    def bytes_moved(self, shape: Shape) -> int:
        M, N = map(int, shape)  # no check_shape: it calls this to size the problem
        return 4 * (M + N + (M + N - 1))


CONV1D = Conv1dProblem()
#: (M, N) of a conv1d shape (the problem's one shape check)
check_shape = CONV1D.check_shape


def conv1d_te(tvm: Any, M: int, N: int, Mp: int) -> tuple[Any, Any, Any]:
    """The full 1D convolution as TVM tensor expressions, over an output length padded to Mp >= M + N - 1.

        Apad (Mp + N - 1) = a (M) with N-1 zeros on the left (and enough on the right for the padded output)
        out[n] = sum_k Apad[n + N - 1 - k] * w[k]       n < Mp   (= np.convolve(a, w) on its first M + N - 1)

    The zero padding is its own stage, `Apad` (Mp + N - 1,), which a schedule inlines or computes at its consumer.

    Returns:
        (A (M,), W (N,), B (Mp,)) tensors for `te.create_prim_func([A, W, B])`.
    """
    from tvm import te

    A = te.placeholder((M,), name="A", dtype="float32")  # (M,)
    W = te.placeholder((N,), name="W", dtype="float32")  # (N,)
    zero = tvm.tirx.const(0.0, "float32")
    Apad = te.compute((Mp + N - 1,),  # (Mp + N - 1,)
                      lambda i: tvm.tirx.if_then_else(tvm.tirx.all(i >= N - 1, i < M + N - 1), A[i - (N - 1)], zero),
                      name="Apad")
    k = te.reduce_axis((0, N), name="k")
    B = te.compute((Mp,), lambda n: te.sum(Apad[n + N - 1 - k] * W[k], axis=k), name="B")  # (Mp,)
    return A, W, B
