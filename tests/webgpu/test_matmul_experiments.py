"""`experiments/matmul_tiles_webgpu.py` and `experiments/matmul_variants_webgpu.py` end to end on the tiny preset,
each run as a script (`python experiments/X.py ... --out DIR`): the fitted family is sampled, verified and timed
next to the tuner's usual candidates, the reported bests are the minima of the recorded times, and the variants
study times each value of a parameter on the record's fastest configs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tilewise.model import tune_seeds

pytestmark = pytest.mark.webgpu

ROOT = Path(__file__).resolve().parents[2]
TILES = ROOT / "experiments" / "matmul_tiles_webgpu.py"
VARIANTS = ROOT / "experiments" / "matmul_variants_webgpu.py"


def run(script: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=600)


def run_ok(script: Path, *args: str) -> subprocess.CompletedProcess:
    res = run(script, *args)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    return res


def tiles(out: Path, seq: int, ops: str, sample: int, *rows: int) -> dict:
    """One tiles run on the tiny preset (no random usual candidates); its tiles.json."""
    run_ok(TILES, "--preset", "tiny", "--seq", str(seq), "--sample", str(sample), "--tune-candidates", "0",
           "--ops", ops, *(["--rows", *map(str, rows)] if rows else []), "--out", str(out))
    return json.loads((out / "tiles.json").read_text())


def test_fitted_rows_split_the_decision(webgpu_device, tmp_path):
    rep = tiles(tmp_path, 346, "ffn.down", 1, 8)
    assert rep["fitted_rows"] == [64, 88, 120, 128, 176]
    assert rep["rows"] == [8]
    fam = rep["ops"]["ffn.down"]["family"]
    assert fam and all(any(f"BM={b}," in key for b in rep["fitted_rows"]) for key in fam)


def test_tiles_times_family_and_usual_candidates(webgpu_device, tmp_path):
    rep = tiles(tmp_path, 70, "ffn.down", 3)
    assert rep["rows"] == [23, 70] and list(rep["ops"]) == ["ffn.down"]
    assert rep["fitted_rows"] == sorted({tune_seeds.fitted_rows(70, j) for j in (2, 3, 4)} | {64, 128})
    op = rep["ops"]["ffn.down"]
    times = op["times_ms"]
    fam, usual = set(op["family"]), set(op["usual"])
    assert fam and usual and not fam & usual and fam | usual == set(times)
    assert len(fam) <= 3 * 2  # --sample per kernel (tiled and split-K)
    fitted = set(rep["fitted_rows"])
    for key in fam:
        assert any(f"BM={b}," in key for b in fitted)
        assert all(times[key][str(m)] > 0 for m in (23, 70))
    for m in ("23", "70"):
        best = op["best"][m]
        assert best["usual_ms"] == min(times[c][m] for c in usual)
        assert best["family_ms"] == min(times[c][m] for c in fam)
    md = (tmp_path / "tiles.md").read_text()
    assert md.count("| ffn.down |") == 2 and "usual/family" in md


def test_variants_time_each_value_on_the_records_fastest_configs(webgpu_device, tmp_path):
    tiles(tmp_path / "t", 40, "conv.out_proj", 2)
    record = str(tmp_path / "t" / "tiles.json")
    bad = run(VARIANTS, "--from", record, "--param", "UK", "--out", str(tmp_path / "bad"))
    assert bad.returncode != 0 and "NAME=V1,V2" in bad.stderr and not (tmp_path / "bad").exists()

    run_ok(VARIANTS, "--from", record, "--param", "UK=0,1", "--top", "2", "--out", str(tmp_path / "v"))
    rep = json.loads((tmp_path / "v" / "variants.json").read_text())
    assert (rep["param"], rep["values"]) == ("UK", [0, 1])  # numbers parsed as ints
    op = rep["ops"]["conv.out_proj"]
    times = op["times_ms"]
    base = [c for c in times if ",UK=0," in c]
    assert 1 <= len(base) <= 2 and all(c.replace(",UK=0,", ",UK=1,") in times for c in base)  # each both ways
    for m in rep["rows"]:
        assert op["best"][str(m)]["0"] == min(times[c][str(m)] for c in base)
        assert op["best"][str(m)]["1"] == min(times[c.replace(",UK=0,", ",UK=1,")][str(m)] for c in base)
    rows = [r for r in (tmp_path / "v" / "variants.md").read_text().splitlines() if r.startswith("| conv.out_proj")]
    assert len(rows) == len(base) * len(rep["rows"])
    for r in rows:
        t0, t1, ratio = (x.strip() for x in r.split("|")[4:7])
        # the table prints times to 4 decimals and the ratio of the unrounded times: allow the rounding of both
        a, b, q = float(t0), float(t1), float(ratio[:-1])
        assert abs(a / b - q) <= a / b * (0.5e-4 / a + 0.5e-4 / b) + 1e-3

    run_ok(VARIANTS, "--from", record, "--param", "CL=block,strided", "--top", "1", "--out", str(tmp_path / "cl"))
    rep = json.loads((tmp_path / "cl" / "variants.json").read_text())
    assert (rep["param"], rep["values"]) == ("CL", ["block", "strided"])  # words stay words
    assert "| CL=block ms | CL=strided ms |" in (tmp_path / "cl" / "variants.md").read_text()
