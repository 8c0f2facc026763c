"""`tilewise tune model` on lavapipe at tiny shapes: both kernels measured across rows, the fitted ranges cover
every row count, and the executor loads the table (and only a table for this device and these kernels)."""

from __future__ import annotations

import argparse
import itertools
import warnings

import numpy as np
import pytest

import tilewise
from tilewise import model_tune
from tilewise.model.config import preset
from tilewise.model.webgpu import DispatchTable, dispatch_path, kernel_version

pytestmark = pytest.mark.webgpu


def test_model_matmul_shapes_cover_every_projection():
    cfg = preset("lfm2-350m")
    shapes = model_tune.model_matmuls(cfg)
    assert shapes["ffn.gate_up"] == ("swiglu", 4608, 1024, True)  # ffn_norm fused in
    assert shapes["ffn.down"] == ("residual", 1024, 4608, False)
    assert shapes["attn.qkv"] == ("none", (16 + 2 * 8) * 64, 1024, True)
    assert shapes["conv.in_proj"] == ("none", 3072, 1024, True)


def test_tune_matmul_ranges_cover_all_rows(webgpu_device):
    rows = [1, 3, 64]
    segs, record = model_tune.tune_matmul(webgpu_device, "nf4", "residual", 64, 64, rows, 2, 0, print,
                                          hand_picked=False)
    assert segs[0]["min_rows"] == 1 and segs[-1]["max_rows"] is None
    for a, b in itertools.pairwise(segs):
        assert b["min_rows"] == a["max_rows"] + 1
    assert {s["kind"] for s in segs} <= {"rows", "tiled", "splitk"}
    assert set(record["best_ms"]) == set(rows) and all(v > 0 for v in record["best_ms"].values())
    kinds = {c.split(",")[0] for c in record["candidates"]}
    assert kinds == {"kind=rows", "kind=tiled", "kind=splitk"}, "every kernel kind must be measured"
    # where the tuning time went: every stage ran, so every stage took time
    assert set(record["seconds"]) == {"compile", "verify", "inputs", "measure"}
    assert all(v > 0 for v in record["seconds"].values()), record["seconds"]


def test_run_writes_a_table_the_executor_uses(webgpu_device, tmp_path, monkeypatch, rng):
    monkeypatch.setenv("TILEWISE_DISPATCH_DIR", str(tmp_path))
    args = argparse.Namespace(preset="tiny", seq=40, weights="nf4", device="webgpu", budget=1, seed=0, json=None,
                              rows=[1, 40], force=False, hand_picked=False)
    assert model_tune.run(args) == 0
    path = dispatch_path(webgpu_device.info.fingerprint)
    table = DispatchTable.load_for(webgpu_device.info.fingerprint, path)
    distinct = set(model_tune.model_matmuls(preset("tiny")).values())  # the two out_projs coincide
    assert table.version == kernel_version() and len(table.matmul) == len(distinct) == 5
    assert "attention" in table.ops
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a matching table loads without any warning
        model = tilewise.load("tiny", device="webgpu", weights="nf4", seed=1)
    assert model.executor.dispatch.source == str(path)
    cpu = tilewise.load("tiny", device="cpu", weights="nf4", seed=1)
    ids = rng.integers(0, 512, 40)
    np.testing.assert_allclose(model.scores(model.prefill(ids)), cpu.scores(cpu.prefill(ids)), atol=2e-5)


def test_f16_arithmetic_competes_when_asked(webgpu_device):
    if "shader-f16" not in webgpu_device.enabled_features:
        pytest.skip("adapter has no shader-f16")
    _, record = model_tune.tune_matmul(webgpu_device, "nf4", "swiglu", 64, 64, [2, 40], 1, 0, print,
                                       hand_picked=False, f16_arith=True)
    from tilewise.kernels.matmul import MatmulTemplate

    t = MatmulTemplate("tiled", "nf4", "swiglu", webgpu_device.enabled_features, True, True)
    assert all(c["F16A"] for c in model_tune.candidates(t, webgpu_device.info.limits, 2, 0))  # seeds included
    assert any("F16A=True" in c for c in record["candidates"])
    _, record = model_tune.tune_matmul(webgpu_device, "nf4", "residual", 64, 256, [2, 64], 1, 0, print,
                                       hand_picked=False, f16_arith=True)
    kinds_f16a = {c.split(",")[0] for c in record["candidates"] if "F16A=True" in c}
    assert kinds_f16a == {"kind=tiled", "kind=splitk"}, "f16 FMAs compete in both many-row kernels"
    t = MatmulTemplate("splitk", "nf4", "residual", webgpu_device.enabled_features, True, True)
    assert all(c["F16A"] and c["F16S"] for c in model_tune.candidates(t, webgpu_device.info.limits, 2, 0))
    assert not any("F16A" in c for c in model_tune.tune_matmul(
        webgpu_device, "nf4", "swiglu", 64, 64, [2], 1, 0, print, hand_picked=False)[1]["candidates"])


def test_candidates_sharing_inputs_are_still_checked_value_by_value(webgpu_device, rng):
    """Model tuning lets VERIFY_REUSE checks share one input set; each check re-poisons the output, so a kernel
    that leaves rows unwritten fails even right after a correct kernel filled them on the same inputs."""
    from tilewise.devices.base import Launch
    from tilewise.kernels import matmul as mm
    from tilewise.tune.verify import Verifier

    assert model_tune.VERIFY_REUSE > 1
    t = mm.MatmulTemplate("tiled", "nf4", "swiglu", webgpu_device.enabled_features, norm=True)
    cfg = t.default_config()
    shape = (97, 64, 128)
    ver = Verifier(t, webgpu_device, shape, rng, reuse=model_tune.VERIFY_REUSE)
    prog = t.compile(webgpu_device, cfg, shape)
    assert ver.check(prog, cfg).ok
    host_before = ver.buffers()["x"]

    class HalfGrid(mm.MatmulTemplate):  # the same kernel launched over the first row tile only
        def launches(self, program, bufs, config, shape):
            (full,) = super().launches(program, bufs, config, shape)
            return [Launch(full.program, (full.grid[0], 1, 1), full.buffers)]

    ver.template = HalfGrid("tiled", "nf4", "swiglu", webgpu_device.enabled_features, norm=True)
    bad = ver.check(prog, cfg)
    assert ver.buffers()["x"] is host_before  # the same inputs: the second check shared them
    assert not bad.ok
