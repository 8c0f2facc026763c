"""The results store: SQLite (WAL, one transaction per result) under the user cache directory.

One row per (device fingerprint, kernel, source hash, shape, config). A row holds the status (one of
`STATUSES`), a message (the illegal rule's numbers, the compiler's first error line, the verification
error), the timing statistics and the verification error. Re-running a sweep skips what is stored (unless
forced); killing a sweep loses nothing already written, because every result commits on its own.

`Store(path, readonly=True)` reads without creating or changing anything (report, export). Moving results
between machines (`tilewise store export/import FILE.json`) lives in `store_io`.
"""

from __future__ import annotations

import os
import random
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from tilewise.errors import ConfigError

STATUSES = ("ok", "illegal", "compile_error", "launch_error", "wrong", "timeout")
EXPORT_FORMAT = "tilewise-results"
SCHEMA_VERSION = 1
# How long a writer waits for another process's transaction. Transactions hold one row (or one import), so
# waiting this long means a stuck process, not a busy one.
BUSY_TIMEOUT_S = 30.0


def default_path() -> Path:
    """`<user cache dir>/tilewise/results.sqlite` (override with TILEWISE_STORE)."""
    env = os.environ.get("TILEWISE_STORE")
    if env:
        return Path(env)
    try:
        from platformdirs import user_cache_dir

        base = Path(user_cache_dir("tilewise", appauthor=False))
    except ImportError:  # platformdirs is a dependency; this keeps a bare checkout usable
        base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tilewise"
    return base / "results.sqlite"


@dataclass
class Result:
    """One stored outcome of one config at one shape on one device."""

    fingerprint: str
    kernel: str
    source_hash: str
    shape: str
    config: str
    status: str
    message: str = ""
    median_ms: float | None = None
    p20_ms: float | None = None
    p80_ms: float | None = None
    ci_lo_ms: float | None = None
    ci_hi_ms: float | None = None
    samples: int | None = None
    rel_err: float | None = None
    max_abs_err: float | None = None
    gflops: float | None = None
    tile_waste: float | None = None
    version: str = ""
    created: float = 0.0
    #: who measured it when a cluster did (`host/device`); None for a local run and for stores older than the field
    worker: str | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} is not one of {STATUSES}")

    @property
    def key(self) -> tuple[str, str, str, str, str]:
        return (self.fingerprint, self.kernel, self.source_hash, self.shape, self.config)


COLUMNS = tuple(f.name for f in fields(Result))
_SQL_TYPES = {"str": "TEXT", "float | None": "REAL", "int | None": "INTEGER", "float": "REAL", "str | None": "TEXT"}
#: columns added after the first schema: (name, SQL type); old stores gain them on their first writable open
ADDED_COLUMNS = (("worker", "TEXT"),)
_INSERT = f"INTO results ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"
_TABLES = ("meta", "results")


def shape_key(shape: Iterable[int]) -> str:
    """`346x1024x2560`."""
    return "x".join(str(int(s)) for s in shape)


def missing_store(path: Path) -> ConfigError:
    """The error of a read-only command pointed at a store that does not exist."""
    return ConfigError(f"there is no results store at {path}",
                       "check the path given to --store (`tilewise store path` shows the default store); "
                       "`tilewise tune`, `tilewise sweep` or `tilewise store import` create one")


