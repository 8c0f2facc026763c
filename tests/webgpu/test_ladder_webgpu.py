"""The three GPU ladders end to end on a real adapter at CI sizes: every rung verified and measured, verdicts and
speedups consistent, staging answers present, JSON and plot written."""

from __future__ import annotations

import json

import pytest

from tilewise.ladder import LADDERS, plot, run_ladder, write_json

pytestmark = pytest.mark.webgpu

FAST = {"warmup": 1, "min_rounds": 4, "max_rounds": 6, "budget_s": 1.0}


@pytest.mark.parametrize("primitive", ["conv1d-gpu", "gemm-gpu", "dwsep-conv2d-gpu"])
def test_gpu_ladder(webgpu_device, tmp_path, primitive):
    spec = LADDERS[primitive]
    res = run_ladder(primitive, webgpu_device, spec.small_shape, tune_count=3, tune_seconds=30, measure_kw=FAST,
                     tune_measure_kw={"min_rounds": 2, "max_rounds": 2, "budget_s": 0.5})
    names = [r.name for r in res.rungs]
    assert names[: len(spec.rungs)] == [r.name for r in spec.rungs] and names[-1] == "tuned best"
    for r in res.rungs:
        assert r.status == "ok", f"{r.name}: {r.reason}"
        assert r.rel_err is not None and r.rel_err < 1e-4
        assert r.stats is not None and r.stats.ci95_ms[0] <= r.stats.median_ms <= r.stats.ci95_ms[1]
    assert res.rungs[0].verdict == "baseline"
    base = res.rungs[0].stats
    for r in res.rungs[1:]:
        assert r.verdict in ("win", "tie", "loss", "regained", "noisy")
        if r.verdict == "win":  # a win is clear of the baseline, never tied with it or slower
            assert r.stats.ci95_ms[1] < base.ci95_ms[0]
    assert len(res.staging) >= len(spec.staging_pairs)
    for a in res.staging:
        assert a.winner in ("workgroup", "private", "tie") and a.factor >= 1.0
    path = tmp_path / "ladder.json"
    write_json(res, str(path))
    d = json.loads(path.read_text())
    assert d["device"] == webgpu_device.info.name and d["reference_ms"] > 0
    assert d["rungs"][0]["name"] == "baseline"
    pytest.importorskip("matplotlib")
    plot(res, str(tmp_path / "ladder.png"))
    assert (tmp_path / "ladder.png").stat().st_size > 1000
