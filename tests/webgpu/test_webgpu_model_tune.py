"""`tilewise tune model` on lavapipe at tiny shapes: both kernels measured across rows, the fitted ranges cover
every row count, and the executor loads the table (and only a table for this device and these kernels)."""

from __future__ import annotations

import argparse
import itertools
import json
import warnings

import numpy as np
import pytest

import tilewise
from tilewise.cli import tune_model as tune_model_cli
from tilewise.model import tune as model_tune
from tilewise.model.config import preset
from tilewise.model.dispatch import dispatch_path, load_model_table, matmul_key
from tilewise.tune.dispatch import DispatchTable

pytestmark = pytest.mark.webgpu


def test_model_matmul_shapes_cover_every_projection():
    cfg = preset("lfm2-350m")
    shapes = model_tune.model_matmuls(cfg)
    assert shapes["ffn.gate_up"] == ("swiglu", 4608, 1024, True)  # ffn_norm fused in
    assert shapes["ffn.down"] == ("residual", 1024, 4608, False)
    assert shapes["attn.qkv"] == ("none", (16 + 2 * 8) * 64, 1024, True)
    assert shapes["conv.in_proj"] == ("none", 3072, 1024, True)


def test_tune_matmul_ranges_cover_all_rows(webgpu_device, tmp_path):
    from tilewise.tune.store import Store

    rows = [1, 3, 64]
    store = Store(tmp_path / "s.sqlite")
    entry, record = model_tune.tune_matmul(webgpu_device, "nf4", "residual", 64, 64, rows, 2, 0, print,
                                           hand_picked=False, store=store)
    segs = entry.ranges
    assert segs[0]["m_min"] == 1 and segs[-1]["m_max"] is None
    for a, b in itertools.pairwise(segs):
        assert b["m_min"] == a["m_max"] + 1
    assert {s["kernel"].split(".")[1] for s in segs} <= {"rows", "tiled", "splitk"}
    # every candidate's outcome at every row count is stored, and a second run resumes from the store
    stored = store.query(fingerprint=webgpu_device.info.fingerprint)
    assert {r.shape for r in stored} == {f"{m}x64x64" for m in rows}
    assert sum(r.status == "ok" for r in stored) == len(record["candidates"]) * len(rows)
    again, record2 = model_tune.tune_matmul(webgpu_device, "nf4", "residual", 64, 64, rows, 2, 0, print,
                                            hand_picked=False, store=store)
    assert again.ranges == entry.ranges and record2["best_ms"] == record["best_ms"]
    assert record2["seconds"]["compile"] == 0 and record2["seconds"]["measure"] == 0
    assert set(record["best_ms"]) == set(rows) and all(v > 0 for v in record["best_ms"].values())
    kinds = {c.split(",")[0] for c in record["candidates"]}
    assert kinds == {"kind=rows", "kind=tiled", "kind=splitk"}, "every kernel kind must be measured"
    # where the tuning time went: every stage ran, so every stage took time
    assert set(record["seconds"]) == {"compile", "verify", "inputs", "measure"}
    assert all(v > 0 for v in record["seconds"].values()), record["seconds"]


def test_climb_measures_neighbours_of_the_fastest_kernels_best_at_the_decisions_rows(webgpu_device, tmp_path):
    from tilewise.tune.search import neighbours
    from tilewise.tune.store import Store

    rows, seq = [1, 64, 70], 70
    store = Store(tmp_path / "s.sqlite")
    _, plain = model_tune.tune_matmul(webgpu_device, "nf4", "residual", 64, 64, rows, 2, 0, print,
                                      hand_picked=False, store=store, seq=seq)
    stored = {(r.config, r.shape) for r in store.query(fingerprint=webgpu_device.info.fingerprint)}
    _, record = model_tune.tune_matmul(webgpu_device, "nf4", "residual", 64, 64, rows, 2, 0, print,
                                       hand_picked=False, store=store, seq=seq, climb=5)
    climb = record["climb"]
    assert climb["from"] == plain["best"][seq].split(",", 1)[1] and 1 <= climb["measured"] <= 5
    assert climb["starts"][0] == climb["from"] and 1 <= len(climb["starts"]) <= 3  # the fastest and its ties
    assert climb["best_ms"] <= climb["from_ms"] and record["best_ms"][seq] <= plain["best_ms"][seq]
    # the climb's first configs are neighbours of its starts, measured at the decision's lengths (70 and 23 rows;
    # 23 is not among the rows, so at 70 only), verified and stored like the sweep's
    tpl = next(t for t in model_tune.matmul_templates(webgpu_device, "nf4", "residual", rows)
               if t.name == climb["kernel"])
    near = {c.key() for s in climb["starts"]
            for c in neighbours(tpl.space(), tpl.parse_config(s), webgpu_device.info.limits)}
    added = {(r.config, r.shape) for r in store.query(fingerprint=webgpu_device.info.fingerprint)} - stored
    new = {c for c, _ in added}
    assert {shape for _, shape in added} == {"70x64x64"}
    untried = near - {c for c, _ in stored}  # what the climbs measure first (five steps at most here)
    assert new and (new <= near if len(untried) >= 5 else bool(untried & new))