class Store:
    """SQLite results store.

    `Store(path)` opens (creating it when absent) for reading and writing; `Store(path, readonly=True)` reads an
    existing store and never creates or changes a file (a missing one raises `ConfigError`). A corrupt file raises
    `ConfigError` and is never dropped.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, *, readonly: bool = False) -> None:
        self.path = Path(path) if path is not None else default_path()
        self.readonly = readonly
        if self.path.is_dir():
            raise ConfigError(f"the results store {self.path} is a folder",
                              f"give a file, e.g. --store {self.path / 'results.sqlite'}")
        try:
            self._db = self._open_readonly() if readonly else self._open_writable()
        except sqlite3.DatabaseError as exc:
            raise self._unreadable(exc) from exc

    # ---- opening ---------------------------------------------------------------------------------------------
    def _open_writable(self) -> sqlite3.Connection:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot create the folder of the results store {self.path} ({exc.strerror})",
                              "pass --store PATH in a writable folder") from exc
        # isolation_level=None: transactions are explicit (`_write`), so every write takes the write lock up front
        # with BEGIN IMMEDIATE and waits for it (busy timeout) instead of failing on a lock upgrade.
        db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        try:
            self._check(db)  # before the WAL switch, which rewrites the header of a file that may not be ours
            self._wal(db)
            # NORMAL in WAL: a crashed process loses nothing committed; only a power cut can lose the last
            # transactions, never corrupt the file.
            db.execute("PRAGMA synchronous=NORMAL")
            self._create(db)
        except BaseException:
            db.close()
            raise
        return db

    @staticmethod
    def _wal(db: sqlite3.Connection) -> None:
        """Switch the file to WAL (persistent: once per store) so readers never block the writer.

        The switch takes an exclusive lock without SQLite's busy handler: processes creating one new store at
        once get "database is locked" there. They retry until one has switched (then the mode reads "wal")."""
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        while db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            try:
                db.execute("PRAGMA journal_mode=WAL").fetchone()
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(random.uniform(0.005, 0.05))  # jitter: racing creators do not retry in lockstep

    def _open_readonly(self) -> sqlite3.Connection:
        if not self.path.exists():
            raise missing_store(self.path)
        uri = self.path.resolve().as_uri()

        def connect(options: str) -> sqlite3.Connection:
            db = sqlite3.connect(f"{uri}?mode=ro{options}", uri=True, timeout=BUSY_TIMEOUT_S)
            try:
                db.execute("SELECT name FROM sqlite_master").fetchall()
            except BaseException:
                db.close()
                raise
            return db

        try:
            db = connect("")
        except sqlite3.OperationalError as exc:
            # A WAL store closed cleanly has no -shm/-wal file, and a read-only folder cannot hold a new one.
            # Nobody can write such a store either (a writer needs the -wal file), so reading it as immutable is
            # exact; with a -wal file left behind it would not be (the file then holds committed rows).
            wal = Path(f"{self.path}-wal")
            no_sidecar = "unable to open" in str(exc) or "readonly" in str(exc)
            if not no_sidecar or (wal.exists() and wal.stat().st_size > 0):
                raise
            db = connect("&immutable=1")
        try:
            self._check(db)
            if not self._tables(db):  # an empty file (a store never written): it holds nothing
                db.close()
                db = sqlite3.connect(":memory:", isolation_level=None)
                self._create(db)
        except BaseException:
            db.close()
            raise
        return db

    def _check(self, db: sqlite3.Connection) -> None:
        check = db.execute("PRAGMA quick_check").fetchone()
        if check and check[0] != "ok":
            raise sqlite3.DatabaseError(f"quick_check: {check[0]}")
        tables = self._tables(db)
        if tables and not set(_TABLES) <= tables:
            raise ConfigError(f"{self.path} is a SQLite database but not a tilewise results store (it has the "
                              f"tables {', '.join(sorted(tables))}); nothing was changed",
                              "check the path given to --store (`tilewise store path` shows the default store)")

    @staticmethod
    def _tables(db: sqlite3.Connection) -> set[str]:
        return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}

    @staticmethod
    def _create(db: sqlite3.Connection) -> None:
        """Create the tables when absent: IF NOT EXISTS inside one immediate transaction, so processes creating
        one store at once wait for each other and the first one's tables serve all."""
        cols = ", ".join(f"{f.name} {_SQL_TYPES.get(str(f.type), 'TEXT')}" for f in fields(Result))
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute(f"CREATE TABLE IF NOT EXISTS results ({cols}, "
                       "PRIMARY KEY (fingerprint, kernel, source_hash, shape, config))")
            db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
            db.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            have = {r[1] for r in db.execute("PRAGMA table_info(results)")}
            for name, sql_type in ADDED_COLUMNS:  # nullable: every old row reads as None
                if name not in have:
                    db.execute(f"ALTER TABLE results ADD COLUMN {name} {sql_type}")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def _unreadable(self, exc: sqlite3.DatabaseError) -> ConfigError:
        text = str(exc)
        if "unable to open" in text and not self.path.exists():
            return ConfigError(f"cannot create the results store {self.path}: its folder {self.path.parent} does not "
                               f"take new files ({text})", "pass --store PATH in a writable folder")
        if "readonly" in text or "unable to open" in text:
            return ConfigError(f"the results store {self.path} cannot be written here ({text}); nothing was changed",
                               "make the file and its folder writable, or pass --store PATH to write elsewhere; "
                               "`tilewise report` and `tilewise store export` read it as it is")
        return ConfigError(
            f"the results store {self.path} is unreadable ({text}); nothing was changed",
            f"use another store with --store PATH, or move the file aside (mv {self.path} {self.path}.bad) "
            "to start a fresh one; `tilewise store export` can copy results out of a readable store")

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- writing ---------------------------------------------------------------------------------------------
    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One transaction holding the write lock from its start: all of it commits, or none of it."""
        if self.readonly:
            raise ConfigError(f"the results store {self.path} was opened read-only", "open it with Store(path)")
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def put(self, result: Result) -> None:
        """Write one result in its own transaction (replacing the row with the same key)."""
        if not result.created:
            result.created = time.time()
        if not result.version:
            from tilewise import __version__

            result.version = __version__
        row = asdict(result)
        with self._write() as db:
            db.execute(f"INSERT OR REPLACE {_INSERT}", [row[c] for c in COLUMNS])

    def put_many(self, results: Sequence[Result], replace: bool = False) -> tuple[int, int]:
        """Write rows as given, all in one transaction; returns (written, skipped because already stored).

        A row whose key is stored is kept unless `replace` (local measurements are never silently lost)."""
        added = 0
        with self._write() as db:
            for r in results:
                row = asdict(r)
                cur = db.execute(f"INSERT OR {'REPLACE' if replace else 'IGNORE'} {_INSERT}",
                                 [row[c] for c in COLUMNS])
                added += cur.rowcount
        return added, len(results) - added

    # ---- reading ---------------------------------------------------------------------------------------------
    def get(self, fingerprint: str, kernel: str, source_hash: str, shape: str, config: str) -> Result | None:
        cur = self._db.execute("SELECT * FROM results WHERE fingerprint=? AND kernel=? AND source_hash=? AND shape=? "
                               "AND config=?", (fingerprint, kernel, source_hash, shape, config))
        row = cur.fetchone()
        return self._row(cur, row) if row else None

    def query(self, fingerprint: str | None = None, kernel: str | None = None, shape: str | None = None,
              status: str | None = None) -> list[Result]:
        """Rows matching every given field, oldest first."""
        where, args = self._where(fingerprint=fingerprint, kernel=kernel, shape=shape, status=status)
        cur = self._db.execute(f"SELECT * FROM results{where} ORDER BY created", args)
        return [self._row(cur, r) for r in cur.fetchall()]

    def best(self, fingerprint: str, kernel: str, shape: str, n: int) -> list[Result]:
        """The `n` fastest timed ok rows of one (device, kernel, shape), fastest first."""
        cur = self._db.execute("SELECT * FROM results WHERE fingerprint=? AND kernel=? AND shape=? AND status='ok' "
                               "AND median_ms IS NOT NULL ORDER BY median_ms, config LIMIT ?",
                               (fingerprint, kernel, shape, n))
        return [self._row(cur, r) for r in cur.fetchall()]

    def distinct(self, column: str) -> list[str]:
        """The stored values of one key column (`fingerprint`, `kernel`, `shape`), sorted."""
        if column not in ("fingerprint", "kernel", "shape"):
            raise ValueError(f"not a key column: {column}")
        return [r[0] for r in self._db.execute(f"SELECT DISTINCT {column} FROM results ORDER BY {column}")]

    def __iter__(self) -> Iterator[Result]:
        return iter(self.query())

    def __len__(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM results").fetchone()[0])

    def summary(self, fingerprint: str | None = None, kernel: str | None = None,
                shape: str | None = None) -> list[dict[str, Any]]:
        """Counts per (device, kernel, shape, status), for rows matching every given field."""
        where, args = self._where(fingerprint=fingerprint, kernel=kernel, shape=shape)
        cur = self._db.execute(f"SELECT fingerprint, kernel, shape, status, COUNT(*), MIN(median_ms) FROM results"
                               f"{where} GROUP BY fingerprint, kernel, shape, status "
                               "ORDER BY fingerprint, kernel, shape", args)
        return [{"fingerprint": f, "kernel": k, "shape": s, "status": st, "count": n, "best_ms": b}
                for f, k, s, st, n, b in cur.fetchall()]

    @staticmethod
    def _where(**match: str | None) -> tuple[str, list[str]]:
        given = {k: v for k, v in match.items() if v is not None}
        return ((" WHERE " + " AND ".join(f"{k}=?" for k in given)) if given else "", list(given.values()))

    @staticmethod
    def _row(cur: sqlite3.Cursor, row: tuple[Any, ...]) -> Result:
        names = [d[0] for d in cur.description]
        return Result(**{n: v for n, v in zip(names, row) if n in COLUMNS})

    # ---- sharing between machines (see store_io) -------------------------------------------------------------
    def export_json(self, path: str | os.PathLike[str]) -> int:
        """Write every result to a JSON file (`-`: stdout), atomically; returns how many."""
        from tilewise.tune.store_io import write_export

        return write_export(self, path)

    def import_json(self, path: str | os.PathLike[str], replace: bool = False) -> tuple[int, int]:
        """Import an exported JSON file, all rows or none; returns (added, skipped because already stored).

        Every field of every row is checked before anything is written."""
        from tilewise.tune.store_io import read_export

        return self.put_many(read_export(path), replace=replace)
