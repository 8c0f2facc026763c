"""Dataset: records replay to the expert's labels, format checks, version refusal, worker independence."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest

from tilewise.errors import ConfigError
from tilewise.game.dataset import (
    FORMAT_NAME,
    FORMAT_VERSION,
    concat_datasets,
    game_seed,
    generate,
    read_dataset,
    write_dataset,
)
from tilewise.game.engine import Game
from tilewise.game.expert import Expert, action_toward
from tilewise.game.prompt import render_prompt
from tilewise.game.tokenizer import encode_prompt, load_tokenizer


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    data = generate(3, seed=7, max_pieces=12, explore=0.2, workers=1)
    path = write_dataset(data, tmp_path_factory.mktemp("ds") / "small")
    return data, path


def test_written_file_reads_back_identically(small):
    data, path = small
    assert path.suffix == ".npz"
    back = read_dataset(path)
    for k in ("tokens", "lengths", "actions", "played", "game_ids", "steps", "pieces", "targets"):
        np.testing.assert_array_equal(getattr(back, k), getattr(data, k))
    assert back.targets.dtype == np.int8 and back.targets.shape == (len(data), 2)
    assert back.meta["version"] == FORMAT_VERSION and back.meta["seed"] == 7 and back.meta["games"] == 3
    assert back.tokens.dtype == np.uint16 and back.actions.dtype == np.uint8
    assert [len(t) for t in back.token_ids] == back.lengths.tolist()


def test_uncompressed_file_reads_back_identically(small, tmp_path):
    data, packed = small
    path = write_dataset(data, tmp_path / "plain", compress=False)
    with zipfile.ZipFile(path) as z:
        assert {i.compress_type for i in z.infolist()} == {zipfile.ZIP_STORED}
    with zipfile.ZipFile(packed) as z:
        assert {i.compress_type for i in z.infolist()} == {zipfile.ZIP_DEFLATED}
    back = read_dataset(path)
    for k in ("tokens", "lengths", "actions", "played", "game_ids", "steps", "pieces", "targets"):
        np.testing.assert_array_equal(getattr(back, k), getattr(data, k))
    assert back.meta == read_dataset(packed).meta


def test_records_replay_to_the_expert_labels(small):
    data, _ = small
    tok = load_tokenizer()
    expert = Expert()
    assert sorted(set(data.game_ids.tolist())) == [0, 1, 2]
    explored = 0
    for g in range(3):
        rows = np.flatnonzero(data.game_ids == g)
        assert data.steps[rows].tolist() == list(range(rows.size))
        game = Game(game_seed(7, g))
        for i in rows:
            ids = encode_prompt(tok, render_prompt(game))
            assert data.token_ids[i].tolist() == ids
            assert data.actions[i] == expert.act(game)
            assert data.pieces[i] == game.pieces
            # the target is the expert's, and the label is the step toward it from where the piece is
            t_rot, t_x = data.targets[i].tolist()
            assert (t_rot, t_x) == (expert.target(game.board, game.piece) or (-1, -1))
            assert data.actions[i] == action_toward(None if t_rot < 0 else (t_rot, t_x), game.rot, game.x)
            explored += int(data.played[i] != data.actions[i])
            assert data.played[i] in (data.actions[i], 2, 3, 4, 5)
            game.step(int(data.played[i]))
        assert game.pieces == 12 or game.game_over
    assert explored > 0  # explore=0.2 must have played some non-expert moves


def test_output_does_not_depend_on_workers():
    a = generate(2, seed=3, max_pieces=4, workers=1)
    b = generate(2, seed=3, max_pieces=4, workers=2)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.actions, b.actions)
    assert a.meta == b.meta


def test_explore_zero_plays_the_labels():
    d = generate(1, seed=1, max_pieces=5, explore=0.0, workers=1)
    np.testing.assert_array_equal(d.actions, d.played)


def test_detours_shift_new_pieces_sideways_and_keep_the_expert_labels():
    """With detour=1 every piece starts with 1-3 sideways steps (then the expert plays on), every label is the
    expert's, and the data holds shifted, unrotated pieces labelled "rotate"; detour=0 changes nothing."""
    d = generate(2, seed=5, max_pieces=10, explore=0.0, workers=1, detour=1.0)
    assert d.meta["detour"] == 1.0
    expert = Expert()
    shifted_unrotated_rotate = 0
    for g in range(2):
        game = Game(game_seed(5, g))
        step_in_piece = 0
        for i in np.flatnonzero(d.game_ids == g):
            assert d.actions[i] == expert.act(game)
            if step_in_piece == 0:
                assert d.played[i] in (4, 5)  # a detour step, whatever the expert wanted
            elif step_in_piece >= 3:
                assert d.played[i] == d.actions[i]  # detours are over after 3 steps: the expert plays
            if game.rot == 0 and game.x != game.piece.spawn_x and d.actions[i] in (2, 3):
                shifted_unrotated_rotate += 1
            step_in_piece = 0 if game.step(int(d.played[i])).locked else step_in_piece + 1
        assert game.pieces == 10 or game.game_over
    assert shifted_unrotated_rotate > 0  # the positions the expert's own order never shows
    plain = generate(2, seed=5, max_pieces=10, explore=0.05, workers=1)
    again = generate(2, seed=5, max_pieces=10, explore=0.05, workers=1, detour=0.0)
    np.testing.assert_array_equal(plain.tokens, again.tokens)
    np.testing.assert_array_equal(plain.played, again.played)
    with pytest.raises(ConfigError, match="detour"):
        generate(1, seed=1, detour=1.5)


