"""The training loop learns a learnable rule, is seeded, honours its budgets, and writes a loadable HF folder."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tilewise.errors import ConfigError  # noqa: E402
from tilewise.game.tokenizer import TOKENIZER_PATH  # noqa: E402
from tilewise.model.config import ModelConfig  # noqa: E402
from tilewise.train.data import from_records, split_games  # noqa: E402
from tilewise.train.trainer import TrainSettings, lr_factor, save_hf_folder, train  # noqa: E402

VOCAB = 40


def _cfg() -> ModelConfig:
    return ModelConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, layer_types=("conv", "full_attention"),
                       num_attention_heads=2, num_key_value_heads=1, head_dim=16, block_auto_adjust_ff_dim=False,
                       max_position_embeddings=256)


def _task(n: int, seed: int):
    """Random prompts of 12..20 tokens; the label is a fixed function of the token 3 before the end."""
    rng = np.random.default_rng(seed)
    prompts, actions = [], []
    for _ in range(n):
        ids = rng.integers(4, VOCAB, rng.integers(12, 21))
        prompts.append(ids)
        actions.append(int(ids[-3]) % 6)
    games = np.arange(n) // 10
    return from_records(prompts, actions, games, np.arange(n) % 10, pad_id=0, vocab_size=VOCAB)


def _settings(**kw: object) -> TrainSettings:
    base = dict(epochs=100, max_steps=200, batch_size=32, lr=3e-3, warmup_steps=20, seed=0, device="cpu",
                eval_every_s=0, log_every=100)
    base.update(kw)
    return TrainSettings(**base)


def test_learns_a_rule_far_above_chance() -> None:
    train_ex, held = split_games(_task(2000, 1), 0.1, seed=0)
    lines: list[str] = []
    _, result = train(_cfg(), train_ex, held, _settings(), log=lines.append)
    assert result.heldout_examples == len(held) > 0
    assert result.heldout_accuracy > 0.8, result  # chance is 1/6
    assert result.steps == 200 and result.stopped_by == "steps"
    assert any("tok/s" in line and "loss" in line for line in lines)


def test_same_seed_same_weights() -> None:
    train_ex, held = split_games(_task(300, 2), 0.1, seed=0)
    a, _ = train(_cfg(), train_ex, held, _settings(max_steps=15), log=lambda s: None)
    b, _ = train(_cfg(), train_ex, held, _settings(max_steps=15), log=lambda s: None)
    c, _ = train(_cfg(), train_ex, held, _settings(max_steps=15, seed=1), log=lambda s: None)
    for (name, pa), pb, pc in zip(a.state_dict().items(), b.state_dict().values(), c.state_dict().values()):
        assert torch.equal(pa, pb), name
        if pa.ndim >= 2:
            assert not torch.equal(pa, pc), name


def test_time_budget_stops_cleanly() -> None:
    train_ex, held = split_games(_task(500, 3), 0.1, seed=0)
    _, result = train(_cfg(), train_ex, held, _settings(max_steps=10**6, time_budget_s=1.5), log=lambda s: None)
    assert result.stopped_by == "time budget"
    assert 1.5 <= result.train_time_s < 10
    assert 0 < result.steps < 10**6
    assert np.isfinite(result.heldout_accuracy)


def test_train_agreement_sample_size_is_a_setting() -> None:
    train_ex, held = split_games(_task(300, 4), 0.1, seed=0)
    _, skipped = train(_cfg(), train_ex, held, _settings(max_steps=5, train_eval_examples=0), log=lambda s: None)
    assert np.isnan(skipped.train_accuracy) and np.isfinite(skipped.heldout_accuracy)
    _, few = train(_cfg(), train_ex, held, _settings(max_steps=5, train_eval_examples=7), log=lambda s: None)
    assert abs(few.train_accuracy * 7 - round(few.train_accuracy * 7)) < 1e-9  # k of 7 decisions agree


def test_lr_schedule_warms_up_and_anneals() -> None:
    assert lr_factor(0.0, 0, 10) == pytest.approx(0.1)
    assert lr_factor(0.0, 9, 10) == pytest.approx(1.0)
    assert lr_factor(0.0, 10, 10) == pytest.approx(1.0)
    assert lr_factor(0.5, 500, 10) == pytest.approx(0.55)
    assert lr_factor(1.0, 1000, 10) == pytest.approx(0.1)
    values = [lr_factor(p, 100, 10) for p in np.linspace(0, 1, 11)]
    assert all(x >= y for x, y in itertools.pairwise(values))


def test_out_of_vocabulary_data_is_refused() -> None:
    ex = _task(100, 4)
    ex.ids[5, 2] = VOCAB + 3
    with pytest.raises(ConfigError, match="outside the model's vocabulary"):
        train(_cfg(), ex, ex.subset(np.zeros(len(ex), bool)), _settings(max_steps=2), log=lambda s: None)


def test_hf_folder_has_the_documented_files(tmp_path: Path) -> None:
    train_ex, held = split_games(_task(200, 5), 0.1, seed=0)
    model, result = train(_cfg(), train_ex, held, _settings(max_steps=3), log=lambda s: None)
    out = save_hf_folder(model, _cfg(), tmp_path / "m", TOKENIZER_PATH, training={"result": result})
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json",
                                                     "training.json"]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "lfm2" and cfg["num_labels"] == 8 and cfg["id2label"]["1"] == "hard_drop"
    assert ModelConfig.from_hf_dict(cfg).layer_types == _cfg().layer_types
    assert json.loads((out / "training.json").read_text())["result"]["steps"] == 3


def test_aux_target_loss_trains_its_head_and_leaves_the_export_alone() -> None:
    """Targets that are a fixed function of the prompt: with the auxiliary loss on, its head learns them (chance
    1/44), the action rule is still learnt, and the model keeps exactly the exported parameters."""
    ex = _task(2000, 4)
    rng = np.random.default_rng(4)
    last = ex.ids[np.arange(len(ex)), ex.lengths - 2]  # the token 2 before the end decides the placement
    ex.targets = np.stack([last % 4, (last // 4) % 11], axis=1).astype(np.int64)  # (N, 2) rot, x
    ex.targets[rng.random(len(ex)) < 0.05] = -1  # nothing reachable: ignored
    train_ex, held = split_games(ex, 0.1, seed=0)
    lines: list[str] = []
    model, result = train(_cfg(), train_ex, held, _settings(max_steps=300, log_every=50, aux_target_weight=1.0),
                          log=lines.append)
    assert result.aux_target_batch_accuracy > 0.5, result
    assert result.heldout_accuracy > 0.7, result
    assert any("auxiliary target loss" in line for line in lines) and any(" aux " in line for line in lines)
    plain, _ = train(_cfg(), train_ex, held, _settings(max_steps=5), log=lambda s: None)
    assert list(model.state_dict()) == list(plain.state_dict())  # the aux head never joins the model
    ex_no = _task(200, 5)
    notes: list[str] = []
    _, r = train(_cfg(), *split_games(ex_no, 0.1, seed=0), _settings(max_steps=3, aux_target_weight=1.0),
                 log=notes.append)
    assert any("records no expert targets" in n for n in notes) and np.isnan(r.aux_target_batch_accuracy)
    with pytest.raises(ConfigError, match="negative"):
        train(_cfg(), train_ex, held, _settings(max_steps=3, aux_target_weight=-1.0), log=lambda s: None)
