"""Model shapes for training: the bundled default and a toy shape for tests, sized from the tokenizer.

The default is sized for a CPU decision well under 100 ms on 2 cores at the game's 348-token prompt
(see the README, "Training the bundled model"): hidden 256, 8 blocks with attention at 2, 5 and 7 (the last
block attends, so the position that answers can read the whole board), SwiGLU FFN 768, 4 query heads over 2 KV
heads of 64.
"""

from __future__ import annotations

from typing import Any

from tilewise.errors import ConfigError
from tilewise.model.config import ModelConfig

SHAPES: dict[str, dict[str, Any]] = {
    "default": {"hidden": 256, "layers": 8, "attn": (2, 5, 7), "ffn": 768, "heads": 4, "kv_heads": 2},
    "small": {"hidden": 128, "layers": 6, "attn": (2, 5), "ffn": 384, "heads": 2, "kv_heads": 1},
    "tiny": {"hidden": 32, "layers": 3, "attn": (1,), "ffn": 64, "heads": 2, "kv_heads": 1},
}


def model_config(tokenizer: Any, shape: str = "default", hidden: int | None = None, layers: int | None = None,
                 attn: tuple[int, ...] | None = None, ffn: int | None = None, heads: int | None = None,
                 kv_heads: int | None = None) -> ModelConfig:
    """An LFM2 classifier config whose vocabulary and special ids come from `tokenizer`.

    Args:
        tokenizer: a `tokenizers.Tokenizer` with the chat template's special tokens.
        shape: a name in `SHAPES`; the keyword arguments override its fields.
        hidden: residual width.
        layers: number of blocks.
        attn: indices of the attention blocks (the rest are short-conv blocks).
        ffn: SwiGLU width (used as given: no HF auto-adjust).
        heads: query heads (head_dim = hidden / heads).
        kv_heads: key/value heads.

    Returns:
        The config.
    """
    if shape not in SHAPES:
        raise ConfigError(f"unknown model shape {shape!r}", f"use one of {', '.join(SHAPES)}")
    s = dict(SHAPES[shape])
    for key, value in (("hidden", hidden), ("layers", layers), ("attn", attn), ("ffn", ffn), ("heads", heads),
                       ("kv_heads", kv_heads)):
        if value is not None:
            s[key] = value
    if s["hidden"] % s["heads"]:
        raise ConfigError(f"hidden {s['hidden']} is not a multiple of {s['heads']} heads",
                          "pick --heads dividing --hidden")
    bad = [i for i in s["attn"] if not 0 <= i < s["layers"]]
    if bad:
        raise ConfigError(f"attention layer index {bad[0]} is outside 0..{s['layers'] - 1}",
                          "give --attn indices below --layers")
    ids = {name: tokenizer.token_to_id(name) for name in ("<|pad|>", "<|startoftext|>", "<|im_end|>")}
    return ModelConfig(
        vocab_size=tokenizer.get_vocab_size(with_added_tokens=True),
        hidden_size=s["hidden"],
        intermediate_size=s["ffn"],
        layer_types=tuple("full_attention" if i in s["attn"] else "conv" for i in range(s["layers"])),
        num_attention_heads=s["heads"],
        num_key_value_heads=s["kv_heads"],
        head_dim=s["hidden"] // s["heads"],
        block_auto_adjust_ff_dim=False,
        max_position_embeddings=4096,
        pad_token_id=ids["<|pad|>"],
        bos_token_id=ids["<|startoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        name=f"tilewise-{shape}",
    )
