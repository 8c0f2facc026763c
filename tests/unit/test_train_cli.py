"""`tilewise train` end to end at toy scale, and its clear errors for bad datasets, tokenizers and checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tilewise.cli import main  # noqa: E402
from tilewise.errors import ConfigError  # noqa: E402
from tilewise.game.dataset import generate, write_dataset  # noqa: E402
from tilewise.game.tokenizer import TOKENIZER_PATH  # noqa: E402
from tilewise.train.export import convert_to_nf4, load_torch_model  # noqa: E402


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = generate(3, seed=5, max_pieces=4, workers=1)
    return write_dataset(data, tmp_path_factory.mktemp("data") / "toy.npz")


@pytest.fixture(scope="module")
def trained(dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, int]:
    root = tmp_path_factory.mktemp("run")
    out, nf4, res = root / "hf", root / "nf4", root / "results.json"
    rc = main(["train", "--data", str(dataset), "--out", str(out), "--shape", "tiny", "--steps", "3", "--batch", "4",
               "--device", "cpu", "--log-every", "1", "--eval-every-s", "0", "--nf4", str(nf4),
               "--results-json", str(res)])
    return out, nf4, res, rc


def test_train_writes_hf_folder_nf4_and_results(trained: tuple[Path, Path, Path, int],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    out, nf4, res, rc = trained
    assert rc == 0
    assert {p.name for p in out.iterdir()} == {"config.json", "model.safetensors", "tokenizer.json", "training.json"}
    assert {p.name for p in nf4.iterdir()} >= {"config.json", "model.safetensors", "tokenizer.json"}
    record = json.loads(res.read_text())
    assert record["result"]["steps"] == 3
    assert record["heldout_games"] >= 1 and record["train_decisions"] > 0
    assert record["parameters"] == sum(p.numel() for p in load_torch_model(out).parameters())
    # the NF4 folder is much smaller and still a working classifier
    assert (nf4 / "model.safetensors").stat().st_size < (out / "model.safetensors").stat().st_size / 3
    scores = load_torch_model(nf4)(torch.randint(0, 390, (1, 20)))
    assert scores.shape == (1, 8) and torch.isfinite(scores).all()


def test_dataset_of_another_format_version_is_refused(dataset: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    with np.load(dataset) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["version"] = np.array(99, dtype=np.int64)
    bad = tmp_path / "v99.npz"
    np.savez(bad, **arrays)
    rc = main(["train", "--data", str(bad), "--out", str(tmp_path / "m"), "--shape", "tiny", "--steps", "1"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "version 99" in err and "fix:" in err
    assert not (tmp_path / "m").exists()


def test_missing_dataset_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["train", "--data", str(tmp_path / "none.npz"), "--out", str(tmp_path / "m"), "--shape", "tiny"])
    assert rc == 2 and "does not exist" in capsys.readouterr().err


def _tokenizer_without(tmp_path: Path, special: str) -> Path:
    d = json.loads(TOKENIZER_PATH.read_text())
    for t in d["added_tokens"]:
        if t["content"] == special:
            t["content"] = "<|renamed|>"
    vocab = d["model"]["vocab"]
    vocab["<|renamed|>"] = vocab.pop(special)
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(d))
    return path


def test_tokenizer_lacking_a_special_token_is_refused(dataset: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    tok = _tokenizer_without(tmp_path, "<|im_end|>")
    rc = main(["train", "--data", str(dataset), "--out", str(tmp_path / "m"), "--tokenizer", str(tok),
               "--shape", "tiny", "--steps", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and "<|im_end|>" in err


def test_dataset_made_with_another_tokenizer_is_refused(dataset: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    d = json.loads(TOKENIZER_PATH.read_text())
    vocab = d["model"]["vocab"]
    a, b = sorted(k for k in vocab if vocab[k] > 300)[:2]  # swap two ids: same specials, other fingerprint
    vocab[a], vocab[b] = vocab[b], vocab[a]
    tok = tmp_path / "other.json"
    tok.write_text(json.dumps(d))
    rc = main(["train", "--data", str(dataset), "--out", str(tmp_path / "m"), "--tokenizer", str(tok),
               "--shape", "tiny", "--steps", "1"])
    assert rc == 2 and "another tokenizer" in capsys.readouterr().err


def test_corrupt_checkpoint_is_refused(trained: tuple[Path, Path, Path, int], tmp_path: Path) -> None:
    out = trained[0]
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("config.json", "tokenizer.json"):
        (broken / name).write_bytes((out / name).read_bytes())
    data = (out / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(data[: len(data) // 2])  # truncated
    with pytest.raises(ConfigError):
        convert_to_nf4(broken, tmp_path / "nf4")
    with pytest.raises(ConfigError):
        load_torch_model(broken)


def test_bad_shape_arguments_are_refused(dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["train", "--data", str(dataset), "--out", str(tmp_path / "m"), "--shape", "tiny", "--layers", "2",
               "--attn", "5"])
    assert rc == 2 and "attention layer index 5" in capsys.readouterr().err
    rc = main(["train", "--data", str(dataset), "--out", str(tmp_path / "m"), "--shape", "huge"])
    assert rc == 2 and "unknown model shape" in capsys.readouterr().err


def test_batched_play_matches_the_play_loop_on_the_runtime(trained: tuple[Path, Path, Path, int]) -> None:
    """`play_batched` (torch, games in lockstep) gives the games `tilewise game eval --policy model` plays."""
    from tilewise.game.play import ModelPolicy, evaluate_policy
    from tilewise.model.runtime import load
    from tilewise.train.evaluate import play_batched

    out = trained[0]
    policy = ModelPolicy(load(str(out), device="cpu", weights="f32"))
    ref = evaluate_policy(lambda s: policy, games=3, max_pieces=6, seed=11)
    ours = play_batched(load_torch_model(out), [11, 12, 13], max_pieces=6)
    assert ours["per_game"] == ref["per_game"]
    assert ours["mean_lines"] == ref["mean_lines"] and ours["mean_pieces"] == ref["mean_pieces"]
    assert ours["decisions"] == sum(r["steps"] for r in ref["per_game"]) > 0
