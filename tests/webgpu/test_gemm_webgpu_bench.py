"""`bench/gemm_webgpu.py` end to end at tiny shapes on the WebGPU adapter, run as a script: it tunes, races the
best configs at each benchmark shape, and what it reports (the tuned list, the per-shape picks and their
statistics, the status counts) is what the evaluation engine stored. Without torch+CUDA the cuBLAS columns say
n/a and the record says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tilewise.tune.store import Store

pytestmark = pytest.mark.webgpu

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gemm_webgpu.py"
KEYS = {"date", "device", "python", "argv", "tune_shape", "tune_seconds", "status_counts", "tuned", "table"}
ROW_KEYS = {"shape", "M", "N", "K", "wgsl_config", "wgsl_label", "wgsl_median_ms", "wgsl_ci95_ms", "wgsl_tflops",
            "tied_with", "cublas"}


def cuda_torch() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.skipif(cuda_torch(), reason="torch sees a CUDA GPU: the cuBLAS columns would be measured")
def test_bench_reports_what_the_engine_stored(webgpu_device, tmp_path):
    out, db = tmp_path / "gemm", tmp_path / "results.sqlite"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    res = subprocess.run([sys.executable, str(SCRIPT), "--budget-s", "1", "--no-prior", "--tune-shape", "64,64,64",
                          "--shapes", "64,64,64;40,64,32", "--shape-budget-s", "1", "--race", "3", "--store", str(db),
                          "--out", str(out)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    rec = json.loads(out.with_suffix(".json").read_text())
    assert set(rec) == KEYS and rec["tune_shape"] == [64, 64, 64] and "gemm" in rec["argv"]
    assert rec["device"]["fingerprint"] == webgpu_device.info.fingerprint
    store = Store(db)
    at = {s: {r.config: r for r in store.query(shape=s)} for s in ("64x64x64", "40x64x32")}

    # the tuning: seed 003's 16 points only (the budget leaves no random search), each stored once by the engine
    assert sum(rec["status_counts"].values()) == 16 == len(at["64x64x64"])
    assert Counter(r.status for r in at["64x64x64"].values()) == rec["status_counts"]
    tuned = rec["tuned"]
    assert len(tuned) == rec["status_counts"]["ok"] and [t["median_ms"] for t in tuned] == sorted(
        t["median_ms"] for t in tuned)
    for i, t in enumerate(tuned):
        row = at["64x64x64"][t["config"]]
        assert (row.status, row.message, row.rel_err) == ("ok", t["reason"], t["rel_err"])
        assert t["reason"].startswith("verified at 64x64x64: rel_err")
        if i >= 3:  # not among the --race 3 re-timed at 64^3: the stored times are the tuning's
            assert row.median_ms == t["median_ms"] and list((row.ci_lo_ms, row.ci_hi_ms)) == t["ci95_ms"]

    # the per-shape picks: raced through the engine, which stored the race's statistics
    table = rec["table"]
    assert [r["shape"] for r in table] == ["64x64x64 (M,K,N)", "40x32x64 (M,K,N)"]
    for r, key in zip(table, ("64x64x64", "40x64x32")):
        assert set(r) == ROW_KEYS and r["cublas"] is None
        row = at[key][r["wgsl_config"]]
        assert row.status == "ok" and row.message.startswith("verified at")
        assert row.median_ms == r["wgsl_median_ms"] and [row.ci_lo_ms, row.ci_hi_ms] == r["wgsl_ci95_ms"]
        assert r["wgsl_tflops"] == pytest.approx(2 * r["M"] * r["N"] * r["K"] / r["wgsl_median_ms"] / 1e9)
    assert {t["config"] for t in tuned[:3]} >= {table[0]["wgsl_config"]}  # at 64^3 the pick is a tuned finalist
    assert len(at["40x64x32"]) >= 16  # the seed space was tuned at the other shape too (--shape-budget-s)

    text = out.with_suffix(".txt").read_text()
    assert "shape M x K x N" in text and "WGSL/cuBLAS" in text
    picks = [ln for ln in text.splitlines() if ln.startswith(("64x64x64 ", "40x32x64 "))]
    assert len(picks) == 2 and all(" n/a " in ln for ln in picks)
    assert "cuBLAS was not measured" in text
