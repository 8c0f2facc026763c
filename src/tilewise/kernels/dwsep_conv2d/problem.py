"""The depthwise-separable 2D convolution, NCHW, shared by every backend's implementation:

    d[b, c, y, x]   = sum_{ky, kx} xin[b, c, y + ky - P, x + kx - P] * dw[c, ky, kx]   (zero padding P)
    out[b, o, y, x] = sum_c pw[o, c] * d[b, c, y, x]
    xin (B, C, H, W), dw (C, K, K), pw (O, C), out (B, O, Ho, Wo) with Ho = H + 2P - K + 1, Wo = W + 2P - K + 1

The shape is (B, C, H, W, O, K, P); a kernel larger than the padded input is refused. The inputs are scaled so that
the output stays of order 1 whatever K and C: taps by 1/K, pointwise weights by 1/sqrt(C).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from tilewise.errors import ConfigError
from tilewise.kernels.base import HostInputs, Problem, Shape, nonzero_uniform


class DwsepShape(NamedTuple):
    """A checked shape with its output size."""

    B: int
    C: int
    H: int
    W: int
    O: int
    K: int
    P: int
    Ho: int
    Wo: int


def reference_dwsep(x: np.ndarray, dw: np.ndarray, pw: np.ndarray, P: int) -> np.ndarray:
    """float64 depthwise-separable convolution: x (B,C,H,W), dw (C,K,K), pw (O,C) -> (B,O,Ho,Wo)."""
    x64 = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (P, P), (P, P)))  # (B, C, H+2P, W+2P)
    K = dw.shape[-1]
    Ho, Wo = x64.shape[2] - K + 1, x64.shape[3] - K + 1
    d = np.zeros((x.shape[0], x.shape[1], Ho, Wo))  # (B, C, Ho, Wo)
    for ky in range(K):
        for kx in range(K):
            d += x64[:, :, ky:ky + Ho, kx:kx + Wo] * dw[None, :, ky, kx, None, None].astype(np.float64)
    return np.einsum("oc,bchw->bohw", pw.astype(np.float64), d)


class DwsepProblem(Problem):
    """Fused depthwise-separable conv2d on a shape (B, C, H, W, O, K, P)."""

    name = "dwsep-conv2d"
    shape_names = ("B", "C", "H", "W", "O", "K", "P")
    dtype = "f32"
    example_shape = (1, 32, 56, 56, 64, 3, 1)

    def check_shape(self, shape: Sequence[int]) -> Shape:
        """The shape as ints (P may be 0); refuses a kernel larger than the padded input."""
        return self.check_size(tuple(self.dims(shape)[:7]))

    def dims(self, shape: Sequence[int]) -> DwsepShape:
        """The checked shape with its output size (B, C, H, W, O, K, P, Ho, Wo)."""
        if len(shape) != 7 or any(int(s) < 0 for s in shape) or any(int(s) < 1 for s in shape[:6]):
            raise ConfigError(f"dwsep-conv2d shape {shape!r} must be B,C,H,W,O,K,P (positive, P >= 0)",
                              "write e.g. --shape 1,32,56,56,64,3,1")
        B, C, H, W, O, K, P = (int(s) for s in shape)
        if K > H + 2 * P or K > W + 2 * P:
            raise ConfigError(f"dwsep-conv2d kernel {K}x{K} is larger than the padded input {H + 2 * P}x{W + 2 * P} "
                              f"(H={H}, W={W}, P={P})", "use a smaller kernel or more padding")
        return DwsepShape(B, C, H, W, O, K, P, H + 2 * P - K + 1, W + 2 * P - K + 1)

    def make_inputs(self, shape: Shape, rng: np.random.Generator) -> HostInputs:
        B, C, H, W, O, K = self.dims(shape)[:6]
        return {"x": nonzero_uniform(rng, (B, C, H, W)).astype(np.float32),
                "dw": (nonzero_uniform(rng, (C, K, K)) / K).astype(np.float32),
                "pw": (nonzero_uniform(rng, (O, C)) / np.sqrt(C)).astype(np.float32)}

    def reference(self, host: HostInputs, shape: Shape) -> np.ndarray:
        return reference_dwsep(host["x"], host["dw"], host["pw"], self.dims(shape).P)

    def output_shape(self, shape: Shape) -> tuple[int, ...]:
        """(B, O, Ho, Wo): what `reference` and every template's `read_output` return."""
        d = self.dims(shape)
        return (d.B, d.O, d.Ho, d.Wo)

    def flops(self, shape: Shape) -> int:
        d = self.dims(shape)
        return 2 * d.B * d.Ho * d.Wo * d.C * (d.K * d.K + d.O)

    def bytes_moved(self, shape: Shape) -> int:
        d = self.dims(shape)
        return 4 * (d.B * d.C * d.H * d.W + d.C * d.K * d.K + d.O * d.C + d.B * d.O * d.Ho * d.Wo)


DWSEP = DwsepProblem()
