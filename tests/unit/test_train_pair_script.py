"""recipes/bundled_model/train_h200_pair.sh refuses what it cannot do with a message that says what to do instead."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "recipes" / "bundled_model" / "train_h200_pair.sh"


def _run(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHON=sys.executable)
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=120)


def test_wrong_argument_count_prints_usage(tmp_path):
    res = _run(str(tmp_path / "out"), "--seed 1", tmp_path=tmp_path)
    assert res.returncode == 2
    assert "usage: recipes/bundled_model/train_h200_pair.sh OUT_DIR" in res.stderr


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="this machine has two GPUs: the pair would run")
def test_fewer_than_two_gpus_is_refused_before_any_work(tmp_path):
    out = tmp_path / "out"
    res = _run(str(out), "--seed 1", "--seed 2", tmp_path=tmp_path)
    assert res.returncode == 2
    assert "a pair needs 2" in res.stderr and "recipes/bundled_model/train_h200.sh once per setting" in res.stderr
    assert not out.exists(), "nothing is written when the pair cannot run"
