"""The one dispatch-table format: which kernel and config to run for which problem and row count.

`tilewise sweep --out` and `tilewise tune model` write it; the model runtime loads it. A table is measured on one
device (its fingerprint) and holds one entry per problem, keyed by the problem's dispatch key (the problem name and
every size but the rows: `gemm:2560x1024`, `nf4_matmul.swiglu.norm:4608x1024`, `attention:16x8x64`). An entry is
the fewest row ranges whose choice is within a tolerance of the per-row-count best at every measured row count
(`fit_dispatch`); the last range also serves larger counts.

    {"format": "tilewise-dispatch", "schema": 2, "device": FINGERPRINT,
     "kernel_versions": {"matmul": "3f2a...", ...},           # per kernel family: the code the entries measured
     "entries": {KEY: {"family": "matmul", "fixed": {"N": 2560, "K": 1024}, "tolerance": 0.03,
                       "ranges": [{"m_min": 1, "m_max": 95, "kernel": TEMPLATE, "config": {...},
                                   "config_key": "BM=...", "label": "..."}, ...],     # m_max null: no bound
                       "measured_m": [...], "per_m": {M: {"best": KEY, "median_ms": ...}}}},
     "measured": {...},                                        # free-form records of how the entries were measured
     "settings": {MODEL: {"values": {"pdl": false, ...}, "versions": {...}, "raced": {...}}},  # whole-run choices
     "partial": {"left": [...], "why": "..."},                 # only while a run has not measured every shape
     "portable": {"backend": "cuda", "devices": [FP, ...]}}    # only in a portable table (device "portable")

A loader drops the entries whose family's code changed since (with a warning naming them), and a table from
another device entirely, so a stale choice never runs. `settings` holds choices an executor makes for a whole model
(which the model tune races on whole decisions), keyed by the model's shape signature; a setting measured on kernel
code that has changed since is dropped the same way. A portable table (`tilewise report --portable`) serves any
device of its backend, each entry checked against that device's rules as every table is.
"""

from __future__ import annotations

import functools
import hashlib
import json
import sys
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tilewise.errors import ConfigError
from tilewise.files import write_atomic
from tilewise.kernels.base import KernelTemplate
from tilewise.kernels.registry import backend_of
from tilewise.tune.sweep import SweepResult, parse_m_values, sweep, sweep_json

FORMAT = "tilewise-dispatch"
SCHEMA = 2
#: the `device` of a table chosen for several devices at once (`tilewise report --portable`)
PORTABLE_DEVICE = "portable"


@dataclass
class Range:
    """Rows m_min..m_max (inclusive) run `config` (a config, or any hashable choice such as (kernel, config))."""

    m_min: int
    m_max: int
    config: Any


def fit_dispatch(times: Mapping[Hashable, Mapping[int, float]], ms: Sequence[int], tolerance: float = 0.03,
                 ) -> list[Range]:
    """The fewest M ranges, each with one choice whose time is within `tolerance` of the per-M best.

    Greedy furthest-reach is optimal for covering a line with the fewest intervals: from the first
    uncovered M, take the choice that stays acceptable the longest (ties: the lowest summed time).

    Args:
        times: choice -> {M: median ms} (missing M = that choice cannot run there).
        ms: the measured M values.
        tolerance: accepted slowdown over the per-M best (0.03 = 3%).

    Returns:
        Ranges covering 1..max(ms) contiguously; a range's m_max is the last measured M it covers.
    """
    if tolerance < 0:
        raise ConfigError(f"tolerance {tolerance} is negative", "give --tolerance 0.03 for 3%")
    ms = sorted(ms)
    best = {}
    for m in ms:
        vals = [t[m] for t in times.values() if m in t]
        if not vals:
            raise ConfigError(f"no config ran at M={m}", "check the sweep's failures")
        best[m] = min(vals)
    ok = {c: {m for m in ms if m in t and t[m] <= (1 + tolerance) * best[m]} for c, t in times.items()}
    ranges: list[Range] = []
    i = 0
    while i < len(ms):
        choice, reach, cost = None, i - 1, float("inf")
        for c, good in ok.items():
            j = i
            while j < len(ms) and ms[j] in good:
                j += 1
            if j - 1 < i:
                continue
            total = sum(times[c][ms[x]] for x in range(i, j))
            if j - 1 > reach or (j - 1 == reach and total < cost):
                choice, reach, cost = c, j - 1, total
        assert choice is not None  # the per-M best is always within tolerance
        lo = ranges[-1].m_max + 1 if ranges else 1
        ranges.append(Range(lo, ms[reach], choice))
        i = reach + 1
    return ranges


