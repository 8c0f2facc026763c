"""The torch training model equals HF's LFM2 on the same weights, and right padding never changes a score."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tilewise.model.config import ModelConfig  # noqa: E402
from tilewise.train.model import Lfm2Classifier  # noqa: E402


def _cfg(**kw: object) -> ModelConfig:
    base = dict(vocab_size=97, hidden_size=32, intermediate_size=48, layer_types=("conv", "full_attention", "conv"),
                num_attention_heads=4, num_key_value_heads=2, head_dim=8, block_auto_adjust_ff_dim=False,
                max_position_embeddings=512)
    base.update(kw)
    return ModelConfig(**base)


def _random_model(cfg: ModelConfig, seed: int) -> Lfm2Classifier:
    model = Lfm2Classifier(cfg)
    model.init_weights(seed, std=0.1)
    gen = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:  # norms away from one so a missing weight multiply shows
                p.copy_(0.5 + torch.rand(p.shape, generator=gen))
    return model.eval()


def test_state_dict_uses_hf_names() -> None:
    cfg = _cfg()
    keys = set(Lfm2Classifier(cfg).state_dict())
    assert "model.embed_tokens.weight" in keys
    assert "model.embedding_norm.weight" in keys
    assert "score.weight" in keys
    assert "model.layers.0.conv.conv.weight" in keys
    assert "model.layers.0.conv.in_proj.weight" in keys
    assert "model.layers.1.self_attn.q_layernorm.weight" in keys
    assert "model.layers.2.feed_forward.w2.weight" in keys
    assert Lfm2Classifier(cfg).score.weight.shape == (8, 32)


def test_parameter_count_matches_config() -> None:
    cfg = _cfg()
    n = sum(p.numel() for p in Lfm2Classifier(cfg).parameters())
    assert n == cfg.parameter_count()


@pytest.mark.parametrize("seed", [0, 1])
def test_hidden_states_match_hf_lfm2(seed: int) -> None:
    transformers = pytest.importorskip("transformers")
    cfg = _cfg()
    model = _random_model(cfg, seed)
    hf_dict = {k: v for k, v in cfg.to_hf_dict().items() if k != "architectures"}
    hf_cfg = transformers.Lfm2Config(**hf_dict)
    hf_cfg._attn_implementation = "eager"
    hf = transformers.Lfm2Model(hf_cfg).eval()
    backbone = {k.removeprefix("model."): v for k, v in model.state_dict().items() if k.startswith("model.")}
    hf.load_state_dict(backbone, strict=True)
    ids = torch.randint(0, cfg.vocab_size, (3, 37), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        ours = model.hidden(ids)
        theirs = hf(input_ids=ids).last_hidden_state
        scores = model(ids)
    assert torch.allclose(ours, theirs, atol=2e-5, rtol=1e-4), float((ours - theirs).abs().max())
    # the head reads the last position of the HF hidden states
    assert torch.allclose(scores, theirs[:, -1] @ model.score.weight.T, atol=2e-5)


def test_right_padding_does_not_change_scores() -> None:
    cfg = _cfg()
    model = _random_model(cfg, 3)
    gen = torch.Generator().manual_seed(5)
    lengths = torch.tensor([30, 17, 24])
    ids = torch.randint(0, cfg.vocab_size, (3, 30), generator=gen)
    with torch.no_grad():
        batched = model(ids, lengths)
        for i, n in enumerate(lengths.tolist()):
            alone = model(ids[i: i + 1, :n])
            assert torch.allclose(batched[i], alone[0], atol=1e-5), (i, batched[i], alone[0])
        # the pads themselves are irrelevant
        ids2 = ids.clone()
        ids2[1, 17:] = torch.randint(0, cfg.vocab_size, (13,), generator=gen)
        assert torch.allclose(model(ids2, lengths)[1], batched[1], atol=1e-6)


def test_init_is_seeded() -> None:
    cfg = _cfg()
    a, b, c = Lfm2Classifier(cfg), Lfm2Classifier(cfg), Lfm2Classifier(cfg)
    a.init_weights(4)
    b.init_weights(4)
    c.init_weights(5)
    for (name, pa), pb, pc in zip(a.state_dict().items(), b.state_dict().values(), c.state_dict().values()):
        assert torch.equal(pa, pb), name
        if pa.ndim >= 2:
            assert not torch.equal(pa, pc), name
    assert np.isfinite(a.score.weight.detach().numpy()).all()
