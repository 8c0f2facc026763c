"""The GEMM problem, shared by every backend's implementation:

    C (M, N) = alpha * A (M, K) @ B (K, N) + beta * C (M, N)      row-major; C fp32, A and B fp32 (or f16: gemm-f16)

`beta == 0` (the default) makes C an output only: it is never read (BLAS semantics: NaN in C does not leak into the
result), so verification poisons it with NaN. `beta != 0` makes C an input too: `make_inputs` draws it like A and B
and `initial_output` hands it to the output buffer before every run.
"""

from __future__ import annotations

import numpy as np

from tilewise.kernels.base import HostInputs, Problem, Shape, nonzero_uniform

INPUT_DTYPES = {"f32": np.float32, "f16": np.float16}


class GemmProblem(Problem):
    """C = alpha * A @ B + beta * C on a shape (M, N, K).

    Args:
        alpha: scale of A @ B.
        beta: scale of the existing C; 0 never reads C.
        inputs: "f32", or "f16" (`gemm-f16`, the subgroup-matrix GEMM's problem: A and B are drawn, then rounded to
            f16, and the float64 reference multiplies those rounded values, so it checks the kernel's arithmetic
            (products of f16 values are exact in f32, sums are f32) and not the rounding: f32's tolerance applies).
    """

    name = "gemm"
    shape_names = ("M", "N", "K")
    dtype = "f32"
    example_shape = (4096, 4096, 4096)

    def __init__(self, alpha: float = 1.0, beta: float = 0.0, inputs: str = "f32") -> None:
        if inputs not in INPUT_DTYPES:
            raise ValueError(f"unknown GEMM input type {inputs!r}; use one of {', '.join(INPUT_DTYPES)}")
        self.alpha = float(alpha)
        self.beta = float(beta)
        self.inputs = inputs
        if inputs != "f32":
            self.name = f"gemm-{inputs}"

    def make_inputs(self, shape: Shape, rng: np.random.Generator) -> HostInputs:
        M, N, K = self.check_shape(shape)
        dtype = INPUT_DTYPES[self.inputs]
        host = {"a": nonzero_uniform(rng, (M, K)).astype(dtype),  # (M, K)
                "b": nonzero_uniform(rng, (K, N)).astype(dtype)}  # (K, N)
        if self.beta != 0.0:
            host["c"] = nonzero_uniform(rng, (M, N)).astype(np.float32)  # (M, N), read by beta * C
        return host

    def reference(self, host: HostInputs, shape: Shape) -> np.ndarray:
        out = self.alpha * (host["a"].astype(np.float64) @ host["b"].astype(np.float64))
        if self.beta != 0.0:
            out += self.beta * host["c"].astype(np.float64)
        return out

    def output_shape(self, shape: Shape) -> tuple[int, ...]:
        """C's shape (M, N): what `reference` and every template's `read_output` return."""
        M, N, _ = self.check_shape(shape)
        return (M, N)

    def flops(self, shape: Shape) -> int:
        M, N, K = self.check_shape(shape)
        return 2 * M * N * K

    def bytes_moved(self, shape: Shape) -> int:
        M, N, K = map(int, shape)  # no check_shape: it calls this to size the problem
        size = np.dtype(INPUT_DTYPES[self.inputs]).itemsize
        return size * (M * K + K * N) + 4 * M * N * (2 if self.beta != 0.0 else 1)

    def initial_output(self, host: HostInputs, shape: Shape) -> np.ndarray | None:
        return host["c"] if self.beta != 0.0 else None


#: the problem every GEMM template computes unless built with other alpha and beta (`CudaGemm(alpha, beta)`)
GEMM = GemmProblem()

#: gemm-f16's problem (the subgroup-matrix GEMM): A and B in f16
GEMM_F16 = GemmProblem(inputs="f16")
