"""Moving results between machines: the export file (`{"format": "tilewise-results", "schema": 1, "results":
[...]}`), written atomically and never over a database, and read back only when every field of every row is valid.

The row invariants follow how the engine writes and reads rows: an `ok` row is timed (a finite positive
`median_ms`; p20 <= median <= p80 and ci_lo <= median <= ci_hi where given, at least one sample), any other status
carries no timing; errors are non-negative (infinite for a non-finite output), tile waste is at least 1.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tilewise.errors import ConfigError
from tilewise.files import write_atomic
from tilewise.tune.store import COLUMNS, EXPORT_FORMAT, SCHEMA_VERSION, STATUSES, Result, Store

STDOUT = "-"
SQLITE_MAGIC = b"SQLite format 3\x00"
WAL_MAGIC = (b"\x37\x7f\x06\x82", b"\x37\x7f\x06\x83")
_SHAPE = re.compile(r"[1-9][0-9]*(x(0|[1-9][0-9]*))*")  # rows >= 1; a later size may be 0 (attention's cached P)
_TIMES = ("median_ms", "p20_ms", "p80_ms", "ci_lo_ms", "ci_hi_ms")
_FIX_ROW = "correct or remove that row, or export it again with `tilewise store export`; nothing was imported"


def is_database(path: str | os.PathLike[str]) -> bool:
    """True when `path` is a SQLite database or a SQLite write-ahead log (a store's `-wal` file)."""
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError:
        return False
    return head == SQLITE_MAGIC or head[:4] in WAL_MAGIC


# ---- export ------------------------------------------------------------------------------------------------------
def export_data(store: Store) -> dict[str, Any]:
    return {"format": EXPORT_FORMAT, "schema": SCHEMA_VERSION, "results": [asdict(r) for r in store]}


def check_export_target(store_path: Path, target: str | os.PathLike[str]) -> None:
    """Refuse an export file that is a folder, in a missing folder, the store itself or any SQLite file."""
    if str(target) == STDOUT:
        return
    p = Path(target)
    fix = "choose another file name, e.g. results.json (or - for stdout)"
    if p.is_dir():
        raise ConfigError(f"the export file {p} is a folder; nothing was written", f"give a file, e.g. {p / 'r.json'}")
    if not p.parent.is_dir():
        raise ConfigError(f"the export file {p}: the folder {p.parent} does not exist; nothing was written",
                          "create the folder first or write somewhere else")
    siblings = {Path(f"{store_path}{s}").absolute() for s in ("", "-wal", "-shm", "-journal")}
    same = p.absolute() in siblings or (p.exists() and store_path.exists() and os.path.samefile(p, store_path))
    if same:
        raise ConfigError(f"the export file {p} is the results store {store_path} (or one of its files); writing "
                          "it would replace the results with JSON, so nothing was written", fix)
    if is_database(p):
        raise ConfigError(f"the export file {p} is a SQLite database (a results store?); it is never overwritten, "
                          "so nothing was written", fix)


def write_export(store: Store, target: str | os.PathLike[str]) -> int:
    """Write every result of `store` as JSON to `target` (`-`: stdout), atomically; returns how many."""
    check_export_target(store.path, target)
    data = export_data(store)
    text = json.dumps(data, indent=1)
    if str(target) == STDOUT:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    else:
        write_atomic(Path(target), text)
    return len(data["results"])


# ---- import ------------------------------------------------------------------------------------------------------
def read_export(path: str | os.PathLike[str]) -> list[Result]:
    """The rows of an export file, each field checked; one `ConfigError` names the first bad one."""
    fix = "give a file written by `tilewise store export`"
    if is_database(path):
        raise ConfigError(f"{path} is a SQLite database (a results store?), not an export; nothing was imported",
                          f"{fix}; to copy a whole store, `tilewise store export FILE --store {path}` first")
    try:
        text = Path(path).read_text()
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not a text file ({exc.reason}); nothing was imported", fix) from exc
    except OSError as exc:
        raise ConfigError(f"cannot read {path} ({exc.strerror or exc}); nothing was imported",
                          "check the file name") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); "
                          "nothing was imported", fix) from exc
    if not isinstance(data, dict) or data.get("format") != EXPORT_FORMAT:
        raise ConfigError(f"{path} is not a tilewise results export (it lacks \"format\": \"{EXPORT_FORMAT}\"); "
                          "nothing was imported", fix)
    if data.get("schema") != SCHEMA_VERSION:
        raise ConfigError(f"{path} has export schema {data.get('schema')!r}; this tilewise reads schema "
                          f"{SCHEMA_VERSION}; nothing was imported",
                          "export it again with this version's `tilewise store export`")
    rows = data.get("results")
    if not isinstance(rows, list):
        raise ConfigError(f"{path}: \"results\" is {_kind(rows)}, not a list of rows; nothing was imported", fix)
    out: list[Result] = []
    seen: dict[tuple[str, ...], int] = {}
    for i, row in enumerate(rows):
        result = check_row(row, f"{path}: result {i}")
        first = seen.setdefault(result.key, i)
        if first != i:
            raise ConfigError(f"{path}: results {first} and {i} have the same key (device, kernel, source hash, "
                              f"shape, config = {', '.join(result.key)}); nothing was imported",
                              "keep one of the two rows")
        out.append(result)
    return out


