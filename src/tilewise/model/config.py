"""LFM2 model configuration: reads HF `config.json` (model_type "lfm2") and names the presets.

The HF semantics are kept exactly (transformers' `Lfm2Config` / `Lfm2MLP`):
- `layer_types` wins; without it `full_attn_idxs` lists the attention layers (default: every layer).
- `block_ff_dim` is an alias of `intermediate_size`, `tie_embedding` of `tie_word_embeddings`.
- FFN auto-adjust: ffn = int(2 * intermediate_size / 3); if `block_ffn_dim_multiplier` is set,
  ffn = int(multiplier * ffn) rounded up to a multiple of `block_multiple_of`.
- head_dim = hidden_size // num_attention_heads unless `head_dim` is given.
- RoPE theta from `rope_parameters.rope_theta` (transformers >= 5) or `rope_theta` (older files).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tilewise.errors import ConfigError

LAYER_TYPES = ("conv", "full_attention")
NUM_LABELS = 8  # 6 actions + 2 reserved outputs

# the public LFM2-350M layer pattern (attention at 2, 5, 8, 10, 12, 14)
_LFM2_350M_ATTN = (2, 5, 8, 10, 12, 14)


@dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of an LFM2 classifier (everything the forward pass needs).

    Attributes:
        hidden_size: width of the residual stream.
        intermediate_size: the configured FFN size before auto-adjust (HF `intermediate_size`).
        layer_types: one of `conv` / `full_attention` per block.
        ffn_dim: the FFN width actually used (after the auto-adjust rule).
        num_labels: rows of the classifier head `score.weight` (8).
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    layer_types: tuple[str, ...]
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope_theta: float = 1_000_000.0
    norm_eps: float = 1e-5
    conv_L_cache: int = 3
    max_position_embeddings: int = 128_000
    tie_word_embeddings: bool = True
    block_auto_adjust_ff_dim: bool = True
    block_ffn_dim_multiplier: float | None = 1.0
    block_multiple_of: int = 256
    num_labels: int = NUM_LABELS
    bos_token_id: int | None = 1
    eos_token_id: int | None = 2
    pad_token_id: int | None = 0
    name: str = field(default="lfm2", compare=False)
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self.validate()

    @property
    def num_layers(self) -> int:
        return len(self.layer_types)

    @property
    def ffn_dim(self) -> int:
        return ffn_dim(self.intermediate_size, self.block_auto_adjust_ff_dim, self.block_ffn_dim_multiplier,
                       self.block_multiple_of)

    @property
    def attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "full_attention")

    def validate(self) -> None:
        """Raise ConfigError naming the first inconsistent field."""
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                     "head_dim", "conv_L_cache", "max_position_embeddings", "num_labels"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"LFM2 config: {name} must be a positive integer, got {value!r}",
                                  "fix the value in config.json")
        if not self.layer_types:
            raise ConfigError("LFM2 config has no layers (layer_types is empty)", "give num_hidden_layers >= 1")
        for i, t in enumerate(self.layer_types):
            if t not in LAYER_TYPES:
                raise ConfigError(f"LFM2 config: layer {i} has unknown layer type {t!r}",
                                  f"use one of {', '.join(LAYER_TYPES)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"LFM2 config: num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}",
                "grouped-query attention needs heads % kv_heads == 0")
        if self.head_dim % 2:
            raise ConfigError(f"LFM2 config: head_dim={self.head_dim} is odd", "RoPE needs an even head_dim")
        if not self.norm_eps > 0 or not self.rope_theta > 0:
            raise ConfigError(f"LFM2 config: norm_eps={self.norm_eps} and rope_theta={self.rope_theta} must be > 0",
                              "fix the value in config.json")
        if self.ffn_dim < 1:
            raise ConfigError(f"LFM2 config: the FFN size works out to {self.ffn_dim}",
                              "raise intermediate_size or set block_auto_adjust_ff_dim false")

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], name: str = "lfm2") -> ModelConfig:
        """Build from a parsed HF `config.json` (model_type must be "lfm2").

        Args:
            d: the JSON object.
            name: a label for messages and reports.

        Returns:
            The config.
        """
        model_type = d.get("model_type")
        if model_type != "lfm2":
            raise ConfigError(f"config.json has model_type {model_type!r}, not 'lfm2': this is not an LFM2 checkpoint",
                              "point tilewise at an LFM2 folder (config.json with \"model_type\": \"lfm2\")")
        if d.get("conv_bias", False):
            raise ConfigError("LFM2 config has conv_bias=true; tilewise supports the bias-free short conv only",
                              "use a checkpoint trained with conv_bias=false (all released LFM2 models are)")
        try:
            hidden = int(d.get("hidden_size", d.get("block_dim", 2560)))
            n_layers = int(d.get("num_hidden_layers", 32))
            heads = int(d.get("num_attention_heads", d.get("num_heads", 32)))
            layer_types = d.get("layer_types")
            if layer_types is None:
                idxs = d.get("full_attn_idxs")
                idxs = list(range(n_layers)) if idxs is None else [int(i) for i in idxs]
                layer_types = ["full_attention" if i in idxs else "conv" for i in range(n_layers)]
            elif len(layer_types) != n_layers and "num_hidden_layers" in d:
                raise ConfigError(f"LFM2 config: layer_types has {len(layer_types)} entries but num_hidden_layers "
                                  f"is {n_layers}", "make them agree")
            rope = d.get("rope_parameters") or {}
            theta = float(rope.get("rope_theta", d.get("rope_theta", 1_000_000.0)))
            rope_type = rope.get("rope_type", "default")
            if rope_type != "default":
                raise ConfigError(f"LFM2 config uses rope_type {rope_type!r}", "tilewise implements default RoPE only")
            mult = d.get("block_ffn_dim_multiplier", 1.0)
            eos = d.get("eos_token_id", 2)
            if isinstance(eos, list):
                eos = eos[0] if eos else None
            known = {"hidden_size", "num_hidden_layers", "num_attention_heads", "layer_types", "vocab_size"}
            return cls(
                vocab_size=int(d.get("vocab_size", 65536)),
                hidden_size=hidden,
                intermediate_size=int(d.get("intermediate_size", d.get("block_ff_dim", 12288))),
                layer_types=tuple(layer_types),
                num_attention_heads=heads,
                num_key_value_heads=int(d.get("num_key_value_heads", 8)),
                head_dim=int(d.get("head_dim") or hidden // heads),
                rope_theta=theta,
                norm_eps=float(d.get("norm_eps", d.get("block_norm_eps", 1e-5))),
                conv_L_cache=int(d.get("conv_L_cache", 3)),
                max_position_embeddings=int(d.get("max_position_embeddings", 128_000)),
                tie_word_embeddings=bool(d.get("tie_word_embeddings", d.get("tie_embedding", True))),
                block_auto_adjust_ff_dim=bool(d.get("block_auto_adjust_ff_dim", True)),
                block_ffn_dim_multiplier=None if mult is None else float(mult),
                block_multiple_of=int(d.get("block_multiple_of", 256)),
                num_labels=int(d.get("num_labels", len(d.get("id2label", {})) or NUM_LABELS)),
                bos_token_id=d.get("bos_token_id", 1),
                eos_token_id=eos,
                pad_token_id=d.get("pad_token_id", 0),
                name=name,
                extra={k: v for k, v in d.items() if k not in known},
            )
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"LFM2 config.json has a malformed field: {exc}", "fix config.json") from exc

    @classmethod
    def from_file(cls, path: str | Path) -> ModelConfig:
        """Read an HF `config.json`."""
        path = Path(path)
        try:
            d = json.loads(path.read_text())
        except OSError as exc:
            raise ConfigError(f"cannot read {path}: {exc}", "check the path") from exc
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path} is not valid JSON: {exc}", "fix or replace config.json") from exc
        if not isinstance(d, dict):
            raise ConfigError(f"{path} does not hold a JSON object", "fix or replace config.json")
        return cls.from_hf_dict(d, name=path.parent.name or "lfm2")

    def to_hf_dict(self) -> dict[str, Any]:
        """The HF `config.json` object (loadable by `transformers.Lfm2Config`)."""
        return {
            "architectures": ["Lfm2Model"],
            "model_type": "lfm2",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "layer_types": list(self.layer_types),
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "norm_eps": self.norm_eps,
            "conv_L_cache": self.conv_L_cache,
            "conv_bias": False,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "block_auto_adjust_ff_dim": self.block_auto_adjust_ff_dim,
            "block_ffn_dim_multiplier": self.block_ffn_dim_multiplier,
            "block_multiple_of": self.block_multiple_of,
            "num_labels": self.num_labels,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "pad_token_id": self.pad_token_id,
        }

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    def parameter_count(self, with_embeddings: bool = True) -> int:
        """Number of weights (embedding counted once: it is tied)."""
        h, f = self.hidden_size, self.ffn_dim
        q, kv = self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        n = 0
        for t in self.layer_types:
            n += 2 * h + 3 * h * f
            if t == "conv":
                n += 4 * h * h + h * self.conv_L_cache
            else:
                n += h * q + 2 * h * kv + q * h + 2 * self.head_dim
        n += h + self.num_labels * h
        return n + (self.vocab_size * h if with_embeddings else 0)


def ffn_dim(intermediate_size: int, auto_adjust: bool, multiplier: float | None, multiple_of: int) -> int:
    """The FFN width HF's `Lfm2MLP` builds from the config (see the module docstring)."""
    size = intermediate_size
    if auto_adjust:
        size = int(2 * size / 3)
        if multiplier is not None:
            size = int(multiplier * size)
            size = multiple_of * ((size + multiple_of - 1) // multiple_of)
    return size


def _pattern(n_layers: int, attn: tuple[int, ...]) -> tuple[str, ...]:
    return tuple("full_attention" if i in attn else "conv" for i in range(n_layers))


PRESETS: dict[str, ModelConfig] = {
    # the public LiquidAI LFM2-350M shape: FFN 6656 auto-adjusts to 4608
    "lfm2-350m": ModelConfig(
        vocab_size=65536, hidden_size=1024, intermediate_size=6656, layer_types=_pattern(16, _LFM2_350M_ATTN),
        num_attention_heads=16, num_key_value_heads=8, head_dim=64, bos_token_id=1, eos_token_id=7,
        name="lfm2-350m"),
    # seed 001's classifier: hidden 1024, FFN 2560 (given directly, no auto-adjust), 14 blocks. The seed does not
    # print its layer pattern; this keeps LFM2-350M's attention positions that fall inside 14 blocks.
    "seed-250m": ModelConfig(
        vocab_size=65536, hidden_size=1024, intermediate_size=2560, layer_types=_pattern(14, (2, 5, 8, 10, 12)),
        num_attention_heads=16, num_key_value_heads=8, head_dim=64, block_auto_adjust_ff_dim=False,
        bos_token_id=1, eos_token_id=7, name="seed-250m"),
    # for tests: both layer kinds, GQA, small everything
    "tiny": ModelConfig(
        vocab_size=512, hidden_size=64, intermediate_size=192, layer_types=_pattern(4, (1, 3)),
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, block_multiple_of=32, max_position_embeddings=2048,
        name="tiny"),
}


def preset(name: str) -> ModelConfig:
    """Return a named preset config (`lfm2-350m`, `seed-250m`, `tiny`)."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown model preset {name!r}",
                          f"use one of {', '.join(PRESETS)} or a path to a model folder") from None
