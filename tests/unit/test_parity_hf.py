"""Parity with HF transformers' own LFM2 (`Lfm2Model`) on the same weights, written by HF as a folder and read
back through tilewise's checkpoint loader: float64 and float32 reference and the CPU executor, several layer
patterns and head counts, lengths around the 96-row cutoff and ~350; continuation equals one-shot prefill."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import tilewise  # noqa: E402
from tilewise.model import checkpoint as ckpt  # noqa: E402
from tilewise.model import reference  # noqa: E402
from tilewise.model.config import ModelConfig  # noqa: E402

TOL = 1e-4  # max abs difference of the final hidden state, float32

CONFIGS = {
    # name: (hidden, layer pattern, heads, kv heads, extra HF fields)
    "mixed-gqa": (64, ["conv", "full_attention", "conv", "full_attention"], 4, 2, {}),
    "attn-only-mha": (48, ["full_attention"] * 3, 4, 4, {"rope_parameters": {"rope_type": "default",
                                                                           "rope_theta": 10000.0}}),
    "conv-only": (32, ["conv"] * 3, 2, 1, {"conv_L_cache": 4}),
    "attn-first-mqa": (64, ["full_attention", "conv", "conv", "full_attention", "conv"], 8, 1,
                       {"block_auto_adjust_ff_dim": False, "intermediate_size": 96}),
}


def _hf_folder(tmp_path_factory, name: str, causal_lm: bool = False):
    hidden, layers, heads, kv, extra = CONFIGS[name]
    fields = dict(vocab_size=300, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=len(layers),
                  layer_types=layers, num_attention_heads=heads, num_key_value_heads=kv, block_multiple_of=16,
                  max_position_embeddings=1024, tie_word_embeddings=True)
    fields.update(extra)
    hc = transformers.Lfm2Config(**fields)
    cfg = ModelConfig.from_hf_dict(hc.to_dict())
    tensors = ckpt.random_tensors(cfg, seed=len(name), head=False)
    model = (transformers.Lfm2ForCausalLM if causal_lm else transformers.Lfm2Model)(hc).eval()
    prefix = "model." if causal_lm else ""
    state = {prefix + k: torch.from_numpy(v) for k, v in tensors.items()}
    if causal_lm:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state, strict=True)
    folder = tmp_path_factory.mktemp(name)
    model.save_pretrained(folder)
    return folder, (model.model if causal_lm else model)


@pytest.fixture(scope="module", params=list(CONFIGS))
def case(request, tmp_path_factory):
    folder, hf = _hf_folder(tmp_path_factory, request.param, causal_lm=request.param == "mixed-gqa")
    ck = ckpt.Checkpoint.open(folder)
    weights = {n: ck.float32(n) for n in ck.names()}
    return ck.config, weights, hf, tilewise.load(str(folder), weights="f32")


def _hf_hidden(hf, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return hf(torch.from_numpy(ids)[None], use_cache=False).last_hidden_state[0].numpy().astype(np.float64)


@pytest.mark.parametrize("n", [1, 95, 96, 97, 350])
def test_final_hidden_matches_hf(case, n):
    cfg, weights, hf, model = case
    ids = np.random.default_rng(n).integers(0, cfg.vocab_size, n)
    want = _hf_hidden(hf, ids)  # (n, H)
    assert np.abs(want).max() > 0.5  # activations are O(1), so the tolerance means something
    ref64, _ = reference.forward(cfg, weights, ids, dtype=np.float64)
    ref32, _ = reference.forward(cfg, weights, ids, dtype=np.float32)
    assert np.abs(ref64 - want).max() < TOL  # every position
    assert np.abs(ref32 - want).max() < TOL
    assert np.abs(model.hidden(model.prefill(ids)) - want[-1]).max() < TOL


def test_continuation_equals_prefill(case):
    cfg, weights, _, model = case
    ids = np.random.default_rng(7).integers(0, cfg.vocab_size, 350)
    full = model.hidden(model.prefill(ids))
    split = model.hidden(model.extend(model.prefill(ids[:47]), ids[47:]))
    state = model.prefill(ids[:1])
    for t in ids[1:]:
        state = model.extend(state, [t])
    np.testing.assert_allclose(split, full, atol=1e-5, rtol=0)
    np.testing.assert_allclose(model.hidden(state), full, atol=1e-5, rtol=0)
    # and the float64 reference's own continuation state
    h1, s1 = reference.forward(cfg, weights, ids[:200])
    h2, _ = reference.forward(cfg, weights, ids[200:], s1)
    ref, _ = reference.forward(cfg, weights, ids)
    np.testing.assert_allclose(np.concatenate([h1, h2]), ref, atol=1e-10, rtol=0)


def test_hf_config_json_is_read(case):
    cfg, _, hf, _ = case
    assert cfg.layer_types == tuple(hf.config.layer_types)
    assert cfg.ffn_dim == hf.layers[0].feed_forward.w1.out_features
    assert cfg.conv_L_cache == hf.config.conv_L_cache


def test_nf4_executor_matches_hf_on_dequantized_weights(tmp_path_factory):
    """The NF4 path end to end: HF folder -> `tilewise convert --format nf4` -> CPU executor, against HF running
    the dequantized weights."""
    from tilewise.cli import main

    folder, hf = _hf_folder(tmp_path_factory, "mixed-gqa")
    out = tmp_path_factory.mktemp("nf4") / "m"
    assert main(["convert", str(folder), str(out), "--format", "nf4", "--blocksize", "32"]) == 0
    model = tilewise.load(str(out), weights="nf4")
    ck = model.checkpoint
    assert ck.weights == "nf4"
    state = {k: torch.from_numpy(np.array(ck.float32(k))) for k in ck.names()}
    hf.load_state_dict(state, strict=True)
    ids = np.random.default_rng(3).integers(0, model.config.vocab_size, 96)
    want = _hf_hidden(hf, ids)[-1]
    assert np.abs(model.hidden(model.prefill(ids)) - want).max() < TOL
