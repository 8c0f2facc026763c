"""The classifier's dispatch: which kernel and config each tuned op runs at each row count, on one device.

The table is the one format of `tilewise.tune.dispatch` (written by `tilewise tune model`, or by `tilewise sweep
... --out`), one file per device fingerprint. Its entries are keyed by the ops' problems:
`nf4_matmul.swiglu.norm:4608x1024` (a matmul's weight format, epilogue, fused norm, N x K) and
`attention:16x8x64` (heads, kv heads, head size). Without a table, or for an op it lacks, the executor takes the
defaults below: the short-row kernel below 96 rows (seed 001's measured cutoff) and 64x64 tiles from there.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from tilewise.errors import ConfigError
from tilewise.kernels.attention import webgpu as attn_k
from tilewise.kernels.matmul import webgpu as mm
from tilewise.tune.dispatch import DispatchTable, family_version
from tilewise.tune.store import default_path

TUNE_FIX = "run `tilewise tune model --preset P --seq 346 --device webgpu` to measure this device"


def dispatch_path(fingerprint: str) -> Path:
    """Where `tilewise tune model` writes the dispatch table of a device (override: TILEWISE_DISPATCH_DIR)."""
    env = os.environ.get("TILEWISE_DISPATCH_DIR")
    base = Path(env) if env else default_path().parent / "dispatch"
    slug = "".join(ch if ch.isalnum() or ch in ".-" else "-" for ch in fingerprint)
    return base / f"model-{slug}.json"


def matmul_key(fmt: str, epilogue: str, n: int, k: int, norm: bool = False) -> str:
    """The dispatch key of one of the model's matmuls (the problem's: rows are what the entry dispatches on)."""
    return mm.MatmulProblem(fmt, epilogue, norm).dispatch_key((1, n, k))


def attention_key(hq: int, hkv: int, d: int) -> str:
    return attn_k.AttentionProblem().dispatch_key((1, 0, hq, hkv, d))


def matmul_name(kind: str, fmt: str, epilogue: str, norm: bool = False) -> str:
    """The template name of an f32-arithmetic matmul kernel (what the defaults run)."""
    return mm.MatmulTemplate(kind, fmt, epilogue, None, norm=norm).name


def default_matmul(rows: int) -> tuple[str, dict[str, Any]]:
    """(kind, config values) the executor runs for `rows` rows when no table says otherwise."""
    if rows <= 2:
        return "rows", dict(mm.DEFAULT_ONE_ROW)
    if rows < mm.DEFAULT_CUTOFF_ROWS:
        return "rows", dict(mm.DEFAULT_ROWS)
    return "tiled", dict(mm.DEFAULT_TILED)


def current_versions() -> dict[str, str]:
    """The code versions of the families the model tunes (a table measured on other code is stale)."""
    return {"matmul": family_version(mm.MatmulTemplate()), "attention": family_version(attn_k.AttentionTemplate())}


def load_model_table(fingerprint: str, path: str | Path | None = None, quiet: bool = False) -> DispatchTable:
    """The table for a device, or an empty one (the defaults) with a warning saying how to tune.

    A table from another device, or one that is unreadable, gives the defaults with a warning; entries of a family
    whose code changed since they were measured are dropped (the rest are kept), with a warning naming it.
    """
    path = Path(path) if path is not None else dispatch_path(fingerprint)
    if not path.exists():
        if not quiet:
            warnings.warn(f"no tuned dispatch table for {fingerprint}; using safe defaults (short-row kernel below "
                          f"{mm.DEFAULT_CUTOFF_ROWS} rows, 64x64 tiles from there). To tune: {TUNE_FIX}", stacklevel=2)
        return DispatchTable(fingerprint)
    try:
        table = DispatchTable.load(path)
    except ConfigError as exc:
        warnings.warn(f"ignoring dispatch table {path}: {exc.problem}; using defaults. {TUNE_FIX}", stacklevel=2)
        return DispatchTable(fingerprint)
    usable, notes = table.usable_on(fingerprint, current_versions())
    if notes:
        warnings.warn(f"dispatch table {path}: {'; '.join(notes)}; using defaults for those. {TUNE_FIX}",
                      stacklevel=2)
    return usable
