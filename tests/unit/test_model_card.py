"""`tilewise.train.card` writes the numbers it is given: the run's, or a separately measured latency table."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np

from tilewise.train.card import card

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "bench" / "results" / "2026-11-30-h200-pair5-lr2e-3_results.json"
MODEL = ROOT / "src" / "tilewise" / "model" / "default"


def _latency(rng: np.random.Generator) -> dict:
    p20, p50, p80 = np.sort(rng.uniform(10, 90, 3)).round(2)
    return {"usable_cores": 2, "cpus": int(rng.integers(2, 64)), "blas_threads": "default",
            "rows": [{"shape": "default", "parameters": 6729600, "decision_ms_p20": float(p20),
                      "decision_ms_p50": float(p50), "decision_ms_p80": float(p80)}]}


def test_cpu_latency_table_replaces_the_runs_own():
    res = json.loads(RECORD.read_text())
    lat = _latency(np.random.default_rng(7))
    own = res["cpu_latency"]["rows"][0]
    text = card(res, MODEL, None, cpu_latency=lat)
    row = lat["rows"][0]
    assert f"| default | 6,729,600 | {row['decision_ms_p20']} | {row['decision_ms_p50']} | {row['decision_ms_p80']} |" \
        in text
    assert f"2 of the machine's {lat['cpus']} cores" in text
    assert f"| {own['decision_ms_p50']} |" not in text
    # without the option the run's own table is written
    assert f"| {own['decision_ms_p20']} | {own['decision_ms_p50']} |" in card(res, MODEL, None)


def test_extra_games_cut_by_the_time_budget_are_marked():
    res = json.loads(RECORD.read_text())
    cut = card(res, MODEL, None)
    assert res["model_play_extra"]["stopped_by_time"]
    assert f"mean {res['model_play_extra']['mean_lines']:.1f} lines" in cut
    assert "(stopped by the time budget)." in cut
    whole = copy.deepcopy(res)
    whole["model_play_extra"]["stopped_by_time"] = False
    assert "(stopped by the time budget)" not in card(whole, MODEL, None)


def test_play_quality_table_shows_its_command_and_numbers():
    res = json.loads(RECORD.read_text())
    rng = np.random.default_rng(11)
    lines, pieces = float(rng.uniform(50, 300)), float(rng.uniform(300, 900))
    pq = {"command": "python recipes/bundled_model/play_quality.py --games 64 --seed 300",
          "results": {"model": {"engine": "torch-cuda", "games": 64, "max_pieces": 1000, "mean_lines": lines,
                                "mean_pieces": pieces, "games_at_cap": 3}}}
    text = card(res, MODEL, pq)
    assert "Also played with `python recipes/bundled_model/play_quality.py --games 64 --seed 300`:" in text
    assert f"| model | torch-cuda | 64 | 1000 | {lines:.1f} | {pieces:.1f} | 3 |" in text
