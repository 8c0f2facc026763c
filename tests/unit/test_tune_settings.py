"""The CUDA executor's whole-model settings: raced on whole decisions (a fake executor on a fake clock here, so the
verdicts are exact), kept in the dispatch table per model signature, dropped when the kernels they ran on change,
and taken by an executor only where its caller and TILEWISE_CUDA_PDL left them open."""

from __future__ import annotations

import dataclasses
import json
import time
from types import SimpleNamespace

import numpy as np
import pytest

from tilewise.errors import ConfigError
from tilewise.model import bench as model_bench
from tilewise.model.config import PRESETS
from tilewise.model.dispatch import CUDA_SETTINGS, model_settings, model_signature
from tilewise.model.tune_settings import choose, outputs_agree, race_settings
from tilewise.tune.dispatch import DispatchTable


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def perf_counter(self) -> float:
        return self.t


class FakeModel:
    """Decisions whose cost (ms, on the fake clock) depends on the executor's settings: `cost(pdl, fuse_preps,
    serial_reduce, fold_norm)` plus 1% noise; `differs` names a setting whose on side adds `delta` to one value of
    the output row."""

    def __init__(self, clock: FakeClock, cost, rng, has_pdl: bool = True, differs: str | None = None,
                 delta: float = 1e-3) -> None:
        self.clock, self.cost, self.rng, self.differs, self.delta = clock, cost, rng, differs, np.float32(delta)
        self.config = PRESETS["tiny"]
        self.executor = SimpleNamespace(pdl=False, fuse_preps=True, serial_reduce=False, fold_norm=False,
                                        fuse_rope=False, zero_copy=False, dev=SimpleNamespace(pdl=has_pdl))
        self.row = rng.standard_normal(8).astype(np.float32)

    def prefill(self, ids):
        ex = self.executor
        noise = 1 + 0.01 * self.rng.standard_normal()
        self.clock.t += self.cost(ex.pdl, ex.fuse_preps, ex.serial_reduce, ex.fold_norm) * noise / 1e3
        row = self.row.copy()
        if self.differs and getattr(ex, self.differs):
            row[int(self.rng.integers(0, 8))] += self.delta
        return SimpleNamespace(last_hidden=row)


@pytest.fixture
def clock(monkeypatch):
    c = FakeClock()
    monkeypatch.setattr(model_bench, "time", SimpleNamespace(perf_counter=c.perf_counter, time=time.time))
    return c


def test_choose_leaves_the_default_unless_the_race_was_decided_on_the_same_bits():
    for default in (True, False):
        for verdict in ("faster", "slower", "tie", "noisy"):
            for same in (True, False):
                got = choose(default, verdict, same)
                want = (verdict == "faster") if same and verdict in ("faster", "slower") else default
                assert got is want, (default, verdict, same)


@pytest.mark.parametrize("pdl_faster", [True, False])
def test_the_race_takes_the_faster_side_and_keeps_the_default_on_a_tie(clock, pdl_faster):
    rng = np.random.default_rng(int(pdl_faster))
    base = float(rng.uniform(0.2, 2.0))
    gain = float(rng.uniform(0.05, 0.2))  # PDL's share, one way or the other; fused prologues change nothing

    def cost(pdl: bool, fuse: bool, serial: bool, fold: bool) -> float:
        return base * (1 - gain if pdl == pdl_faster else 1.0)

    model = FakeModel(clock, cost, rng)
    raced = race_settings(model, seq=40, log=lambda _m: None)
    assert raced["pdl"]["value"] is pdl_faster
    assert raced["pdl"]["verdict"] == ("faster" if pdl_faster else "slower")
    for name in ("fuse_preps", "serial_reduce", "fold_norm", "fuse_rope", "zero_copy"):
        assert raced[name]["verdict"] == "tie" and raced[name]["value"] is CUDA_SETTINGS[name]
    assert all(r["outputs_agree"] and r["decisions"] == 60 for r in raced.values())
    assert (model.executor.pdl, model.executor.fuse_preps) == (pdl_faster, True)  # left with the choices


def test_each_race_runs_with_the_earlier_choice_applied(clock):
    rng = np.random.default_rng(7)

    def cost(pdl: bool, fuse: bool, serial: bool, fold: bool) -> float:  # fused prologues pay only with PDL on,
        # which wins its own race; serial reductions only where the prologues are not fused
        return 1.0 - 0.1 * pdl - 0.1 * (pdl and fuse) + 0.05 * (not pdl and fuse) - 0.1 * (serial and not fuse)

    model = FakeModel(clock, cost, rng)
    model.executor.fuse_preps = False  # whatever the executor held before, each race sets both sides itself
    raced = race_settings(model, seq=40, log=lambda _m: None)
    assert raced["pdl"]["value"] is True and raced["fuse_preps"]["value"] is True
    assert raced["fuse_preps"]["verdict"] == "faster"
    assert raced["serial_reduce"]["verdict"] == "tie" and raced["serial_reduce"]["value"] is False


