"""The results store under bad input and contention: read-only commands create nothing and read read-only stores,
exports never land on a database, imports are checked field by field and land all or nothing, concurrent creators
all succeed, a killed writer leaves a readable store, and the report fits 80 columns."""

import contextlib
import io
import json
import math
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from tilewise.cli import build_parser, main
from tilewise.errors import ConfigError
from tilewise.tune.store import STATUSES, Result, Store
from tilewise.tune.store_io import check_row

FP = "webgpu:Vulkan:llvmpipe-LLVM-15.0.6-256-bits:Mesa-23.2.1-1-deb12u1:3f2a9c1e4b"


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def make_row(rng, i, status="ok", fp=FP, kernel="gemm", shape="64x64x64", names=("BM", "BN", "BK")):
    """A consistent random row as the engine writes it."""
    config = ",".join(f"{n}={int(rng.choice([8, 16, 32, 64, 128]))}" for n in names) + f",ID={i}"
    row = Result(fp, kernel, f"h{int(rng.integers(1 << 30)):x}", shape, config, status, f"message {i}",
                 rel_err=float(rng.uniform(1e-8, 1e-4)), max_abs_err=float(rng.uniform(1e-8, 1e-4)),
                 tile_waste=float(rng.uniform(1.0, 2.0)), version="0.1.0",
                 created=float(rng.uniform(1.6e9, 1.8e9)))
    if status == "ok":
        m = float(rng.uniform(0.01, 5.0))
        row.median_ms, row.p20_ms, row.p80_ms = m, m * float(rng.uniform(0.8, 1)), m * float(rng.uniform(1, 1.2))
        row.ci_lo_ms, row.ci_hi_ms = m * float(rng.uniform(0.9, 1)), m * float(rng.uniform(1, 1.1))
        row.samples, row.gflops = int(rng.integers(5, 60)), float(rng.uniform(1, 500))
    elif status == "wrong":
        row.rel_err = row.max_abs_err = math.inf  # a non-finite output
    return row


def filled_store(path, rng, n=6):
    with Store(path) as st:
        for i in range(n):
            st.put(make_row(rng, i, STATUSES[i % len(STATUSES)]))
    return path


def snapshot(path):
    """The store's content: its file's bytes and its write-ahead log's (absent = empty). The shared-memory index
    (`-shm`) is left out: SQLite readers of a WAL file write their read marks there, by design."""
    wal = Path(f"{path}-wal")
    return Path(path).read_bytes(), wal.read_bytes() if wal.exists() else b""


def store_files(folder):
    """The files of a folder but SQLite's sidecars of a WAL store, which a reader may open (empty) beside it."""
    return sorted(p.name for p in Path(folder).iterdir() if not p.name.endswith(("-wal", "-shm")))


def rows_of(path):
    with Store(path, readonly=True) as st:
        return sorted((asdict(r) for r in st), key=lambda r: r["config"])


# ---- read-only commands create nothing ---------------------------------------------------------------------------
def test_store_path_creates_nothing_and_says_so(capsys, tmp_path):
    target = tmp_path / "new" / "results.sqlite"
    code, out, err = run(capsys, "store", "path", "--store", target)
    assert code == 0 and out == f"{target}\n" and "(does not exist yet" in err
    assert not target.parent.exists()
    filled_store(target, __import__("numpy").random.default_rng(3))
    code, out, err = run(capsys, "store", "path", "--store", target)
    assert code == 0 and out == f"{target}\n" and err == ""


