"""`bench/matmul_tiles_webgpu.py` end to end on the tiny preset: the fitted family is sampled, verified and timed
next to the tuner's usual candidates, and the reported bests are the minima of the recorded times."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tilewise.model import tune as model_tune

pytestmark = pytest.mark.webgpu

BENCH = Path(__file__).resolve().parents[2] / "bench" / "matmul_tiles_webgpu.py"


def _load(path: Path = BENCH):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_fitted_rows_split_the_decision(tmp_path):
    mod = _load()
    assert mod.fitted_rows(346) == [64, 88, 120, 128, 176]
    assert set(mod.fitted_rows(70)) == {model_tune.fitted_rows(70, j) for j in (2, 3, 4)} | {64, 128}


def test_bench_times_family_and_usual_candidates(webgpu_device, tmp_path):
    mod = _load()
    assert mod.main(["--preset", "tiny", "--seq", "70", "--sample", "3", "--tune-candidates", "0",
                     "--ops", "ffn.down", "--out", str(tmp_path)]) == 0
    rep = json.loads((tmp_path / "tiles.json").read_text())
    assert rep["rows"] == [23, 70] and list(rep["ops"]) == ["ffn.down"]
    op = rep["ops"]["ffn.down"]
    times = op["times_ms"]
    fam, usual = set(op["family"]), set(op["usual"])
    assert fam and usual and not fam & usual and fam | usual == set(times)
    assert len(fam) <= 3 * 2  # --sample per kernel (tiled and split-K)
    fitted = set(mod.fitted_rows(70))
    for key in fam:
        assert any(f"BM={b}," in key for b in fitted)
        assert all(times[key][str(m)] > 0 for m in (23, 70))
    for m in ("23", "70"):
        best = op["best"][m]
        assert best["usual_ms"] == min(times[c][m] for c in usual)
        assert best["family_ms"] == min(times[c][m] for c in fam)
    md = (tmp_path / "tiles.md").read_text()
    assert md.count("| ffn.down |") == 2 and "usual/family" in md


def test_variants_bench_times_each_value_on_the_records_fastest_configs(webgpu_device, tmp_path):
    tiles = _load()
    assert tiles.main(["--preset", "tiny", "--seq", "40", "--sample", "2", "--tune-candidates", "0",
                       "--ops", "conv.out_proj", "--out", str(tmp_path / "t")]) == 0
    var = _load(BENCH.with_name("matmul_variants_webgpu.py"))
    assert var.parse_param("UK=0,1") == ("UK", [0, 1])
    assert var.parse_param("CL=block,strided") == ("CL", ["block", "strided"])
    with pytest.raises(SystemExit, match="NAME=V1,V2"):
        var.parse_param("UK")
    assert var.main(["--from", str(tmp_path / "t" / "tiles.json"), "--param", "UK=0,1", "--top", "2",
                     "--out", str(tmp_path / "v")]) == 0
    rep = json.loads((tmp_path / "v" / "variants.json").read_text())
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
        assert ratio == f"{float(t0) / float(t1):.3f}x" or abs(float(t0) / float(t1) - float(ratio[:-1])) < 2e-3
