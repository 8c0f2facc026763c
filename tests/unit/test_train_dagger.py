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