def family_of(template: KernelTemplate) -> str:
    """The kernel family a template belongs to: its package under `tilewise.kernels` (`matmul`, `gemm`, ...)."""
    parts = type(template).__module__.split(".")
    return parts[2] if len(parts) > 3 and parts[:2] == ["tilewise", "kernels"] else parts[-1]


#: which backend a family's source file belongs to, by its name; files no backend owns (problem.py, tiling.py,
#: __init__.py) belong to all. A table is stale only when the code of its own backend (or a shared file) changed.
_OWNERS = (("cuda", (".cu",), ("cuda", "tvm_cuda")), ("tvm-llvm", (), ("tvm_llvm",)),
           ("webgpu", (".wgsl",), ("webgpu", "wgsl", "sgmat")))
_KERNELS = Path(__file__).resolve().parents[1] / "kernels"


def file_backend(path: Path) -> str | None:
    """The backend a family source file is written for, or None for a file all its backends share."""
    for backend, suffixes, stems in _OWNERS:
        if path.suffix in suffixes or path.stem.startswith(stems):
            return backend
    return None


def _imported_kernel_files(path: Path) -> set[Path]:
    """The family modules `path` imports (`from tilewise.kernels.F.M import ...`, `from tilewise.kernels.F import
    M`): code it runs."""
    st = path.stat()
    return set(_imports_of(path, st.st_mtime_ns, st.st_size))


@functools.lru_cache(maxsize=256)
def _imports_of(path: Path, mtime_ns: int, size: int) -> frozenset[Path]:
    """`_imported_kernel_files` of one version of a file (keyed by its time and size: every table load and store
    asks for the same files, and parsing them is most of a version's cost)."""
    import ast

    found: set[Path] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tilewise.kernels."):
            parts = node.module.split(".")[2:]  # F.M, or F with the modules among the names
            names = [parts[1]] if len(parts) == 2 else [a.name for a in node.names] if len(parts) == 1 else []
            found.update(_KERNELS / parts[0] / f"{n}.py" for n in names if (_KERNELS / parts[0] / f"{n}.py").is_file())
    return frozenset(found)


def package_version(family_dir: Path, backend: str | None) -> str:
    """Hash of the code `backend` runs for the family in `family_dir`: its files and the shared ones (every file for
    backend None), then the other families' modules those import."""
    files = {p for p in family_dir.iterdir() if p.suffix in (".py", ".cu", ".wgsl")
             and (backend is None or file_backend(p) in (None, backend))}
    todo = [p for p in files if p.suffix == ".py"]
    while todo:
        for dep in _imported_kernel_files(todo.pop()):
            if dep not in files and dep.parent != family_dir:
                files.add(dep)
                todo.append(dep)
    h = hashlib.sha256()
    for p in sorted(files, key=lambda p: (p.parent != family_dir, p.parent.name, p.name)):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:12]


def family_version(template: KernelTemplate) -> str:
    """Hash of the code a template's family runs on its backend (`package_version`): a table measured on other
    code is stale, and editing one backend's kernels leaves the other backends' tables valid."""
    name = type(template).__module__
    path = Path(sys.modules[name].__file__ or "")
    if len(name.split(".")) <= 3:  # a module outside a family package: itself alone
        return hashlib.sha256(path.name.encode() + path.read_bytes()).hexdigest()[:12]
    return package_version(path.parent, file_backend(path))


@dataclass
class Entry:
    """One problem's choices per row range (see the module docstring for the JSON)."""

    ranges: list[dict[str, Any]]
    family: str = ""
    fixed: dict[str, int] = field(default_factory=dict)
    tolerance: float | None = None
    measured_m: list[int] = field(default_factory=list)
    per_m: dict[str, dict[str, Any]] = field(default_factory=dict)

    def pick(self, m: int) -> tuple[str, dict[str, Any]] | None:
        """(kernel name, config) for m rows; beyond the last range its choice; None when no range covers m."""
        for r in self.ranges:
            hi = r.get("m_max")
            if r["m_min"] <= m and (hi is None or m <= hi):
                return r.get("kernel", ""), dict(r["config"])
        if self.ranges and m > (self.ranges[-1].get("m_max") or m):
            return self.ranges[-1].get("kernel", ""), dict(self.ranges[-1]["config"])
        return None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"family": self.family, "fixed": self.fixed, "ranges": self.ranges}
        if self.tolerance is not None:
            out["tolerance"] = self.tolerance
        if self.measured_m:
            out.update(measured_m=self.measured_m, per_m=self.per_m)
        return out

    @classmethod
    def from_json(cls, d: Any, where: str = "the dispatch table", key: str = "?") -> Entry:
        """An entry checked field by field: one ConfigError naming the entry, the range and what is wrong."""
        return cls(*_checked_entry(d, f"{where}: entry {key!r}"))


