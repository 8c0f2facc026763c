"""Dataset records become padded arrays; the held-out split takes whole games; bad records fail clearly."""

from __future__ import annotations

import numpy as np
import pytest

from tilewise.errors import ConfigError
from tilewise.train.data import from_records, split_games


def _records(seed: int, n_games: int = 20):
    rng = np.random.default_rng(seed)
    prompts, actions, games, steps = [], [], [], []
    for g in range(n_games):
        for s in range(int(rng.integers(3, 9))):
            prompts.append(rng.integers(1, 300, int(rng.integers(5, 12))))
            actions.append(int(rng.integers(0, 6)))
            games.append(1000 + 7 * g)
            steps.append(s)
    return prompts, actions, games, steps


def test_padding_keeps_every_prompt_and_its_length() -> None:
    prompts, actions, games, steps = _records(0)
    ex = from_records(prompts, actions, games, steps, pad_id=0, vocab_size=300)
    assert ex.ids.shape == (len(prompts), max(len(p) for p in prompts))
    for i, p in enumerate(prompts):
        assert ex.lengths[i] == len(p)
        assert np.array_equal(ex.ids[i, : len(p)], p)
        assert (ex.ids[i, len(p):] == 0).all()
    assert ex.action_counts() == np.bincount(actions, minlength=6).tolist()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_split_holds_out_whole_games(seed: int) -> None:
    ex = from_records(*_records(seed), pad_id=0)
    train, held = split_games(ex, 0.25, seed=seed)
    assert len(train) + len(held) == len(ex)
    assert not set(train.games.tolist()) & set(held.games.tolist())
    assert len(set(held.games.tolist())) == 5  # 25% of 20 games
    # same seed, same split; the trimmed width fits the longest kept prompt
    again, _ = split_games(ex, 0.25, seed=seed)
    assert np.array_equal(again.games, train.games)
    assert held.ids.shape[1] == held.lengths.max()


def test_split_keeps_one_game_out_when_fraction_rounds_to_zero() -> None:
    ex = from_records(*_records(4, n_games=3), pad_id=0)
    train, held = split_games(ex, 0.01, seed=0)
    assert len(set(held.games.tolist())) == 1 and len(train) > 0


def test_reserved_or_negative_actions_are_refused() -> None:
    prompts, actions, games, steps = _records(5)
    actions[3] = 6
    with pytest.raises(ConfigError, match="record 3 has expert action 6"):
        from_records(prompts, actions, games, steps, pad_id=0)


def test_field_lengths_must_agree() -> None:
    prompts, actions, games, steps = _records(6)
    with pytest.raises(ConfigError, match="disagree in length"):
        from_records(prompts, actions[:-1], games, steps, pad_id=0)


def test_token_ids_beyond_the_tokenizer_are_refused() -> None:
    prompts, actions, games, steps = _records(7)
    prompts[2] = np.array([5, 390, 7])
    with pytest.raises(ConfigError, match=r"token id 390.*only 390 tokens"):
        from_records(prompts, actions, games, steps, pad_id=0, vocab_size=390)


def test_empty_dataset_is_refused() -> None:
    with pytest.raises(ConfigError, match="no decisions"):
        from_records([], [], [], [], pad_id=0)