def _rewrite(path, out, **changes):
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    arrays.update(changes)
    for k in [k for k, v in changes.items() if v is None]:
        arrays.pop(k)
    np.savez(out, **arrays)
    return out


def test_another_version_is_refused_clearly(small, tmp_path):
    _, path = small
    bad = _rewrite(path, tmp_path / "v2.npz", version=np.array(2))
    with pytest.raises(ConfigError, match="format version 2; this tilewise reads version 1"):
        read_dataset(bad)


@pytest.mark.parametrize("change, match", [
    ({"format": np.array("something-else")}, "not 'tilewise-game-dataset'"),
    ({"format": None}, "no format/version"),
    ({"played": None}, "lacks the arrays played"),
    ({"steps": np.zeros(3, dtype=np.int32)}, "steps has shape"),
    ({"actions": "bad"}, "outside 0-5"),
])
def test_malformed_files_are_refused(small, tmp_path, change, match):
    data, path = small
    if change.get("actions") == "bad":
        acts = data.actions.copy()
        acts[5] = 6
        change = {"actions": acts}
    bad = _rewrite(path, tmp_path / "bad.npz", **change)
    with pytest.raises(ConfigError, match=match):
        read_dataset(bad)


def test_not_a_dataset(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        read_dataset(tmp_path / "missing.npz")
    txt = tmp_path / "x.npz"
    txt.write_text(json.dumps({"format": FORMAT_NAME}))
    with pytest.raises(ConfigError, match=r"not an \.npz"):
        read_dataset(txt)


@pytest.mark.parametrize("kwargs, match", [
    ({"games": 0, "seed": 1}, "games"),
    ({"games": 1, "seed": "1"}, "seed"),
    ({"games": 1, "seed": 1, "explore": 1.5}, "explore"),
    ({"games": 1, "seed": 1, "max_pieces": 0}, "max_pieces"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        generate(**kwargs)


def test_files_without_targets_still_read(small, tmp_path):
    """Files written before the targets array existed read back with `targets` None (no target signal)."""
    data, path = small
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files if k != "targets"}
    old = tmp_path / "old.npz"
    np.savez_compressed(old, **arrays)
    back = read_dataset(old)
    assert back.targets is None
    np.testing.assert_array_equal(back.actions, data.actions)
    assert concat_datasets([data, back]).targets is None  # no target signal where one part lacks it
    np.testing.assert_array_equal(concat_datasets([data, data]).targets[len(data):], data.targets)


def test_bad_targets_are_refused(small, tmp_path):
    _, path = small
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    for change, match in (((arrays["targets"][:-1]), "targets has shape"),
                          (np.where(np.arange(arrays["targets"].size).reshape(-1, 2) == 0, 7,
                                    arrays["targets"]).astype(np.int8), "rotation state")):
        bad = tmp_path / "bad.npz"
        np.savez_compressed(bad, **{**arrays, "targets": change})
        with pytest.raises(ConfigError, match=match):
            read_dataset(bad)
