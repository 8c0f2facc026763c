"""The LFM2 classifier in torch, for training: one flat file, HF tensor names, batched right-padded prompts.

The forward is written out here (not `transformers.Lfm2Model`) so that training needs only torch and runs the
fused kernels torch has (`scaled_dot_product_attention`, depthwise `conv1d`); `tests/unit/test_train_parity.py`
checks it against HF's `Lfm2Model` and tilewise's float64 reference on the same weights.

Semantics (identical to HF LFM2, see `tilewise.model.config`):
- blocks are pre-norm: `x + op(operator_norm(x))`, then `x + w2(silu(w1 h) * w3 h)` with `h = ffn_norm(x)`;
- short conv: `in_proj` -> B, C, x (chunks of `hidden` along features); `y = C * causal_conv3(B * x)`;
- attention: GQA, RMSNorm per head on q and k before RoPE (rotate-half, theta from the config), scale
  1/sqrt(head_dim), causal;
- final RMSNorm (`model.embedding_norm`), then `score` (8 x hidden, no bias) on the last real position.

Padding: prompts are right-padded. Both mixers are causal, so pad tokens after a prompt cannot change the
hidden states of its real tokens; the head reads position `length - 1` of each row and no mask is needed.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from tilewise.model.config import ModelConfig


class RMSNorm(nn.Module):
    """HF `Lfm2RMSNorm`: normalise in float32, multiply by `weight` (initialised to ones, no `1 +` offset)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


class FeedForward(nn.Module):
    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(hidden, ffn, bias=False)
        self.w3 = nn.Linear(hidden, ffn, bias=False)
        self.w2 = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class ShortConv(nn.Module):
    def __init__(self, hidden: int, kernel: int) -> None:
        super().__init__()
        self.kernel = kernel
        # HF keeps the depthwise weight as a Conv1d parameter of shape (hidden, 1, kernel)
        self.conv = nn.Conv1d(hidden, hidden, kernel_size=kernel, groups=hidden, bias=False, padding=kernel - 1)
        self.in_proj = nn.Linear(hidden, 3 * hidden, bias=False)
        self.out_proj = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, T, H)
        seq_len = x.shape[1]
        bcx = self.in_proj(x).transpose(1, 2)  # (B, 3H, T)
        b, c, xs = bcx.chunk(3, dim=1)  # each (B, H, T)
        # depthwise causal conv as kernel shifted multiply-adds: the same sum as HF's padded conv1d, and no
        # slow depthwise-convolution path on CPUs
        bx = F.pad(b * xs, (self.kernel - 1, 0))  # (B, H, T + L - 1)
        taps = self.conv.weight[:, 0, :, None]  # (H, L, 1)
        conv = taps[:, 0] * bx[..., :seq_len]
        for j in range(1, self.kernel):
            conv = conv + taps[:, j] * bx[..., j: j + seq_len]  # (B, H, T)
        return self.out_proj((c * conv).transpose(1, 2))


