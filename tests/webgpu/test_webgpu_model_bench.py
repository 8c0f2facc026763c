"""`tilewise bench` on lavapipe (tiny preset): the JSON carries every key the lead's tables read, the per-op
GPU times add up to the launches of a decision, and the scores agree with the CPU executor."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.webgpu


def test_bench_cli_writes_the_json_keys(webgpu_device, tmp_path):
    from tilewise.cli import main

    out = tmp_path / "b.json"
    rc = main(["bench", "--device", "webgpu", "--preset", "tiny", "--seq", "60", "--decisions", "3",
               "--json", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())
    for key in ("device", "preset", "seq", "weights", "decisions", "latency_ms_p50", "latency_ms_p90",
                "latency_ms_p99", "ops", "max_abs_score_diff"):
        assert key in res, key
    assert res["device"] == "webgpu" and res["preset"] == "tiny" and res["seq"] == 60 and res["weights"] == "nf4"
    assert res["latency_ms_p50"] <= res["latency_ms_p90"] <= res["latency_ms_p99"]
    assert {"embed", "head", "ffn.gate_up", "ffn.down"} <= {o["name"] for o in res["ops"]}
    assert all(o["ms"] > 0 and o["launches"] >= 1 for o in res["ops"])
    assert res["launches_per_decision"] == sum(o["launches"] for o in res["ops"])
    assert res["max_abs_score_diff"] < 1e-4
    assert res["prefix_cached"]["prefix_tokens"] == 47
    from tilewise.model.measured import load_decisions  # kept for auto's choice between WebGPU runtimes

    (kept,) = load_decisions(webgpu_device.info.fingerprint).values()
    assert kept["samples_ms"] == res["latency_samples_ms"]


def test_bench_refuses_bad_arguments(webgpu_device):
    from tilewise.cli import main

    assert main(["bench", "--preset", "tiny", "--seq", "1"]) != 0
    assert main(["bench", "--preset", "tiny", "--decisions", "0"]) != 0
