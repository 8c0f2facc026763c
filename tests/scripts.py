"""Import a script of bench/ or experiments/ as a module for its tests (its main() is not run)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_script(relpath: str, name: str | None = None) -> ModuleType:
    """The script at `relpath` (from the repository root) as module `name` (default: its file name), loaded afresh
    and registered in `sys.modules` (dataclasses and pickling inside it look their module up there)."""
    name = name or Path(relpath).stem
    spec = importlib.util.spec_from_file_location(name, ROOT / relpath)
    assert spec is not None and spec.loader is not None, relpath
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return mod
