"""Attention of the LFM2 classifier, as math: per-head q/k RMSNorm + RoPE, then causal GQA softmax(QK^T)V.

Shape (M, P, HQ, HKV, D): M new query rows after P cached positions, HQ query heads sharing HKV key/value heads
of size D. RoPE uses half-split pairs (d, d + D/2) with angles built in float64, so that positions in the
thousands keep f32 accuracy.
"""

from __future__ import annotations

import math

import numpy as np

from tilewise.errors import ConfigError
from tilewise.kernels.base import HostInputs, Problem, Shape


def rope_table(positions: int, head_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """(cos, sin) of shape (positions, D/2), computed in float64 then rounded to f32."""
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)  # (D/2,)
    ang = np.arange(positions, dtype=np.float64)[:, None] * inv[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def qknorm_rope_ref(qkv: np.ndarray, qn: np.ndarray, kn: np.ndarray, p: int, hq: int, hkv: int, d: int,
                    theta: float, eps: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float64 (q (M, Hq, D), k (M, Hkv, D), v (M, Hkv, D)) for rows at positions p .. p+M-1."""
    m = qkv.shape[0]
    x = qkv.astype(np.float64).reshape(m, hq + 2 * hkv, d)
    q, k, v = x[:, :hq], x[:, hq:hq + hkv], x[:, hq + hkv:]

    def norm(t: np.ndarray, w: np.ndarray) -> np.ndarray:
        return t / np.sqrt((t * t).mean(-1, keepdims=True) + eps) * w.astype(np.float64)

    inv = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    ang = (p + np.arange(m, dtype=np.float64))[:, None] * inv[None, :]  # (M, D/2)
    cos = np.concatenate([np.cos(ang)] * 2, -1)[:, None, :]
    sin = np.concatenate([np.sin(ang)] * 2, -1)[:, None, :]

    def rope(t: np.ndarray) -> np.ndarray:
        rot = np.concatenate([-t[..., d // 2:], t[..., :d // 2]], -1)
        return t * cos + rot * sin

    return rope(norm(q, qn)), rope(norm(k, kn)), v


def attention_ref(q: np.ndarray, k: np.ndarray, v: np.ndarray, p: int, first: int = 0) -> np.ndarray:
    """Causal GQA attention of queries q (Mq, Hq, D) at rows first.. of a chunk after p cached positions
    over keys/values k, v (T, Hkv, D); returns (Mq, Hq * D) float64."""
    mq, hq, d = q.shape
    hkv = k.shape[1]
    out = np.empty((mq, hq, d))
    for h in range(hq):
        kh, vh = k[:, h // (hq // hkv)].astype(np.float64), v[:, h // (hq // hkv)].astype(np.float64)
        s = q[:, h].astype(np.float64) @ kh.T / math.sqrt(d)  # (Mq, T)
        pos = p + first + np.arange(mq)
        s = np.where(np.arange(k.shape[0])[None, :] <= pos[:, None], s, -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        out[:, h] = (s / s.sum(-1, keepdims=True)) @ vh
    return out.reshape(mq, hq * d)


class AttentionProblem(Problem):
    """Causal GQA attention of M new queries after P cached positions; shape (M, P, HQ, HKV, D)."""

    name = "attention"
    shape_names = ("M", "P", "HQ", "HKV", "D")
    example_shape = (346, 0, 16, 8, 64)

    def check_shape(self, shape: Shape) -> Shape:
        shp = tuple(int(s) for s in shape)
        if len(shp) != 5 or min(shp) < 0 or shp[0] < 1 or min(shp[2:]) < 1:
            raise ConfigError(f"attention takes a shape M,P,HQ,HKV,D (M, HQ, HKV, D >= 1, P >= 0), got {shape!r}",
                              "write e.g. --shape 346,0,16,8,64")
        return self.check_size(shp)

    def output_shape(self, shape: Shape) -> tuple[int, ...]:
        return (shape[0], shape[2] * shape[4])  # (M, HQ D)

    def dispatch_key(self, shape: Shape) -> str:
        """Heads and head size only: one choice serves every cached length P."""
        return f"attention:{shape[2]}x{shape[3]}x{shape[4]}"

    def make_inputs(self, shape: Shape, rng: np.random.Generator) -> HostInputs:
        m, p, hq, hkv, d = self.check_shape(shape)
        return {"q": rng.standard_normal((m, hq * d)).astype(np.float32),  # (M, HQ D)
                "k_cache": rng.standard_normal((p + m, hkv * d)).astype(np.float32),  # (P + M, HKV D)
                "v_cache": rng.standard_normal((p + m, hkv * d)).astype(np.float32)}

    def reference(self, host: HostInputs, shape: Shape) -> np.ndarray:
        m, p, hq, hkv, d = shape
        return attention_ref(host["q"].reshape(m, hq, d), host["k_cache"].reshape(-1, hkv, d),
                             host["v_cache"].reshape(-1, hkv, d), p)

    def flops(self, shape: Shape) -> int:
        m, p, hq, _, d = shape
        keys = m * p + m * (m + 1) // 2  # causal: query i sees p + i + 1 keys
        return 4 * keys * hq * d

    def bytes_moved(self, shape: Shape) -> int:
        m, p, hq, hkv, d = shape
        return 4 * (2 * m * hq * d + 2 * (p + m) * hkv * d)


class QKNormRopeProblem(Problem):
    """Per-head q/k RMSNorm + RoPE of M projected rows at positions P..P+M-1; shape (M, P, HQ, HKV, D).
    Output (M, (HQ + 2 HKV) D): each row's rotated q heads, rotated k heads, then its v heads unchanged."""

    name = "qknorm_rope"
    shape_names = ("M", "P", "HQ", "HKV", "D")
    example_shape = (346, 0, 16, 8, 64)

    def __init__(self, theta: float = 1e6, eps: float = 1e-5) -> None:
        self.theta, self.eps = theta, eps

    def check_shape(self, shape: Shape) -> Shape:
        return AttentionProblem.check_shape(self, shape)  # type: ignore[arg-type]

    def output_shape(self, shape: Shape) -> tuple[int, ...]:
        m, _, hq, hkv, d = shape
        return (m, (hq + 2 * hkv) * d)

    def make_inputs(self, shape: Shape, rng: np.random.Generator) -> HostInputs:
        m, _, hq, hkv, d = self.check_shape(shape)
        return {"qkv": rng.standard_normal((m, (hq + 2 * hkv) * d)).astype(np.float32),  # (M, (HQ + 2 HKV) D)
                "q_norm": (1 + 0.3 * rng.standard_normal(d)).astype(np.float32),  # (D,)
                "k_norm": (1 + 0.3 * rng.standard_normal(d)).astype(np.float32)}  # (D,)

    def reference(self, host: HostInputs, shape: Shape) -> np.ndarray:
        m, p, hq, hkv, d = shape
        q, k, v = qknorm_rope_ref(host["qkv"], host["q_norm"], host["k_norm"], p, hq, hkv, d, self.theta, self.eps)
        return np.concatenate([q.reshape(m, -1), k.reshape(m, -1), v.reshape(m, -1)], axis=1)

    def flops(self, shape: Shape) -> int:
        m, _, hq, hkv, d = shape
        return 8 * m * (hq + hkv) * d

    def bytes_moved(self, shape: Shape) -> int:
        m, p, hq, hkv, d = shape
        return 4 * (2 * m * (hq + 2 * hkv) * d + 2 * d + (p + m) * d)
