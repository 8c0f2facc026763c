"""DAgger pieces: the fast prompt encoder, on-policy collection with expert labels, merging, and `--init`."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from tilewise.errors import ConfigError
from tilewise.game.dataset import (
    FORMAT_VERSION,
    PromptEncoder,
    concat_datasets,
    game_seed,
    generate,
    read_dataset,
    write_dataset,
)
from tilewise.game.engine import Game
from tilewise.game.expert import Expert
from tilewise.game.prompt import render_prompt
from tilewise.game.tokenizer import encode_prompt, load_tokenizer
from tilewise.train.collect import collect_on_policy

ARRAYS = ("tokens", "lengths", "actions", "played", "game_ids", "steps", "pieces")


def _always(action: int):
    def policy(tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        assert tokens.ndim == 2 and lengths.shape == (tokens.shape[0],)
        return np.full(tokens.shape[0], action)

    return policy


def _hashed(tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """A deterministic per-prompt policy (its action depends on the prompt only, never on the batch)."""
    return np.array([int(t[:n].astype(np.int64) @ np.arange(1, n + 1)) % 6 for t, n in zip(tokens, lengths)])


# ---------------------------------------------------------------- PromptEncoder

def test_prompt_encoder_gives_the_tokenizers_ids() -> None:
    tok = load_tokenizer()
    enc = PromptEncoder(tok, verify_first=0, verify_every=10**9)  # no self-checks: compare here instead
    rng = random.Random(0)
    n = 0
    for seed in range(3):
        game, expert = Game(seed), Expert()
        while not game.game_over and n < 600 * (seed + 1):
            prompt = render_prompt(game)
            assert enc.encode(prompt) == encode_prompt(tok, prompt)
            game.step(expert.act(game) if seed == 0 else rng.randrange(6))  # expert, then messy random boards
            n += 1
    assert enc.fast and enc.mismatches == 0


class _MergingTokenizer:
    """A tokenizer whose ids for a whole prompt are not its lines' ids joined (it merges across newlines)."""

    def __init__(self, tok) -> None:
        self.tok = tok

    def encode(self, text: str, add_special_tokens: bool = True):
        class _E:
            pass

        e = _E()
        e.ids = self.tok.encode(text, add_special_tokens=False).ids
        if "\n" in text:
            e.ids = [*e.ids, 7]
        return e


def test_prompt_encoder_falls_back_to_whole_prompts_on_a_difference() -> None:
    enc = PromptEncoder(_MergingTokenizer(load_tokenizer()), verify_first=2)
    prompt = render_prompt(Game(1))
    whole = enc._whole(prompt)
    assert enc.encode(prompt) == whole  # the check caught the difference and returned the whole encoding
    assert not enc.fast and enc.mismatches == 1
    assert enc.encode(render_prompt(Game(2))) == enc._whole(render_prompt(Game(2)))


# ---------------------------------------------------------------- on-policy collection

def test_records_follow_the_policy_and_carry_the_expert_labels() -> None:
    """A policy that always moves left: states are on its trajectory, labels are the expert's actions there."""
    data = collect_on_policy(_always(4), 2, seed=9, max_pieces=50, workers=1)
    tok, expert = load_tokenizer(), Expert()
    assert data.meta["version"] == FORMAT_VERSION and data.meta["source"] == "on-policy"
    assert (data.played == 4).all()
    assert (data.actions != 4).any()  # the expert disagrees somewhere: labels are not the played actions
    for g in range(2):
        rows = np.flatnonzero(data.game_ids == g)
        assert rows.size and data.steps[rows].tolist() == list(range(rows.size))
        game = Game(game_seed(9, g))
        for i in rows:
            assert data.token_ids[i].tolist() == encode_prompt(tok, render_prompt(game))
            assert data.actions[i] == expert.act(game)
            assert data.pieces[i] == game.pieces
            assert tuple(data.targets[i].tolist()) == (expert.target(game.board, game.piece) or (-1, -1))
            game.step(4)
        assert game.game_over  # always-left stacks the left side until it tops out
        res = data.meta["results"][g]
        assert {k: res[k] for k in ("pieces", "lines", "steps", "game_over", "stopped", "rollin_pieces",
                                    "policy_pieces")} == {"pieces": game.pieces, "lines": game.lines,
                                                          "steps": game.steps, "game_over": True, "stopped": False,
                                                          "rollin_pieces": 0, "policy_pieces": game.pieces}
    c = data.meta["collector"]
    assert c["positions"] == len(data) and c["beta"] == 0.0
    assert c["policy_agreement"] == pytest.approx(float((data.actions == 4).mean()), abs=1e-4)


def test_beta_one_is_the_expert_alone() -> None:
    on = collect_on_policy(_always(0), 3, seed=4, max_pieces=15, beta=1.0, workers=1)
    expert = generate(3, seed=4, max_pieces=15, explore=0.0, workers=1)
    for k in ARRAYS:
        np.testing.assert_array_equal(getattr(on, k), getattr(expert, k))


def test_mixture_plays_the_expert_about_beta_of_the_time() -> None:
    data = collect_on_policy(_always(5), 4, seed=2, max_pieces=40, beta=0.5, workers=1)
    mixed = (data.played == data.actions) & (data.actions != 5)
    policy = data.played == 5
    assert (mixed | policy).all()
    share = mixed.sum() / (data.actions != 5).sum()
    assert 0.35 < share < 0.65


