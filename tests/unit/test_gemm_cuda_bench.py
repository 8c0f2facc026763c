"""`bench/gemm_cuda.py` end to end without a GPU, run as a script (`python bench/gemm_cuda.py ...`) on a host
stand-in of the CUDA device that runs gemm.cu itself (host_gemm_cuda.py, put in place of `CUDADevice` by a
`sitecustomize` in the script's process), at tiny shapes, with one seed point broken to fail compiling and one to
write a wrong value. What the script reports (the seed table, the sweep, the finals and their ratios to cuBLAS,
raced as the template's peer) is what the evaluation engine stored in the run's results store."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from host_cuda import SM90

from tilewise.kernels.gemm.cuda import CudaGemm, name_expression
from tilewise.tune.store import Store

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gemm_cuda.py"
TPL = CudaGemm()
SEED = TPL.space("seed")
TUNE, OTHER = (70, 72, 40), (33, 136, 28)  # partial tiles in M, N and K for every config
COMPILE_FAILS = SEED.config(dict(zip(SEED.params, (128, 128, 8, 64, 64, 4, 8, 4, 128))))
WRONG = SEED.config(dict(zip(SEED.params, (64, 64, 16, 32, 32, 2, 4, 4, 128))))
BROKEN = {name_expression(COMPILE_FAILS): "compile", name_expression(WRONG): "wrong"}
SWEEP_COUNT, FINALISTS = 6, 2

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ (the host stand-in's compiler) not found")


def key(shape) -> str:
    return "x".join(map(str, shape))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One run of the script; (its gemm_cuda.json, its text log, its store's rows per shape key and config)."""
    tmp = tmp_path_factory.mktemp("gemm-cuda-bench")
    site = tmp / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        f"import host_gemm_cuda\n\nhost_gemm_cuda.install({str(tmp / 'build')!r}, {BROKEN!r})\n")
    path = [str(site), str(Path(__file__).parent), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    env.pop("CUPY_TF32", None)
    out = tmp / "out"
    res = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--tune-shape", ",".join(map(str, TUNE)),
                          "--shapes", ";".join(",".join(map(str, s)) for s in (TUNE, OTHER)), "--rounds", "2",
                          "--sweep-rounds", "1", "--sweep-count", str(SWEEP_COUNT), "--sweep-batch", "3",
                          "--finalists", str(FINALISTS), "--workers", "2", "--budget-s", "600"],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rep = json.loads((out / "gemm_cuda.json").read_text())
    with Store(out / "results.sqlite") as store:
        rows: dict[str, dict] = {}
        for r in store.query(fingerprint=rep["device"]["fingerprint"], kernel="gemm"):
            rows.setdefault(r.shape, {})[r.config] = r
    return rep, (out / "gemm_cuda.txt").read_text(), rows


def retimed_at_tune(rep) -> set[str]:
    """Configs timed again at the tuning shape after the seed table: by the sweep, and in the finals' race."""
    return {r["config"] for r in rep["sweep"]["ranked"]} | set(rep["finals"][0]["finalists"])


def test_the_run_is_on_the_host_stand_in(run):
    rep, text, _ = run
    assert rep["device"]["backend"] == "cuda" and rep["device"]["name"] == "host gemm.cu (g++)"
    assert set(rep) >= {"device", "host", "seed", "sweep", "finals", "seconds_total", "args"} and "error" not in rep
    assert rep["args"]["tune_shape"] == "70,72,40" and text.rstrip().endswith(" s")


