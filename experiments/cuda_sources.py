"""The model kernels' CUDA text as the experiments change it: every kernels module that builds a family's text calls
its own imported name `model_source` (`kernels/cudasrc.py`), so an edit has to reach each of them, or some family
compiles unedited without a word. `model_sources` patches all of them at once (found, not listed); `source_at(rev)`
builds the text from another commit's files (git), `source_in(folder)` from a copy of another tree's kernels folder,
for racing two versions of the kernels.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import tilewise.kernels.attention.cuda  # noqa: E402  (imported so that their `model_source` names exist)
import tilewise.kernels.cudasrc as cudasrc  # noqa: E402
import tilewise.kernels.matmul.cuda  # noqa: E402
import tilewise.kernels.rowops.cuda  # noqa: E402
import tilewise.kernels.shortconv.cuda  # noqa: E402,F401

Source = Callable[..., str]  # (family, *filenames) -> text


def source_users() -> list[object]:
    """Every loaded tilewise.kernels module whose `model_source` is cudasrc's (cudasrc itself included)."""
    real = cudasrc.model_source
    return [m for name, m in sorted(sys.modules.items())
            if name.startswith("tilewise.kernels") and getattr(m, "model_source", None) is real]


@contextlib.contextmanager
def model_sources(source: Source, users: list[object] | None = None) -> Iterator[None]:
    """Within the block, every family's text comes from `source` (called with the family and its file names).
    `users`: `source_users()` found once by a caller that patches often (finding them walks sys.modules, a fraction
    of a millisecond: a cost a timed decision would carry)."""
    users = source_users() if users is None else users
    real = cudasrc.model_source
    for m in users:
        m.model_source = source  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for m in users:
            m.model_source = real  # type: ignore[attr-defined]


@cache
def _file_at(rev: str, path: str) -> str:
    got = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True, text=True)
    if got.returncode != 0:
        raise SystemExit(f"git show {rev}:{path} failed: {got.stderr.strip()} (is {rev} a commit of this checkout?)")
    return got.stdout


def source_in(folder: str | Path) -> Source:
    """`model_source` from a copy of another tree's `src/tilewise/kernels` folder (where no git history is at hand)."""
    root = Path(folder)

    def read(path: str) -> str:
        if not (root / path).is_file():
            raise SystemExit(f"{root / path} is missing: pass a copy of a tree's src/tilewise/kernels folder")
        return (root / path).read_text()

    def source(family: str, *filenames: str) -> str:
        return "\n".join([*(read(h) for h in cudasrc.MODEL_HEADERS), *(read(f"{family}/{f}") for f in filenames)])

    return source


def source_at(rev: str) -> Source:
    """`model_source` as commit `rev` had its files: the same headers and families, read through git."""
    kernels = "src/tilewise/kernels"

    def source(family: str, *filenames: str) -> str:
        heads = [_file_at(rev, f"{kernels}/{h}") for h in cudasrc.MODEL_HEADERS]
        return "\n".join([*heads, *(_file_at(rev, f"{kernels}/{family}/{f}") for f in filenames)])

    return source