def check_row(row: Any, where: str) -> Result:
    """One export row as a `Result`, or a `ConfigError` naming `where`, the field, its value and the fix."""
    if not isinstance(row, dict):
        raise ConfigError(f"{where} is {_kind(row)}, not an object of fields", _FIX_ROW)
    row = {"worker": None, **row}  # exports from before the worker field lack it
    missing = [c for c in COLUMNS if c not in row]
    if missing:
        raise ConfigError(f"{where} lacks the field{'s' * (len(missing) > 1)} {', '.join(missing)}", _FIX_ROW)
    unknown = sorted(str(k) for k in row if k not in COLUMNS)
    if unknown:
        raise ConfigError(f"{where} has the unknown field{'s' * (len(unknown) > 1)} {', '.join(unknown)}", _FIX_ROW)

    def bad(field: str, wants: str) -> ConfigError:
        return ConfigError(f"{where}: {field} is {_show(row[field])}; expected {wants}", _FIX_ROW)

    for name in ("fingerprint", "kernel", "source_hash"):
        if not isinstance(row[name], str) or not row[name].strip():
            raise bad(name, "a non-empty string")
    for name in ("message", "version"):
        if not isinstance(row[name], str):
            raise bad(name, "a string")
    if row["worker"] is not None and (not isinstance(row["worker"], str) or not row["worker"].strip()):
        raise bad("worker", "null or a non-empty string (who measured the row)")
    if not isinstance(row["shape"], str) or not _SHAPE.fullmatch(row["shape"]):
        raise bad("shape", "sizes joined by x, e.g. \"64x64x64\"")
    config = row["config"]
    if not isinstance(config, str) or any("=" not in p or not p.split("=", 1)[0].strip() for p in config.split(",")
                                          if config):
        raise bad("config", "NAME=VALUE pairs joined by commas, e.g. \"BM=64,BN=64\"")
    if row["status"] not in STATUSES:
        raise bad("status", f"one of {', '.join(STATUSES)}")
    if not _number(row["created"]) or not math.isfinite(row["created"]) or row["created"] < 0:
        raise bad("created", "a finite non-negative number (seconds since 1970)")
    for name in ("rel_err", "max_abs_err"):
        if row[name] is not None and (not _number(row[name]) or math.isnan(row[name]) or row[name] < 0):
            raise bad(name, "null or a non-negative number")
    if row["tile_waste"] is not None and (not _finite(row["tile_waste"]) or row["tile_waste"] < 1):
        raise bad("tile_waste", "null or a finite number of at least 1 (launched over useful area)")
    timing = (*_TIMES, "samples", "gflops")
    if row["status"] != "ok":
        for name in timing:
            if row[name] is not None:
                raise bad(name, f"null: a {row['status']} row is not timed")
        return Result(**row)
    if row["median_ms"] is None or not _finite(row["median_ms"]) or row["median_ms"] <= 0:
        raise bad("median_ms", "a finite positive time in milliseconds: an ok row is timed")
    for name in _TIMES[1:]:
        if row[name] is not None and (not _finite(row[name]) or row[name] <= 0):
            raise bad(name, "null or a finite positive time in milliseconds")
    median = row["median_ms"]
    for lo, hi in (("p20_ms", "median_ms"), ("median_ms", "p80_ms"), ("ci_lo_ms", "median_ms"),
                   ("median_ms", "ci_hi_ms")):
        if row[lo] is not None and row[hi] is not None and row[lo] > row[hi]:
            other = hi if lo == "median_ms" else lo
            raise bad(other, f"{'at least' if lo == 'median_ms' else 'at most'} median_ms ({median!r})")
    if row["samples"] is not None and (type(row["samples"]) is not int or not 1 <= row["samples"] < 2**53):
        raise bad("samples", "null or a whole number of at least 1")
    if row["gflops"] is not None and (not _finite(row["gflops"]) or row["gflops"] < 0):
        raise bad("gflops", "null or a finite non-negative number")
    return Result(**row)


def _number(x: Any) -> bool:
    """An int or float, not a bool; ints only within float's exact range (SQLite stores 64 bits)."""
    return isinstance(x, float) or (type(x) is int and abs(x) <= 2**53)


def _finite(x: Any) -> bool:
    return _number(x) and math.isfinite(x)


def _kind(x: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", type(None): "null", bool: "a boolean"}.get(
        type(x), f"a {type(x).__name__}")


def _show(x: Any) -> str:
    text = json.dumps(x, default=str)
    return text if len(text) <= 60 else text[:57] + "..."