def test_seed_table_is_the_engines_outcomes_raced_with_cublas(run):
    rep, text, stored = run
    seed, at = rep["seed"], stored[key(TUNE)]
    assert seed["shape"] == list(TUNE)
    rows = {r["config"]: r for r in seed["rows"]}
    assert len(rows) == 17 and rows["cuBLAS"]["median_ms"] > 0  # 16 points and the peer, raced together
    assert Counter(r["status"] for c, r in rows.items() if c != "cuBLAS") == {
        "ok": 12, "illegal": 2, "compile_error": 1, "wrong": 1}
    for c in SEED:
        row, db = rows[c.key()], at[c.key()]
        if row["status"] == "illegal":
            assert row["reasons"] == TPL.why_illegal(c, SM90, TUNE) and db.message == "; ".join(row["reasons"])
        assert db.status == row["status"]
    assert "refused by the test" in rows[COMPILE_FAILS.key()]["message"]
    assert rows[COMPILE_FAILS.key()]["message"] == at[COMPILE_FAILS.key()].message
    wrong = rows[WRONG.key()]
    assert wrong["message"].startswith("verified at 70x72x40: ") and "worst at (0, 0)" in wrong["message"]
    cub = rows["cuBLAS"]["median_ms"]
    ok = [r for r in seed["rows"] if r.get("status") == "ok"]
    assert [r["median_ms"] for r in ok] == sorted(r["median_ms"] for r in ok)
    for r in ok:
        assert r["pct_cublas"] == pytest.approx(100 * cub / r["median_ms"])
        assert r["message"].startswith("verified at 70x72x40: rel_err") and r["rel_err"] < 1e-5
    untouched = [r for r in ok if r["config"] not in retimed_at_tune(rep)]
    assert len(untouched) >= 8
    for r in untouched:  # the store holds the race's times
        db = at[r["config"]]
        assert (db.status, db.message, db.median_ms, db.samples) == ("ok", r["message"], r["median_ms"], 2)
    assert "cuBLAS sgemm (fp32, TF32 off)" in text and "illegal: warps_count" in text


def test_sweep_runs_through_tune_and_stores_every_config(run):
    rep, _, stored = run
    sw, at = rep["sweep"], stored[key(TUNE)]
    legal, illegal = TPL.space("full").split(SM90)
    assert (sw["grid"], sw["legal"], sw["illegal"]) == (TPL.space("full").size, len(legal), len(illegal))
    assert sw["tried"] == SWEEP_COUNT == sum(sw["status"].values())
    assert sw["measured"] == len(sw["ranked"]) == sw["status"].get("ok", 0) >= 1
    assert sw["compiled"] == SWEEP_COUNT - sw["status"].get("compile_error", 0)
    assert [r["median_ms"] for r in sw["ranked"]] == sorted(r["median_ms"] for r in sw["ranked"])
    for r in sw["ranked"]:
        db = at[r["config"]]
        assert db.status == "ok" and db.message == r["message"] and r["samples"] == 1
        if r["config"] not in rep["finals"][0]["finalists"]:
            assert db.median_ms == r["median_ms"]


def test_finals_race_the_picks_with_cublas_and_store_them(run):
    rep, text, stored = run
    finals = rep["finals"]
    assert [f["shape"] for f in finals] == [list(TUNE), list(OTHER)]
    sweep_best = rep["sweep"]["ranked"][0]["config"]
    assert list(finals[0]["finalists"]) == [r["config"] for r in rep["sweep"]["ranked"][:FINALISTS]]
    for f in finals:
        fin = f["finalists"]
        assert f["pick"] in fin and sweep_best in fin and len(fin) <= FINALISTS + 1
        assert f["median_ms"] == fin[f["pick"]]["median_ms"] == min(s["median_ms"] for s in fin.values())
        assert f["ratio"] == pytest.approx(f["cublas"]["median_ms"] / f["median_ms"])
        assert f["cublas"]["samples"] == fin[f["pick"]]["samples"] == 2  # one race: the same rounds
        assert f["ok"] and f["status"] == "ok" and f["rel_err"] < 1e-5
        assert f["message"].startswith(f"verified at {key(f['shape'])}: ")  # at the shape itself
        assert f["rel_vs_cublas"] < 1e-5 and f["cublas_rel_err"] < 1e-5
        assert WRONG.key() not in fin and COMPILE_FAILS.key() not in fin
        for c, s in fin.items():  # the race's times are what the store holds
            db = stored[key(f["shape"])][c]
            assert db.status == "ok" and db.median_ms == s["median_ms"]
        line = next(ln for ln in text.splitlines() if ln.startswith(key(f["shape"]) + " "))
        # two rounds are too few to rank: the ratio cell says so instead of printing a number
        assert f["vs_cublas"] == "noisy" and " noisy " in line and f"{f['ratio']:6.3f}" not in line
        assert f["describe"] in line
    # at the other shape every verified config was raced briefly first, through the engine
    verified = {r["config"] for r in rep["seed"]["rows"] if r.get("status") == "ok"}
    verified |= {r["config"] for r in rep["sweep"]["ranked"]}
    assert {c for c, r in stored[key(OTHER)].items() if r.status == "ok"} == verified
    assert "== finals: tuned best vs cuBLAS fp32 (TF32 off) ==" in text
