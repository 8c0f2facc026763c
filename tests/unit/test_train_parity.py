"""Weights written by `tilewise train` give the same 8 scores in tilewise's float64 reference as in torch.

The path under test is the shipped one: torch model -> HF folder (`save_hf_folder`) -> tilewise's checkpoint
loader -> `reference.forward` in float64 -> `score.weight` on the last position; and the same after NF4
conversion, against the torch model loaded back from the NF4 folder (dequantized weights).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tilewise.game.tokenizer import TOKENIZER_PATH, encode_prompt, example_prompt, load_tokenizer  # noqa: E402
from tilewise.model import reference  # noqa: E402
from tilewise.train.export import checkpoint_weights, convert_to_nf4, load_torch_model  # noqa: E402
from tilewise.train.model import Lfm2Classifier  # noqa: E402
from tilewise.train.shapes import model_config  # noqa: E402
from tilewise.train.trainer import save_hf_folder  # noqa: E402


def _reference_scores(folder: Path, ids: np.ndarray) -> np.ndarray:
    cfg, tensors = checkpoint_weights(folder)
    weights = {k: v.astype(np.float64) for k, v in tensors.items()}
    hidden, _ = reference.forward(cfg, weights, ids, dtype=np.float64)  # (n, H)
    return hidden[-1] @ weights["score.weight"].T  # (8,)


@pytest.fixture(scope="module")
def trained_folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Lfm2Classifier]:
    """A small model of random weights (norms too) with a few AdamW steps on random labels, saved as HF."""
    tok = load_tokenizer()
    cfg = model_config(tok, "tiny", hidden=64, layers=4, attn=(1, 3), ffn=96, heads=4, kv_heads=2)
    model = Lfm2Classifier(cfg)
    model.init_weights(11, std=0.05)
    gen = torch.Generator().manual_seed(12)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.copy_(0.5 + torch.rand(p.shape, generator=gen))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(3):  # trained weights, not just an init
        ids = torch.randint(0, cfg.vocab_size, (4, 50), generator=gen)
        loss = torch.nn.functional.cross_entropy(model(ids)[:, :6], torch.randint(0, 6, (4,), generator=gen))
        opt.zero_grad()
        loss.backward()
        opt.step()
    folder = save_hf_folder(model.eval(), cfg, tmp_path_factory.mktemp("hf") / "m", TOKENIZER_PATH)
    return folder, model


def _prompt_ids() -> np.ndarray:
    return np.array(encode_prompt(load_tokenizer(), example_prompt()), dtype=np.int64)


def test_reference_float64_matches_torch_on_a_game_prompt(trained_folder: tuple[Path, Lfm2Classifier]) -> None:
    folder, model = trained_folder
    ids = _prompt_ids()
    assert ids.size > 300  # the real prompt, ~350 tokens
    ref = _reference_scores(folder, ids)
    with torch.no_grad():
        ours = model(torch.from_numpy(ids)[None])[0].double().numpy()
    assert np.abs(ref).max() > 1e-2  # scores of a real size, so the tolerance means something
    np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)


def test_reference_matches_torch_on_random_ids(trained_folder: tuple[Path, Lfm2Classifier]) -> None:
    folder, model = trained_folder
    rng = np.random.default_rng(3)
    for n in (1, 5, 77):
        ids = rng.integers(0, model.cfg.vocab_size, n)
        ref = _reference_scores(folder, ids)
        with torch.no_grad():
            ours = model(torch.from_numpy(ids)[None])[0].double().numpy()
        np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)


def test_hf_folder_round_trips_into_torch(trained_folder: tuple[Path, Lfm2Classifier]) -> None:
    folder, model = trained_folder
    back = load_torch_model(folder)
    for (name, a), b in zip(model.state_dict().items(), back.state_dict().values()):
        assert torch.equal(a, b), name
    assert (folder / "tokenizer.json").read_bytes() == TOKENIZER_PATH.read_bytes()


def test_nf4_folder_matches_its_dequantized_torch_model(trained_folder: tuple[Path, Lfm2Classifier],
                                                        tmp_path: Path) -> None:
    folder, model = trained_folder
    nf4 = convert_to_nf4(folder, tmp_path / "nf4")
    ids = _prompt_ids()
    back = load_torch_model(nf4)
    with torch.no_grad():
        ours = back(torch.from_numpy(ids)[None])[0].double().numpy()
        full = model(torch.from_numpy(ids)[None])[0].double().numpy()
    np.testing.assert_allclose(ours, _reference_scores(nf4, ids), atol=1e-4, rtol=0)
    # quantization changed the weights (the NF4 path is really taken) but not beyond NF4's error
    w_nf4 = back.model.layers[0].feed_forward.w1.weight
    w_f32 = model.model.layers[0].feed_forward.w1.weight
    rel = float(((w_nf4 - w_f32).norm() / w_f32.norm()).detach())
    assert 1e-3 < rel < 0.2, rel
    assert not np.allclose(ours, full, atol=1e-7)