TABLE_FIX = "write the table again with `tilewise tune model` or `tilewise sweep ... --out FILE` (or delete it)"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _checked_entry(d: Any, at: str) -> tuple[Any, ...]:
    """The fields of an Entry from JSON, refusing missing keys, wrong types and ranges that overlap or leave gaps
    (a row count no range covers, or two ranges claim, would run an unplanned kernel)."""
    def bad(what: str) -> ConfigError:
        return ConfigError(f"{at} {what}", TABLE_FIX)

    if not isinstance(d, dict):
        raise bad(f"is a {type(d).__name__}, not an object")
    ranges = d.get("ranges")
    if not isinstance(ranges, list) or not ranges:
        raise bad("has no ranges (a non-empty list of {m_min, m_max, kernel, config})")
    end = 0  # the last row count covered so far
    for i, r in enumerate(ranges):
        here = f"range {i}"
        if not isinstance(r, dict):
            raise bad(f"{here} is a {type(r).__name__}, not an object")
        missing = [k for k in ("m_min", "m_max", "kernel", "config") if k not in r]
        if missing:
            raise bad(f"{here} lacks {', '.join(missing)}")
        lo, hi, kernel, cfg = r["m_min"], r["m_max"], r["kernel"], r["config"]
        if not _is_int(lo) or lo < 1:
            raise bad(f"{here}: m_min {lo!r} is not a row count >= 1")
        if hi is not None and not _is_int(hi):
            raise bad(f"{here}: m_max {hi!r} is neither a row count nor null (no bound)")
        if hi is not None and lo > hi:
            raise bad(f"{here}: m_min {lo} > m_max {hi}")
        if hi is None and i != len(ranges) - 1:
            raise bad(f"{here} has no upper bound (m_max null) but range {i + 1} follows it")
        if lo <= end:
            raise bad(f"{here} (rows {lo}..{hi if hi is not None else ''}) overlaps the rows up to {end} before it")
        if lo > end + 1:
            raise bad(f"{here} starts at row {lo}: rows {end + 1}..{lo - 1} have no range (a gap)")
        if not isinstance(kernel, str) or not kernel:
            raise bad(f"{here}: kernel {kernel!r} is not a kernel name")
        if not isinstance(cfg, dict) or not all(isinstance(k, str) and isinstance(v, (int, float, str))
                                                for k, v in cfg.items()):
            raise bad(f"{here}: config {cfg!r} is not an object of parameter values")
        end = hi if hi is not None else lo
    fixed, tol, measured_m, per_m = (d.get("fixed", {}), d.get("tolerance"), d.get("measured_m", []),
                                     d.get("per_m", {}))
    if not isinstance(fixed, dict) or not all(_is_int(v) for v in fixed.values()):
        raise bad(f"has fixed sizes {fixed!r}, not an object of whole numbers")
    if tol is not None and (not isinstance(tol, (int, float)) or isinstance(tol, bool)):
        raise bad(f"has tolerance {tol!r}, not a number")
    if not isinstance(measured_m, list) or not all(_is_int(m) for m in measured_m) or not isinstance(per_m, dict):
        raise bad("has measured_m / per_m that are not a list of row counts / an object")
    family = d.get("family", "")
    if not isinstance(family, str):
        raise bad(f"has family {family!r}, not a name")
    return [dict(r) for r in ranges], family, dict(fixed), tol, list(measured_m), dict(per_m)


def make_ranges(ranges: Sequence[Range], kernel_of: Any = None, open_end: bool = False) -> list[dict[str, Any]]:
    """The JSON ranges of fitted `Range`s. A range's `config` is a Config, or a (kernel name, Config) pair;
    `kernel_of` names the kernel of plain configs. `open_end` leaves the last range without an upper bound."""
    out = []
    for i, r in enumerate(ranges):
        kernel, cfg = r.config if isinstance(r.config, tuple) else (kernel_of, r.config)
        out.append({"m_min": r.m_min, "m_max": None if open_end and i == len(ranges) - 1 else r.m_max,
                    "kernel": kernel, "config": dict(cfg), "config_key": cfg.key(), "label": str(cfg)})
    return out


