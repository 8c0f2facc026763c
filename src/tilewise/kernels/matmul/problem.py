"""The weight matmuls of the LFM2 classifier, as math: y = x @ W^T with W stored (out, in) in a weight format.

Shape (M, N, K): M rows of x (tokens), N outputs, K inputs. Variants of the problem (each its own problem, since
each is a different function):

- epilogue `none` (y = x W^T), `residual` (out += x W^T: the down / out projections, in place on the residual
  stream, so the output's initial value is an input), `swiglu` (paired gate/up weights: out = silu(x Wg^T) *
  (x Wu^T), the FFN's first half);
- `norm`: an RMSNorm of x (weight g, eps) fused in front: y = (x / rms(x) * g) W^T;
- weights `nf4` (bitsandbytes layout, blocks of 64 along `in`), `f16` or `f32`. The reference multiplies the
  exact stored weights (`quant.nf4.weight_values`), so quantization error is not counted against a kernel.
"""

from __future__ import annotations

import math

import numpy as np

from tilewise.kernels.base import HostInputs, Problem, Shape
from tilewise.quant.nf4 import FORMATS, KERNEL_BLOCKSIZE, weight_arrays, weight_values

EPILOGUES = ("none", "residual", "swiglu")
# bytes one weight costs in each format (absmax included for nf4)
WEIGHT_BYTES = {"nf4": 0.5 + 4 / KERNEL_BLOCKSIZE, "f16": 2.0, "f32": 4.0}


class MatmulProblem(Problem):
    """y = epilogue(norm(x) @ W^T) for one weight format; see the module docstring."""

    shape_names = ("M", "N", "K")
    example_shape = (346, 2560, 1024)

    def __init__(self, fmt: str = "nf4", epilogue: str = "none", norm: bool = False, eps: float = 1e-5) -> None:
        if fmt not in FORMATS or epilogue not in EPILOGUES:
            raise ValueError(f"unknown matmul problem fmt={fmt} epilogue={epilogue}")
        self.fmt, self.epilogue, self.norm, self.eps = fmt, epilogue, norm, eps
        self.name = f"{fmt}_matmul.{epilogue}" + (".norm" if norm else "")
        self.dtype = "nf4" if fmt == "nf4" else "f32"
        self.sets = 2 if epilogue == "swiglu" else 1

    def make_inputs(self, shape: Shape, rng: np.random.Generator) -> HostInputs:
        m, n, k = self.check_shape(shape)
        host: HostInputs = {"x": rng.standard_normal((m, k)).astype(np.float32)}  # (M, K)
        for suffix in ("", "_up")[: self.sets]:
            if self.fmt == "nf4":
                # NF4 weights drawn as such: every word is 8 valid codes, each of the 16 equally likely (so every
                # decode path is taken), and the block scales vary. Quantizing Gaussian weights instead took
                # about 0.8 s per 4608 x 1024 matrix, most of a verification's time on a GPU.
                host["w" + suffix] = rng.integers(0, 2**32, n * k // 8, dtype=np.uint32)  # (N * K / 8,) packed
                host["absmax" + suffix] = ((1.5 + rng.random(n * k // KERNEL_BLOCKSIZE))  # (N * K / 64,)
                                           / math.sqrt(k)).astype(np.float32)
                continue
            w = (rng.standard_normal((n, k)) / math.sqrt(k)).astype(np.float32)  # (N, K)
            for key, arr in weight_arrays(w, self.fmt).items():
                host[key + suffix] = arr
        if self.epilogue == "residual":
            host["residual"] = rng.standard_normal((m, n)).astype(np.float32)  # (M, N)
        if self.norm:
            host["norm_w"] = (1 + 0.3 * rng.standard_normal(k)).astype(np.float32)  # (K,)
        return host

    def initial_output(self, host: HostInputs, shape: Shape) -> np.ndarray | None:
        return host["residual"] if self.epilogue == "residual" else None

    def reference(self, host: HostInputs, shape: Shape) -> np.ndarray:
        _, n, k = shape
        x = host["x"].astype(np.float64)
        if self.norm:
            x = x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * host["norm_w"].astype(np.float64)
        y = x @ weight_values({"w": host["w"], "absmax": host.get("absmax")}, self.fmt, n, k).T
        if self.epilogue == "swiglu":
            u = x @ weight_values({"w": host["w_up"], "absmax": host.get("absmax_up")}, self.fmt, n, k).T
            return y / (1.0 + np.exp(-y)) * u
        if self.epilogue == "residual":
            return host["residual"].astype(np.float64) + y
        return y

    def flops(self, shape: Shape) -> int:
        m, n, k = shape
        return 2 * m * n * k * self.sets

    def bytes_moved(self, shape: Shape) -> int:
        m, n, k = shape
        out_rw = 2 if self.epilogue == "residual" else 1
        return int(4 * m * k + self.sets * n * k * WEIGHT_BYTES[self.fmt] + out_rw * 4 * m * n
                   + (4 * k if self.norm else 0))
