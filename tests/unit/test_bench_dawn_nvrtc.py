"""The GPU-free parts of the benchmarks: `bench/gemm_dawn.py`'s table with and without robustness and its refusal of
unknown shape names, the interleaved race the Dawn benchmarks share (`bench/bench_args.py`), and
`bench/nvrtc_parallel.py` compiling real SGEMM configs on threads and in processes (skips without libnvrtc)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tests.scripts import load_script

from tilewise.devices.cuda_nvrtc import find_nvrtc

ROOT = Path(__file__).resolve().parents[2]
gemm_dawn = load_script("bench/gemm_dawn.py")


def _race(rng, median_ms: float) -> dict:
    xs = list(median_ms * (1 + 0.01 * rng.standard_normal(20)))
    return {"median_ms": float(np.median(xs)), "tflops": 1.0, "samples_ms": xs}


def test_the_table_ranks_the_unchecked_best_against_the_checked_one():
    rng = np.random.default_rng(3)
    rows = [{"name": "square 4096", "shape": [4096, 4096, 4096],
             "race": {"dawn a": _race(rng, 1.8), "dawn b": _race(rng, 2.0), "unchecked a": _race(rng, 1.0),
                      "cuBLAS f16 (torch)": _race(rng, 0.2), "cuBLAS f32 (torch)": _race(rng, 2.7)}},
            {"name": "lfm2 w2", "shape": [346, 1024, 4608], "race": {"dawn a": _race(rng, 0.30)}}]
    lines = gemm_dawn.table(rows).splitlines()
    on = next(ln for ln in lines if ln.startswith("square 4096") and " on " in ln)
    off = next(ln for ln in lines if ln.startswith("square 4096") and " off " in ln)
    assert on.split()[-1] == "-"  # no ratio of the checked run to itself
    vs_checked, vs_f16 = float(off.split()[-1].rstrip("x")), float(off.split()[-3].rstrip("x"))
    assert abs(vs_checked - 1.8) < 0.05 and abs(vs_f16 - 0.2) < 0.01  # checked / unchecked; cuBLAS f16 / unchecked
    assert abs(float(on.split()[-3].rstrip("x")) - 0.2 / 1.8) < 0.01  # the checked row against cuBLAS f16
    assert not any(ln.startswith("lfm2 w2") and " off " in ln for ln in lines)  # no unchecked run, no row


def test_an_unknown_shape_name_is_refused_before_any_device_opens(tmp_path):
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "gemm_dawn.py"), "--out", str(tmp_path / "r.json"),
                          "--only", "square 4096,square 9999"], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(ROOT / "src")), cwd=ROOT)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "unknown shape names ['square 9999']" in res.stdout and "square 4096" in res.stdout
    assert not (tmp_path / "r.json").exists()


@pytest.mark.skipif(find_nvrtc() is None, reason="libnvrtc not found")
def test_nvrtc_parallel_compiles_every_config_in_every_mode(tmp_path):
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "nvrtc_parallel.py"), "--out", str(tmp_path),
                          "--configs", "2", "--serial", "1", "--workers", "2"], capture_output=True, text=True,
                         timeout=600, env=dict(os.environ, PYTHONPATH=str(ROOT / "src")), cwd=ROOT)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    rec = json.loads((tmp_path / "nvrtc_parallel.json").read_text())
    modes = [r["mode"] for r in rec["rows"]]
    assert any(m.startswith("serial") for m in modes) and any(m.startswith("nvrtc-processes") for m in modes)
    assert any(m.startswith("nvrtc-threads") for m in modes)
    assert all(r["per_s"] > 0 and r["kernels"] >= 1 for r in rec["rows"])
    assert rec["libs"] and all(v and v.split(".")[0].isdigit() for v in rec["libs"].values())


def test_the_shared_race_warms_every_timer_up_then_times_each_once_a_round_in_a_fresh_order():
    bench_args = load_script("bench/bench_args.py")
    calls: list[str] = []

    def timer(name: str, value: float):
        def ms() -> float:
            calls.append(name)
            return value + len(calls)  # each sample distinct: which call produced it shows
        return ms

    names = ["a", "b", "c", "d"]
    samples = bench_args.interleaved({n: timer(n, 10.0 * i) for i, n in enumerate(names)}, 12,
                                     np.random.default_rng(3))
    warm, rounds = calls[:8], [calls[8 + 4 * r: 12 + 4 * r] for r in range(12)]
    assert warm == [n for n in names for _ in range(2)]
    assert len(calls) == 8 + 4 * 12 and all(sorted(r) == names for r in rounds)
    assert len({tuple(r) for r in rounds}) > 1  # the order is drawn again each round
    for i, n in enumerate(names):  # a timer's samples are what it returned in the rounds, in order
        got = [10.0 * i + 9 + j for j, c in enumerate(calls[8:]) if c == n]
        assert samples[n] == got


def test_extra_configs_join_the_seeds_once_and_an_illegal_one_is_refused_with_its_reason(tmp_path):
    from types import SimpleNamespace

    from tilewise.devices.profiles import get_profile
    from tilewise.errors import ConfigError
    from tilewise.kernels.registry import get_template

    tpl = get_template("gemm-f16", "webgpu")
    dev = SimpleNamespace(info=SimpleNamespace(limits=get_profile("h200-dawn")))
    seeds = gemm_dawn.candidates(tpl, dev, 0, 0)
    new = tpl.default_config().replace(FRAG="16x8x16", SM=1, SN=4, FM=8, FN=4, KF=4, SA="workgroup",
                                       SB="workgroup", PAD=8, VS=1)
    assert new not in seeds
    text = f"{new.key()};{seeds[0].key()}"  # one new config, one seed again
    (tmp_path / "c.txt").write_text(text + "\n")
    for extra in (text, "@" + str(tmp_path / "c.txt")):
        got = gemm_dawn.candidates(tpl, dev, 0, 0, extra)
        assert got == [*seeds, new]
    bad = tpl.default_config().replace(FRAG="8x8x8")
    with pytest.raises(ConfigError, match="fragment 8x8x8 f16->f32 is not offered"):
        gemm_dawn.candidates(tpl, dev, 0, 0, bad.key())