def rope_tables(seq_len: int, head_dim: int, theta: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables of HF's default RoPE (rotate-half layout), each (T, head_dim), float32."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    freqs = torch.arange(seq_len, device=device, dtype=torch.float32)[:, None] * inv_freq[None, :]  # (T, D/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (T, D)
    return emb.cos(), emb.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        h = cfg.hidden_size
        self.q_proj = nn.Linear(h, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=False)
        self.out_proj = nn.Linear(self.heads * self.head_dim, h, bias=False)
        self.q_layernorm = RMSNorm(self.head_dim, cfg.norm_eps)
        self.k_layernorm = RMSNorm(self.head_dim, cfg.norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:  # x: (B, T, H)
        bsz, seq_len, _ = x.shape
        q = self.q_layernorm(self.q_proj(x).view(bsz, seq_len, self.heads, self.head_dim)).transpose(1, 2)
        k = self.k_layernorm(self.k_proj(x).view(bsz, seq_len, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(bsz, seq_len, self.kv_heads, self.head_dim).transpose(1, 2)  # (B, KV, T, D)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)  # (T, D)
        q = q * cos + _rotate_half(q) * sin  # (B, NH, T, D)
        k = k * cos + _rotate_half(k) * sin
        # under autocast q and k leave their float32 norms while v is bf16: attend in v's dtype
        q, k = q.to(v.dtype), k.to(v.dtype)
        if self.kv_heads != self.heads:
            rep = self.heads // self.kv_heads
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0 / math.sqrt(self.head_dim))
        return self.out_proj(out.transpose(1, 2).reshape(bsz, seq_len, self.heads * self.head_dim))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_type: str) -> None:
        super().__init__()
        self.is_attention = layer_type == "full_attention"
        if self.is_attention:
            self.self_attn = Attention(cfg)
        else:
            self.conv = ShortConv(cfg.hidden_size, cfg.conv_L_cache)
        self.feed_forward = FeedForward(cfg.hidden_size, cfg.ffn_dim)
        self.operator_norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.ffn_norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = self.operator_norm(x)
        x = x + (self.self_attn(h, cos, sin) if self.is_attention else self.conv(h))
        return x + self.feed_forward(self.ffn_norm(x))


class Backbone(nn.Module):
    """HF `Lfm2Model`'s parameters under the same names (`embed_tokens`, `layers.N.…`, `embedding_norm`)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, t) for t in cfg.layer_types)
        self.embedding_norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)


class Lfm2Classifier(nn.Module):
    """LFM2 blocks + an 8-way linear head on the last real position of each (right-padded) prompt.

    `state_dict()` keys are the HF checkpoint names: `model.embed_tokens.weight`, `model.layers.N.…`,
    `model.embedding_norm.weight` and `score.weight` (num_labels x hidden).

    Args:
        cfg: the model shape (`tilewise.model.config.ModelConfig`).
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        self.score = nn.Linear(cfg.hidden_size, cfg.num_labels, bias=False)

    def init_weights(self, seed: int, std: float = 0.02) -> None:
        """Seeded init: normal(0, std) for matrices and embeddings, residual outputs scaled by 1/sqrt(2 * layers),
        depthwise conv taps normal(0, 1/sqrt(kernel)), norms at one.

        Args:
            seed: the torch generator seed (same seed -> same weights on every device).
            std: the base standard deviation.
        """
        gen = torch.Generator(device="cpu").manual_seed(seed)
        resid_std = std / math.sqrt(2 * self.cfg.num_layers)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.ndim == 1:
                    p.fill_(1.0)
                    continue
                if name.endswith("conv.conv.weight"):
                    s = 1.0 / math.sqrt(self.cfg.conv_L_cache)
                elif name.endswith(("out_proj.weight", "w2.weight")):
                    s = resid_std
                else:
                    s = std
                p.copy_(torch.randn(p.shape, generator=gen) * s)

    def hidden(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Final-norm hidden states of every position.

        Args:
            input_ids: (B, T) token ids.

        Returns:
            (B, T, hidden) tensor.
        """
        seq_len = input_ids.shape[1]
        cos, sin = rope_tables(seq_len, self.cfg.head_dim, self.cfg.rope_theta, input_ids.device)
        x = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return self.model.embedding_norm(x)

    def forward(self, input_ids: torch.Tensor, lengths: torch.Tensor | None = None,
                return_hidden: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Scores of the 8 outputs at each prompt's last real token.

        Args:
            input_ids: (B, T) right-padded token ids.
            lengths: (B,) real lengths (None: every row is T long).
            return_hidden: also return the final-normed hidden state the head reads (for training-only heads).

        Returns:
            (B, num_labels) float32 scores; with `return_hidden`, (scores, (B, hidden) normed last hidden state).
        """
        seq_len = input_ids.shape[1]
        cos, sin = rope_tables(seq_len, self.cfg.head_dim, self.cfg.rope_theta, input_ids.device)
        x = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        if lengths is None:
            last = x[:, -1]
        else:
            last = x[torch.arange(x.shape[0], device=x.device), lengths - 1]  # (B, H)
        # the final norm and head act per position, so only the read position needs them
        h = self.model.embedding_norm(last)  # (B, H)
        scores = self.score(h).float()
        return (scores, h) if return_hidden else scores
