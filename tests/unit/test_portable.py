"""The portable choice: per problem and row range, the kernel and config with the best worst-case ratio to each
device's own best, on synthetic stored results from two fingerprints of real kernels (their true source hashes),
and the model runtime's fallback to the table it writes."""

from __future__ import annotations

import json
import warnings

import pytest

from tilewise.cli import main
from tilewise.devices.profiles import get_profile
from tilewise.errors import ConfigError
from tilewise.kernels.gemm.cuda import CudaGemm
from tilewise.kernels.matmul.webgpu import MatmulTemplate
from tilewise.model.dispatch import load_model_table, portable_path
from tilewise.tune.dispatch import DispatchTable
from tilewise.tune.outcome import Item, item_source_hash
from tilewise.tune.portable import portable_choice, portable_table
from tilewise.tune.store import Result, Store

# two devices of one backend (wgpu-native and Dawn run the same WGSL), and a third no result was measured on
FPS = ("webgpu:Vulkan:gpu-a:1:aaaa", "webgpu+dawn-7:Vulkan:gpu-b:2:bbbb")
NEW_FP = "webgpu:Vulkan:gpu-c:3:cccc"
MS = (1, 8, 64)
N, K = 256, 128
KEY = f"nf4_matmul.none:{N}x{K}"


def _choices():
    """Three real (template, config) choices of one problem: the short-row kernel and two tiled configs."""
    rows, tiled = MatmulTemplate("rows", "nf4", "none"), MatmulTemplate("tiled", "nf4", "none")
    alt = tiled.default_config().replace(BM=32, BN=32, TM=2)
    return {"A": (rows, rows.default_config()), "B": (tiled, tiled.default_config()), "P": (tiled, alt)}


def _put(store, fp, tpl, cfg, shape, ms, source=None):
    src = source or item_source_hash(Item(tpl, cfg, shape))
    store.put(Result(fp, tpl.name, src, "x".join(map(str, shape)), cfg.key(), "ok", "", ms, ms, ms, ms, ms, 5))


def _synthetic(store, rng):
    """Random times where `A` is one device's best (`B` the other's) but awful on the other, and `P` a little
    slower than the best on both: the portable choice must be P. Returns P's ratio per M and device."""
    choices, truth = _choices(), {}
    for m in MS:
        base = {fp: float(rng.uniform(0.5, 2.0)) for fp in FPS}
        slow = {"A": {FPS[0]: 1.0, FPS[1]: float(rng.uniform(3, 5))},
                "B": {FPS[0]: float(rng.uniform(3, 5)), FPS[1]: 1.0},
                "P": {fp: float(rng.uniform(1.05, 1.3)) for fp in FPS}}
        for name, per in slow.items():
            tpl, cfg = choices[name]
            for fp in FPS:
                _put(store, fp, tpl, cfg, (m, N, K), base[fp] * per[fp])
        truth[m] = dict(slow["P"])
    # measured on one device only: never chosen, but it is that device's own best, so P's ratio there grows
    tpl, cfg = choices["B"]
    other = cfg.replace(BK=32)
    scale = float(rng.uniform(0.8, 0.95))
    a_ms = next(r.median_ms for r in store.query(fingerprint=FPS[0], shape=f"8x{N}x{K}")
                if r.config == choices["A"][1].key())
    _put(store, FPS[0], tpl, other, (8, N, K), scale * a_ms)
    truth[8][FPS[0]] /= scale
    return truth


def test_best_worst_case_is_chosen_across_kinds_with_its_ratio_per_device(tmp_path, rng):
    store = Store(tmp_path / "r.sqlite")
    truth = _synthetic(store, rng)
    choice = portable_choice(store.query())
    (g,) = choice["groups"]
    assert g["key"] == KEY and g["backend"] == "webgpu" and g["family"] == "matmul"
    assert g["devices"] == sorted(FPS) and g["measured_m"] == list(MS)
    (r,) = g["ranges"]
    tpl, cfg = _choices()["P"]
    assert (r["kernel"], r["config_key"], r["m_min"], r["m_max"]) == (tpl.name, cfg.key(), 1, None)
    assert r["config"] == dict(cfg)  # typed values (F16S False, not "False"): what the runtime's checks accept
    for fp in FPS:
        assert r["ratio"][fp] == pytest.approx(max(truth[m][fp] for m in MS))
    assert r["worst_ratio"] == pytest.approx(max(max(t.values()) for t in truth.values()))


def test_results_of_changed_code_are_left_out_and_counted(tmp_path, rng):
    store = Store(tmp_path / "r.sqlite")
    _synthetic(store, rng)
    tpl, cfg = _choices()["A"]
    for fp in FPS:  # far the fastest everywhere, but measured on a source this build does not generate
        for m in MS:
            _put(store, fp, tpl, cfg.replace(WG=128), (m, N, K), 1e-4, source="0123456789abcdef")
    choice = portable_choice(store.query())
    assert choice["stale"] == 2 * len(MS)
    assert choice["groups"][0]["ranges"][0]["config_key"] == _choices()["P"][1].key()