def test_store_path_defaults_to_the_environment(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("TILEWISE_STORE", str(tmp_path / "env.sqlite"))
    code, out, _ = run(capsys, "store", "path")
    assert code == 0 and out.strip() == str(tmp_path / "env.sqlite") and not (tmp_path / "env.sqlite").exists()


@pytest.mark.parametrize("argv", [["report"], ["report", "--kernel", "gemm"], ["store", "export", "OUT"]])
def test_read_only_commands_refuse_a_missing_store(capsys, tmp_path, argv):
    missing = tmp_path / "TYPO.sqlite"
    argv = [str(tmp_path / "out.json") if a == "OUT" else a for a in argv]
    code, out, err = run(capsys, *argv, "--store", missing)
    assert code == 2 and out == ""
    assert f"error: there is no results store at {missing}\n" in err
    assert "fix: check the path given to --store (`tilewise store path` shows the default store)" in err
    assert sorted(tmp_path.iterdir()) == []  # neither a store nor an export


def test_readonly_store_api_never_writes(tmp_path, rng):
    path = filled_store(tmp_path / "s.sqlite", rng)
    before = snapshot(path)
    with pytest.raises(ConfigError, match="no results store at"):
        Store(tmp_path / "absent.sqlite", readonly=True)
    with Store(path, readonly=True) as st:
        assert len(st) == 6
        with pytest.raises(ConfigError, match="opened read-only"):
            st.put(make_row(rng, 99))
    assert snapshot(path) == before and not (tmp_path / "absent.sqlite").exists()


def test_an_empty_store_file_reads_as_empty(capsys, tmp_path):
    empty = tmp_path / "empty.sqlite"
    empty.write_bytes(b"")  # what an old `tilewise store path` left behind
    code, out, _ = run(capsys, "report", "--store", empty)
    assert code == 0 and "0 results" in out and "it holds no results yet" in out
    assert empty.read_bytes() == b"" and store_files(tmp_path) == ["empty.sqlite"]


def test_a_foreign_sqlite_file_is_refused_and_untouched(capsys, tmp_path):
    import sqlite3

    other = tmp_path / "app.db"
    with contextlib.closing(sqlite3.connect(other)) as db:
        db.execute("CREATE TABLE users (name TEXT)")
        db.commit()
    before = other.read_bytes()
    for argv in (["report"], ["store", "export", tmp_path / "x.json"], ["store", "import", tmp_path / "x.json"]):
        if argv[1:2] == ["import"]:
            (tmp_path / "x.json").write_text(json.dumps({"format": "tilewise-results", "schema": 1, "results": []}))
        code, _, err = run(capsys, *argv, "--store", other)
        assert code == 2 and f"{other} is a SQLite database but not a tilewise results store" in err
        assert "tables users" in err
        assert other.read_bytes() == before


def _warm_up():
    """Load every module the commands need, on a throwaway store (a forked child that gives up root cannot read
    the interpreter's own files any more)."""
    scratch = Path(tempfile.mkdtemp())
    try:
        with Store(scratch / "s.sqlite") as st:
            st.put(make_row(__import__("numpy").random.default_rng(0), 0))
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            for argv in (["report"], ["store", "export", str(scratch / "r.json")], ["store", "import", "-"],
                         ["store", "import", str(scratch / "r.json")]):
                main([*argv, "--store", str(scratch / "s.sqlite")])
    finally:
        shutil.rmtree(scratch)


def _in_child(argv, uid):
    """Run `main(argv)` in a forked child (as `uid` when given); returns (code, stdout, stderr)."""
    _warm_up()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        out, err = io.StringIO(), io.StringIO()
        try:
            if uid is not None:
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = main(argv)
        except BaseException as exc:  # reported to the parent
            code, err = 99, io.StringIO(repr(exc))
        os.write(w, json.dumps([code, out.getvalue(), err.getvalue()]).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        data = f.read()
    os.waitpid(pid, 0)
    return tuple(json.loads(data))


@pytest.fixture
def readonly_dir(rng):
    """A folder with a healthy store, the folder and file made read-only; commands run as a user who cannot write
    them (root writes anywhere, so as root they run as nobody)."""
    base = Path(tempfile.mkdtemp())
    base.chmod(0o755)
    path = filled_store(base / "s.sqlite", rng)
    with Store(path) as st:  # a writer's close removes the -wal and -shm files; a reader's would leave them
        rows = sorted((asdict(r) for r in st), key=lambda r: r["config"])
    before = snapshot(path)
    uid = None
    if os.geteuid() == 0:
        uid = 65534
        os.chown(base, uid, uid)
        os.chown(path, uid, uid)
    path.chmod(0o444)
    base.chmod(0o555)
    try:
        yield path, rows, before, (lambda argv: _in_child([str(a) for a in argv], uid))
    finally:
        base.chmod(0o755)
        shutil.rmtree(base)


def test_a_read_only_store_is_readable_by_read_only_commands(readonly_dir):
    path, rows, before, run_as_reader = readonly_dir
    assert sorted(p.name for p in path.parent.iterdir()) == ["s.sqlite"]  # no -wal, no -shm: none can be made
    code, out, err = run_as_reader(["report", "--store", path])
    assert (code, err) == (0, "") and f"results store {path}: 6 results" in out and "ok 1" in out
    code, out, err = run_as_reader(["store", "export", "-", "--store", path])
    assert code == 0 and f"exported 6 results from {path} to stdout" in err
    assert sorted(json.loads(out)["results"], key=lambda r: r["config"]) == rows
    code, out, err = run_as_reader(["store", "import", "-", "--store", path])  # a writer says why it cannot
    assert code == 2
    assert snapshot(path) == before and sorted(p.name for p in path.parent.iterdir()) == ["s.sqlite"]


def import_as_reader(run_as_reader, rng, store: Path) -> tuple[int, str]:
    """`tilewise store import` of a one-row export into `store`, run as readonly_dir's reader: (code, stderr)."""
    export = Path(tempfile.mkdtemp())
    try:
        (export / "r.json").write_text(json.dumps({"format": "tilewise-results", "schema": 1,
                                                   "results": [asdict(make_row(rng, 50))]}))
        export.chmod(0o755)
        (export / "r.json").chmod(0o644)
        code, _, err = run_as_reader(["store", "import", export / "r.json", "--store", store])
    finally:
        shutil.rmtree(export)
    return code, err


def test_a_read_only_store_refuses_writers_with_the_reason(readonly_dir, rng):
    path, _, before, run_as_reader = readonly_dir
    code, err = import_as_reader(run_as_reader, rng, path)
    assert code == 2 and f"the results store {path} cannot be written here" in err
    assert "make the file and its folder writable, or pass --store PATH" in err
    assert snapshot(path) == before


def test_a_new_store_in_a_folder_that_takes_no_files_says_so(readonly_dir, rng):
    path, _, _, run_as_reader = readonly_dir
    new = path.parent / "new.sqlite"
    code, err = import_as_reader(run_as_reader, rng, new)
    assert code == 2 and f"cannot create the results store {new}: its folder {path.parent} does not take" in err
    assert "pass --store PATH in a writable folder" in err and "mv " not in err
    assert sorted(p.name for p in path.parent.iterdir()) == ["s.sqlite"]


# ---- exports never land on a database ----------------------------------------------------------------------------
def test_export_over_the_store_or_any_database_is_refused(capsys, tmp_path, rng):
    import sqlite3

    path = filled_store(tmp_path / "s.sqlite", rng)
    other = tmp_path / "other.db"
    with contextlib.closing(sqlite3.connect(other)) as db:
        db.execute("CREATE TABLE t (x)")
        db.commit()
    (tmp_path / "link.sqlite").symlink_to(path)
    os.link(path, tmp_path / "hard.sqlite")
    with Store(path) as st:  # keep a -wal file on disk while the exports are tried
        st.put(make_row(rng, 77))
        before, other_before = snapshot(path), other.read_bytes()
        for target in (path, tmp_path / "link.sqlite", tmp_path / "hard.sqlite", f"{path}-wal"):
            code, out, err = run(capsys, "store", "export", target, "--store", path)
            assert code == 2 and out == ""
            assert f"the export file {target} is the results store {path}" in err
            assert "writing it would replace the results with JSON, so nothing was written" in err
        code, _, err = run(capsys, "store", "export", other, "--store", path)
        assert code == 2 and f"the export file {other} is a SQLite database (a results store?)" in err
        assert snapshot(path) == before and other.read_bytes() == other_before and len(st) == 7


@pytest.mark.parametrize("target, message", [("DIR", "is a folder"), ("nowhere/r.json", "does not exist")])
def test_export_to_a_folder_or_a_missing_folder_is_refused(capsys, tmp_path, rng, target, message):
    path = filled_store(tmp_path / "s.sqlite", rng)
    (tmp_path / "DIR").mkdir()
    names = store_files(tmp_path)
    code, _, err = run(capsys, "store", "export", tmp_path / target, "--store", path)
    assert code == 2 and message in err and "nothing was written" in err
    assert store_files(tmp_path) == names and list((tmp_path / "DIR").iterdir()) == []


def test_export_is_atomic_and_round_trips(capsys, tmp_path, rng, monkeypatch):
    path = filled_store(tmp_path / "s.sqlite", rng, n=9)
    out_file = tmp_path / "r.json"
    out_file.write_text("previous export")
    code, out, _ = run(capsys, "store", "export", out_file, "--store", path)
    assert code == 0 and f"exported 9 results from {path} to {out_file}" in out
    data = json.loads(out_file.read_text())
    assert (data["format"], data["schema"]) == ("tilewise-results", 1)
    assert sorted(data["results"], key=lambda r: r["config"]) == rows_of(path)
    code, out, _ = run(capsys, "store", "import", out_file, "--store", tmp_path / "copy.sqlite")
    assert code == 0 and "imported 9 results" in out
    assert rows_of(tmp_path / "copy.sqlite") == rows_of(path)  # inf errors included

    def crash(*a):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"), Store(path, readonly=True) as st:
        st.export_json(out_file)
    assert out_file.read_text() == json.dumps(data, indent=1)  # the old export, whole
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")) == []


def test_export_to_stdout_is_only_json(capsys, tmp_path, rng, monkeypatch):
    path = filled_store(tmp_path / "s.sqlite", rng)
    monkeypatch.chdir(tmp_path)  # where a file named "-" would land
    code, out, err = run(capsys, "store", "export", "-", "--store", path)
    assert code == 0 and json.loads(out)["results"] and "exported 6 results" in err
    assert not (tmp_path / "-").exists()


# ---- imports are checked, then land all or nothing ---------------------------------------------------------------
def _export_text(rows, **top):
    return json.dumps({"format": "tilewise-results", "schema": 1, "results": rows, **top})


BAD_FIELDS = [  # (status of row 2, field, value or DROP, the message part)
    ("ok", "median_ms", "fast", 'result 2: median_ms is "fast"; expected a finite positive time in milliseconds'),
    ("ok", "median_ms", -0.25, "result 2: median_ms is -0.25; expected a finite positive time in milliseconds"),
    ("ok", "median_ms", math.nan, "result 2: median_ms is NaN; expected a finite positive time in milliseconds"),
    ("ok", "median_ms", {"ms": 1}, 'result 2: median_ms is {"ms": 1}; expected a finite positive time'),
    ("ok", "median_ms", None, "result 2: median_ms is null; expected a finite positive time in milliseconds: an ok "
     "row is timed"),
    ("ok", "p80_ms", -1.0, "result 2: p80_ms is -1.0; expected null or a finite positive time in milliseconds"),
    ("ok", "p20_ms", "DROP", "result 2 lacks the field p20_ms"),
    ("ok", "status", "great", 'result 2: status is "great"; expected one of ok, illegal, compile_error'),
    ("ok", "shape", [64, 64, 64], "result 2: shape is [64, 64, 64]; expected sizes joined by x"),
    ("ok", "shape", "0x64x64", 'result 2: shape is "0x64x64"; expected sizes joined by x'),
    ("ok", "shape", "64x064", 'result 2: shape is "64x064"; expected sizes joined by x'),
    ("ok", "config", {"BM": 64}, 'result 2: config is {"BM": 64}; expected NAME=VALUE pairs'),
    ("ok", "config", "BM64", 'result 2: config is "BM64"; expected NAME=VALUE pairs'),
    ("ok", "p20_ms", 1e9, "result 2: p20_ms is 1000000000.0; expected at most median_ms"),
    ("ok", "ci_hi_ms", 1e-9, "result 2: ci_hi_ms is 1e-09; expected at least median_ms"),
    ("ok", "samples", 2.5, "result 2: samples is 2.5; expected null or a whole number of at least 1"),
    ("ok", "samples", True, "result 2: samples is true; expected null or a whole number"),
    ("ok", "samples", 0, "result 2: samples is 0; expected null or a whole number of at least 1"),
    ("ok", "gflops", math.inf, "result 2: gflops is Infinity; expected null or a finite non-negative number"),
    ("ok", "created", "yesterday", 'result 2: created is "yesterday"; expected a finite non-negative number'),
    ("ok", "tile_waste", 0.5, "result 2: tile_waste is 0.5; expected null or a finite number of at least 1"),
    ("ok", "rel_err", -1e-3, "result 2: rel_err is -0.001; expected null or a non-negative number"),
    ("ok", "fingerprint", "", 'result 2: fingerprint is ""; expected a non-empty string'),
    ("ok", "message", 7, "result 2: message is 7; expected a string"),
    ("ok", "extra", 1, "result 2 has the unknown field extra"),
    ("wrong", "median_ms", 0.5, "result 2: median_ms is 0.5; expected null: a wrong row is not timed"),
    ("timeout", "samples", 3, "result 2: samples is 3; expected null: a timeout row is not timed"),
]


@pytest.mark.parametrize("status, field, value, message", BAD_FIELDS, ids=[f"{b[1]}={b[2]!r}" for b in BAD_FIELDS])
def test_a_bad_field_is_named_and_nothing_is_imported(capsys, tmp_path, rng, status, field, value, message):
    path = filled_store(tmp_path / "s.sqlite", rng, n=3)
    rows = [asdict(make_row(rng, 10 + i, status if i == 2 else "ok")) for i in range(5)]
    if value == "DROP":
        del rows[2][field]
    else:
        rows[2][field] = value
    bad = tmp_path / "bad.json"
    bad.write_text(_export_text(rows))
    before = snapshot(path)
    code, out, err = run(capsys, "store", "import", bad, "--store", path)
    assert code == 2 and out == ""
    assert err.startswith(f"error: {bad}: {message}")
    assert "fix: correct or remove that row, or export it again with `tilewise store export`; nothing was imported" \
        in err
    assert snapshot(path) == before and len(Store(path, readonly=True)) == 3  # rows 0 and 1 were valid: not kept
    code, _, _ = run(capsys, "store", "import", bad, "--store", tmp_path / "fresh.sqlite")
    assert code == 2 and not (tmp_path / "fresh.sqlite").exists()


@pytest.mark.parametrize("text, message", [
    ("this is not json {", "is not JSON (Expecting value at line 1 column 1)"),
    ("[1, 2]", 'is not a tilewise results export (it lacks "format": "tilewise-results")'),
    ('{"format": "tilewise-dispatch", "schema": 2}', "is not a tilewise results export"),
    ('{"format": "tilewise-results", "schema": 2, "results": []}', "has export schema 2; this tilewise reads schema 1"),
    ('{"format": "tilewise-results", "results": []}', "has export schema None"),
    ('{"format": "tilewise-results", "schema": 1, "results": {"a": 1}}', '"results" is an object, not a list'),
    ('{"format": "tilewise-results", "schema": 1, "results": [[1]]}', "result 0 is a list, not an object of fields"),
])
def test_a_file_that_is_not_an_export_is_named(capsys, tmp_path, rng, text, message):
    path = filled_store(tmp_path / "s.sqlite", rng, n=2)
    bad = tmp_path / "in.json"
    bad.write_text(text)
    before = snapshot(path)
    code, _, err = run(capsys, "store", "import", bad, "--store", path)
    assert code == 2 and err.startswith(f"error: {bad}") and message in err and "nothing was imported" in err
    assert snapshot(path) == before


def test_importing_a_store_or_a_missing_file_is_refused(capsys, tmp_path, rng):
    path = filled_store(tmp_path / "s.sqlite", rng, n=2)
    other = filled_store(tmp_path / "other.sqlite", rng, n=2)
    before = snapshot(path)
    code, _, err = run(capsys, "store", "import", other, "--store", path)
    assert code == 2 and f"{other} is a SQLite database (a results store?), not an export" in err
    code, _, err = run(capsys, "store", "import", tmp_path / "nope.json", "--store", path)
    assert code == 2 and f"cannot read {tmp_path / 'nope.json'} (No such file or directory)" in err
    assert snapshot(path) == before


def test_duplicate_rows_in_one_file_are_refused(capsys, tmp_path, rng):
    rows = [asdict(make_row(rng, i)) for i in range(4)]
    rows[3] = {**rows[1], "median_ms": rows[1]["median_ms"] * 2, "p80_ms": rows[1]["p80_ms"] * 2,
               "ci_hi_ms": rows[1]["ci_hi_ms"] * 2}
    (tmp_path / "d.json").write_text(_export_text(rows))
    code, _, err = run(capsys, "store", "import", tmp_path / "d.json", "--store", tmp_path / "s.sqlite")
    assert code == 2 and "results 1 and 3 have the same key" in err and not (tmp_path / "s.sqlite").exists()


def test_put_many_is_one_transaction(tmp_path, rng):
    path = filled_store(tmp_path / "s.sqlite", rng, n=3)
    rows = [make_row(rng, 20 + i) for i in range(5)]
    rows[3].message = {"not": "bindable"}  # the database itself refuses this row, after rows 0-2 were inserted
    with Store(path) as st:
        with pytest.raises(Exception, match=r"type 'dict' is not supported|Error binding"):
            st.put_many(rows)
        assert len(st) == 3
        rows[3].message = "fine"
        assert st.put_many(rows) == (5, 0) and len(st) == 8
        assert st.put_many(rows) == (0, 5)


def test_every_row_the_engine_writes_passes_the_import_check(rng):
    for i in range(30):
        row = make_row(rng, i, STATUSES[i % len(STATUSES)])
        assert check_row(asdict(row), f"result {i}") == row
    # attention's shape is (M, P, HQ, HKV, D): a decision without a cached prefix has P = 0
    row = make_row(rng, 30, shape="346x0x16x8x64", kernel="attention", names=("BQ", "BKV"))
    assert check_row(asdict(row), "result 30") == row


# ---- contention and crashes --------------------------------------------------------------------------------------
def _create_and_write(path, worker, rows, barrier, errors):
    barrier.wait()  # every process opens the new store at the same moment
    try:
        with Store(path) as st:
            for j in range(rows):
                st.put(Result(FP, "gemm", "h", "8x8x8", f"W={worker},J={j}", "ok", median_ms=0.1 + j))
    except Exception as exc:  # reported to the parent
        errors.put(f"worker {worker}: {exc}")
    else:
        errors.put("")


def test_processes_creating_one_new_store_at_once_all_succeed(tmp_path):
    ctx = mp.get_context("fork")
    workers, rows = 8, 10
    for attempt in range(4):  # each attempt races on a new file: the creation is what used to fail
        path = tmp_path / f"new{attempt}" / "results.sqlite"
        barrier, errors = ctx.Barrier(workers), ctx.Queue()
        procs = [ctx.Process(target=_create_and_write, args=(path, w, rows, barrier, errors)) for w in range(workers)]
        for p in procs:
            p.start()
        reports = [errors.get(timeout=120) for _ in procs]
        for p in procs:
            p.join()
        assert [r for r in reports if r] == [] and [p.exitcode for p in procs] == [0] * workers
        with Store(path, readonly=True) as st:
            assert sorted(r.config for r in st) == sorted(f"W={w},J={j}" for w in range(workers) for j in range(rows))


def test_a_writer_killed_mid_write_leaves_a_readable_store(tmp_path):
    path = tmp_path / "r.sqlite"
    script = textwrap.dedent(f"""
        from tilewise.tune.store import Result, Store
        st = Store({str(path)!r})
        i = 0
        while True:  # writes until killed
            st.put(Result("fp", "gemm", "h", "8x8x8", f"BM={{i}}", "ok", f"row {{i}}", median_ms=1.0 + i,
                          p20_ms=1.0 + i, p80_ms=1.0 + i, samples=1))
            i += 1
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
    try:
        seen, deadline = 0, time.monotonic() + 120
        while seen < 200:
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "the writer wrote too slowly to test"
            if path.exists():
                with contextlib.suppress(ConfigError), Store(path, readonly=True) as st:
                    seen = len(st)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    with Store(path) as st:  # opens (quick_check passes), every row whole, and writable again
        rows = list(st)
        assert len(rows) >= seen
        for r in rows:
            i = int(r.config.removeprefix("BM="))
            assert (r.message, r.median_ms, r.samples) == (f"row {i}", 1.0 + i, 1)
        assert sorted(int(r.config[3:]) for r in rows) == list(range(len(rows)))  # no gap: commits in order
        st.put(Result("fp", "gemm", "h", "8x8x8", "BM=-1", "illegal"))
        assert len(st) == len(rows) + 1


# ---- the report --------------------------------------------------------------------------------------------------
@pytest.fixture
def report_store(tmp_path, rng):
    path = tmp_path / "s.sqlite"
    long_fp = FP.replace("3f2a9c1e4b", "ab12cd34ef")
    with Store(path) as st:
        for fp in (FP, long_fp):
            for kernel, shape, names in (("gemm", "64x64x64", ("BM", "BN", "BK", "TM", "TN", "VEC", "UNROLL")),
                                         ("nf4_matmul.tiled.swiglu.norm", "96x4608x1024",
                                          ("WG", "NC", "RM", "EL", "SPLIT", "PREFETCH", "DOUBLE_BUFFER"))):
                for i in range(12):
                    status = "ok" if i < 6 else "illegal" if i < 9 else "compile_error"
                    st.put(make_row(rng, i, status, fp=fp, kernel=kernel, shape=shape, names=names))
    return path


def test_report_fits_80_columns_best_first(capsys, report_store, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = run(capsys, "report", "--store", report_store, "--top", "3")
    lines = out.splitlines()
    assert code == 0 and max(len(line) for line in lines) <= 80
    assert lines[0].startswith("results store ") and lines[0].endswith(f"{report_store.name}: 48 results")
    assert sum(line.startswith("device ") for line in lines) == 2 and FP not in out and ":3f2a9c1e4b" in out
    with Store(report_store, readonly=True) as st:
        best = st.best(FP, "gemm", "64x64x64", 3)
    block = lines[lines.index(next(line for line in lines if ":3f2a9c1e4b" in line)) + 1:]
    assert block[0] == "  gemm 64x64x64: ok 6, illegal 3, compile_error 3"
    assert block[1].split() == ["median_ms", "BM", "BN", "BK", "TM", "TN", "VEC", "UNROLL", "ID"]
    for line, r in zip(block[2:5], best):
        assert line.split() == [f"{r.median_ms:.4f}", *(p.split("=")[1] for p in r.config.split(","))]
    assert [r.median_ms for r in best] == sorted(r.median_ms for r in best)


def test_report_wide_shows_full_fingerprints_and_keys(capsys, report_store):
    code, out, _ = run(capsys, "report", "--store", report_store, "--wide", "--top", "2")
    with Store(report_store, readonly=True) as st:
        best = st.best(FP, "nf4_matmul.tiled.swiglu.norm", "96x4608x1024", 2)
    assert code == 0 and f"device {FP}\n" in out
    for r in best:
        assert f"{r.median_ms:>9.4f}  {r.config}\n" in out


def test_report_json_holds_every_field(capsys, report_store, tmp_path):
    code, out, err = run(capsys, "report", "--store", report_store, "--json", "-", "--kernel", "gemm", "--top", "4")
    data = json.loads(out)
    assert code == 0 and "results store" in err  # the human report moved to stderr
    assert data["results"] == 48 and [g["fingerprint"] for g in data["groups"]] == sorted([FP, FP[:-10] + "ab12cd34ef"])
    with Store(report_store, readonly=True) as st:
        for g in data["groups"]:
            assert g["statuses"] == {"ok": 6, "illegal": 3, "compile_error": 3}
            assert g["best"] == [asdict(r) for r in st.best(g["fingerprint"], "gemm", "64x64x64", 4)]
    code, _, _ = run(capsys, "report", "--store", report_store, "--json", tmp_path / "r.json", "--kernel", "gemm",
                     "--top", "4")
    assert code == 0 and json.loads((tmp_path / "r.json").read_text()) == data


@pytest.mark.parametrize("argv, message", [
    (["--kernel", "gem"], "holds no results for --kernel gem\n  fix: it holds kernels: gemm, nf4_matmul.tiled"),
    (["--shape", "1x2x3"], "holds no results for --shape 1x2x3\n  fix: it holds shapes: 64x64x64, 96x4608x1024"),
    (["--device-fingerprint", "cpu:x"], "holds no results for --device-fingerprint cpu:x\n  fix: it holds fingerpr"),
    (["--kernel", "gemm", "--shape", "96,4608,1024"], "holds no results matching --kernel gemm --shape 96x4608x1024"),
    (["--top", "0"], "tilewise report --top: expected a whole number of at least 1, got 0"),
    (["--top", "many"], "tilewise report --top: expected a whole number, got 'many'"),
])
def test_report_filters_that_match_nothing_say_so(capsys, report_store, argv, message, tmp_path):
    before = snapshot(report_store)
    code, out, err = run(capsys, "report", "--store", report_store, *argv, "--json", tmp_path / "r.json")
    assert code == 2 and out == "" and message in err
    assert snapshot(report_store) == before and not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("command", ["store", "report"])
def test_every_option_has_help_and_the_command_has_examples(command, monkeypatch):
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices[command]
    for action in sub._actions:
        assert action.help, f"{command} {action.option_strings or action.dest} has no help line"
    assert sub.epilog.startswith("examples:\n") and sub.epilog.count(f"tilewise {command}") == 2
    monkeypatch.setenv("COLUMNS", "80")
    assert max(len(line) for line in sub.format_help().splitlines()) <= 80
