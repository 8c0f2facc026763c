"""The LFM2 forward pass written plainly in numpy (float64 or float32): the specification the executors match.

It follows HF transformers' `Lfm2Model` line by line (same names), with no fusion and no row slicing:
- embeddings `embed_tokens[ids]`;
- each block: `h = x + mixer(operator_norm(x))`, `x' = h + w2(silu(w1 n) * w3 n)` with `n = ffn_norm(h)`;
- conv mixer: `B, C, xs = split(in_proj(x), 3)`, `Bx = B * xs`, depthwise causal conv over time with
  kernel `conv_L_cache` (state: the last L columns of Bx), `out_proj(C * conv(Bx))`;
- attention mixer: q/k/v projections, per-head RMSNorm on q and k, RoPE (rotate-half, theta), causal GQA
  softmax(q k^T / sqrt(head_dim)) v, `out_proj` (state: K and V after RoPE);
- final RMSNorm `embedding_norm`. RMSNorm is `w * x / sqrt(mean(x^2) + eps)`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from tilewise.model.config import ModelConfig


@dataclass(frozen=True)
class RefState:
    """Continuation state after `n_tokens` tokens.

    Attributes:
        conv: per layer, (conv_L_cache, hidden) last Bx rows (oldest first, zero-padded at the start) or None.
        keys / values: per layer, (num_key_value_heads, n_tokens, head_dim) or None.
    """

    n_tokens: int
    conv: tuple[np.ndarray | None, ...]
    keys: tuple[np.ndarray | None, ...]
    values: tuple[np.ndarray | None, ...]


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def rope_cos_sin(positions: np.ndarray, head_dim: int, theta: float, dtype: type = np.float64
                 ) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin tables (len(positions), head_dim) in HF's layout: frequencies repeated for both halves."""
    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    freqs = positions.astype(np.float64)[:, None] * inv_freq[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(emb).astype(dtype), np.sin(emb).astype(dtype)


def rotate_half(x: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def empty_state(cfg: ModelConfig, dtype: type = np.float64) -> RefState:
    n = cfg.num_layers
    conv = tuple(np.zeros((cfg.conv_L_cache, cfg.hidden_size), dtype) if t == "conv" else None
                 for t in cfg.layer_types)
    kv = tuple(np.zeros((cfg.num_key_value_heads, 0, cfg.head_dim), dtype) if t == "full_attention" else None
               for t in cfg.layer_types)
    assert len(conv) == n
    return RefState(0, conv, kv, kv)


def forward(cfg: ModelConfig, weights: Mapping[str, np.ndarray], ids: np.ndarray, state: RefState | None = None,
            dtype: type = np.float64) -> tuple[np.ndarray, RefState]:
    """Run the backbone over new tokens.

    Args:
        cfg: the model config.
        weights: HF `Lfm2Model` tensor names -> float arrays.
        ids: (n,) token ids.
        state: the state after earlier tokens (None: start of sequence).
        dtype: np.float64 or np.float32 arithmetic.

    Returns:
        ((n, hidden) final-normed hidden states of the new tokens, the state after them).
    """
    def w(name: str) -> np.ndarray:
        return np.asarray(weights[name], dtype=dtype)

    state = empty_state(cfg, dtype) if state is None else state
    ids = np.asarray(ids, dtype=np.int64)
    n, past = ids.size, state.n_tokens
    eps = cfg.norm_eps
    x = w("embed_tokens.weight")[ids]  # (n, H)
    cos, sin = rope_cos_sin(np.arange(past, past + n), cfg.head_dim, cfg.rope_theta, dtype)  # (n, hd)
    conv_out, keys_out, values_out = list(state.conv), list(state.keys), list(state.values)
    for i, kind in enumerate(cfg.layer_types):
        p = f"layers.{i}."
        h = rms_norm(x, w(p + "operator_norm.weight"), eps)
        if kind == "conv":
            bcx = h @ w(p + "conv.in_proj.weight").T  # (n, 3H)
            b, c, xs = np.split(bcx, 3, axis=-1)
            bx = b * xs  # (n, H)
            taps = w(p + "conv.conv.weight")[:, 0, :]  # (H, L)
            L = cfg.conv_L_cache
            seq = np.concatenate([state.conv[i], bx], axis=0)  # (L + n, H): L cached rows, then the new ones
            conv = np.zeros_like(bx)
            for j in range(L):  # output t sums taps[:, j] * seq[t + 1 + j] (HF's padded conv1d, causal)
                conv += taps[:, j] * seq[1 + j : 1 + j + n]
            conv_out[i] = seq[-L:].copy()
            mixed = (c * conv) @ w(p + "conv.out_proj.weight").T
        else:
            hd, nh, nkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
            q = (h @ w(p + "self_attn.q_proj.weight").T).reshape(n, nh, hd)
            k = (h @ w(p + "self_attn.k_proj.weight").T).reshape(n, nkv, hd)
            v = (h @ w(p + "self_attn.v_proj.weight").T).reshape(n, nkv, hd)
            q = rms_norm(q, w(p + "self_attn.q_layernorm.weight"), eps)
            k = rms_norm(k, w(p + "self_attn.k_layernorm.weight"), eps)
            q = q * cos[:, None, :] + rotate_half(q) * sin[:, None, :]
            k = k * cos[:, None, :] + rotate_half(k) * sin[:, None, :]
            keys = np.concatenate([state.keys[i], k.transpose(1, 0, 2)], axis=1)  # (nkv, past + n, hd)
            values = np.concatenate([state.values[i], v.transpose(1, 0, 2)], axis=1)
            keys_out[i], values_out[i] = keys, values
            group = nh // nkv
            out = np.empty((n, nh, hd), dtype)
            allowed = np.arange(past + n)[None, :] <= (past + np.arange(n))[:, None]  # (n, past + n) causal
            for head in range(nh):
                kv_head = head // group
                s = (q[:, head, :] @ keys[kv_head].T) / np.sqrt(hd)  # (n, past + n)
                s = np.where(allowed, s, -np.inf)
                s = np.exp(s - s.max(axis=-1, keepdims=True))
                out[:, head, :] = (s / s.sum(axis=-1, keepdims=True)) @ values[kv_head]
            mixed = out.reshape(n, nh * hd) @ w(p + "self_attn.out_proj.weight").T
        x = x + mixed
        f = rms_norm(x, w(p + "ffn_norm.weight"), eps)
        f = silu(f @ w(p + "feed_forward.w1.weight").T) * (f @ w(p + "feed_forward.w3.weight").T)
        x = x + f @ w(p + "feed_forward.w2.weight").T
    hidden = rms_norm(x, w("embedding_norm.weight"), eps)
    return hidden, RefState(past + n, tuple(conv_out), tuple(keys_out), tuple(values_out))
