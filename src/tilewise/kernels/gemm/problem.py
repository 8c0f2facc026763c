"""The GEMM problem, shared by every backend's implementation:

    C (M, N) = alpha * A (M, K) @ B (K, N) + beta * C (M, N)      fp32, row-major

`beta == 0` (the default) makes C an output only: it is never read (BLAS semantics: NaN in C does not leak into the
result), so verification poisons it with NaN. `beta != 0` makes C an input too: `make_inputs` draws it like A and B
and `initial_output` hands it to the output buffer before every run.
"""

from __future__ import annotations

import numpy as np

from tilewise.kernels.base import HostInputs, Problem, Shape, nonzero_uniform


class GemmProblem(Problem):
    """C = alpha * A @ B + beta * C on a shape (M, N, K).

    Args:
        alpha: scale of A @ B.
        beta: scale of the existing C; 0 never reads C.
    """

    name = "gemm"
    shape_names = ("M", "N", "K")
    dtype = "f32"
    example_shape = (4096, 4096, 4096)

    def __init__(self, alpha: float = 1.0, beta: float = 0.0) -> None:
        self.alpha = float(alpha)
        self.beta = float(beta)

    def make_inputs(self, shape: Shape, rng: np.random.Generator) -> HostInputs:
        M, N, K = self.check_shape(shape)
        host = {"a": nonzero_uniform(rng, (M, K)).astype(np.float32),  # (M, K)
                "b": nonzero_uniform(rng, (K, N)).astype(np.float32)}  # (K, N)
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
        M, N, K = map(int, shape)
        return 4 * (M * K + K * N + M * N * (2 if self.beta != 0.0 else 1))

    def initial_output(self, host: HostInputs, shape: Shape) -> np.ndarray | None:
        return host["c"] if self.beta != 0.0 else None


#: the problem every GEMM template computes unless built with other alpha and beta (`CudaGemm(alpha, beta)`)
GEMM = GemmProblem()