def test_devices_of_other_backends_never_share_a_choice(tmp_path, rng):
    store = Store(tmp_path / "r.sqlite")
    _synthetic(store, rng)
    gemm = CudaGemm()
    cfg = gemm.space("seed").legal(get_profile("sm_90"))[0]
    for m in MS:
        _put(store, "cuda:CUDA:gpu-d:4:dddd", gemm, cfg, (m, 64, 64), float(rng.uniform(0.5, 2)))
    choice = portable_choice(store.query())
    assert choice["backends"] == ["cuda", "webgpu"]
    by_backend = {g["backend"]: g for g in choice["groups"]}
    assert by_backend["cuda"]["devices"] == ["cuda:CUDA:gpu-d:4:dddd"] and by_backend["cuda"]["key"] == "gemm:64x64"
    assert by_backend["webgpu"]["devices"] == sorted(FPS)
    with pytest.raises(ConfigError, match="spans the backends cuda, webgpu"):
        portable_table(choice)
    assert list(portable_table(choice, "cuda")["entries"]) == ["gemm:64x64"]


def test_report_portable_writes_a_table_marked_portable(tmp_path, rng, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    store = Store(tmp_path / "r.sqlite")
    _synthetic(store, rng)
    store.close()
    out = tmp_path / "d.json"
    assert main(["report", "--portable", "--store", str(tmp_path / "r.sqlite"), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    tpl, cfg = _choices()["P"]
    assert KEY in text and "d1" in text and "d2" in text
    assert all(len(line) <= 80 for line in text.splitlines() if not line.startswith("wrote "))
    data = json.loads(out.read_text())
    assert data["device"] == "portable" and data["portable"] == {"backend": "webgpu", "devices": sorted(FPS)}
    table = DispatchTable.from_json(data)
    assert table.pick(KEY, 8) == (tpl.name, dict(cfg))


def test_a_device_without_a_table_runs_the_installed_portable_one(tmp_path, rng, capsys):
    store = Store(tmp_path / "r.sqlite")
    _synthetic(store, rng)
    store.close()
    assert main(["report", "--portable", "--store", str(tmp_path / "r.sqlite"), "--install"]) == 0
    assert str(portable_path("webgpu")) in capsys.readouterr().out
    with pytest.warns(UserWarning, match="using the portable table .* chosen over 2 devices"):
        table = load_model_table(NEW_FP, limits=get_profile("webgpu-default"))
    tpl, cfg = _choices()["P"]
    assert table.pick(KEY, 300) == (tpl.name, dict(cfg))
    # a CUDA device has no portable table here: the defaults, with the line saying how to tune
    with pytest.warns(UserWarning, match="no tuned dispatch table"):
        assert not load_model_table("cuda:CUDA:gpu-d:4:dddd", limits=get_profile("sm_90"), backend="cuda").entries
    # a device's own table wins over the portable one
    own = DispatchTable(NEW_FP)
    own.save(tmp_path / "own.json")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not load_model_table(NEW_FP, tmp_path / "own.json", limits=get_profile("webgpu-default")).entries


def test_a_portable_entry_breaking_this_devices_rules_runs_the_defaults(tmp_path, rng):
    store = Store(tmp_path / "r.sqlite")
    _synthetic(store, rng)
    table = portable_table(portable_choice(store.query()))
    table["entries"][KEY]["ranges"][0]["config"]["BM"] = 4096  # no device has such workgroup memory
    path = portable_path("webgpu")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(table))
    with pytest.warns(UserWarning) as caught:
        assert not load_model_table(NEW_FP, limits=get_profile("webgpu-default")).entries
    said = " ".join(str(w.message) for w in caught)
    assert "using the portable table" in said and f"entries breaking a kernel rule: {KEY} range 0" in said


def test_a_table_marked_portable_without_its_backend_is_refused():
    with pytest.raises(ConfigError, match="needs a \"portable\" object"):
        DispatchTable.from_json({"format": "tilewise-dispatch", "schema": 2, "device": "portable", "entries": {}})


def test_portable_out_needs_portable_and_writes_nothing(tmp_path, rng, capsys):
    store = Store(tmp_path / "r.sqlite")
    _synthetic(store, rng)
    store.close()
    out = tmp_path / "d.json"
    assert main(["report", "--store", str(tmp_path / "r.sqlite"), "--out", str(out)]) == 2
    assert "apply to `tilewise report --portable`" in capsys.readouterr().err
    assert not out.exists()
    assert main(["report", "--store", str(tmp_path / "r.sqlite"), "--install"]) == 2
    assert not portable_path("webgpu").exists()


def test_an_empty_store_has_no_portable_choice(tmp_path):
    with pytest.raises(ConfigError, match="no timed ok results"):
        portable_choice([])
