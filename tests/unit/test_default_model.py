"""The bundled model loads, uses the game's tokenizer and gives finite, distinct scores on a real prompt."""

import numpy as np
import pytest

import tilewise
from tilewise.model.runtime import DEFAULT_MODEL_DIR

pytestmark = pytest.mark.skipif(not (DEFAULT_MODEL_DIR / "model.safetensors").exists(), reason="no bundled model")


def test_bundled_model_scores_a_game_prompt():
    from tilewise.game.engine import Game
    from tilewise.game.prompt import render_prompt
    from tilewise.game.tokenizer import encode_prompt, load_tokenizer

    model = tilewise.load("default", device="cpu")
    tok = load_tokenizer()
    assert model.config.vocab_size == tok.get_vocab_size(with_added_tokens=True)
    ids = encode_prompt(tok, render_prompt(Game(seed=3)))
    scores = model.scores(model.prefill(ids))
    assert scores.shape == (8,) and np.all(np.isfinite(scores))
    assert np.ptp(scores[:6]) > 1e-3
    assert (DEFAULT_MODEL_DIR / "MODEL_CARD.md").exists()