@dataclass
class DispatchTable:
    """Choices per problem on one device; see the module docstring."""

    device: str = ""
    entries: dict[str, Entry] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    measured: dict[str, Any] = field(default_factory=dict)
    #: "defaults", "tuned" or the file it came from
    source: str = "defaults"
    #: set while a run has not measured every shape: {"left": [...], "why": "..."} (a cut or interrupted run)
    partial: dict[str, Any] | None = None
    #: set in a portable table: {"backend": ..., "devices": [fingerprints it was chosen over]}
    portable: dict[str, Any] | None = None
    #: per model signature: {"values": {setting: value}, "versions": {family: version raced on}, "raced": {...}}
    settings: dict[str, Any] = field(default_factory=dict)

    def pick(self, key: str, m: int) -> tuple[str, dict[str, Any]] | None:
        entry = self.entries.get(key)
        return entry.pick(m) if entry is not None else None

    def put(self, key: str, entry: Entry, template: KernelTemplate) -> None:
        """Add (or replace) an entry measured with `template`'s family code."""
        entry.family = entry.family or family_of(template)
        self.entries[key] = entry
        self.versions[entry.family] = family_version(template)

    def to_json(self) -> dict[str, Any]:
        out = {"format": FORMAT, "schema": SCHEMA, "device": self.device, "kernel_versions": self.versions,
               "entries": {k: e.to_json() for k, e in self.entries.items()}, "measured": self.measured}
        if self.partial:
            out["partial"] = self.partial
        if self.portable is not None:
            out["portable"] = self.portable
        if self.settings:
            out["settings"] = self.settings
        return out

    def save(self, path: str | Path) -> Path:
        """Write atomically (a crash mid-write leaves the old file)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        return write_atomic(path, json.dumps(self.to_json(), indent=1))

    @classmethod
    def from_json(cls, d: Any, where: str = "the dispatch table") -> DispatchTable:
        if not isinstance(d, dict) or d.get("format") != FORMAT or not isinstance(d.get("entries"), dict):
            raise ConfigError(f"{where} is not a tilewise dispatch table (format {FORMAT!r}, schema {SCHEMA})",
                              "write one with `tilewise sweep ... --out FILE` or `tilewise tune model`")
        versions, measured, device = d.get("kernel_versions", {}), d.get("measured", {}), d.get("device", "")
        if not isinstance(versions, dict) or not all(isinstance(v, str) for v in versions.values()):
            raise ConfigError(f"{where}: kernel_versions {versions!r} is not an object of version hashes", TABLE_FIX)
        if not isinstance(measured, dict) or not isinstance(device, str):
            raise ConfigError(f"{where}: measured is not an object or device is not a fingerprint", TABLE_FIX)
        entries = {str(k): Entry.from_json(e, where, k) for k, e in d["entries"].items()}
        partial, portable = d.get("partial"), d.get("portable")
        if partial is not None and not isinstance(partial, dict):
            raise ConfigError(f"{where}: partial {partial!r} is not an object", TABLE_FIX)
        if (device == PORTABLE_DEVICE) != isinstance(portable, dict) or (
                portable is not None and not isinstance(portable.get("backend"), str)):
            raise ConfigError(f"{where}: a table of device {PORTABLE_DEVICE!r} needs a \"portable\" object naming its "
                              "backend, and only such a table has one", "write it again with `tilewise report "
                              "--portable --out FILE`")
        settings = d.get("settings", {})
        if not isinstance(settings, dict) or not all(
                isinstance(v, dict) and isinstance(v.get("values"), dict) and isinstance(v.get("versions"), dict)
                and all(isinstance(x, bool) for x in v["values"].values()) for v in settings.values()):
            raise ConfigError(f"{where}: settings is not an object of {{\"values\": {{setting: true or false}}, "
                              "\"versions\": {...}} per model", TABLE_FIX)
        return cls(device, entries, dict(versions), dict(measured), partial=partial, portable=portable,
                   settings=dict(settings))

    @classmethod
    def load(cls, path: str | Path) -> DispatchTable:
        """Read a table file, refusing files that are not one (old formats included, with what to do)."""
        try:
            d = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"cannot read dispatch table {path}: {exc}",
                              "write one with `tilewise sweep ... --out FILE` or `tilewise tune model`") from exc
        if isinstance(d, dict) and (d.get("format") == "tilewise-model-dispatch" or "ranges" in d):
            raise ConfigError(f"{path} is a dispatch table in the format before schema {SCHEMA}, measured on kernels "
                              "that have changed since", "measure it again (`tilewise tune model`, `tilewise sweep`)")
        table = cls.from_json(d, str(path))
        table.source = str(path)
        return table

    def usable_on(self, fingerprint: str, current: Mapping[str, str]) -> tuple[DispatchTable, list[str]]:
        """This table as it may run on a device with `fingerprint` and family code versions `current`: (the
        usable part, warnings). Another device's table gives nothing (a portable table: another backend's); a
        changed family loses its entries."""
        backend = backend_of(fingerprint)
        if self.portable is not None and self.portable["backend"] != backend:
            return DispatchTable(fingerprint), [f"it is a portable table for {self.portable['backend']} devices, not "
                                                f"for this {backend} device"]
        if self.portable is None and self.device != fingerprint:
            return DispatchTable(fingerprint), [f"it was measured on {self.device!r}, not on this device "
                                                f"{fingerprint!r}"]
        stale = sorted({e.family for e in self.entries.values()
                        if self.versions.get(e.family) != current.get(e.family)})
        kept = {k: e for k, e in self.entries.items() if e.family not in stale}
        changes = ", ".join(f"{f} {self.versions.get(f)!r} -> {current.get(f)!r}" for f in stale)
        notes = [f"the {', '.join(stale)} kernels changed since it was measured (versions {changes})"] if stale else []
        versions = {f: v for f, v in self.versions.items() if f not in stale}
        settings = {}
        for model, s in self.settings.items():
            changed = sorted(f for f, v in s["versions"].items() if current.get(f) != v)
            if changed:
                notes.append(f"the settings raced for {model} ran on {', '.join(changed)} kernels that changed since")
            else:
                settings[model] = s
        return DispatchTable(self.device, kept, versions, self.measured, self.source, self.partial,
                             self.portable, settings), notes


def dispatch_table(result: SweepResult, tolerance: float = 0.03) -> dict[str, Any]:
    """The dispatch table (JSON) of a sweep: one entry, the sweep's problem at its N and K."""
    tpl = result.template
    if tpl is None:
        raise ConfigError("this sweep result does not name its template", "run it with `tune.sweep.sweep`")
    ranges = fit_dispatch(result.times(), result.ms, tolerance)
    per_m = {}
    for m in result.ms:
        b = result.best_at(m)
        if b:
            per_m[str(m)] = {"best": b[0].key(), "median_ms": b[1]}
    shape = (max(result.ms), result.n, result.k)
    entry = Entry(make_ranges(ranges, tpl.name), fixed=dict(zip(tpl.shape_names[1:], shape[1:])),
                  tolerance=tolerance, measured_m=list(result.ms), per_m=per_m)
    table = DispatchTable(result.fingerprint)
    table.put(tpl.problem.dispatch_key(shape), entry, tpl)
    return table.to_json()


def lookup(table: DispatchTable | Mapping[str, Any], m: int, key: str | None = None) -> dict[str, Any]:
    """The config dict a dispatch table picks for M (beyond the last range: the last range's config); `key` may
    be left out when the table has one entry."""
    t = table if isinstance(table, DispatchTable) else DispatchTable.from_json(table)
    if key is None:
        if len(t.entries) != 1:
            raise ConfigError(f"the table has {len(t.entries)} entries; say which one", f"keys: {', '.join(t.entries)}")
        key = next(iter(t.entries))
    got = t.pick(key, m)
    if got is None:
        raise ConfigError(f"dispatch table has no range for M={m} in {key}", "re-run `tilewise sweep` over this M")
    return got[1]


def load_table(path: str | Path) -> DispatchTable:
    """Read a dispatch table file (see `DispatchTable.load`)."""
    return DispatchTable.load(path)


__all__ = ["FORMAT", "PORTABLE_DEVICE", "SCHEMA", "DispatchTable", "Entry", "Range", "dispatch_table", "family_of",
           "family_version", "file_backend", "fit_dispatch", "load_table", "lookup", "make_ranges", "package_version",
           "parse_m_values", "sweep", "sweep_json"]