def test_serial_reductions_are_taken_where_they_decide_faster(clock):
    rng = np.random.default_rng(5)
    gain = float(rng.uniform(0.04, 0.15))
    model = FakeModel(clock, lambda pdl, fuse, serial, fold: 1.0 - gain * serial, rng)
    raced = race_settings(model, seq=40, log=lambda _m: None)
    assert raced["serial_reduce"]["verdict"] == "faster" and raced["serial_reduce"]["value"] is True
    assert model.executor.serial_reduce is True


def test_a_setting_that_changes_the_output_keeps_its_default_however_fast(clock):
    rng = np.random.default_rng(3)
    model = FakeModel(clock, lambda pdl, fuse, serial, fold: 0.5 if pdl else 1.0, rng, differs="pdl")
    lines: list[str] = []
    raced = race_settings(model, seq=40, log=lines.append)
    assert raced["pdl"]["outputs_agree"] is False and raced["pdl"]["value"] is False
    assert raced["pdl"]["verdict"] == "faster"  # measured, but not taken
    assert any("pdl off" in line and "outputs differ" in line for line in lines)


@pytest.mark.parametrize("delta, taken", [(2e-3, True), (0.5, False)])
def test_the_norm_fold_is_taken_where_faster_and_within_the_f16_tolerance_only(clock, delta, taken):
    """fold_norm rounds differently, so its two sides may differ a little (the tolerance is 1e-2 of the largest
    magnitude, at least 1), but not by more; the exact settings still need the same bits."""
    rng = np.random.default_rng(11)
    gain = float(rng.uniform(0.04, 0.15))
    model = FakeModel(clock, lambda pdl, fuse, serial, fold: 1.0 - gain * fold, rng, differs="fold_norm",
                      delta=delta)
    lines: list[str] = []
    raced = race_settings(model, seq=40, log=lines.append)
    fold = raced["fold_norm"]
    assert fold["verdict"] == "faster" and fold["exact"] is False and fold["outputs_agree"] is taken
    assert fold["value"] is taken and model.executor.fold_norm is taken
    assert all(r["exact"] for name, r in raced.items() if name not in ("fold_norm", "fuse_rope"))
    assert raced["fuse_rope"]["exact"] is False


def test_outputs_agree_needs_the_same_bits_except_for_an_inexact_setting(rng):
    a = rng.standard_normal(64).astype(np.float32) * float(rng.uniform(0.5, 20))
    scale = max(1.0, float(np.abs(a).max()))
    near, far = a.copy(), a.copy()
    i = int(rng.integers(0, 64))
    near[i] += np.float32(0.5e-2 * scale)
    far[i] += np.float32(2e-2 * scale)
    assert outputs_agree("serial_reduce", a, a.copy()) and not outputs_agree("serial_reduce", near, a)
    assert outputs_agree("fold_norm", near, a) and not outputs_agree("fold_norm", far, a)
    bad = near.copy()
    bad[i] = np.nan
    assert not outputs_agree("fold_norm", bad, a) and not outputs_agree("fold_norm", a[:10], a)


def test_pdl_is_not_raced_on_a_gpu_without_it(clock):
    model = FakeModel(clock, lambda pdl, fuse, serial, fold: 1.0, np.random.default_rng(4), has_pdl=False)
    lines: list[str] = []
    raced = race_settings(model, seq=40, log=lines.append)
    assert set(raced) == set(CUDA_SETTINGS) - {"pdl"} and model.executor.pdl is False
    assert any("pdl not raced" in line for line in lines)


def record(values: dict, versions: dict) -> dict:
    return {"values": values, "versions": versions, "seq": 40, "raced": {}}


def test_settings_survive_the_table_file_and_are_kept_per_model(tmp_path):
    rng = np.random.default_rng(5)
    tiny, lfm = PRESETS["tiny"], PRESETS["lfm2-350m"]
    table = DispatchTable("cuda:fake", versions={"matmul": "a1", "attention": "b2"})
    picks = {name: {k: bool(rng.integers(0, 2)) for k in CUDA_SETTINGS} for name in ("tiny", "lfm2-350m")}
    table.settings[model_signature(tiny, "nf4")] = record(picks["tiny"], {"matmul": "a1"})
    table.settings[model_signature(lfm, "nf4")] = record(picks["lfm2-350m"], {"matmul": "a1", "attention": "b2"})
    loaded = DispatchTable.load(table.save(tmp_path / "t.json"))
    assert loaded.settings == table.settings
    assert model_settings(loaded, tiny, "nf4", environ={}) == picks["tiny"]
    assert model_settings(loaded, lfm, "nf4", environ={}) == picks["lfm2-350m"]
    assert model_settings(loaded, lfm, "f16", environ={}) == {}  # another weight format: another launch list


