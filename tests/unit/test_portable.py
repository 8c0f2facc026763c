"""The portable choice: per shape and row range, the config with the best worst-case ratio to each device's own
best, on synthetic stored results from two fingerprints."""

from __future__ import annotations

import json

import pytest

from tilewise.cli import main
from tilewise.errors import ConfigError
from tilewise.tune.dispatch import DispatchTable
from tilewise.tune.portable import portable_choice
from tilewise.tune.store import Result, Store

FPS = ("webgpu:Vulkan:gpu-a:1:aaaa", "cuda:CUDA:gpu-b:2:bbbb")
MS = (1, 8, 64)


def _put(store, fp, m, config, ms):
    store.put(Result(fp, "gemm", "h", f"{m}x64x32", config, "ok", "", ms, ms, ms, ms, ms, 5))


def _synthetic(store, rng):
    """Random times where `A` is one device's best (`B` the other's) but awful on the other, and `P` is a little
    slower than the best on both: the portable choice must be P. Returns P's ratio per M and device."""
    truth = {}
    for m in MS:
        base = {fp: float(rng.uniform(0.5, 2.0)) for fp in FPS}
        slow = {"A": {FPS[0]: 1.0, FPS[1]: float(rng.uniform(3, 5))}, "B": {FPS[0]: float(rng.uniform(3, 5)),
                                                                           FPS[1]: 1.0},
                "P": {fp: float(rng.uniform(1.05, 1.3)) for fp in FPS}}
        for cfg, per in slow.items():
            for fp in FPS:
                _put(store, fp, m, f"C={cfg}", base[fp] * per[fp])
        truth[m] = dict(slow["P"])
    # measured on one device only: never chosen, but it is that device's own best, so P's ratio there grows
    scale = float(rng.uniform(0.8, 0.95))
    a_ms = next(r.median_ms for r in store.query(fingerprint=FPS[0], shape="8x64x32") if r.config == "C=A")
    _put(store, FPS[0], 8, "C=ONLYA", scale * a_ms)
    truth[8][FPS[0]] /= scale
    return truth


def test_best_worst_case_is_chosen_with_its_ratio_per_device(tmp_path, rng):
    store = Store(tmp_path / "r.sqlite")
    truth = _synthetic(store, rng)
    choice = portable_choice(store.query())
    (g,) = choice["groups"]
    assert g["devices"] == sorted(FPS) and g["measured_m"] == list(MS)
    (r,) = g["ranges"]
    assert r["config_key"] == "C=P" and r["m_min"] == 1 and r["m_max"] is None
    for fp in FPS:
        assert r["ratio"][fp] == pytest.approx(max(truth[m][fp] for m in MS))
    assert r["worst_ratio"] == pytest.approx(max(max(t.values()) for t in truth.values()))


def test_report_portable_writes_a_table_marked_portable(tmp_path, rng, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    store = Store(tmp_path / "r.sqlite")
    _synthetic(store, rng)
    store.close()
    out = tmp_path / "d.json"
    assert main(["report", "--portable", "--store", str(tmp_path / "r.sqlite"), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "C=P" in text and "d1" in text and "d2" in text
    assert all(len(line) <= 80 for line in text.splitlines() if not line.startswith("wrote "))
    data = json.loads(out.read_text())
    assert data["device"] == "portable" and sorted(data["portable"]["devices"]) == sorted(FPS)
    table = DispatchTable.from_json(data)
    assert table.pick("gemm:64x32", 8)[1] == {"C": "P"}


def test_portable_out_needs_portable_and_writes_nothing(tmp_path, rng, capsys):
    store = Store(tmp_path / "r.sqlite")
    _synthetic(store, rng)
    store.close()
    out = tmp_path / "d.json"
    assert main(["report", "--store", str(tmp_path / "r.sqlite"), "--out", str(out)]) == 2
    assert "apply to `tilewise report --portable`" in capsys.readouterr().err
    assert not out.exists()


def test_an_empty_store_has_no_portable_choice(tmp_path):
    with pytest.raises(ConfigError, match="no timed ok results"):
        portable_choice([])
