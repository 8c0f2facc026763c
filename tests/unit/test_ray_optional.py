"""Ray stays optional: nothing imports it without --ray, a missing Ray is one clear error, and the store's
`worker` column is added to old stores without losing a row."""

from __future__ import annotations

import argparse
import json
import sqlite3
import subprocess
import sys

import pytest

from tilewise.cli import main
from tilewise.errors import ConfigError, DeviceUnavailable
from tilewise.tune.cluster import check_ray
from tilewise.tune.store import Result, Store


def test_cli_and_a_plain_tune_never_import_ray(tmp_path):
    code = ("import sys, tilewise.cli\n"
            "assert 'ray' not in sys.modules, 'import tilewise.cli loaded ray'\n"
            "from tilewise.kernels.registry import get_template\n"
            "from tilewise.devices import get_device\n"
            "from tilewise.tune.tuner import tune\n"
            "from tilewise.tune.store import Store\n"
            "try:\n    dev = get_device('webgpu')\nexcept Exception:\n    dev = None\n"
            "if dev is not None:\n"
            "    r = tune(get_template('gemm', 'webgpu'), dev, (33, 36, 20), store=Store(sys.argv[1]), budget=None,\n"
            "             measure_kw={'min_rounds': 2, 'max_rounds': 2, 'warmup': 1}, final_race=0,\n"
            "             configs=list(get_template('gemm', 'webgpu').space('seed'))[:2])\n"
            "print('ray' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "r.sqlite")], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_missing_ray_is_one_error_with_the_install_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    store = tmp_path / "r.sqlite"
    with pytest.raises(DeviceUnavailable, match="needs Ray") as exc:
        check_ray(argparse.Namespace(ray="local", workers=None))
    assert "pip install 'tilewise[ray]'" in exc.value.fix and "scripts/run extras ray" in exc.value.fix
    for argv in (["tune", "gemm", "--shape", "33,36,20"], ["sweep", "gemm", "--m", "1,2", "--n", "8", "--k", "8"],
                 ["tune", "model", "--preset", "tiny"]):
        assert main([*argv, "--ray", "--store", str(store)]) == 2
        err = capsys.readouterr().err
        assert "needs Ray" in err and "tilewise[ray]" in err
    assert not store.exists()  # refused before a store or device was opened


def test_workers_without_ray_is_refused(tmp_path, capsys):
    store = tmp_path / "r.sqlite"
    assert main(["sweep", "gemm", "--m", "1,2", "--n", "8", "--k", "8", "--workers", "2", "--store", str(store)]) == 2
    assert "--workers applies only with --ray" in capsys.readouterr().err
    assert not store.exists()


def _old_store(path, rows):
    """A store as written before the worker column existed."""
    db = sqlite3.connect(path)
    cols = [c for c in Result.__dataclass_fields__ if c != "worker"]
    db.execute(f"CREATE TABLE results ({', '.join(cols)}, PRIMARY KEY (fingerprint, kernel, source_hash, shape, "
               "config))")
    db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
    db.execute("INSERT INTO meta VALUES ('schema', '1')")
    for r in rows:
        db.execute(f"INSERT INTO results VALUES ({', '.join('?' * len(cols))})", [getattr(r, c) for c in cols])
    db.commit()
    db.close()


def test_an_old_store_reads_and_gains_the_worker_column(tmp_path, rng):
    rows = [Result("fp", "gemm", "h", "8x8x8", f"BM={int(b)}", "ok", "", float(t), float(t) * 0.9, float(t) * 1.1,
                   float(t) * 0.95, float(t) * 1.05, 10, created=1.0 + i)
            for i, (b, t) in enumerate(zip(rng.integers(1, 999, 5), rng.uniform(0.1, 5.0, 5)))]
    path = tmp_path / "old.sqlite"
    _old_store(path, rows)
    with Store(path, readonly=True) as ro:
        assert [(r.config, r.median_ms, r.worker) for r in ro.query()] == [(r.config, r.median_ms, None) for r in rows]
    with Store(path) as rw:  # a writable open adds the column, keeps every row, and writes new ones with a worker
        rw.put(Result("fp", "gemm", "h", "8x8x8", "BM=1000", "ok", "", 1.5, 1.4, 1.6, 1.45, 1.55, 5, worker="h/w0"))
        got = {r.config: r for r in rw.query()}
    assert {c: got[c].median_ms for c in got if c != "BM=1000"} == {r.config: r.median_ms for r in rows}
    assert got["BM=1000"].worker == "h/w0"


def test_exports_without_worker_import_and_bad_workers_are_refused(tmp_path):
    row = {"fingerprint": "fp", "kernel": "gemm", "source_hash": "h", "shape": "8x8x8", "config": "BM=8",
           "status": "illegal", "message": "m", "median_ms": None, "p20_ms": None, "p80_ms": None, "ci_lo_ms": None,
           "ci_hi_ms": None, "samples": None, "rel_err": None, "max_abs_err": None, "gflops": None,
           "tile_waste": None, "version": "0", "created": 1.0}
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"format": "tilewise-results", "schema": 1, "results": [row]}))
    store = Store(tmp_path / "s.sqlite")
    assert store.import_json(old) == (1, 0)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "tilewise-results", "schema": 1,
                               "results": [{**row, "config": "BM=16", "worker": 7}]}))
    with pytest.raises(ConfigError, match="worker is 7"):
        store.import_json(bad)
    assert [r.config for r in store.query()] == ["BM=8"]


def test_tune_model_ray_starts_workers_on_cuda_and_webgpu_devices(monkeypatch):
    """`tilewise tune model --device cuda --ray` must reach the cluster with the CUDA executor's backend allowed
    (it used to be refused as a job with no CUDA implementation before any worker started)."""
    import argparse

    from tilewise.cli import tune_model as tune_model_cli
    from tilewise.tune import cluster

    seen = []

    class Stop(Exception):
        pass

    def fake_start(args, backends, job, prefer=None):
        seen.append((args.device, tuple(backends)))
        raise Stop

    monkeypatch.setattr(cluster, "import_ray", lambda: None)
    monkeypatch.setattr(cluster, "start_cluster", fake_start)
    for device in ("cuda", "webgpu", "dawn"):
        args = argparse.Namespace(preset="tiny", seq=8, weights="nf4", device=device, ray=cluster.LOCAL, workers=2)
        with pytest.raises(Stop):
            tune_model_cli.run(args)
    assert [d for d, _ in seen] == ["cuda", "webgpu", "dawn"]
    assert all({"cuda", "webgpu"} <= set(b) for _, b in seen)


def test_a_cuda_ray_engine_queues_batches_ahead_of_its_workers():
    """With kernels compiled in CPU tasks, each live worker is handed COMPILE_AHEAD batches per call, so the next
    batches compile while it measures; without CPU compiles (WebGPU), one batch per live worker."""
    from types import SimpleNamespace

    from tilewise.tune.cluster import COMPILE_AHEAD, RayEngine

    assert COMPILE_AHEAD >= 2
    workers = [SimpleNamespace(alive=True), SimpleNamespace(alive=False), SimpleNamespace(alive=True)]
    width = RayEngine.width.fget  # type: ignore[attr-defined]
    assert width(SimpleNamespace(workers=workers, cpu_compiles=True)) == 2 * COMPILE_AHEAD
    assert width(SimpleNamespace(workers=workers, cpu_compiles=False)) == 2
    assert width(SimpleNamespace(workers=[SimpleNamespace(alive=False)], cpu_compiles=True)) == COMPILE_AHEAD
