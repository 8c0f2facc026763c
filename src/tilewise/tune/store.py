"""The results store: SQLite (WAL, one transaction per result) under the user cache directory.

One row per (device fingerprint, kernel, source hash, shape, config). A row holds the status (one of
`STATUSES`), a message (the illegal rule's numbers, the compiler's first error line, the verification
error), the timing statistics and the verification error. Re-running a sweep skips what is stored (unless
forced); killing a sweep loses nothing already written, because every result commits on its own.

`export_json`/`import_json` move results between machines (`tilewise store export/import FILE.json`).
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from tilewise.errors import ConfigError

STATUSES = ("ok", "illegal", "compile_error", "launch_error", "wrong", "timeout")
EXPORT_FORMAT = "tilewise-results"
SCHEMA_VERSION = 1


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

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} is not one of {STATUSES}")

    @property
    def key(self) -> tuple[str, str, str, str, str]:
        return (self.fingerprint, self.kernel, self.source_hash, self.shape, self.config)


_COLUMNS = [f.name for f in fields(Result)]
_SQL_TYPES = {"str": "TEXT", "float | None": "REAL", "int | None": "INTEGER", "float": "REAL"}


def shape_key(shape: Iterable[int]) -> str:
    """`346x1024x2560`."""
    return "x".join(str(int(s)) for s in shape)


class Store:
    """SQLite results store. Open with `Store(path)`; a corrupt file raises `ConfigError` (never dropped)."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path is not None else default_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(self.path, timeout=30.0)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            check = self._db.execute("PRAGMA quick_check").fetchone()
            if check and check[0] != "ok":
                raise sqlite3.DatabaseError(f"quick_check: {check[0]}")
            self._create()
        except sqlite3.DatabaseError as exc:
            raise ConfigError(
                f"the results store {self.path} is unreadable ({exc}); nothing was changed",
                f"use another store with --store PATH, or move the file aside (mv {self.path} {self.path}.bad) "
                "to start a fresh one; `tilewise store export` can copy results out of a readable store") from exc

    def _create(self) -> None:
        cols = []
        for f in fields(Result):
            cols.append(f"{f.name} {_SQL_TYPES.get(str(f.type), 'TEXT')}")
        with self._db:
            self._db.execute(f"CREATE TABLE IF NOT EXISTS results ({', '.join(cols)}, "
                             "PRIMARY KEY (fingerprint, kernel, source_hash, shape, config))")
            self._db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
            self._db.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def put(self, result: Result) -> None:
        """Write one result in its own transaction (replacing the row with the same key)."""
        if not result.created:
            result.created = time.time()
        if not result.version:
            from tilewise import __version__

            result.version = __version__
        row = asdict(result)
        with self._db:
            self._db.execute(f"INSERT OR REPLACE INTO results ({', '.join(_COLUMNS)}) VALUES "
                             f"({', '.join('?' * len(_COLUMNS))})", [row[c] for c in _COLUMNS])

    def get(self, fingerprint: str, kernel: str, source_hash: str, shape: str, config: str) -> Result | None:
        cur = self._db.execute("SELECT * FROM results WHERE fingerprint=? AND kernel=? AND source_hash=? AND shape=? "
                               "AND config=?", (fingerprint, kernel, source_hash, shape, config))
        row = cur.fetchone()
        return self._row(cur, row) if row else None

    def query(self, fingerprint: str | None = None, kernel: str | None = None, shape: str | None = None,
              status: str | None = None) -> list[Result]:
        """Rows matching every given field."""
        where, args = [], []
        for col, val in (("fingerprint", fingerprint), ("kernel", kernel), ("shape", shape), ("status", status)):
            if val is not None:
                where.append(f"{col}=?")
                args.append(val)
        sql = "SELECT * FROM results" + (f" WHERE {' AND '.join(where)}" if where else "") + " ORDER BY created"
        cur = self._db.execute(sql, args)
        return [self._row(cur, r) for r in cur.fetchall()]

    def __iter__(self) -> Iterator[Result]:
        return iter(self.query())

    def __len__(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM results").fetchone()[0])

    def summary(self) -> list[dict[str, Any]]:
        """Counts per (device, kernel, shape, status)."""
        cur = self._db.execute("SELECT fingerprint, kernel, shape, status, COUNT(*), MIN(median_ms) FROM results "
                               "GROUP BY fingerprint, kernel, shape, status ORDER BY fingerprint, kernel, shape")
        return [{"fingerprint": f, "kernel": k, "shape": s, "status": st, "count": n, "best_ms": b}
                for f, k, s, st, n, b in cur.fetchall()]

    @staticmethod
    def _row(cur: sqlite3.Cursor, row: tuple[Any, ...]) -> Result:
        names = [d[0] for d in cur.description]
        return Result(**{n: v for n, v in zip(names, row) if n in _COLUMNS})

    # ---- sharing between machines ---------------------------------------------------------------------------
    def export_json(self, path: str | os.PathLike[str]) -> int:
        """Write every result to a JSON file; returns how many."""
        rows = [asdict(r) for r in self]
        Path(path).write_text(json.dumps({"format": EXPORT_FORMAT, "schema": SCHEMA_VERSION, "results": rows},
                                         indent=1))
        return len(rows)

    def import_json(self, path: str | os.PathLike[str], replace: bool = False) -> tuple[int, int]:
        """Read results from an exported JSON file; returns (added, skipped because already stored).

        Rows already in this store are kept unless `replace` (local measurements are never silently lost).
        """
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"cannot read {path}: {exc}", "give a file written by `tilewise store export`") from exc
        if not isinstance(data, dict) or data.get("format") != EXPORT_FORMAT or not isinstance(data.get("results"),
                                                                                                  list):
            raise ConfigError(f"{path} is not a tilewise results export (format {EXPORT_FORMAT!r})",
                              "give a file written by `tilewise store export`")
        parsed = []
        for i, row in enumerate(data["results"]):
            try:
                parsed.append(Result(**{k: row[k] for k in _COLUMNS if k in row}))
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"{path}: result {i} is malformed ({exc}); nothing was imported",
                                  "re-export the file with `tilewise store export`") from exc
        added = skipped = 0
        for r in parsed:
            if not replace and self.get(*r.key) is not None:
                skipped += 1
                continue
            self.put(r)
            added += 1
        return added, skipped
