"""LFM2's short conv, as math: Bx = B * x, a depthwise causal conv over time (kernel L), y = C * conv(Bx).

Shape (M, H, L): M rows, H channels, L taps. BCx (M, 3H) holds B, C and x side by side (HF's `chunk(3)` order);
rows before the chunk come from the state (L-1, H): Bx of the previous L-1 positions, oldest first. The output is
y (M, H) followed by the new state, the last L-1 rows of Bx.
"""

from __future__ import annotations

import numpy as np

from tilewise.kernels.base import HostInputs, Problem, Shape


def conv_ref(bcx: np.ndarray, state: np.ndarray, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float64 (y (M, H), new state (L-1, H)) of the gated causal conv."""
    h = weight.shape[0]
    taps = weight.shape[1]
    b, c, x = (bcx[:, i * h:(i + 1) * h].astype(np.float64) for i in range(3))
    bx = np.concatenate([state.astype(np.float64), b * x])  # (L-1+M, H)
    m = bcx.shape[0]
    conv = sum(weight[:, j].astype(np.float64) * bx[j:j + m] for j in range(taps))
    return c * conv, bx[-(taps - 1):]


class ShortConvProblem(Problem):
    """The gated depthwise causal conv with its continuation state; shape (M, H, L)."""

    name = "shortconv"
    shape_names = ("M", "H", "L")
    example_shape = (346, 1024, 3)

    def make_inputs(self, shape: Shape, rng: np.random.Generator) -> HostInputs:
        m, h, taps = self.check_shape(shape)
        return {"bcx": rng.standard_normal((m, 3 * h)).astype(np.float32),  # (M, 3H)
                "state_in": rng.standard_normal((taps - 1, h)).astype(np.float32),  # (L-1, H)
                "weight": rng.standard_normal((h, taps)).astype(np.float32)}  # (H, L)

    def reference(self, host: HostInputs, shape: Shape) -> np.ndarray:
        y, state = conv_ref(host["bcx"], host["state_in"], host["weight"])
        return np.concatenate([y, state])

    def flops(self, shape: Shape) -> int:
        m, h, taps = shape
        return m * h * (2 * taps + 2)

    def bytes_moved(self, shape: Shape) -> int:
        m, h, taps = shape
        return 4 * (4 * m * h + 2 * (taps - 1) * h + taps * h)
