"""Ladder specs, verdicts, staging answers, the JSON schema (on the TVM CPU ladder) and CLI refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tilewise.devices.profiles import PROFILES
from tilewise.errors import ConfigError
from tilewise.ladder import LADDERS, get_ladder, get_ladder_device, run_ladder, staging_answer, verdict
from tilewise.tune.measure import summarize


@pytest.mark.parametrize("primitive", sorted(LADDERS))
def test_every_rung_is_legal_and_distinct_at_both_shapes(primitive):
    spec = get_ladder(primitive)
    tpl = spec.template()
    sp = tpl.space("full")
    limits = None if spec.device == "tvm-llvm" else PROFILES["webgpu-default"]
    configs = [spec.rung_config(sp, r) for r in spec.rungs]
    assert spec.rungs[0].name == "baseline"
    assert len(configs) - 1 >= 3, "the assignment asks for at least three optimizations per primitive"
    assert len(set(configs)) == len(configs), "two rungs run the same schedule"
    for shape in (spec.shape, spec.small_shape):
        for r, cfg in zip(spec.rungs, configs):
            assert sp.why_illegal(cfg, limits) == [], (r.name, cfg)
            assert tpl.shape_problems(cfg, shape) == [], (r.name, shape)


@pytest.mark.parametrize("primitive", [p for p in sorted(LADDERS) if LADDERS[p].staging_pairs])
def test_staging_pairs_differ_only_in_staging(primitive):
    spec = get_ladder(primitive)
    sp = spec.template().space("full")
    by_name = {r.name: spec.rung_config(sp, r) for r in spec.rungs}
    for wg_name, pv_name in spec.staging_pairs:
        wg, pv = by_name[wg_name], by_name[pv_name]
        assert spec.stage_of(wg) == "workgroup" and spec.stage_of(pv) == "private"
        assert spec.restage(wg, "private") == pv and spec.restage(pv, "workgroup") == wg


def _stats(center, spread, n=40, seed=0):
    r = np.random.default_rng(seed)
    return summarize(center + spread * r.standard_normal(n))


def test_verdicts_tie_win_loss():
    slow, fast = _stats(2.0, 0.01), _stats(1.0, 0.01, seed=1)
    assert verdict(slow, fast) == "win" and verdict(fast, slow) == "loss"
    same = _stats(2.0, 0.01, seed=2)
    assert verdict(slow, same) == "tie"
    assert verdict(slow, slow) == "tie"  # a schedule must tie with itself


def test_staging_answer_names_winner_and_factor():
    a = staging_answer("tile", _stats(0.131, 0.001), _stats(0.057, 0.001, seed=1))
    assert a.winner == "private" and a.factor == pytest.approx(0.131 / 0.057, rel=0.02)
    assert "private staging wins by 2.2" in a.sentence() and "[" in a.sentence()
    t = staging_answer("tile", _stats(1.0, 0.05), _stats(1.0, 0.05, seed=3))
    assert t.winner == "tie" and t.sentence().startswith("at tile: tie")


def test_bad_input_is_refused_with_the_fix():
    with pytest.raises(ConfigError, match="unknown ladder"):
        get_ladder("conv3d-gpu")
    with pytest.raises(ConfigError, match="runs on the tvm-llvm device"):
        get_ladder_device(get_ladder("conv1d-cpu"), "webgpu")
    with pytest.raises(ConfigError, match="WGSL templates only"):
        get_ladder_device(get_ladder("gemm-gpu"), "cuda")


def test_cpu_ladder_json_schema_and_refusals(tmp_path):
    pytest.importorskip("tvm")
    from tilewise.devices.tvm_llvm import TVMLLVMDevice

    dev = TVMLLVMDevice()
    with pytest.raises(ConfigError, match="longer than the input"):
        run_ladder("conv1d-cpu", dev, (8, 16), tune_count=0)
    res = run_ladder("conv1d-cpu", dev, (512, 16), tune_count=3, tune_seconds=20,
                     measure_kw={"warmup": 1, "min_rounds": 5, "max_rounds": 8, "budget_s": 1.0},
                     tune_measure_kw={"min_rounds": 3, "max_rounds": 3})
    from tilewise.ladder import write_json

    path = tmp_path / "ladder.json"
    write_json(res, str(path))
    d = json.loads(path.read_text())
    assert d["primitive"] == "conv1d-cpu" and d["shape"] == [512, 16] and d["reference_ms"] > 0
    names = [r["name"] for r in d["rungs"]]
    assert names[:5] == [r.name for r in LADDERS["conv1d-cpu"].rungs] and names[-1] == "tuned best"
    base = d["rungs"][0]
    assert base["verdict"] == "baseline" and base["speedup_vs_baseline"] == 1.0
    for r in d["rungs"][1:]:
        assert r["status"] == "ok" and r["rel_err"] < 1e-5
        assert r["verdict"] in ("win", "tie", "loss", "regained", "noisy")
        if r["verdict"] == "win":  # a win is clear of the baseline, never tied with it or slower
            assert r["ci95_ms"][1] < base["ci95_ms"][0]
        lo, hi = r["ci95_ms"]
        assert lo <= r["median_ms"] <= hi
        assert r["speedup_vs_baseline"] == pytest.approx(base["median_ms"] / r["median_ms"])
        assert r["speedup_vs_reference"] == pytest.approx(d["reference_ms"] / r["median_ms"])
    assert {"numpy.convolve"} <= {x["name"] for x in d["references"]}
    assert "baseline" in res.table() and "reference numpy.convolve" in res.table()


def test_cli_refuses_bad_shapes(capsys):
    from tilewise.cli import main

    rc = main(["ladder", "conv1d-gpu", "--shape", "4,9"])
    assert rc != 0
    err = capsys.readouterr().err
    assert "longer than the input length M=4" in err or "WebGPU" in err
    rc = main(["ladder", "dwsep-conv2d-gpu", "--shape", "1,2,3"])
    assert rc != 0 and "malformed shape" in capsys.readouterr().err


def test_rungs_a_shape_refuses_are_reported_with_the_numbers_and_skipped():
    pytest.importorskip("tvm")
    from tilewise.devices.tvm_llvm import TVMLLVMDevice

    res = run_ladder("conv1d-cpu", TVMLLVMDevice(), (300, 12), tune_count=0,
                     measure_kw={"warmup": 1, "min_rounds": 3, "max_rounds": 3, "budget_s": 0.5})
    base, *rest = res.rungs
    assert base.status == "ok" and base.verdict == "baseline"
    assert len(rest) == 4
    for r in rest:  # every later rung splits k by 8, which does not divide N = 12
        assert r.status == "illegal" and r.stats is None and r.verdict == ""
        assert r.reason == "reduction_split: N % KI = 12 % 8 = 4 != 0 (a predicated reduction loop)"
    assert "illegal: reduction_split" in res.table()
