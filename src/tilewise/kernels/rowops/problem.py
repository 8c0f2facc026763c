"""Row-wise ops of the LFM2 classifier, as math: RMSNorm, the embedding gather, the final norm + classifier head."""

from __future__ import annotations

import math

import numpy as np

from tilewise.kernels.base import HostInputs, Problem, Shape
from tilewise.kernels.matmul.problem import WEIGHT_BYTES
from tilewise.quant.nf4 import weight_arrays, weight_values


def rmsnorm_ref(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w.astype(np.float64)


class RMSNormProblem(Problem):
    """RMSNorm over rows; shape (M, H)."""

    name = "rmsnorm"
    shape_names = ("M", "H")
    example_shape = (346, 1024)

    def __init__(self, eps: float = 1e-5) -> None:
        self.eps = eps

    def make_inputs(self, shape: Shape, rng: np.random.Generator) -> HostInputs:
        m, h = self.check_shape(shape)
        return {"x": rng.standard_normal((m, h)).astype(np.float32),  # (M, H)
                "weight": (1 + 0.3 * rng.standard_normal(h)).astype(np.float32)}  # (H,)

    def reference(self, host: HostInputs, shape: Shape) -> np.ndarray:
        return rmsnorm_ref(host["x"], host["weight"], self.eps)

    def flops(self, shape: Shape) -> int:
        return 4 * shape[0] * shape[1]

    def bytes_moved(self, shape: Shape) -> int:
        return 4 * (2 * shape[0] * shape[1] + shape[1])


class EmbedProblem(Problem):
    """Embedding gather out[m] = table[ids[m]] from a table stored nf4 / f16 / f32; shape (M, H, V)."""

    shape_names = ("M", "H", "V")
    example_shape = (346, 1024, 65536)

    def __init__(self, fmt: str = "nf4") -> None:
        self.fmt = fmt
        self.name = f"embed.{fmt}"
        self.dtype = fmt

    def make_inputs(self, shape: Shape, rng: np.random.Generator) -> HostInputs:
        m, h, v = self.check_shape(shape)
        table = rng.standard_normal((v, h)).astype(np.float32)  # (V, H)
        host = dict(weight_arrays(table, self.fmt))
        host["ids"] = rng.integers(0, v, m).astype(np.uint32)  # (M,)
        return host

    def reference(self, host: HostInputs, shape: Shape) -> np.ndarray:
        _, h, v = shape
        return weight_values(host, self.fmt, v, h)[host["ids"].astype(np.int64)]

    def flops(self, shape: Shape) -> int:
        return shape[0] * shape[1] if self.fmt == "nf4" else 0

    def bytes_moved(self, shape: Shape) -> int:
        return int(shape[0] * shape[1] * (WEIGHT_BYTES[self.fmt] + 4) + 4 * shape[0])


class HeadProblem(Problem):
    """Final RMSNorm of the last row, then Linear(H, L); shape (M, H, L). Output: the normed row and L scores."""

    name = "head"
    shape_names = ("M", "H", "L")
    example_shape = (346, 1024, 8)

    def __init__(self, eps: float = 1e-5) -> None:
        self.eps = eps

    def make_inputs(self, shape: Shape, rng: np.random.Generator) -> HostInputs:
        m, h, labels = self.check_shape(shape)
        return {"x": rng.standard_normal((m, h)).astype(np.float32),  # (M, H)
                "norm_weight": (1 + 0.3 * rng.standard_normal(h)).astype(np.float32),  # (H,)
                "head_weight": (rng.standard_normal((labels, h)) / math.sqrt(h)).astype(np.float32)}  # (L, H)

    def output_shape(self, shape: Shape) -> tuple[int, ...]:
        return (shape[1] + shape[2],)  # the normed row, then the scores

    def reference(self, host: HostInputs, shape: Shape) -> np.ndarray:
        h = rmsnorm_ref(host["x"][-1:], host["norm_weight"], self.eps)[0]
        return np.concatenate([h, host["head_weight"].astype(np.float64) @ h])

    def flops(self, shape: Shape) -> int:
        return 2 * shape[1] * shape[2] + 4 * shape[1]

    def bytes_moved(self, shape: Shape) -> int:
        return 4 * (shape[1] * (shape[2] + 3) + shape[2])
