"""The CPU executor of the LFM2 classifier: numpy float32 with BLAS, the same `forward` contract as every executor.

NF4/f16 weights are dequantized once at load and kept as float32; q/k/v and w1/w3 are fused into one matrix each,
so every block issues few, large GEMMs. The row plan of final-row slicing (`runtime.block_rows`) is shared with the
other executors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tilewise.model.checkpoint import Checkpoint
from tilewise.model.runtime import block_rows


@dataclass(frozen=True)
class _CPULayer:
    kind: str
    operator_norm: np.ndarray  # (H,)
    ffn_norm: np.ndarray  # (H,)
    w13: np.ndarray  # (2F, H): w1 rows then w3 rows, one GEMM for gate and up
    w2: np.ndarray  # (H, F)
    mix_in: np.ndarray  # conv: in_proj (3H, H); attention: q, k, v rows stacked ((nh + 2 nkv) hd, H)
    mix_out: np.ndarray  # (H, H) or (H, nh hd)
    conv_taps: np.ndarray | None = None  # (H, L)
    q_norm: np.ndarray | None = None  # (hd,)
    k_norm: np.ndarray | None = None  # (hd,)


def _rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    ms = np.einsum("...i,...i->...", x, x)[..., None] / np.float32(x.shape[-1])
    return x * (w / np.sqrt(ms + np.float32(eps)))


def _swiglu(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    """silu(g) * u = g / (1 + exp(-g)) * u, the same operations in the same order, in one temporary (m, F)."""
    t = np.negative(g)
    np.exp(t, out=t)
    t += np.float32(1.0)
    np.divide(g, t, out=t)
    t *= u
    return t


class CPUExecutor:
    """float32 numpy/BLAS executor; weights dequantized once at construction."""

    device_name = "cpu"

    def __init__(self, checkpoint: Checkpoint, device: str = "cpu") -> None:
        cfg = self.cfg = checkpoint.config
        f32 = checkpoint.float32
        self.embed = f32("embed_tokens.weight")  # (V, H)
        self.final_norm = f32("embedding_norm.weight")
        layers = []
        for i, kind in enumerate(cfg.layer_types):
            p = f"layers.{i}."
            w13 = np.concatenate([f32(p + "feed_forward.w1.weight"), f32(p + "feed_forward.w3.weight")])
            common = dict(kind=kind, operator_norm=f32(p + "operator_norm.weight"), ffn_norm=f32(p + "ffn_norm.weight"),
                          w13=w13, w2=np.ascontiguousarray(f32(p + "feed_forward.w2.weight")))
            if kind == "conv":
                layers.append(_CPULayer(**common, mix_in=np.ascontiguousarray(f32(p + "conv.in_proj.weight")),
                                        mix_out=np.ascontiguousarray(f32(p + "conv.out_proj.weight")),
                                        conv_taps=np.ascontiguousarray(f32(p + "conv.conv.weight")[:, 0, :])))
            else:
                a = p + "self_attn."
                qkv = np.concatenate([f32(a + "q_proj.weight"), f32(a + "k_proj.weight"), f32(a + "v_proj.weight")])
                layers.append(_CPULayer(**common, mix_in=qkv, mix_out=np.ascontiguousarray(f32(a + "out_proj.weight")),
                                        q_norm=f32(a + "q_layernorm.weight"), k_norm=f32(a + "k_layernorm.weight")))
        self.layers = tuple(layers)
        hd = cfg.head_dim
        # HF computes inv_freq and the angles in float32; doing the same keeps RoPE bit-close at long positions
        self.inv_freq = (np.float32(1.0) / (np.float32(cfg.rope_theta) ** (
            np.arange(0, hd, 2, dtype=np.float32) / np.float32(hd)))).astype(np.float32)

    def weight_bytes(self) -> int:
        total = self.embed.nbytes + self.final_norm.nbytes
        for lay in self.layers:
            for v in vars(lay).values():
                if isinstance(v, np.ndarray):
                    total += v.nbytes
        return total

    def forward(self, ids: np.ndarray, start: int, caches: Any, final_row_slicing: bool) -> tuple[np.ndarray, Any]:
        cfg = self.cfg
        n, eps = ids.size, cfg.norm_eps
        H, L = cfg.hidden_size, cfg.conv_L_cache
        nh, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        x = self.embed[ids]  # (n, H), a copy
        angles = np.arange(start, start + n, dtype=np.float32)[:, None] * self.inv_freq[None, :]  # (n, hd/2)
        cos, sin = np.cos(angles), np.sin(angles)
        new_caches: list[Any] = []
        cur = n  # x holds the new tokens' last `cur` rows
        for i, (lay, br) in enumerate(zip(self.layers, block_rows(cfg.layer_types, L, n, final_row_slicing))):
            rows = slice(n - br.outputs, n)  # the tokens this block outputs
            h = _rms_norm(x, lay.operator_norm, eps)
            if lay.kind == "conv":
                prev = np.zeros((L, H), np.float32) if caches is None else caches[i]  # (L, H)
                # Bx of the last br.inputs rows: every row, or in a sliced block the L - 1 rows before its outputs
                # and its outputs (which hold the new conv state's last L rows)
                lo = n - br.inputs
                bcx = h[cur - br.inputs:] @ lay.mix_in.T  # (n - lo, 3H)
                b, c, xs = bcx[:, :H], bcx[:, H:2 * H], bcx[:, 2 * H:]
                seq = np.concatenate([prev, b * xs])  # (L + n - lo, H); row L + t - lo holds token t's Bx
                new_caches.append(seq[-L:].copy())
                m = br.outputs
                base = L + rows.start - lo - (L - 1)  # seq row of tap 0 for the first output row
                conv = lay.conv_taps[:, 0] * seq[base : base + m]
                for j in range(1, L):
                    conv += lay.conv_taps[:, j] * seq[base + j : base + j + m]
                cc = c[rows.start - lo : rows.stop - lo]
                mixed = (cc * conv) @ lay.mix_out.T  # (m, H)
            else:
                assert cur == n, "an attention block takes every row (its K/V)"
                k_v = h @ lay.mix_in[nh * hd:].T  # (n, 2 nkv hd): every row's K/V is kept for later tokens
                q = h[rows] @ lay.mix_in[: nh * hd].T  # (m, nh hd): queries only for the output rows
                m = q.shape[0]
                k = _rope(_rms_norm(k_v[:, : nkv * hd].reshape(n, nkv, hd), lay.k_norm, eps), cos, sin)
                v = k_v[:, nkv * hd:].reshape(n, nkv, hd)
                q = _rope(_rms_norm(q.reshape(m, nh, hd), lay.q_norm, eps), cos[rows], sin[rows])
                if caches is None:
                    keys, values = k.transpose(1, 0, 2).copy(), v.transpose(1, 0, 2).copy()  # (nkv, n, hd)
                else:
                    pk, pv = caches[i]
                    keys = np.concatenate([pk, k.transpose(1, 0, 2)], axis=1)  # (nkv, start + n, hd)
                    values = np.concatenate([pv, v.transpose(1, 0, 2)], axis=1)
                new_caches.append((keys, values))
                mixed = _attention(q, keys, values, start + rows.start, nkv) @ lay.mix_out.T  # (m, H)
            x = x[cur - br.outputs:] + mixed  # a sliced block drops the residual's other rows here
            cur = br.outputs
            f = _rms_norm(x, lay.ffn_norm, eps)
            gu = f @ lay.w13.T  # (m, 2F)
            F = gu.shape[1] // 2
            x = x + _swiglu(gu[:, :F], gu[:, F:]) @ lay.w2.T
        hidden = _rms_norm(x[-1], self.final_norm, eps)  # (H,)
        return hidden, tuple(new_caches)


def _rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate-half RoPE on (n, heads, hd) with (n, hd/2) tables (HF's layout repeats them for both halves)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def _attention(q: np.ndarray, keys: np.ndarray, values: np.ndarray, q_start: int, nkv: int) -> np.ndarray:
    """Causal GQA at batch 1: q (m, nh, hd) at positions q_start.., keys/values (nkv, T, hd) -> (m, nh hd).

    The query heads that share a KV head are stacked into one (group * m, hd) matrix, so each KV head costs
    two GEMMs and K/V are never repeated.
    """
    m, nh, hd = q.shape
    T = keys.shape[1]
    group = nh // nkv
    qg = q.reshape(m, nkv, group, hd).transpose(1, 2, 0, 3).reshape(nkv, group * m, hd)  # (nkv, group m, hd)
    s = np.matmul(qg, keys.transpose(0, 2, 1)) * np.float32(1.0 / np.sqrt(hd))  # (nkv, group m, T)
    s = s.reshape(nkv, group, m, T)
    q_pos = q_start + np.arange(m)
    future = np.arange(T)[None, :] > q_pos[:, None]  # (m, T)
    if future.any():  # adding a -inf / 0 mask: 4x faster than boolean indexing, the same values
        s += np.where(future, np.float32(-np.inf), np.float32(0.0))
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    out = np.matmul(s.reshape(nkv, group * m, T), values)  # (nkv, group m, hd)
    return out.reshape(nkv, group, m, hd).transpose(2, 0, 1, 3).reshape(m, nh * hd)
