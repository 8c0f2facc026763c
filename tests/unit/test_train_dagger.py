"""DAgger training: `tilewise train --init` resumes exactly the saved weights; several data files; the torch policy."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tilewise.game.dataset import generate, write_dataset  # noqa: E402
from tilewise.game.tokenizer import load_tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from tilewise.cli import main

    root = tmp_path_factory.mktemp("dagger")
    data = write_dataset(generate(3, seed=5, max_pieces=4, workers=1), root / "expert.npz")
    rc = main(["train", "--data", str(data), "--out", str(root / "hf"), "--shape", "tiny", "--steps", "3",
               "--batch", "4", "--device", "cpu", "--eval-every-s", "0"])
    assert rc == 0
    return root / "hf", data


def _tensors(folder: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(folder / "model.safetensors"))


def test_init_starts_from_exactly_the_saved_weights(tiny_model: tuple[Path, Path]) -> None:
    from tilewise.train.export import load_torch_model
    from tilewise.train.shapes import model_config
    from tilewise.train.trainer import TrainSettings, initial_model

    hf, _ = tiny_model
    saved = load_torch_model(hf)
    cfg = model_config(load_tokenizer(), "tiny")
    start = initial_model(cfg, TrainSettings(init=str(hf), seed=123))
    fresh = initial_model(cfg, TrainSettings(seed=123))
    ids = torch.randint(4, 390, (3, 40))
    lengths = torch.tensor([40, 31, 12])
    with torch.no_grad():
        assert torch.equal(start.eval()(ids, lengths), saved(ids, lengths))  # same scores before any step
        assert not torch.equal(fresh.eval()(ids, lengths), saved(ids, lengths))


def test_cli_init_with_zero_lr_writes_back_the_same_weights(tiny_model: tuple[Path, Path], tmp_path: Path) -> None:
    from tilewise.cli import main

    hf, data = tiny_model
    res = tmp_path / "r.json"
    # no --shape: the --init folder's shape is used; lr 0 leaves every weight as it was
    rc = main(["train", "--data", str(data), "--out", str(tmp_path / "again"), "--init", str(hf), "--steps", "2",
               "--batch", "4", "--lr", "0", "--device", "cpu", "--eval-every-s", "0", "--results-json", str(res)])
    assert rc == 0
    before, after = _tensors(hf), _tensors(tmp_path / "again")
    assert before.keys() == after.keys()
    for k in before:
        np.testing.assert_array_equal(before[k], after[k], err_msg=k)
    record = json.loads(res.read_text())
    assert record["settings"]["init"] == str(hf)
    assert json.loads((tmp_path / "again" / "config.json").read_text()) == json.loads((hf / "config.json").read_text())


def test_cli_init_refuses_another_shape(tiny_model: tuple[Path, Path], tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    from tilewise.cli import main

    hf, data = tiny_model
    rc = main(["train", "--data", str(data), "--out", str(tmp_path / "m"), "--init", str(hf), "--shape", "small",
               "--steps", "1", "--device", "cpu"])
    assert rc == 2 and "--init" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


def test_cli_trains_on_several_files_and_reports_each(tiny_model: tuple[Path, Path], tmp_path: Path) -> None:
    from tilewise.cli import main
    from tilewise.train.dagger import collect_round

    hf, data = tiny_model
    on = collect_round(hf, games=20, seed=77, max_pieces=2, device="cpu", workers=1)
    assert on.meta["policy"] == "hf" and on.meta["collector"]["positions"] == len(on) > 0
    on_path = write_dataset(on, tmp_path / "round1.npz")
    res = tmp_path / "r.json"
    rc = main(["train", "--data", str(data), str(on_path), "--out", str(tmp_path / "r1"), "--init", str(hf),
               "--steps", "2", "--batch", "4", "--device", "cpu", "--eval-every-s", "0", "--results-json", str(res)])
    assert rc == 0
    record = json.loads(res.read_text())
    assert record["data"] == [str(data), str(on_path)]
    parts = record["result"]["heldout_by_data"]
    assert [p["part"] for p in parts] == [0, 1]
    assert sum(p["examples"] for p in parts) == record["heldout_decisions"] == record["result"]["heldout_examples"]


def test_torch_policy_is_the_argmax_of_the_scores(tiny_model: tuple[Path, Path]) -> None:
    from tilewise.train.dagger import torch_policy
    from tilewise.train.export import load_torch_model

    model = load_torch_model(tiny_model[0])
    tokens = np.random.default_rng(0).integers(4, 390, (5, 30)).astype(np.uint16)
    lengths = np.array([30, 29, 10, 5, 30])
    acts = torch_policy(model, "cpu", max_batch=2)(tokens, lengths)
    with torch.no_grad():
        ref = model(torch.from_numpy(tokens.astype(np.int64)), torch.from_numpy(lengths))[:, :6].argmax(-1)
    np.testing.assert_array_equal(acts, ref.numpy())


def test_data_repeat_oversamples_a_files_decisions(tiny_model: tuple[Path, Path], tmp_path: Path) -> None:
    from tilewise.cli import main

    hf, data = tiny_model
    res = tmp_path / "r.json"
    rc = main(["train", "--data", str(data), str(data), "--data-repeat", "1", "3", "--out", str(tmp_path / "m"),
               "--init", str(hf), "--epochs", "1", "--batch", "4", "--device", "cpu", "--eval-every-s", "0",
               "--results-json", str(res)])
    assert rc == 0
    record = json.loads(res.read_text())
    a, b = record["data_train_decisions"]
    assert record["result"]["steps"] == (a + 3 * b) // 4  # one epoch holds the second file three times
    rc = main(["train", "--data", str(data), "--data-repeat", "1", "2", "--out", str(tmp_path / "x"),
               "--init", str(hf), "--steps", "1", "--device", "cpu"])
    assert rc == 2


def test_repeats_sample_only_the_repeated_decisions() -> None:
    from tilewise.model.config import ModelConfig
    from tilewise.train.data import from_records
    from tilewise.train.trainer import TrainSettings, train

    cfg = ModelConfig(vocab_size=40, hidden_size=32, intermediate_size=64, layer_types=("conv", "full_attention"),
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16, block_auto_adjust_ff_dim=False,
                      max_position_embeddings=64)
    rng = np.random.default_rng(0)
    ex = from_records([rng.integers(4, 40, 10) for _ in range(40)], [1] * 20 + [4] * 20, np.arange(40) // 4,
                      np.arange(40) % 4, pad_id=0, vocab_size=40)
    # only the first 20 decisions (all labelled 1) are ever sampled: the model learns to answer 1 everywhere
    _, result = train(cfg, ex, ex.subset(np.arange(40) >= 20), TrainSettings(max_steps=60, epochs=100, batch_size=8,
                      lr=3e-3, warmup_steps=5, device="cpu", eval_every_s=0, log_every=100),
                      log=lambda s: None, repeats=np.array([1] * 20 + [0] * 20))
    assert result.heldout_accuracy == 0.0  # held-out games are all label 4
