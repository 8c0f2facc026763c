"""LFM2 config: HF config.json semantics (layer pattern, FFN auto-adjust, aliases), presets, bad configs."""

from __future__ import annotations

import json

import pytest

from tilewise.errors import ConfigError
from tilewise.model.config import PRESETS, ModelConfig, ffn_dim, preset

# the public LFM2-350M config.json, abridged to the fields that shape the model
LFM2_350M_JSON = {
    "architectures": ["Lfm2ForCausalLM"], "model_type": "lfm2", "block_auto_adjust_ff_dim": True,
    "block_ff_dim": 6656, "block_ffn_dim_multiplier": 1.0, "block_multiple_of": 256, "conv_L_cache": 3,
    "conv_bias": False, "hidden_size": 1024, "intermediate_size": 6656, "max_position_embeddings": 128000,
    "layer_types": ["conv", "conv", "full_attention", "conv", "conv", "full_attention", "conv", "conv",
                    "full_attention", "conv", "full_attention", "conv", "full_attention", "conv", "full_attention",
                    "conv"],
    "norm_eps": 1e-05, "num_attention_heads": 16, "num_hidden_layers": 16, "num_key_value_heads": 8,
    "rope_theta": 1000000.0, "vocab_size": 65536, "tie_embedding": True, "eos_token_id": 7,
}


def test_lfm2_350m_config_json_matches_preset():
    cfg = ModelConfig.from_hf_dict(LFM2_350M_JSON)
    ref = preset("lfm2-350m")
    assert cfg.ffn_dim == 4608  # 6656 * 2/3 = 4437 -> rounded up to a multiple of 256
    assert cfg.attention_layers == (2, 5, 8, 10, 12, 14)
    for name in ("vocab_size", "hidden_size", "layer_types", "num_attention_heads", "num_key_value_heads",
                 "head_dim", "rope_theta", "norm_eps", "conv_L_cache", "ffn_dim"):
        assert getattr(cfg, name) == getattr(ref, name), name
    assert 340e6 < cfg.parameter_count() < 370e6


def test_full_attn_idxs_and_aliases():
    d = {"model_type": "lfm2", "hidden_size": 64, "num_hidden_layers": 5, "full_attn_idxs": [1, 4],
         "num_attention_heads": 4, "num_key_value_heads": 1, "block_ff_dim": 300, "block_auto_adjust_ff_dim": False,
         "tie_embedding": False, "rope_parameters": {"rope_type": "default", "rope_theta": 5000.0}, "vocab_size": 77}
    cfg = ModelConfig.from_hf_dict(d)
    assert cfg.layer_types == ("conv", "full_attention", "conv", "conv", "full_attention")
    assert cfg.ffn_dim == 300 and cfg.intermediate_size == 300
    assert cfg.tie_word_embeddings is False and cfg.rope_theta == 5000.0 and cfg.head_dim == 16
    # no pattern at all: every layer is attention (HF's default)
    d2 = {k: v for k, v in d.items() if k != "full_attn_idxs"}
    assert ModelConfig.from_hf_dict(d2).layer_types == ("full_attention",) * 5


@pytest.mark.parametrize("inter,auto,mult,multiple,want", [
    (6656, True, 1.0, 256, 4608), (6656, True, None, 256, 4437), (2560, False, 1.0, 256, 2560),
    (12288, True, 1.0, 256, 8192), (1000, True, 1.5, 64, 1024), (100, True, 1.0, 32, 96)])
def test_ffn_auto_adjust_rule(inter, auto, mult, multiple, want):
    assert ffn_dim(inter, auto, mult, multiple) == want


def test_ffn_rule_and_pattern_agree_with_transformers():
    transformers = pytest.importorskip("transformers")
    for inter, auto, mult, multiple in [(6656, True, 1.0, 256), (6656, True, 1, 128), (777, True, 1.3, 32),
                                        (512, False, 1.0, 256)]:
        hc = transformers.Lfm2Config(hidden_size=32, intermediate_size=inter, block_auto_adjust_ff_dim=auto,
                                     block_ffn_dim_multiplier=mult, block_multiple_of=multiple, num_hidden_layers=3,
                                     full_attn_idxs=[0, 2], num_attention_heads=4, num_key_value_heads=2,
                                     vocab_size=50)
        mlp = transformers.models.lfm2.modeling_lfm2.Lfm2MLP(hc)
        cfg = ModelConfig.from_hf_dict(hc.to_dict())
        assert cfg.ffn_dim == mlp.w1.out_features
        assert cfg.layer_types == tuple(hc.layer_types)
        # and our config.json round-trips through transformers
        back = transformers.Lfm2Config.from_dict(cfg.to_hf_dict())
        assert ModelConfig.from_hf_dict(back.to_dict()) == cfg


def test_presets_are_valid_and_distinct():
    assert set(PRESETS) >= {"lfm2-350m", "seed-250m", "tiny"}
    seed = preset("seed-250m")
    assert (seed.hidden_size, seed.ffn_dim, seed.num_layers) == (1024, 2560, 14)
    assert 200e6 < seed.parameter_count() < 260e6
    tiny = preset("tiny")
    assert tiny.parameter_count() < 1e6 and "conv" in tiny.layer_types and tiny.attention_layers
    assert tiny.num_attention_heads > tiny.num_key_value_heads  # exercises GQA


def test_unknown_layer_type_is_named():
    d = dict(LFM2_350M_JSON, layer_types=["conv"] * 15 + ["mamba"])
    with pytest.raises(ConfigError, match=r"layer 15 has unknown layer type 'mamba'"):
        ModelConfig.from_hf_dict(d)


def test_non_lfm2_config_is_rejected(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    with pytest.raises(ConfigError, match="not an LFM2 checkpoint"):
        ModelConfig.from_file(p)
    p.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        ModelConfig.from_file(p)


@pytest.mark.parametrize("change,match", [
    ({"num_key_value_heads": 3}, "not a multiple"), ({"conv_bias": True}, "conv_bias"),
    ({"hidden_size": 0}, "hidden_size"), ({"layer_types": ["conv"] * 3}, "num_hidden_layers")])
def test_bad_fields_are_named(change, match):
    with pytest.raises(ConfigError, match=match):
        ModelConfig.from_hf_dict(dict(LFM2_350M_JSON, **change))


def test_unknown_preset():
    with pytest.raises(ConfigError, match="unknown model preset"):
        preset("gpt2")