def test_records_do_not_depend_on_workers() -> None:
    a = collect_on_policy(_hashed, 4, seed=3, max_pieces=25, beta=0.3, workers=1)
    b = collect_on_policy(_hashed, 4, seed=3, max_pieces=25, beta=0.3, workers=2)
    for k in ARRAYS:
        np.testing.assert_array_equal(getattr(a, k), getattr(b, k))
    assert a.meta["results"] == b.meta["results"]
    assert b.meta["collector"]["workers"] == 2


def test_time_budget_keeps_the_positions_played() -> None:
    data = collect_on_policy(_always(1), 3, seed=5, max_pieces=1000, beta=1.0, workers=1, time_budget_s=0.3)
    assert data.meta["collector"]["stopped_by_time"]
    assert all(r["stopped"] for r in data.meta["results"])
    full = generate(3, seed=5, max_pieces=1000, explore=0.0, workers=1)
    for g in range(3):  # a prefix of each expert game
        rows = np.flatnonzero(data.game_ids == g)
        ref = np.flatnonzero(full.game_ids == g)[: rows.size]
        np.testing.assert_array_equal(data.tokens[rows], full.tokens[ref])
        np.testing.assert_array_equal(data.actions[rows], full.actions[ref])


@pytest.mark.parametrize("bad, match", [(7, "outside 0-5"), (-1, "outside 0-5")])
def test_bad_policy_actions_are_refused(bad: int, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        collect_on_policy(_always(bad), 1, seed=1, max_pieces=3, workers=1)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ConfigError, match="beta"):
        collect_on_policy(_always(1), 1, seed=1, beta=1.5)
    with pytest.raises(ConfigError, match="games"):
        collect_on_policy(_always(1), 0, seed=1)


# ---------------------------------------------------------------- merging

def test_merged_records_keep_the_format(tmp_path: Path) -> None:
    expert = generate(2, seed=1, max_pieces=6, workers=1)
    on = collect_on_policy(_always(4), 3, seed=100, max_pieces=6, workers=1)
    merged = concat_datasets([expert, on])
    back = read_dataset(write_dataset(merged, tmp_path / "merged.npz"))
    assert back.meta["version"] == FORMAT_VERSION
    assert back.meta["parts"] == [{"seed": 1, "games": 2, "source": "expert"},
                                  {"seed": 100, "games": 3, "source": "on-policy"}]
    n = len(expert)
    for k in ("tokens", "lengths", "actions", "played", "steps", "pieces", "targets"):
        np.testing.assert_array_equal(getattr(back, k)[:n], getattr(expert, k))
        np.testing.assert_array_equal(getattr(back, k)[n:], getattr(on, k))
    np.testing.assert_array_equal(back.game_ids[n:], on.game_ids + 2)  # distinct games
    assert back.meta["games"] == 5 and len(back.meta["results"]) == 5


def test_adding_files_keeps_the_first_files_held_out_games(tmp_path: Path) -> None:
    from tilewise.train.data import load_examples, load_split, split_games

    first = write_dataset(generate(20, seed=1, max_pieces=3, workers=1), tmp_path / "expert.npz")
    second = write_dataset(collect_on_policy(_always(4), 20, seed=100, max_pieces=3, workers=1), tmp_path / "on.npz")
    _, held_alone = split_games(load_examples(first), 0.1, seed=0)
    train, held, parts, sizes = load_split([first, second], 0.1, seed=0)
    assert sum(sizes) == len(train)
    np.testing.assert_array_equal(parts[0].games, held_alone.games)
    np.testing.assert_array_equal(parts[0].ids, held_alone.ids)
    assert len(parts) == 2 and len(parts[1]) > 0 and parts[1].games.min() >= 20  # second file's ids come after
    assert not set(train.games.tolist()) & set(held.games.tolist())
    assert len(train) + len(held) == len(read_dataset(first)) + len(read_dataset(second))


def test_expert_rollin_then_the_policy_up_to_its_piece_cap() -> None:
    """With a roll-in, the expert plays first (not recorded); the policy's part is capped at policy_pieces."""
    data = collect_on_policy(_always(1), 8, seed=6, max_pieces=100, prefix_pieces=12, policy_pieces=5, workers=1)
    expert = Expert()
    rollins = [r["rollin_pieces"] for r in data.meta["results"]]
    assert rollins[0] == rollins[4] == 0  # every fourth game starts from the empty board
    assert all(1 <= k <= 12 for g, k in enumerate(rollins) if g % 4)
    for g, res in enumerate(data.meta["results"]):
        game = Game(game_seed(6, g))
        while game.pieces < res["rollin_pieces"]:
            game.step(expert.act(game))
        rows = np.flatnonzero(data.game_ids == g)
        assert data.pieces[rows[0]] == res["rollin_pieces"] and data.steps[rows[0]] == 0
        for i in rows:
            assert data.actions[i] == expert.act(game) and data.played[i] == 1
            game.step(1)  # hard drop: one piece per step
        assert res["policy_pieces"] == game.pieces - res["rollin_pieces"] == 5 and not res["stopped"]
    c = data.meta["collector"]
    assert c["from_empty"]["games"] == 2 and c["policy_part"]["games"] == 8
    assert c["policy_part"]["mean_pieces"] == 5.0
