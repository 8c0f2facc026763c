"""Results store: round trip, resume after a crash, corrupt files, export/import between machines."""

import json
import subprocess
import sys
import textwrap

import pytest

from tilewise.errors import ConfigError
from tilewise.tune.store import STATUSES, Result, Store


def result(i, status="ok", fp="webgpu:test:abc", **kw):
    return Result(fp, "gemm", "hash1", "64x64x64", f"BM={i}", status, f"message {i}",
                  median_ms=0.1 * (i + 1) if status == "ok" else None, **kw)


def test_statuses_are_exactly_the_contract():
    assert STATUSES == ("ok", "illegal", "compile_error", "launch_error", "wrong", "timeout")
    with pytest.raises(ValueError):
        result(0, status="failed")


def test_round_trip_and_query(tmp_path):
    with Store(tmp_path / "r.sqlite") as st:
        for i, s in enumerate(STATUSES):
            st.put(result(i, s, rel_err=1e-7 * i))
        assert len(st) == len(STATUSES)
        got = st.get("webgpu:test:abc", "gemm", "hash1", "64x64x64", "BM=4")
        assert got.status == "wrong" and got.message == "message 4" and got.rel_err == pytest.approx(4e-7)
        assert got.version and got.created > 0
        assert [r.config for r in st.query(status="ok")] == ["BM=0"]
        st.put(result(0, "ok", median_ms_override=None) if False else result(0, "timeout"))  # same key replaces
        assert len(st) == len(STATUSES)
        assert st.get("webgpu:test:abc", "gemm", "hash1", "64x64x64", "BM=0").status == "timeout"


def test_wal_mode(tmp_path):
    st = Store(tmp_path / "r.sqlite")
    assert st._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_killed_writer_loses_nothing_it_committed(tmp_path):
    path = tmp_path / "r.sqlite"
    script = textwrap.dedent(f"""
        import os
        from tilewise.tune.store import Result, Store
        st = Store({str(path)!r})
        for i in range(7):
            st.put(Result("fp", "gemm", "h", "8x8x8", f"BM={{i}}", "ok", median_ms=float(i)))
        os._exit(9)  # die mid-sweep: no close, no cleanup
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 9, proc.stderr
    with Store(path) as st:
        assert sorted(r.config for r in st) == [f"BM={i}" for i in range(7)]


def test_corrupt_store_is_refused_with_the_fix(tmp_path):
    path = tmp_path / "bad.sqlite"
    path.write_bytes(b"this is not a database" * 100)
    before = path.read_bytes()
    with pytest.raises(ConfigError) as exc:
        Store(path)
    assert "--store PATH" in str(exc.value) and str(path) in str(exc.value)
    assert path.read_bytes() == before  # never silently dropped


def test_export_import_between_stores(tmp_path):
    a = Store(tmp_path / "a.sqlite")
    for i in range(4):
        a.put(result(i))
    assert a.export_json(tmp_path / "x.json") == 4
    data = json.loads((tmp_path / "x.json").read_text())
    assert data["format"] == "tilewise-results" and len(data["results"]) == 4
    b = Store(tmp_path / "b.sqlite")
    local = result(1)
    local.median_ms = 9.0
    b.put(local)
    added, skipped = b.import_json(tmp_path / "x.json")
    assert (added, skipped) == (3, 1)
    assert b.get(*local.key).median_ms == 9.0  # local measurement kept
    added, skipped = b.import_json(tmp_path / "x.json", replace=True)
    assert added == 4 and b.get(*local.key).median_ms == pytest.approx(0.2)


def test_import_rejects_foreign_and_malformed_files(tmp_path):
    st = Store(tmp_path / "s.sqlite")
    (tmp_path / "other.json").write_text(json.dumps({"results": []}))
    with pytest.raises(ConfigError, match="not a tilewise results export"):
        st.import_json(tmp_path / "other.json")
    (tmp_path / "bad.json").write_text(json.dumps({"format": "tilewise-results", "schema": 1,
                                                   "results": [{"status": "meh"}]}))
    with pytest.raises(ConfigError, match="result 0 lacks the fields fingerprint"):
        st.import_json(tmp_path / "bad.json")
    assert len(st) == 0