def test_a_malformed_settings_object_is_refused_with_the_fix(tmp_path):
    for bad in ([], {"m": {"values": {"pdl": True}}}, {"m": {"values": [], "versions": {}}}, {"m": 3},
                {"m": {"values": {"pdl": "yes"}, "versions": {}}}, {"m": {"values": {"pdl": 1}, "versions": {}}}):
        d = DispatchTable("cuda:fake").to_json()
        d["settings"] = bad
        path = tmp_path / "bad.json"
        path.write_text(json.dumps(d))
        with pytest.raises(ConfigError) as exc:
            DispatchTable.load(path)
        assert "settings" in exc.value.problem and "tilewise tune model" in exc.value.fix


def test_settings_raced_on_kernels_that_changed_since_are_dropped_with_a_note():
    tiny, lfm = PRESETS["tiny"], PRESETS["lfm2-350m"]
    table = DispatchTable("cuda:fake", versions={"matmul": "a1", "attention": "b2"})
    table.settings[model_signature(tiny, "nf4")] = record({"pdl": True}, {"matmul": "a1"})
    table.settings[model_signature(lfm, "nf4")] = record({"pdl": True}, {"matmul": "a1", "attention": "b2"})
    usable, notes = table.usable_on("cuda:fake", {"matmul": "a1", "attention": "c3"})
    assert list(usable.settings) == [model_signature(tiny, "nf4")]
    assert any("attention" in n and "lfm2" not in n and "settings" in n for n in notes)
    same, notes = table.usable_on("cuda:fake", {"matmul": "a1", "attention": "b2"})
    assert same.settings == table.settings and not notes
    other, _ = table.usable_on("cuda:other", {"matmul": "a1", "attention": "b2"})
    assert other.settings == {}  # another device's races say nothing about this one


def test_an_executor_takes_known_boolean_settings_and_leaves_pdl_to_its_caller_or_the_environment():
    tiny = PRESETS["tiny"]
    table = DispatchTable("cuda:fake")
    table.settings[model_signature(tiny, "nf4")] = record(
        {"pdl": True, "fuse_preps": False, "turbo": True, "graphs": "yes"}, {})  # as given in memory, not loaded
    assert model_settings(table, tiny, "nf4", environ={}) == {"pdl": True, "fuse_preps": False}
    assert model_settings(table, tiny, "nf4", pdl=False, environ={}) == {"fuse_preps": False}
    assert model_settings(table, tiny, "nf4", environ={"TILEWISE_CUDA_PDL": "0"}) == {"fuse_preps": False}
    assert model_settings(table, tiny, "nf4", environ={"TILEWISE_CUDA_PDL": " "}) == {"pdl": True,
                                                                                       "fuse_preps": False}


def test_the_signature_separates_models_whose_launch_lists_differ():
    tiny = PRESETS["tiny"]
    flipped = dataclasses.replace(tiny, layer_types=tuple(reversed(tiny.layer_types)))
    renamed = dataclasses.replace(tiny, name="another name")
    assert flipped.layer_types != tiny.layer_types
    sigs = {model_signature(c, f) for c in (tiny, flipped, PRESETS["lfm2-350m"]) for f in ("nf4", "f16")}
    assert len(sigs) == 6
    assert model_signature(renamed, "nf4") == model_signature(tiny, "nf4")  # shapes, not names


@pytest.mark.parametrize(("backend", "cluster", "partial", "raced"), [
    ("cuda", False, False, True), ("cuda", True, False, False), ("cuda", False, True, False),
    ("webgpu", False, False, False)])
def test_tune_model_races_the_settings_after_a_whole_local_cuda_tune_only(monkeypatch, backend, cluster, partial,
                                                                         raced):
    import argparse

    from tilewise.cli import tune_model as tune_model_cli
    from tilewise.model import tune as model_tune
    from tilewise.model import tune_settings
    from tilewise.tune.engine import Engine

    table = DispatchTable("x:fake")
    table.source = "table.json"
    table.partial = {"left": ["ffn.down"], "why": "--budget-s 1 s passed"} if partial else None
    calls = []
    monkeypatch.setattr(model_tune, "tune_model", lambda *a, **kw: table)
    monkeypatch.setattr(tune_settings, "tune_settings",
                        lambda *a, **kw: calls.append(a) or {"values": {"pdl": True, "fuse_preps": False}})
    dev = SimpleNamespace(info=SimpleNamespace(backend=backend, runtime=None, fingerprint="x:fake"))
    got = {}
    args = argparse.Namespace(json=None)
    make = Engine if not cluster else (lambda *a, **kw: None)
    assert tune_model_cli._run_one(args, PRESETS["tiny"], "tiny", 40, "nf4", dev, "device line", make,
                               lambda target, summary, note: got.update(summary)) == 0
    assert len(calls) == raced
    if raced:
        assert calls[0][5] is table and calls[0][6] == "table.json"  # the tuned table, saved where it was read
    assert got["settings"] == ({"pdl": True, "fuse_preps": False} if raced else None)