def test_run_writes_a_table_the_executor_uses(webgpu_device, tmp_path, monkeypatch, rng):
    monkeypatch.setenv("TILEWISE_DISPATCH_DIR", str(tmp_path))
    monkeypatch.setenv("TILEWISE_STORE", str(tmp_path / "s.sqlite"))
    args = argparse.Namespace(preset="tiny", seq=40, weights="nf4", device="webgpu", budget=1, seed=0, json=None,
                              rows=[1, 40], force=False, hand_picked=False)
    assert tune_model_cli.run(args) == 0
    path = dispatch_path(webgpu_device.info.fingerprint)
    table = load_model_table(webgpu_device.info.fingerprint, path)
    distinct = set(model_tune.model_matmuls(preset("tiny")).values())  # the two out_projs coincide
    assert {matmul_key("nf4", *m) for m in distinct} | {"attention:4x2x16", "shortconv:64x3"} == set(table.entries)
    assert len(distinct) == 5 and set(table.versions) == {"matmul", "attention", "shortconv"}
    # tiny ends in attention: its last block's one query has a tile of its own (the decision below runs it)
    assert [(r["m_min"], r["m_max"]) for r in table.entries["attention:4x2x16"].ranges] == [(1, 1), (2, None)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a matching table loads without any warning
        model = tilewise.load("tiny", device="webgpu", weights="nf4", seed=1)
    assert model.executor.dispatch.source == str(path)
    cpu = tilewise.load("tiny", device="cpu", weights="nf4", seed=1)
    ids = rng.integers(0, 512, 40)
    np.testing.assert_allclose(model.scores(model.prefill(ids)), cpu.scores(cpu.prefill(ids)), atol=2e-5)


def test_a_portable_table_of_real_tunes_serves_a_device_without_its_own(webgpu_device, tmp_path, monkeypatch, rng,
                                                                        capsys):
    """A real tune here, the same results under a second fingerprint with other times (another GPU of the backend),
    the portable choice over both installed, and this device's own table removed: the executor runs the portable
    table's choices (nothing left out as changed code) and its scores match the CPU's."""
    from tilewise.cli import main
    from tilewise.model.dispatch import portable_path
    from tilewise.tune.store import Store

    monkeypatch.setenv("TILEWISE_DISPATCH_DIR", str(tmp_path))
    monkeypatch.setenv("TILEWISE_STORE", str(tmp_path / "s.sqlite"))
    args = argparse.Namespace(preset="tiny", seq=8, weights="nf4", device="webgpu", budget=1, seed=0, json=None,
                              rows=[1], force=False, hand_picked=False)
    assert tune_model_cli.run(args) == 0
    fp = webgpu_device.info.fingerprint
    with Store(tmp_path / "s.sqlite") as store:
        rows = store.query(fingerprint=fp)
        other = "webgpu:Vulkan:another-gpu:1:0123456789"
        for r in rows:
            f = float(rng.uniform(0.5, 2.0))
            store.put(type(r)(**{**r.__dict__, "fingerprint": other, "median_ms": r.median_ms and r.median_ms * f,
                                 "p20_ms": r.p20_ms and r.p20_ms * f, "p80_ms": r.p80_ms and r.p80_ms * f,
                                 "ci_lo_ms": r.ci_lo_ms and r.ci_lo_ms * f, "ci_hi_ms": r.ci_hi_ms and r.ci_hi_ms * f}))
    capsys.readouterr()
    assert main(["report", "--portable", "--install", "--json", str(tmp_path / "choice.json")]) == 0
    choice = json.loads((tmp_path / "choice.json").read_text())
    assert choice["stale"] == 0 and choice["devices"] == sorted([fp, other])
    own = dispatch_path(fp)
    own_keys = set(load_model_table(fp, own).entries)
    own.unlink()
    portable = DispatchTable.load(portable_path("webgpu"))
    assert set(portable.entries) == own_keys  # every op the tune measured has a portable choice
    with pytest.warns(UserWarning, match="using the portable table .* chosen over 2 devices"):
        model = tilewise.load("tiny", device="webgpu", weights="nf4", seed=1)
    assert set(model.executor.dispatch.entries) == own_keys
    cpu = tilewise.load("tiny", device="cpu", weights="nf4", seed=1)
    ids = rng.integers(0, 512, 8)
    np.testing.assert_allclose(model.scores(model.prefill(ids)), cpu.scores(cpu.prefill(ids)), atol=2e-5)


def test_f16_arithmetic_competes_when_asked(webgpu_device):
    if "shader-f16" not in webgpu_device.enabled_features:
        pytest.skip("adapter has no shader-f16")
    _, record = model_tune.tune_matmul(webgpu_device, "nf4", "swiglu", 64, 64, [2, 40], 1, 0, print,
                                       hand_picked=False, f16_arith=True)
    from tilewise.kernels.matmul.webgpu import MatmulTemplate

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
    """Matmul candidates let `verify_reuse` checks share one input set; each check re-poisons the output, so a
    kernel that leaves rows unwritten fails even right after a correct kernel filled them on the same inputs."""
    from tilewise.devices.base import Launch
    from tilewise.kernels.matmul import webgpu as mm
    from tilewise.tune.verify import Verifier

    t = mm.MatmulTemplate("tiled", "nf4", "swiglu", webgpu_device.enabled_features, norm=True)
    assert t.verify_reuse > 1
    cfg = t.default_config()
    shape = (97, 64, 128)
    ver = Verifier(t, webgpu_device, shape, rng, reuse=t.verify_reuse)
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


def _tiny_args(tmp_path, **kw):
    base = {"preset": "tiny", "seq": 40, "weights": "nf4", "device": "webgpu", "budget": 2, "budget_s": None,
            "seed": 0, "json": None, "rows": [1, 40], "force": False, "hand_picked": False,
            "store": str(tmp_path / "s.sqlite")}
    return argparse.Namespace(**{**base, **kw})


def _rows(store, fp):
    return {(r.kernel, r.shape, r.config): (r.status, r.created) for r in store.query(fingerprint=fp)}


def test_progress_lines_per_shape_and_candidate(webgpu_device, tmp_path, capsys):
    from tilewise.cli import main

    out = tmp_path / "summary.json"
    assert main(["tune", "model", "--preset", "tiny", "--seq", "40", "--rows", "1,40", "--budget", "2",
                 "--no-hand-picked", "--device", "webgpu", "--store", str(tmp_path / "s.sqlite"),
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    # not a terminal: plain lines, one at the first candidate of every shape's row count
    for i, label in enumerate(("ffn.gate_up 128x64", "ffn.down 64x128"), 1):
        for m in (40, 1):
            assert f"matmul {i}/5 (nf4 {label}, rows 1..40) M={m}: candidate 1/" in text
    assert "attention (attention:4x2x16, 40 rows): candidate 1/2" in text
    assert "short conv (shortconv:64x3, 40 rows): candidate 1/2" in text
    summary = json.loads(out.read_text())
    assert summary["partial"] is None and len(summary["entries"]) == 7 and summary["model"] == "tiny"


def test_budget_s_stops_early_and_writes_a_partial_table(webgpu_device, tmp_path, capsys):
    from tilewise.tune.store import Store

    fp = webgpu_device.info.fingerprint
    args = _tiny_args(tmp_path, budget_s=1e-6)  # passed before the first candidate starts
    assert tune_model_cli.run(args) == 0
    text = capsys.readouterr().out
    table = DispatchTable.load(dispatch_path(fp))
    labels = [lab for lab in model_tune.model_matmuls(preset("tiny")) if lab != "attn.out_proj"]
    assert table.partial == {"left": [*labels, "attention", "conv"], "why": "--budget-s 1e-06 s passed"}
    assert table.entries == {} and "cut ffn.gate_up" in text and "partial" in text
    assert _rows(Store(args.store), fp) == {}  # no candidate was started
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a partial table loads like any other: the defaults serve what it lacks
        model = tilewise.load("tiny", device="webgpu", weights="nf4")
    assert model.executor.dispatch.entries == {}


def test_an_interrupt_keeps_what_was_measured_and_a_rerun_resumes(webgpu_device, tmp_path):
    from tilewise.tune.store import Store

    fp = webgpu_device.info.fingerprint
    store = Store(tmp_path / "s.sqlite")
    cfg = preset("tiny")
    kw = {"rows": [1, 40], "n_cand": 1, "budget": 2, "hand_picked": False, "store": store, "log": lambda _: None}
    seen = []

    def interrupt(text, done, total):
        seen.append(text)
        if text.startswith("matmul 2/5") and "M=1: candidate 2/" in text:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        model_tune.tune_model(webgpu_device, cfg, 40, progress=interrupt, **kw)
    first_key = matmul_key("nf4", "swiglu", 128, 64, True)
    table = DispatchTable.load(dispatch_path(fp))
    assert set(table.entries) == {first_key} and table.partial["why"] == "interrupted"
    assert table.partial["left"][0] == "ffn.down" and "attention" in table.partial["left"]
    before = _rows(store, fp)
    shapes = {s for _, s, _ in before}
    assert shapes == {"1x128x64", "40x128x64", "40x64x128"}  # shape 1 at both row counts, shape 2 at 40

    # a re-run measures only what is missing: every stored outcome is reused as it was
    seen.clear()
    done = model_tune.tune_model(webgpu_device, cfg, 40, progress=lambda *a: seen.append(a[0]), **kw)
    assert done.partial is None and DispatchTable.load(dispatch_path(fp)).partial is None
    assert len(done.entries) == 7 and not any(t.startswith("matmul 1/") and "gate_up" in t for t in seen)
    after = _rows(store, fp)
    assert {k: after[k] for k in before} == before and len(after) > len(before)
    # and once everything is measured, nothing new at all
    model_tune.tune_model(webgpu_device, cfg, 40, progress=lambda *a: pytest.fail("measured again"), **kw)
    assert _rows(store, fp) == after
